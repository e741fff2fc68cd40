#include "engine/tensor.hpp"

#include <cstdlib>
#include <cstring>

#include "kernels/error.hpp"

namespace gale::engine {

// Host storage, 64-byte aligned so BLAS and vector loads see aligned rows.
struct Tensor::Storage {
  explicit Storage(size_t bytes) : size(bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    ptr = static_cast<unsigned char*>(rounded == 0 ? nullptr : std::aligned_alloc(64, rounded));
    if (rounded != 0 && ptr == nullptr)
      throw ResourceError("out of host memory allocating " + std::to_string(bytes) + " bytes");
  }
  ~Storage() { std::free(ptr); }
  unsigned char* ptr = nullptr;
  size_t size = 0;
};

unsigned char* Tensor::base() const { return storage_ ? storage_->ptr : nullptr; }

Tensor Tensor::empty(int64_t rows, int64_t cols, DType dtype, Device device) {
  if (!device.is_cpu())
    throw DeviceError("Tensor::empty: device " + device.name() + " is not available in this build");
  GALE_ASSERT(rows >= 0 && cols >= 0);
  Tensor t;
  t.rows_ = rows;
  t.cols_ = cols;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(rows * cols) * dtype_size(dtype));
  return t;
}

Tensor Tensor::zeros(int64_t rows, int64_t cols, DType dtype, Device device) {
  Tensor t = empty(rows, cols, dtype, device);
  if (t.nbytes() > 0) std::memset(t.base(), 0, t.nbytes());
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

Tensor Tensor::rows_slice(int64_t begin, int64_t end) const {
  GALE_ASSERT(0 <= begin && begin <= end && end <= rows_);
  Tensor t = *this;
  t.offset_ = offset_ + static_cast<size_t>(begin * cols_) * dtype_size(dtype_);
  t.rows_ = end - begin;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(rows_, cols_, dtype_, device_);
  if (nbytes() > 0) std::memcpy(t.base(), base() + offset_, nbytes());
  return t;
}

void Tensor::fill(float value) {
  float* p = f32();
  for (int64_t i = 0; i < numel(); ++i) p[i] = value;
}

std::vector<float> Tensor::to_vector() const {
  GALE_ASSERT(dtype_ == DType::kF32);
  return std::vector<float>(f32(), f32() + numel());
}

}  // namespace gale::engine
