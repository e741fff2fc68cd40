// engine/tensor.hpp — a dense tensor: dtype, shape (rank <= 2), device, shared storage.
//
// No autograd: layers implement forward and backward explicitly. Copies share storage (like
// torch.Tensor); clone() deep-copies. Row slices are views over the same storage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/device.hpp"
#include "kernels/dtype.hpp"
#include "kernels/views.hpp"

namespace gale::engine {

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised rows x cols tensor (cols = 1 for vectors) on `device`.
  static Tensor empty(int64_t rows, int64_t cols, DType dtype = DType::kF32,
                      Device device = Device::cpu());
  static Tensor zeros(int64_t rows, int64_t cols, DType dtype = DType::kF32,
                      Device device = Device::cpu());
  // On a GPU, allocated in stream order on the device's IO stream (device_context.hpp), for work
  // enqueued there; the compute stream must wait for that work (an event) before it reads the
  // tensor. Freed safely whichever stream last used it: the free waits for both streams' work
  // enqueued before it. On the CPU the same as empty().
  static Tensor empty_io(int64_t rows, int64_t cols, DType dtype, Device device);
  // Copies host data into a new f32 tensor.
  static Tensor from_vector(const std::vector<float>& values, int64_t rows, int64_t cols);
  // Copies rows x cols elements of `dtype` from host memory into a new tensor on `device`.
  static Tensor from_host(const void* data, int64_t rows, int64_t cols, DType dtype, Device device);

  bool defined() const { return storage_ != nullptr; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t numel() const { return rows_ * cols_; }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  template <typename T> T* data() { return reinterpret_cast<T*>(base() + offset_); }
  template <typename T> const T* data() const { return reinterpret_cast<const T*>(base() + offset_); }
  float* f32() { return data<float>(); }
  const float* f32() const { return data<float>(); }

  // f32 views for kernels.
  kernels::MatrixView view();
  kernels::ConstMatrixView view() const;

  // Rows [begin, end) as a view sharing storage.
  Tensor rows_slice(int64_t begin, int64_t end) const;

  // Tensors packed one after another in one zero-filled storage, each starting at a multiple of
  // kPackAlign bytes (a model's gradients: one sum, one pass can then cover several).
  static constexpr size_t kPackAlign = 256;
  static std::vector<Tensor> packed_zeros(const std::vector<std::pair<int64_t, int64_t>>& shapes, DType dtype,
                                          Device device);
  // Whether `next` is the tensor packed right after this one.
  bool packed_before(const Tensor& next) const;
  // This tensor through `last` (packed after it, at any distance), with the padding between them,
  // as one n x 1 view. The padding holds zeros unless written through such a view.
  Tensor packed_through(const Tensor& last) const;
  Tensor clone() const;
  // A copy on `device` (this tensor itself when it is already there). Copies to the host wait
  // for the device; copies to a device are ordered on its compute stream.
  Tensor to(const Device& device) const;
  void fill(float value);           // f32 only
  std::vector<float> to_vector() const;  // f32 only, host copy (waits for a device)

 private:
  struct Storage;
  unsigned char* base() const;
  // A fresh rows x cols tensor; `io` takes a device's memory on its IO stream (empty_io).
  static Tensor allocate(int64_t rows, int64_t cols, DType dtype, Device device, bool io);

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  int64_t rows_ = 0, cols_ = 0;
  DType dtype_ = DType::kF32;
  Device device_ = Device::cpu();
};

}  // namespace gale::engine
