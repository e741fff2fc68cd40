// engine/device_context.hpp — what the engine holds per CUDA device: the budgeted memory pool
// every tensor on that device is allocated from, the compute stream, a cuBLAS handle on it, and
// the IO stream on which mini-batches are assembled (blocks, feature gathers) while the compute
// stream trains the previous one.
//
// One context per device for the whole process (the pool's budget is the user's
// --gpu-mem-budget), created on first use. Only built with GALE_WITH_CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/cuda/runtime.hpp"

namespace gale::engine {

class DeviceContext {
 public:
  // The context of device `ordinal`, created on first use (throws DeviceError when the device is
  // missing).
  static DeviceContext& get(int ordinal);
  // Sets the budget a device's pool will charge against; must precede the device's first use
  // (setting the budget it already has is allowed).
  // budget_text is what the user wrote ("8G"), for messages.
  static void set_budget(int ordinal, uint64_t bytes, const std::string& budget_text);

  int device() const { return device_; }
  kernels::cuda::MemoryPool& pool() { return *pool_; }
  kernels::cuda::Stream& stream() { return *stream_; }
  kernels::cuda::CublasHandle& blas() { return *blas_; }
  kernels::cuda::Stream& io_stream() { return *io_stream_; }
  // Orders the compute stream after the work enqueued on the IO stream so far (one reused event;
  // any thread). What Tensor::empty_io's frees use, so memory the IO stream still reads is never
  // handed out again on the compute stream.
  void order_compute_after_io();
  // Blocks until all work on the compute stream has finished.
  void synchronize() { stream_->synchronize(); }

  DeviceContext(int ordinal, uint64_t budget, const std::string& budget_text);
  ~DeviceContext();

 private:
  int device_;
  // Declaration order is destruction order reversed: the handle and stream go before the pool.
  std::unique_ptr<kernels::cuda::MemoryPool> pool_;
  std::unique_ptr<kernels::cuda::Stream> stream_;
  std::unique_ptr<kernels::cuda::CublasHandle> blas_;
  std::unique_ptr<kernels::cuda::Stream> io_stream_;
  std::mutex io_mutex_;
  std::unique_ptr<kernels::cuda::Event> io_done_;
};

// The priority of the streams on a training step's critical path (the compute stream, the
// gradient sums' stream): high, unless GALE_EQUAL_STREAMS is set.
kernels::cuda::Stream::Priority compute_priority();

}  // namespace gale::engine
