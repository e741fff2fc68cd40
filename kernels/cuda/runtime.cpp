// kernels/cuda/runtime.cpp — device discovery, RAII wrappers and the per-device memory pool.
// Host-only code: compiled as C++ against the CUDA runtime, no nvcc needed.
#include "kernels/cuda/runtime.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gale::kernels::cuda {

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    // No driver or no GPU (cudaErrorNoDevice, cudaErrorInsufficientDriver): a CPU-only machine.
    // Clear the error so a later check does not report it for an unrelated call.
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

void request_eager_module_loading() {
  ::setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);  // the user's own value stands
}

std::string module_loading() {
  static const std::string mode = [] {  // fixed once the driver has started
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &entry, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess || entry == nullptr) {
      (void)cudaGetLastError();
      return std::string();
    }
    int loading = 0;  // CUmoduleLoadingMode: 1 eager, 2 lazy (cuda.h, not included: Gale links no libcuda)
    if (reinterpret_cast<int (*)(int*)>(entry)(&loading) != 0) return std::string();
    return std::string(loading == 1 ? "eager" : loading == 2 ? "lazy" : "");
  }();
  return mode;
}

void require_device(int ordinal) {
  const int count = device_count();
  if (ordinal < 0 || ordinal >= count) {
    throw DeviceError("no CUDA device " + std::to_string(ordinal) + " (found " +
                      std::to_string(count) + ")");
  }
}

DeviceInfo device_info(int ordinal) {
  require_device(ordinal);
  cudaDeviceProp prop{};
  GALE_CHECK_CUDA(cudaGetDeviceProperties(&prop, ordinal));
  DeviceInfo info;
  info.name = prop.name;
  info.total_memory = prop.totalGlobalMem;
  info.multiprocessors = prop.multiProcessorCount;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.l2_cache_bytes = prop.l2CacheSize;
  return info;
}

int current_multiprocessors() {
  int device = 0, sms = 0;
  GALE_CHECK_CUDA(cudaGetDevice(&device));
  GALE_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// --- DeviceGuard ---------------------------------------------------------------------------------

DeviceGuard::DeviceGuard(int ordinal) {
  require_device(ordinal);
  int current = 0;
  GALE_CHECK_CUDA(cudaGetDevice(&current));
  if (current != ordinal) {
    GALE_CHECK_CUDA(cudaSetDevice(ordinal));
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

// --- Stream --------------------------------------------------------------------------------------

Stream::Stream(int device, Priority priority) : device_(device) {
  DeviceGuard guard(device);  // a stream belongs to the device current at its creation
  if (priority == Priority::kNormal) {
    GALE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return;
  }
  int least = 0, greatest = 0;
  GALE_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  GALE_CHECK_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
}

Stream::~Stream() { reset(); }

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void Stream::reset() noexcept {
  // cudaStreamDestroy returns at once; work already enqueued still completes.
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

void Stream::wait(const Event& event) const {
  GALE_CHECK_CUDA(cudaStreamWaitEvent(stream_, event.get(), 0));
}

void Stream::synchronize() const { GALE_CHECK_CUDA(cudaStreamSynchronize(stream_)); }

void Stream::synchronize_unchecked() const noexcept {
  if (cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
}

// --- Event ---------------------------------------------------------------------------------------

Event::Event(int device, Timing timing) : device_(device) {
  DeviceGuard guard(device);
  const unsigned flags = timing == Timing::kEnabled ? cudaEventDefault : cudaEventDisableTiming;
  GALE_CHECK_CUDA(cudaEventCreateWithFlags(&event_, flags));
}

Event::~Event() { reset(); }

Event::Event(Event&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void Event::reset() noexcept {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
  event_ = nullptr;
}

void Event::record(cudaStream_t stream) { GALE_CHECK_CUDA(cudaEventRecord(event_, stream)); }

bool Event::ready() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  GALE_CHECK_CUDA(status);
  return true;
}

void Event::synchronize() const { GALE_CHECK_CUDA(cudaEventSynchronize(event_)); }

void Event::synchronize_unchecked() const noexcept {
  if (cudaEventSynchronize(event_) != cudaSuccess) (void)cudaGetLastError();
}

float elapsed_ms(const Event& start, const Event& end) {
  end.synchronize();  // cudaEventElapsedTime answers cudaErrorNotReady until `end` has completed
  float ms = 0.0f;
  GALE_CHECK_CUDA(cudaEventElapsedTime(&ms, start.get(), end.get()));
  return ms;
}

// --- MemoryPool ----------------------------------------------------------------------------------

namespace {

// Devices that have a live MemoryPool. Two pools on one device would each honour their own
// budget and together exceed the user's, so a second one is a bug.
std::mutex pool_devices_mutex;
std::set<int> pool_devices;

void claim_pool_device(int device) {
  std::lock_guard<std::mutex> lock(pool_devices_mutex);
  if (!pool_devices.insert(device).second) {
    throw InternalError("a MemoryPool for cuda:" + std::to_string(device) +
                        " already exists; share it so one budget governs the device");
  }
}

void release_pool_device(int device) noexcept {
  std::lock_guard<std::mutex> lock(pool_devices_mutex);
  pool_devices.erase(device);
}

}  // namespace

// Kept blocks by stream. A stream takes its own kept blocks at once (its later work runs after the
// free). Another registered stream takes one only once the free has finished on the GPU: blocks
// are kept in generations, and an event recorded after a generation's frees ("sealing" it) tells
// when every free of that generation has passed, with no dependency between the streams (the IO
// stream takes the blocks of tensors freed on the compute stream two steps ago, a sampling stream
// those of blocks the IO stream has finished with).
struct MemoryPool::Cache {
  struct Kept {
    void* ptr;
    uint64_t generation;
  };
  struct PerStream {
    std::unordered_map<size_t, std::deque<Kept>> kept;  // by class, oldest first
    uint64_t generation = 0;  // of the blocks kept from now on
    uint64_t unsealed = 0;    // blocks kept in this generation
    uint64_t completed = 0;   // the generations below it have finished on the stream
    std::deque<std::pair<uint64_t, cudaEvent_t>> sealed;  // oldest first
    std::vector<cudaEvent_t> spare;
  };
  static constexpr size_t kMaxSealed = 4;
  std::mutex mutex;
  std::atomic<bool> active{false};  // some stream is registered: classes and the map are in use
  std::unordered_map<cudaStream_t, PerStream> streams;
  std::unordered_map<void*, size_t> classed;  // live blocks allocated in a class, and the class
  std::atomic<uint64_t> cached{0};            // bytes kept
  uint64_t limit = 0;
  std::atomic<uint64_t> allocations{0}, reused{0};

  // Advances `ps.completed` past the sealed generations that have finished.
  static void refresh(PerStream& ps) {
    while (!ps.sealed.empty()) {
      const cudaError_t status = cudaEventQuery(ps.sealed.front().second);
      if (status == cudaErrorNotReady) return;
      if (status != cudaSuccess) {
        (void)cudaGetLastError();  // a sticky error: the next checked call reports it
        return;
      }
      ps.completed = ps.sealed.front().first + 1;
      ps.spare.push_back(ps.sealed.front().second);
      ps.sealed.pop_front();
    }
  }

  // Records an event after the blocks kept so far on `stream`; false when it cannot.
  static bool seal(PerStream& ps, cudaStream_t stream, int device) {
    if (ps.unsealed == 0 || ps.sealed.size() >= kMaxSealed) return false;
    cudaEvent_t event = nullptr;
    if (!ps.spare.empty()) {
      event = ps.spare.back();
      ps.spare.pop_back();
    } else {
      try {
        DeviceGuard guard(device);  // an event belongs to the device current at its creation
        if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
          (void)cudaGetLastError();
          return false;
        }
      } catch (const std::exception&) {
        return false;  // kept blocks only wait longer; the allocation goes on without them
      }
    }
    if (cudaEventRecord(event, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      ps.spare.push_back(event);
      return false;
    }
    ps.sealed.emplace_back(ps.generation, event);
    ++ps.generation;
    ps.unsealed = 0;
    return true;
  }

  // A kept block of class `cls` for `stream` (registered), or null. Under the mutex.
  void* take(cudaStream_t stream, size_t cls, int device) {
    PerStream& own = streams.at(stream);
    if (auto it = own.kept.find(cls); it != own.kept.end() && !it->second.empty()) {
      void* ptr = it->second.back().ptr;
      it->second.pop_back();
      return ptr;
    }
    for (auto& [other, ps] : streams) {
      if (other == stream) continue;
      auto it = ps.kept.find(cls);
      if (it == ps.kept.end() || it->second.empty()) continue;
      if (it->second.front().generation >= ps.completed) refresh(ps);
      if (it->second.front().generation < ps.completed) {
        void* ptr = it->second.front().ptr;
        it->second.pop_front();
        return ptr;
      }
      seal(ps, other, device);  // so that its blocks become free for this stream soon
    }
    return nullptr;
  }

  void destroy_events(PerStream& ps) noexcept {
    for (auto& [gen, event] : ps.sealed) (void)cudaEventDestroy(event);
    for (cudaEvent_t event : ps.spare) (void)cudaEventDestroy(event);
    ps.sealed.clear();
    ps.spare.clear();
  }
};

namespace {

// The class a block of `bytes` is allocated in on a caching stream: 256 bytes at least, otherwise
// rounded up to an eighth of the power of two below it (at most 12.5% more).
size_t size_class(size_t bytes) {
  if (bytes <= 256) return 256;
  const size_t floor_pow2 = size_t{1} << (63 - __builtin_clzll(static_cast<unsigned long long>(bytes)));
  const size_t step = std::max<size_t>(256, floor_pow2 / 8);
  return (bytes + step - 1) / step * step;
}

// What a pool keeps of blocks freed on caching streams: a quarter of the budget, 2 GiB at most.
uint64_t kept_limit(uint64_t budget_bytes) {
  return std::min<uint64_t>(uint64_t{2} << 30, budget_bytes == MemoryBudget::kUnlimited ? ~uint64_t{0} : budget_bytes / 4);
}

}  // namespace

MemoryPool::MemoryPool(int device, uint64_t budget_bytes, std::string budget_text)
    : device_(device),
      budget_(budget_bytes, "--gpu-mem-budget", std::move(budget_text)),
      cache_(std::make_unique<Cache>()) {
  require_device(device);
  claim_pool_device(device);
  cache_->limit = kept_limit(budget_bytes);
  try {
    // A pool of our own rather than the device's default pool: its release threshold and trims
    // then cannot disturb other libraries that use cudaMallocAsync on the default pool.
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    GALE_CHECK_CUDA(cudaMemPoolCreate(&pool_, &props));
    // With the default threshold of 0 the pool hands all free memory back to the driver at every
    // stream synchronisation, and the next batch pays for mapping it again. Keeping up to the
    // budget cached makes steady-state training allocate without driver calls.
    uint64_t threshold = budget_bytes;  // the attribute is a cuuint64_t, i.e. uint64_t
    GALE_CHECK_CUDA(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
  } catch (...) {
    if (pool_ != nullptr) (void)cudaMemPoolDestroy(pool_);
    release_pool_device(device);
    throw;
  }
}

MemoryPool::~MemoryPool() {
  // Blocks still kept belong to streams that were never unregistered (and may be gone): freed
  // synchronously, so the pool does not stay alive for them.
  for (auto& [stream, ps] : cache_->streams) {
    for (auto& [cls, blocks] : ps.kept)
      for (const Cache::Kept& k : blocks) (void)cudaFree(k.ptr);
    cache_->destroy_events(ps);
  }
  (void)cudaGetLastError();
  // Allocations still pending a stream-ordered free keep the pool alive inside the driver until
  // they complete; the destroy itself returns at once.
  (void)cudaMemPoolDestroy(pool_);
  release_pool_device(device_);
}

void* MemoryPool::allocate(size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  Cache& c = *cache_;
  c.allocations.fetch_add(1, std::memory_order_relaxed);
  bool classed = false;
  if (c.active.load(std::memory_order_acquire) && bytes <= kMaxCachedBlock) {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.streams.count(stream) != 0) {
      classed = true;
      bytes = size_class(bytes);
      budget_.charge(bytes);  // throws with every block still kept
      if (void* ptr = c.take(stream, bytes, device_)) {
        c.cached.fetch_sub(bytes, std::memory_order_relaxed);
        c.classed.emplace(ptr, bytes);
        c.reused.fetch_add(1, std::memory_order_relaxed);
        return ptr;
      }
      budget_.release(bytes);
    }
  }
  // Kept blocks give way to live ones: the budget bounds both together.
  if (c.cached.load(std::memory_order_relaxed) != 0 && !budget_.unlimited() &&
      budget_.in_use() + c.cached.load(std::memory_order_relaxed) + bytes > budget_.limit())
    release_cached(nullptr);
  budget_.charge(bytes);  // throws before the device is touched
  void* ptr = nullptr;
  cudaError_t status = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream);
  if (status == cudaErrorMemoryAllocation && c.cached.load(std::memory_order_relaxed) != 0) {
    (void)cudaGetLastError();
    release_cached(nullptr);
    status = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream);
  }
  if (status != cudaSuccess) {
    budget_.release(bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      // Within the budget but not on the device: the run is larger than the GPU, or other
      // processes (or NCCL, cuBLAS) hold what the budget counted on. Say what the device has.
      size_t free_bytes = 0, total_bytes = 0;
      std::string device_has;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        device_has = ", " + format_bytes(free_bytes) + " free of the device's " +
                     format_bytes(total_bytes);
      }
      (void)cudaGetLastError();
      throw ResourceError("cuda:" + std::to_string(device_) + " out of memory: allocating " +
                          format_bytes(bytes) + " with " + format_bytes(budget_.in_use()) + " in use" + device_has +
                          ": the run needs more GPU memory than is free");
    }
    throw_cuda_error(status, "cudaMallocFromPoolAsync(...)", __FILE__, __LINE__);
  }
  if (classed) {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.classed.emplace(ptr, bytes);
  }
  return ptr;
}

void MemoryPool::deallocate(void* ptr, size_t bytes, cudaStream_t stream) noexcept {
  if (ptr == nullptr) return;
  Cache& c = *cache_;
  if (c.active.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> lock(c.mutex);
    if (auto it = c.classed.find(ptr); it != c.classed.end()) {
      bytes = it->second;  // what was charged
      c.classed.erase(it);
      budget_.release(bytes);
      auto s = c.streams.find(stream);
      if (s != c.streams.end() && c.cached.load(std::memory_order_relaxed) + bytes <= c.limit) {
        Cache::PerStream& ps = s->second;
        ps.kept[bytes].push_back({ptr, ps.generation});  // the stream's later work runs after this free
        ++ps.unsealed;
        c.cached.fetch_add(bytes, std::memory_order_relaxed);
        return;
      }
      lock.unlock();
      if (cudaFreeAsync(ptr, stream) != cudaSuccess) (void)cudaGetLastError();
      return;
    }
  }
  // Called from destructors, so a failure cannot be thrown; it can only follow an earlier,
  // sticky device error that the next checked call reports anyway.
  if (cudaFreeAsync(ptr, stream) != cudaSuccess) (void)cudaGetLastError();
  budget_.release(bytes);
}

void MemoryPool::set_budget(uint64_t budget_bytes, std::string budget_text) {
  release_cached(nullptr);  // what was kept under the old budget may not fit the new one
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    cache_->limit = kept_limit(budget_bytes);
  }
  budget_.set_limit(budget_bytes, std::move(budget_text));
  budget_.reset_peak();
  uint64_t threshold = budget_bytes;  // as in the constructor: keep up to the budget mapped
  GALE_CHECK_CUDA(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
}

void MemoryPool::cache_frees_on(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(cache_->mutex);
  cache_->streams.try_emplace(stream);
  cache_->active.store(true, std::memory_order_release);
}

void MemoryPool::stop_caching(cudaStream_t stream) noexcept {
  release_cached(stream);
  std::lock_guard<std::mutex> lock(cache_->mutex);
  if (auto it = cache_->streams.find(stream); it != cache_->streams.end()) {
    cache_->destroy_events(it->second);
    cache_->streams.erase(it);
  }
}

void MemoryPool::release_cached(cudaStream_t stream) noexcept {
  std::vector<std::pair<cudaStream_t, void*>> blocks;
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    for (auto& [s, ps] : cache_->streams) {
      if (stream != nullptr && s != stream) continue;
      for (auto& [cls, list] : ps.kept) {
        for (const Cache::Kept& k : list) blocks.emplace_back(s, k.ptr);
        cache_->cached.fetch_sub(cls * list.size(), std::memory_order_relaxed);
        list.clear();
      }
      ps.unsealed = 0;
    }
  }
  for (auto [s, p] : blocks)
    if (cudaFreeAsync(p, s) != cudaSuccess) (void)cudaGetLastError();
}

MemoryPool::Counts MemoryPool::counts() const noexcept {
  return {cache_->allocations.load(std::memory_order_relaxed), cache_->reused.load(std::memory_order_relaxed)};
}

uint64_t MemoryPool::cached_bytes() const noexcept { return cache_->cached.load(std::memory_order_relaxed); }

uint64_t MemoryPool::reserved() const {
  uint64_t bytes = 0;
  GALE_CHECK_CUDA(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &bytes));
  return bytes;
}

void MemoryPool::trim(uint64_t keep_bytes) {
  release_cached(nullptr);
  GALE_CHECK_CUDA(cudaMemPoolTrimTo(pool_, keep_bytes));
}

// --- CublasHandle --------------------------------------------------------------------------------

CublasHandle::CublasHandle(const Stream& stream, MemoryPool& pool, size_t workspace_bytes)
    : stream_(stream.get()), pool_(&pool), workspace_bytes_(workspace_bytes) {
  GALE_ASSERT(pool.device() == stream.device());
  DeviceGuard guard(stream.device());  // a handle belongs to the device current at its creation
  GALE_CHECK_CUBLAS(cublasCreate(&handle_));
  try {
    // cublasSetStream resets the workspace to cuBLAS's own, so the stream is set first.
    GALE_CHECK_CUBLAS(cublasSetStream(handle_, stream_));
    workspace_ = pool.allocate(workspace_bytes, stream_);
    GALE_CHECK_CUBLAS(cublasSetWorkspace(handle_, workspace_, workspace_bytes));
  } catch (...) {
    reset();
    throw;
  }
}

CublasHandle::~CublasHandle() { reset(); }

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      stream_(other.stream_),
      pool_(other.pool_),
      workspace_(std::exchange(other.workspace_, nullptr)),
      workspace_bytes_(other.workspace_bytes_) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    reset();
    handle_ = std::exchange(other.handle_, nullptr);
    stream_ = other.stream_;
    pool_ = other.pool_;
    workspace_ = std::exchange(other.workspace_, nullptr);
    workspace_bytes_ = other.workspace_bytes_;
  }
  return *this;
}

void CublasHandle::reset() noexcept {
  // cublasDestroy waits for the handle's work, so the workspace is idle when it is freed.
  if (handle_ != nullptr) (void)cublasDestroy(handle_);
  handle_ = nullptr;
  if (workspace_ != nullptr) pool_->deallocate(workspace_, workspace_bytes_, stream_);
  workspace_ = nullptr;
}

// --- copies --------------------------------------------------------------------------------------

void copy_bytes(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                cudaStream_t stream) {
  if (bytes == 0) return;
  GALE_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream));
}

void copy_rows_on_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows,
                         cudaStream_t stream) {
  if (rows == 0 || row_bytes == 0) return;
  GALE_CHECK_CUDA(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace gale::kernels::cuda
