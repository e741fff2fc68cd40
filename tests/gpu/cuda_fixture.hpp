// tests/gpu/cuda_fixture.hpp — what the GPU suites' fixtures share: the skip (with its reason) on a
// machine without a CUDA device, a memory pool and a stream on device 0, copies to and from the
// device, and outputs poisoned with NaN, so that an element a kernel forgets to write fails.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/fill.hpp"
#include "kernels/cuda/runtime.hpp"

namespace gale::testing {

template <typename Base = ::testing::Test>
class CudaFixture : public Base {
 protected:
  void SetUp() override {
    if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
    pool_ = std::make_unique<kernels::cuda::MemoryPool>(0);
    stream_ = std::make_unique<kernels::cuda::Stream>(0);
  }

  template <typename T>
  kernels::cuda::DeviceBuffer<T> upload(const std::vector<T>& host) {
    return kernels::cuda::to_device(*pool_, host, *stream_);
  }

  template <typename T>
  std::vector<T> download(const kernels::cuda::DeviceBuffer<T>& d) {
    return kernels::cuda::to_host_and_wait(d.view(), *stream_);
  }

  // The first n elements only: a buffer sized for a bound (a capacity) is written only up to its
  // count, and copying the rest would read memory no kernel wrote (compute-sanitizer initcheck).
  template <typename T>
  std::vector<T> download(const kernels::cuda::DeviceBuffer<T>& d, size_t n) {
    return kernels::cuda::to_host_and_wait(d.view().subspan(0, std::min(n, d.size())), *stream_);
  }

  kernels::cuda::DeviceBuffer<float> poisoned(size_t n) {
    kernels::cuda::DeviceBuffer<float> d(*pool_, n, *stream_);
    if (n > 0) kernels::cuda::fill(d.data(), n, std::numeric_limits<float>::quiet_NaN(), *stream_);
    return d;
  }

  std::unique_ptr<kernels::cuda::MemoryPool> pool_;
  std::unique_ptr<kernels::cuda::Stream> stream_;
};

}  // namespace gale::testing
