// kernels/cuda/runtime.cpp — device discovery, RAII wrappers and the per-device memory pool.
// Host-only code: compiled as C++ against the CUDA runtime, no nvcc needed.
#include "kernels/cuda/runtime.hpp"

#include <mutex>
#include <set>
#include <utility>

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

Stream::Stream(int device) : device_(device) {
  DeviceGuard guard(device);  // a stream belongs to the device current at its creation
  GALE_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
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

MemoryPool::MemoryPool(int device, uint64_t budget_bytes, std::string budget_text)
    : device_(device), budget_(budget_bytes, "--gpu-mem-budget", std::move(budget_text)) {
  require_device(device);
  claim_pool_device(device);
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
  // Allocations still pending a stream-ordered free keep the pool alive inside the driver until
  // they complete; the destroy itself returns at once.
  (void)cudaMemPoolDestroy(pool_);
  release_pool_device(device_);
}

void* MemoryPool::allocate(size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  budget_.charge(bytes);  // throws before the device is touched
  void* ptr = nullptr;
  const cudaError_t status = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream);
  if (status != cudaSuccess) {
    budget_.release(bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      // Within the budget but not on the device: the budget is larger than what is free (other
      // processes, NCCL, cuBLAS, or a GPU smaller than the budget).
      throw ResourceError("cuda:" + std::to_string(device_) + " out of memory: allocating " +
                          format_bytes(bytes) + " with " + format_bytes(budget_.in_use()) +
                          " in use; set --gpu-mem-budget below the GPU's free memory");
    }
    throw_cuda_error(status, "cudaMallocFromPoolAsync(...)", __FILE__, __LINE__);
  }
  return ptr;
}

void MemoryPool::deallocate(void* ptr, size_t bytes, cudaStream_t stream) noexcept {
  if (ptr == nullptr) return;
  // Called from destructors, so a failure cannot be thrown; it can only follow an earlier,
  // sticky device error that the next checked call reports anyway.
  if (cudaFreeAsync(ptr, stream) != cudaSuccess) (void)cudaGetLastError();
  budget_.release(bytes);
}

uint64_t MemoryPool::reserved() const {
  uint64_t bytes = 0;
  GALE_CHECK_CUDA(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &bytes));
  return bytes;
}

void MemoryPool::trim(uint64_t keep_bytes) {
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
