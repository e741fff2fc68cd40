#include "engine/device_context.hpp"

#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

#include "kernels/error.hpp"

namespace gale::engine {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<int, std::unique_ptr<DeviceContext>> contexts;
  // Every op asks for its device's context: once created, a context is found here without the
  // lock (worker threads of several GPUs would otherwise contend for it thousands of times a step).
  static constexpr int kFast = 64;
  std::array<std::atomic<DeviceContext*>, kFast> fast{};
};

// Never destroyed: freeing pools and handles during static destruction races the CUDA runtime's
// own teardown; the driver reclaims everything when the process exits.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

kernels::cuda::Stream::Priority compute_priority() {
  static const bool equal = std::getenv("GALE_EQUAL_STREAMS") != nullptr;
  return equal ? kernels::cuda::Stream::Priority::kNormal : kernels::cuda::Stream::Priority::kHigh;
}

DeviceContext::DeviceContext(int ordinal, uint64_t budget, const std::string& budget_text) : device_(ordinal) {
  kernels::cuda::require_device(ordinal);
  // GALE_SYNC=block|yield: how a host thread waits for the device (CUDA's default spins while
  // there are cores to spare), for measuring what spinning waiters cost the other threads.
  if (const char* sync = std::getenv("GALE_SYNC")) {
    const std::string mode = sync;
    const unsigned flags = mode == "block" ? cudaDeviceScheduleBlockingSync : mode == "yield" ? cudaDeviceScheduleYield : 0u;
    if (flags != 0) {
      kernels::cuda::DeviceGuard guard(ordinal);
      GALE_CHECK_CUDA(cudaSetDeviceFlags(flags));
    }
  }
  pool_ = std::make_unique<kernels::cuda::MemoryPool>(ordinal, budget, budget_text);
  // The training step's stream goes first where its kernels and the sampler's or the feature
  // loads' wait for the same SMs: they run ahead of the step (prefetch), the step is the critical
  // path, and with several GPUs every step waits for the slowest one's gradients.
  // GALE_EQUAL_STREAMS=1 gives every stream one priority, for measuring what this buys.
  stream_ = std::make_unique<kernels::cuda::Stream>(ordinal, compute_priority());
  io_stream_ = std::make_unique<kernels::cuda::Stream>(ordinal);
  // A training step allocates and frees about a hundred tensors on these two streams: kept blocks
  // spare the driver's allocator calls, which worker threads of several GPUs contend for.
  if (std::getenv("GALE_NO_BLOCK_CACHE") == nullptr) {
    pool_->cache_frees_on(*stream_);
    pool_->cache_frees_on(*io_stream_);
  }
  blas_ = std::make_unique<kernels::cuda::CublasHandle>(*stream_, *pool_);
  io_done_ = std::make_unique<kernels::cuda::Event>(ordinal);
}

DeviceContext::~DeviceContext() {
  blas_.reset();  // its workspace is kept on the compute stream
  pool_->stop_caching(*stream_);
  pool_->stop_caching(*io_stream_);
}

void DeviceContext::order_compute_after_io() {
  // A wait takes the event's state when it is enqueued, so one event serves every call; the lock
  // keeps another thread's record from landing between this record and its wait.
  std::lock_guard<std::mutex> lock(io_mutex_);
  io_done_->record(*io_stream_);
  stream_->wait(*io_done_);
}

DeviceContext& DeviceContext::get(int ordinal) {
  Registry& r = registry();
  const bool fast = ordinal >= 0 && ordinal < Registry::kFast;
  if (fast) {
    if (DeviceContext* ctx = r.fast[static_cast<size_t>(ordinal)].load(std::memory_order_acquire)) return *ctx;
  }
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.contexts.find(ordinal);
  if (it != r.contexts.end()) return *it->second;
  // Unbudgeted until a run leases the device (begin_budget).
  auto ctx = std::make_unique<DeviceContext>(ordinal, kernels::cuda::MemoryBudget::kUnlimited, std::string());
  DeviceContext& ref = *ctx;
  r.contexts[ordinal] = std::move(ctx);
  if (fast) r.fast[static_cast<size_t>(ordinal)].store(&ref, std::memory_order_release);
  return ref;
}

void DeviceContext::begin_budget(uint64_t bytes, const std::string& budget_text) {
  kernels::cuda::MemoryPool& pool = *pool_;
  const uint64_t live = pool.in_use();
  if (live > bytes)
    throw ResourceError("--gpu-mem-budget " + (budget_text.empty() ? kernels::cuda::format_bytes(bytes) : budget_text) +
                        " exceeded: cuda:" + std::to_string(device_) + " holds " +
                        kernels::cuda::format_bytes(live) +
                        " before the run starts (cuBLAS's workspace and tensors still alive); give a larger budget");
  pool.set_budget(bytes, budget_text);
}

void DeviceContext::end_budget() noexcept {
  try {
    // The run's frees are stream-ordered: once both streams have drained, its memory is unused and
    // the trim hands it back (a later run, or another process, maps what it needs afresh).
    io_stream_->synchronize();
    stream_->synchronize();
    pool_->set_budget(kernels::cuda::MemoryBudget::kUnlimited);
    pool_->trim(0);
  } catch (const std::exception&) {
    // A sticky device error: the next checked call reports it. The budget may stay the run's.
  }
}

}  // namespace gale::engine
