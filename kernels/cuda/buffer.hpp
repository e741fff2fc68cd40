// kernels/cuda/buffer.hpp — owning device arrays (DeviceBuffer) and non-owning views (DeviceSpan).
//
//   MemoryPool pool(0, budget_bytes, "8G");
//   Stream stream(0);
//   DeviceBuffer<float> x(pool, n, stream);          // charged to the budget, stream-ordered
//   copy_to_device(x.data(), host.data(), n, stream);
//   fill(x.data(), n, 0.0f, stream);
//   std::vector<float> back = to_host_and_wait(x.view(), stream);
//
// A DeviceBuffer is allocated on a stream and freed on that stream when it goes out of scope, so
// memory is reused as soon as the stream reaches the free, with no host synchronisation. Work on
// another stream that reads the buffer must be ordered before the free: record an Event there and
// make the buffer's stream wait on it, or hand the buffer over with set_stream.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/runtime.hpp"

namespace gale::kernels::cuda {

// count elements of T in device memory, borrowed.
template <typename T>
struct DeviceSpan {
  T* data = nullptr;
  size_t size = 0;

  size_t bytes() const noexcept { return size * sizeof(T); }
  bool empty() const noexcept { return size == 0; }
  DeviceSpan subspan(size_t offset, size_t count) const noexcept { return {data + offset, count}; }
  operator DeviceSpan<const T>() const noexcept { return {data, size}; }  // NOLINT: T* -> const T*
};

template <typename T>
class DeviceBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "device memory holds plain data only");

 public:
  DeviceBuffer() = default;
  // Uninitialised memory for `size` elements, usable by work on `stream` enqueued after this call.
  DeviceBuffer(MemoryPool& pool, size_t size, cudaStream_t stream)
      : pool_(&pool),
        stream_(stream),
        data_(static_cast<T*>(pool.allocate(size * sizeof(T), stream))),
        size_(size) {}

  ~DeviceBuffer() { reset(); }

  DeviceBuffer(DeviceBuffer&& other) noexcept
      : pool_(other.pool_),
        stream_(other.stream_),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}

  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      pool_ = other.pool_;
      stream_ = other.stream_;
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  size_t bytes() const noexcept { return size_ * sizeof(T); }
  bool empty() const noexcept { return size_ == 0; }
  cudaStream_t stream() const noexcept { return stream_; }
  int device() const noexcept { return pool_ == nullptr ? -1 : pool_->device(); }

  DeviceSpan<T> view() noexcept { return {data_, size_}; }
  DeviceSpan<const T> view() const noexcept { return {data_, size_}; }

  // Makes `stream` the one the buffer is freed on. The caller has ordered `stream` after all
  // earlier use (Stream::wait on an Event recorded on the old stream).
  void set_stream(cudaStream_t stream) noexcept { stream_ = stream; }

  // Frees the memory once the buffer's stream reaches this point; the buffer becomes empty.
  void reset() noexcept {
    if (data_ != nullptr) pool_->deallocate(data_, bytes(), stream_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  MemoryPool* pool_ = nullptr;
  cudaStream_t stream_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
};

// A new buffer holding a copy of host[0, count), stream-ordered. See copy_bytes for when the host
// memory may be reused.
template <typename T>
DeviceBuffer<T> to_device(MemoryPool& pool, const T* host, size_t count, cudaStream_t stream) {
  DeviceBuffer<T> buffer(pool, count, stream);
  copy_to_device(buffer.data(), host, count, stream);
  return buffer;
}

template <typename T>
DeviceBuffer<T> to_device(MemoryPool& pool, const std::vector<T>& host, cudaStream_t stream) {
  return to_device(pool, host.data(), host.size(), stream);
}

// Copies `src` to a new host vector and waits for the stream, so the result is ready on return.
template <typename T>
std::vector<std::remove_const_t<T>> to_host_and_wait(DeviceSpan<T> src, cudaStream_t stream) {
  std::vector<std::remove_const_t<T>> host(src.size);
  copy_to_host(host.data(), src.data, src.size, stream);
  GALE_CHECK_CUDA(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace gale::kernels::cuda
