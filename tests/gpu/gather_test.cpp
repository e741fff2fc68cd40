// gather_rows_cuda (kernels/gather.cu) against gather_rows: equal bit for bit (random bit
// patterns, NaN payloads included) at odd and aligned widths, with padded leading dimensions
// (the 4-byte path) and aligned ones (the 16-byte path), from device memory and from mapped pinned
// host memory over UVA, ids repeated and in any order. Outputs are poisoned first, and the padding
// columns must stay poisoned. Skips without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/fill.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/error.hpp"
#include "kernels/gather.hpp"
#include "kernels/random.hpp"
#include "tests/gpu/cuda_fixture.hpp"

namespace gale::kernels {
namespace {

using cuda::DeviceBuffer;
using cuda::MemoryPool;
using cuda::Stream;

constexpr int64_t kWidths[] = {1, 3, 4, 5, 31, 32, 33, 64, 100, 257};

// Host memory the GPU reads over UVA (cudaHostAllocMapped), freed with the object.
class MappedFloats {
 public:
  explicit MappedFloats(const std::vector<float>& values) {
    void* p = nullptr;
    GALE_CHECK_CUDA(cudaHostAlloc(&p, std::max<size_t>(values.size(), 1) * sizeof(float), cudaHostAllocMapped));
    host_ = static_cast<float*>(p);
    if (!values.empty()) std::memcpy(host_, values.data(), values.size() * sizeof(float));
    void* d = nullptr;
    GALE_CHECK_CUDA(cudaHostGetDevicePointer(&d, host_, 0));
    device_ = static_cast<float*>(d);
  }
  ~MappedFloats() { cudaFreeHost(host_); }
  MappedFloats(const MappedFloats&) = delete;
  MappedFloats& operator=(const MappedFloats&) = delete;
  const float* device() const { return device_; }

 private:
  float* host_ = nullptr;
  float* device_ = nullptr;
};

// Random 32-bit patterns: every float class, NaNs with payloads among them.
std::vector<float> random_patterns(size_t n, uint64_t key) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(random_bits(key, i) >> 32);
    std::memcpy(&v[i], &bits, sizeof(float));
  }
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

enum class Source { kDevice, kMappedHost };

class GatherRowsCudaTest : public gale::testing::CudaFixture<::testing::TestWithParam<Source>> {
 protected:
  // Gathers n ids from a rows x width source with leading dimensions src_ld / out_ld; `offset`
  // shifts the source data by that many floats (0 keeps it 16-byte aligned).
  void check(int64_t rows, int64_t width, int64_t src_ld, int64_t out_ld, int64_t n, int64_t offset, uint64_t key) {
    const std::string what = "rows " + std::to_string(rows) + " width " + std::to_string(width) + " src_ld " +
                             std::to_string(src_ld) + " out_ld " + std::to_string(out_ld) + " n " + std::to_string(n) +
                             " offset " + std::to_string(offset);
    const std::vector<float> src = random_patterns(static_cast<size_t>(rows * src_ld + offset), key);
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int64_t>(random_below(key + 1, i, static_cast<uint64_t>(rows)));
    if (n > 2) ids[1] = ids[0];  // a repeat
    const float poison = std::numeric_limits<float>::quiet_NaN();

    std::vector<float> cpu(static_cast<size_t>(n * out_ld), poison);
    gather_rows(ConstMatrixView{src.data() + offset, rows, width, src_ld}, ids.data(), n,
                MatrixView{cpu.data(), n, width, out_ld});

    std::unique_ptr<MappedFloats> mapped;
    DeviceBuffer<float> d_src;
    const float* src_ptr = nullptr;
    if (GetParam() == Source::kDevice) {
      d_src = cuda::to_device(*pool_, src, *stream_);
      src_ptr = d_src.data();
    } else {
      mapped = std::make_unique<MappedFloats>(src);
      src_ptr = mapped->device();
    }
    auto d_ids = cuda::to_device(*pool_, ids, *stream_);
    DeviceBuffer<float> d_out(*pool_, cpu.size(), *stream_);
    cuda::fill(d_out.data(), d_out.size(), poison, *stream_);
    gather_rows_cuda(ConstMatrixView{src_ptr + offset, rows, width, src_ld}, d_ids.data(), n,
                     MatrixView{d_out.data(), n, width, out_ld}, *stream_);
    const std::vector<float> gpu = cuda::to_host_and_wait(d_out.view(), *stream_);
    EXPECT_TRUE(same_bits(gpu, cpu)) << what;
  }
};

TEST_P(GatherRowsCudaTest, AlignedRowsMatchTheCpuBitForBit) {
  uint64_t key = 1;
  for (int64_t width : kWidths) {
    const int64_t ld = (width + 3) / 4 * 4;  // 16-byte rows: the vector path, scalar tail when width % 4
    check(301, width, ld, ld, 1037, 0, key++);
    check(301, width, ld + 4, ld, 517, 0, key++);
  }
}

TEST_P(GatherRowsCudaTest, UnalignedRowsMatchTheCpuBitForBit) {
  uint64_t key = 100;
  for (int64_t width : kWidths) {
    check(157, width, width + 1, width + 3, 999, 0, key++);   // padded, odd leading dimensions
    check(157, width, width, width, 333, 1, key++);            // data 4 bytes past alignment
  }
}

TEST_P(GatherRowsCudaTest, ManyRowsAndEmptyInputs) {
  check(100003, 33, 36, 36, 200001, 0, 7);  // more rows than one grid pass at narrow groups
  check(10, 8, 8, 8, 0, 0, 8);              // no ids
}

INSTANTIATE_TEST_SUITE_P(Sources, GatherRowsCudaTest, ::testing::Values(Source::kDevice, Source::kMappedHost),
                         [](const ::testing::TestParamInfo<Source>& info) {
                           return info.param == Source::kDevice ? std::string("DeviceMemory")
                                                                : std::string("MappedPinnedHost");
                         });

TEST(GatherRowsCuda, BadShapesAreInputErrors) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  Stream stream(0);
  std::vector<float> src(12), out(8);
  const int64_t ids[2] = {0, 1};
  EXPECT_THROW(gather_rows_cuda(ConstMatrixView{src.data(), 3, 4, 4}, ids, 2, MatrixView{out.data(), 2, 3, 4}, stream),
               InputError);
  EXPECT_THROW(gather_rows_cuda(ConstMatrixView{src.data(), 3, 4, 4}, ids, 2, MatrixView{out.data(), 1, 4, 4}, stream),
               InputError);
}

}  // namespace
}  // namespace gale::kernels
