// kernels/cuda/runtime.hpp — the CUDA device runtime every GPU component builds on.
//
// Offers: device discovery (device_count, require_device, device_info), DeviceGuard (make a device
// current for a scope), RAII Stream, Event and CublasHandle, the per-device MemoryPool that charges
// every allocation against the `--gpu-mem-budget`, and stream-ordered copies. Owning buffers sit in
// buffer.hpp, the error macros in check.hpp.
//
// Conventions: every op takes a cudaStream_t (Stream converts implicitly) and never blocks the
// host unless its name says so (synchronize, *_and_wait, elapsed_ms). Objects are created for an
// explicit device ordinal and do not depend on the caller's current device. Lifetimes: a pool
// outlives its buffers and handles; a stream outlives the buffers and handles bound to it (they
// free their memory on it).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cuda/budget.hpp"
#include "kernels/cuda/check.hpp"

namespace gale::kernels::cuda {

// Number of CUDA devices; 0 when there is no GPU or no driver. Never throws.
int device_count() noexcept;

// Throws DeviceError "no CUDA device N (found M)" unless `ordinal` names a present device.
void require_device(int ordinal);

// How the CUDA driver loads the kernels of Gale and of its libraries (cuBLAS, cuSPARSE, NCCL):
// lazily, each one at its first launch (CUDA's default), or eagerly, all of them when a GPU's
// context is made. Eager loading costs about 2 s of start-up and 0.45 GiB of each GPU's memory
// (outside the pool's budget), and makes a data-parallel epoch on 2 H200s about 1% shorter, in one
// process and as processes; a run on one GPU gains nothing (docs/performance.md, twentieth
// session). The driver reads CUDA_MODULE_LOADING once, when the process's first CUDA call starts
// it: request_eager_module_loading sets it to EAGER, unless the user set it, and must come before
// the process's first CUDA call (later it changes nothing).
void request_eager_module_loading();
// "eager" or "lazy" as the driver loads (starting it if it has not started); "" without a driver.
std::string module_loading();

struct DeviceInfo {
  std::string name;             // "NVIDIA H100 80GB HBM3"
  uint64_t total_memory = 0;    // bytes
  int multiprocessors = 0;      // SM count, for sizing persistent grids
  int compute_major = 0;        // 9 on Hopper
  int compute_minor = 0;
  int64_t l2_cache_bytes = 0;   // 50 MiB on an H100
};
DeviceInfo device_info(int ordinal);

// SM count of the calling thread's current device, for sizing a launch's grid (one attribute
// query, cheap enough per launch, unlike device_info's full property read).
int current_multiprocessors();

// Makes `ordinal` the calling thread's current device for a scope, then restores the previous one.
// Kernel launches, stream and event creation act on the current device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class Event;

// An owned, non-blocking stream: it never serialises with the legacy default stream, which other
// libraries may use, so Gale's copies and kernels overlap with theirs.
class Stream {
 public:
  // kHigh: the device's greatest priority, whose waiting blocks the scheduler starts before those
  // of normal streams (running blocks are never preempted).
  enum class Priority { kNormal, kHigh };
  explicit Stream(int device, Priority priority = Priority::kNormal);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const noexcept { return stream_; }
  operator cudaStream_t() const noexcept { return stream_; }  // NOLINT: ops take cudaStream_t
  int device() const noexcept { return device_; }

  // Work enqueued on this stream after the call waits until `event` has completed; the host does
  // not wait. This is how a buffer produced on one stream is handed to another.
  void wait(const Event& event) const;
  // Blocks the host until all work on this stream has finished.
  void synchronize() const;
  // The same for destructors: an error (the device failing already, which whoever meets it first
  // reports) is cleared, not thrown, so unwinding from that failure never ends in std::terminate.
  void synchronize_unchecked() const noexcept;

 private:
  void reset() noexcept;

  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

// An owned event. Sync-only events (the default) skip timestamping and are cheaper to record.
class Event {
 public:
  enum class Timing { kDisabled, kEnabled };

  explicit Event(int device, Timing timing = Timing::kDisabled);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const noexcept { return event_; }
  int device() const noexcept { return device_; }

  // Captures the work enqueued on `stream` so far.
  void record(cudaStream_t stream);
  // True when the captured work has finished; never blocks.
  bool ready() const;
  // Blocks the host until the captured work has finished.
  void synchronize() const;
  // The same for destructors (as Stream::synchronize_unchecked).
  void synchronize_unchecked() const noexcept;

 private:
  void reset() noexcept;

  cudaEvent_t event_ = nullptr;
  int device_ = -1;
};

// Milliseconds of GPU time between two recorded timing events; waits for `end` to complete.
float elapsed_ms(const Event& start, const Event& end);

// One device's stream-ordered memory pool (cudaMemPoolCreate + cudaMallocFromPoolAsync), charged
// against one budget. At most one pool exists per device at a time, so one budget governs every
// byte Gale puts on a GPU: storage tiers, samplers and the engine all allocate through it.
//
// Freed memory stays cached in the pool (release threshold = the budget) and is reused by later
// allocations without a driver call, also across stream synchronisations. The budget counts
// the bytes of live allocations: a free returns its bytes when it is enqueued, the pool reuses
// the memory once the stream reaches the free.
class MemoryPool {
 public:
  // budget_text: the budget as the user wrote it ("8G"), for messages.
  explicit MemoryPool(int device, uint64_t budget_bytes = MemoryBudget::kUnlimited,
                      std::string budget_text = {});
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // Stream-ordered allocation usable by work on `stream` (and on streams ordered after it).
  // Throws ResourceError, before touching the device, when the budget would be exceeded, and
  // ResourceError when the device itself runs out. 0 bytes gives nullptr.
  void* allocate(size_t bytes, cudaStream_t stream);
  // Frees once `stream` reaches this point; `bytes` is what was allocated. Never throws.
  void deallocate(void* ptr, size_t bytes, cudaStream_t stream) noexcept;

  // Charges what is allocated from now on against `budget_bytes` (kUnlimited: no cap): hands the
  // kept blocks back, resizes what may be kept (a quarter of the budget) and the pool's release
  // threshold, and starts a new peak. Bytes in use stay charged and count against the new budget.
  // For a new run on a device whose pool outlives runs (engine/device_context.hpp); not meant to
  // race allocations.
  void set_budget(uint64_t budget_bytes, std::string budget_text = {});

  int device() const noexcept { return device_; }
  cudaMemPool_t get() const noexcept { return pool_; }
  const MemoryBudget& budget() const noexcept { return budget_; }
  uint64_t in_use() const noexcept { return budget_.in_use(); }
  uint64_t peak() const noexcept { return budget_.peak(); }
  void reset_peak() noexcept { budget_.reset_peak(); }
  // Bytes the pool holds from the driver: in use plus cached free memory.
  uint64_t reserved() const;
  // Returns cached free memory beyond `keep_bytes` to the driver (e.g. before NCCL or cuBLAS
  // allocate outside the pool); blocks kept by cache_frees_on go back to the pool first.
  void trim(uint64_t keep_bytes = 0);

  // Keeps blocks freed on `stream` for later allocations, without a driver call either way. A
  // training step allocates and frees about a hundred tensors, and cudaMallocFromPoolAsync and
  // cudaFreeAsync take a lock that every thread of the process shares: with one worker thread per
  // GPU each call costs about twice what it costs alone (2 H200s: 0.6 -> 1.3 us). Blocks up to
  // kMaxCachedBlock are allocated on such a stream in size classes (an eighth of a power of two
  // apart, so at most 12.5% larger; the budget is charged the class) and kept when freed on one.
  // The stream itself reuses them at once; another caching stream once the free has finished on
  // the GPU (an event after each generation of frees tells), so no stream ever waits for another.
  // The pool keeps at most a quarter of the budget (and 2 GiB) so, and hands it all back whenever
  // an allocation would otherwise pass the budget, and on trim(). The stream must outlive the
  // registration: stop_caching(stream) returns its blocks before it is destroyed.
  static constexpr size_t kMaxCachedBlock = size_t{64} << 20;
  void cache_frees_on(cudaStream_t stream);
  void stop_caching(cudaStream_t stream) noexcept;
  // Allocation calls so far, and how many of them a kept block served.
  struct Counts {
    uint64_t allocations = 0;
    uint64_t reused = 0;
  };
  Counts counts() const noexcept;
  uint64_t cached_bytes() const noexcept;

 private:
  struct Cache;
  // Frees the kept blocks of `stream` (every stream when null) to the pool. Never throws.
  void release_cached(cudaStream_t stream) noexcept;

  int device_;
  cudaMemPool_t pool_ = nullptr;
  MemoryBudget budget_;
  std::unique_ptr<Cache> cache_;
};

// A cuBLAS handle bound to one stream for its whole life. Its workspace comes from the pool, so
// it is charged to the budget like every other byte (cuBLAS would otherwise cudaMalloc its own).
class CublasHandle {
 public:
  // 32 MiB is the workspace cuBLAS recommends on Hopper (4 MiB suffices on older GPUs).
  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  CublasHandle(const Stream& stream, MemoryPool& pool,
               size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CublasHandle();
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const noexcept { return handle_; }
  operator cublasHandle_t() const noexcept { return handle_; }  // NOLINT: cuBLAS calls take it
  cudaStream_t stream() const noexcept { return stream_; }
  // The handle's workspace, for cuBLASLt calls on the same stream.
  void* workspace() const noexcept { return workspace_; }
  size_t workspace_bytes() const noexcept { return workspace_bytes_; }

 private:
  void reset() noexcept;

  cublasHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  MemoryPool* pool_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// Stream-ordered copy of `bytes`; direction given by `kind`. A pageable host source may be reused
// when the call returns (the driver stages it); a pinned host buffer must stay alive, and a host
// destination must not be read, until the stream reaches the copy.
void copy_bytes(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                cudaStream_t stream);

template <typename T>
void copy_to_device(T* dst, const T* src, size_t count, cudaStream_t stream) {
  copy_bytes(dst, src, count * sizeof(T), cudaMemcpyHostToDevice, stream);
}
template <typename T>
void copy_to_host(T* dst, const T* src, size_t count, cudaStream_t stream) {
  copy_bytes(dst, src, count * sizeof(T), cudaMemcpyDeviceToHost, stream);
}
template <typename T>
void copy_on_device(T* dst, const T* src, size_t count, cudaStream_t stream) {
  copy_bytes(dst, src, count * sizeof(T), cudaMemcpyDeviceToDevice, stream);
}

// Stream-ordered copy of `rows` rows of `row_bytes` between device buffers of different row
// pitches (cudaMemcpy2DAsync), e.g. a dense matrix into one whose rows are padded.
void copy_rows_on_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows,
                         cudaStream_t stream);

}  // namespace gale::kernels::cuda
