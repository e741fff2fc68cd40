// engine/device_context.hpp — what the engine holds per CUDA device: the budgeted memory pool
// every tensor on that device is allocated from, the compute stream, a cuBLAS handle on it, and
// the IO stream on which mini-batches are assembled (blocks, feature gathers) while the compute
// stream trains the previous one.
//
// One context per device for the whole process, created on first use; its budget belongs to a
// run, not to the process. A run (train, predict, bench train) holds a DeviceBudgetLease
// (engine/devices.hpp) on each GPU it uses: the lease charges the pool against the run's
// --gpu-mem-budget (or nothing, without one) and gives the device back, unbudgeted, when the run
// ends. One run holds a GPU at a time: a second run that overlaps it on the same GPU is refused
// with a ResourceError naming the holder (sharing the device under the sum of both budgets would
// let each run size itself by room the other is using). Work outside any run (tests, tools) uses
// the device unbudgeted. Only built with GALE_WITH_CUDA.
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
  // A run's budget: what the pool holds live now (cuBLAS's workspace, tensors of work outside any
  // run) counts against it, and when that alone passes it the run is refused (ResourceError
  // naming --gpu-mem-budget) with the budget unchanged. budget_text is what the user wrote ("8G"),
  // for messages. DeviceBudgetLease calls these, one lease at a time per device.
  void begin_budget(uint64_t bytes, const std::string& budget_text);
  // Back to no budget once the run's work has finished, with the pool's unused memory returned to
  // the driver. Never throws (a failure only leaves memory mapped).
  void end_budget() noexcept;

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
