#include "engine/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/error.hpp"
#if GALE_WITH_CUDA
#include "engine/device_context.hpp"
#endif

namespace gale::engine {

// Host storage is 64-byte aligned so BLAS and vector loads see aligned rows; device storage
// comes from the device's budgeted pool, stream-ordered on its compute stream.
struct Tensor::Storage {
  Storage(size_t bytes, const Device& device, bool io = false) : size(bytes), device(device), io(io) {
    if (device.is_cpu()) {
      const size_t rounded = (bytes + 63) / 64 * 64;
      ptr = static_cast<unsigned char*>(rounded == 0 ? nullptr : std::aligned_alloc(64, rounded));
      if (rounded != 0 && ptr == nullptr)
        throw ResourceError("out of host memory allocating " + std::to_string(bytes) + " bytes");
      return;
    }
#if GALE_WITH_CUDA
    DeviceContext& ctx = DeviceContext::get(device.ordinal);
    ptr = static_cast<unsigned char*>(ctx.pool().allocate(bytes, io ? ctx.io_stream() : ctx.stream()));
#else
    throw DeviceError("device " + device.name() + ": this build has no CUDA backend");
#endif
  }
  ~Storage() {
    if (device.is_cpu()) {
      std::free(ptr);
      return;
    }
#if GALE_WITH_CUDA
    DeviceContext& ctx = DeviceContext::get(device.ordinal);
    if (io && ptr != nullptr) {
      // The IO stream may still be reading it (a later batch's match) and the compute stream may
      // be too: free it on the compute stream once the IO stream's work so far is done as well.
      try {
        ctx.order_compute_after_io();
      } catch (...) {
        // Never throw from a destructor (std::terminate): order the free the slow way, and where
        // even that wait fails the device is failing already, which the caller reports.
        ctx.io_stream().synchronize_unchecked();
      }
    }
    ctx.pool().deallocate(ptr, size, ctx.stream());
#endif
  }
  unsigned char* ptr = nullptr;
  size_t size = 0;
  Device device;
  bool io = false;
};

#if GALE_WITH_CUDA
namespace {
// Copies bytes between any two devices (host or CUDA), ordered on the CUDA side's compute stream;
// the host waits when the destination is host memory.
void copy_between(void* dst, const Device& to, const void* src, const Device& from, size_t bytes) {
  if (bytes == 0) return;
  if (to.is_cuda() && from.is_cuda() && to.ordinal != from.ordinal) {
    // Stream-ordered pool memory is reachable only from its own GPU (no pool grants its peers
    // access: the sums between GPUs are NCCL's), so a copy from one GPU to another, which nothing
    // on a hot path makes, goes through host memory.
    std::vector<unsigned char> host(bytes);
    copy_between(host.data(), Device::cpu(), src, from, bytes);
    copy_between(dst, to, host.data(), Device::cpu(), bytes);
    DeviceContext::get(to.ordinal).synchronize();  // `host` must outlive the copy
    return;
  }
  const Device& cuda = to.is_cuda() ? to : from;
  // The copy runs on that GPU's stream, which CUDA takes only while its GPU is current: the calling
  // thread's may be another (the main thread moving a tensor to GPU 1).
  const kernels::cuda::DeviceGuard guard(cuda.ordinal);
  DeviceContext& ctx = DeviceContext::get(cuda.ordinal);
  const cudaMemcpyKind kind = from.is_cpu() ? cudaMemcpyHostToDevice
                              : to.is_cpu() ? cudaMemcpyDeviceToHost
                                            : cudaMemcpyDeviceToDevice;
  kernels::cuda::copy_bytes(dst, src, bytes, kind, ctx.stream());
  if (to.is_cpu()) ctx.synchronize();
}
}  // namespace
#endif

unsigned char* Tensor::base() const { return storage_ ? storage_->ptr : nullptr; }

Tensor Tensor::allocate(int64_t rows, int64_t cols, DType dtype, Device device, bool io) {
  GALE_ASSERT(rows >= 0 && cols >= 0);
  Tensor t;
  t.rows_ = rows;
  t.cols_ = cols;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(rows * cols) * dtype_size(dtype), device, io);
  return t;
}

Tensor Tensor::empty(int64_t rows, int64_t cols, DType dtype, Device device) {
  return allocate(rows, cols, dtype, device, /*io=*/false);
}

Tensor Tensor::empty_io(int64_t rows, int64_t cols, DType dtype, Device device) {
  return allocate(rows, cols, dtype, device, /*io=*/!device.is_cpu());
}

Tensor Tensor::zeros(int64_t rows, int64_t cols, DType dtype, Device device) {
  Tensor t = empty(rows, cols, dtype, device);
  if (t.nbytes() == 0) return t;
  if (device.is_cpu()) {
    std::memset(t.base(), 0, t.nbytes());
  } else {
#if GALE_WITH_CUDA
    const kernels::cuda::DeviceGuard guard(device.ordinal);  // as copy_between
    DeviceContext& ctx = DeviceContext::get(device.ordinal);
    GALE_CHECK_CUDA(cudaMemsetAsync(t.base(), 0, t.nbytes(), ctx.stream()));
#endif
  }
  return t;
}

Tensor Tensor::to(const Device& device) const {
  if (device == device_) return *this;
  Tensor t = empty(rows_, cols_, dtype_, device);
#if GALE_WITH_CUDA
  copy_between(t.base(), device, base() + offset_, device_, nbytes());
#endif
  return t;
}

Tensor Tensor::from_host(const void* data, int64_t rows, int64_t cols, DType dtype, Device device) {
  Tensor t = empty(rows, cols, dtype, device);
  if (t.nbytes() == 0) return t;
  if (device.is_cpu()) {
    std::memcpy(t.base(), data, t.nbytes());
  } else {
#if GALE_WITH_CUDA
    copy_between(t.base(), device, data, Device::cpu(), t.nbytes());
#endif
  }
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, int64_t rows, int64_t cols) {
  GALE_ASSERT(static_cast<int64_t>(values.size()) == rows * cols);
  Tensor t = empty(rows, cols);
  if (!values.empty()) std::memcpy(t.f32(), values.data(), values.size() * sizeof(float));
  return t;
}

kernels::MatrixView Tensor::view() {
  GALE_ASSERT(dtype_ == DType::kF32);
  return {f32(), rows_, cols_, cols_};
}

kernels::ConstMatrixView Tensor::view() const {
  GALE_ASSERT(dtype_ == DType::kF32);
  return {f32(), rows_, cols_, cols_};
}

std::vector<Tensor> Tensor::packed_zeros(const std::vector<std::pair<int64_t, int64_t>>& shapes, DType dtype,
                                         Device device) {
  const auto aligned = [](size_t bytes) { return (bytes + kPackAlign - 1) / kPackAlign * kPackAlign; };
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const auto& [rows, cols] : shapes) {
    GALE_ASSERT(rows >= 0 && cols >= 0);
    offsets.push_back(total);
    total = aligned(total + static_cast<size_t>(rows * cols) * dtype_size(dtype));
  }
  const Tensor all = zeros(static_cast<int64_t>(total / dtype_size(dtype)), 1, dtype, device);
  std::vector<Tensor> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor t = all;
    t.offset_ = all.offset_ + offsets[i];
    t.rows_ = shapes[i].first;
    t.cols_ = shapes[i].second;
    out.push_back(std::move(t));
  }
  return out;
}

bool Tensor::packed_before(const Tensor& next) const {
  const size_t end = offset_ + nbytes();
  return defined() && storage_ == next.storage_ && dtype_ == next.dtype_ && offset_ % kPackAlign == 0 &&
         next.offset_ == (end + kPackAlign - 1) / kPackAlign * kPackAlign;
}

Tensor Tensor::packed_through(const Tensor& last) const {
  GALE_ASSERT(defined() && storage_ == last.storage_ && dtype_ == last.dtype_ && last.offset_ >= offset_);
  Tensor t = *this;
  t.rows_ = static_cast<int64_t>((last.offset_ + last.nbytes() - offset_) / dtype_size(dtype_));
  t.cols_ = 1;
  return t;
}

Tensor Tensor::rows_slice(int64_t begin, int64_t end) const {
  GALE_ASSERT(0 <= begin && begin <= end && end <= rows_);
  Tensor t = *this;
  t.offset_ = offset_ + static_cast<size_t>(begin * cols_) * dtype_size(dtype_);
  t.rows_ = end - begin;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(rows_, cols_, dtype_, device_);
  if (nbytes() == 0) return t;
  if (device_.is_cpu()) {
    std::memcpy(t.base(), base() + offset_, nbytes());
  } else {
#if GALE_WITH_CUDA
    copy_between(t.base(), device_, base() + offset_, device_, nbytes());
#endif
  }
  return t;
}

void Tensor::fill(float value) {
  if (device_.is_cpu()) {
    float* p = f32();
    for (int64_t i = 0; i < numel(); ++i) p[i] = value;
    return;
  }
#if GALE_WITH_CUDA
  // A pageable host source may be released once the copy is enqueued (the driver stages it).
  const std::vector<float> host(static_cast<size_t>(numel()), value);
  copy_between(base() + offset_, device_, host.data(), Device::cpu(), nbytes());
#endif
}

std::vector<float> Tensor::to_vector() const {
  GALE_ASSERT(dtype_ == DType::kF32);
  if (device_.is_cpu()) return std::vector<float>(f32(), f32() + numel());
  return to(Device::cpu()).to_vector();
}

}  // namespace gale::engine
