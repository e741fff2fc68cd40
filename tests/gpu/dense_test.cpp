// The CUDA dense ops (kernels/dense_cuda.cu) against their CPU twins (kernels/dense_cpu.cpp) on
// fresh random inputs of awkward sizes: rows 1 / 37 / 1000, columns 1 / 7 / 33 / 256, tight and
// padded leading dimensions (so both the float4 and the scalar paths run). Every output is
// poisoned with NaN first, so an element a kernel forgets fails the comparison, and the padding
// of a strided output must still be NaN afterwards, so a kernel writing past a row fails too.
// Every test skips with a reason when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/fill.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/dense.hpp"
#include "kernels/random.hpp"
#include "tests/gpu/cuda_fixture.hpp"

namespace gale::kernels {
namespace {

using cuda::CublasHandle;
using cuda::DeviceBuffer;
using cuda::MemoryPool;
using cuda::Stream;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kRows[] = {1, 37, 1000};
constexpr int64_t kCols[] = {1, 7, 33, 256};

std::vector<float> random_values(uint64_t key, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * random_uniform(key, i);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// |got - want| <= tol * max(1, |want|): relative for large values, absolute near zero.
::testing::AssertionResult within(double got, double want, double tol) {
  if (std::isnan(want) ? std::isnan(got) : std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "got " << got << ", want " << want << " (tolerance " << tol << ")";
}

std::string shape_name(int64_t rows, int64_t cols, int64_t ld) {
  return std::to_string(rows) + " x " + std::to_string(cols) + " (ld " + std::to_string(ld) + ")";
}

// A rows x cols matrix with leading dimension ld, on the host and the device.
struct Matrix {
  int64_t rows = 0, cols = 0, ld = 0;
  std::vector<float> host;
  DeviceBuffer<float> device;

  MatrixView host_view() { return {host.data(), rows, cols, ld}; }
  MatrixView device_view() { return {device.data(), rows, cols, ld}; }
};

class DenseCuda : public gale::testing::CudaFixture<> {
 protected:
  // Random values in [lo, hi) everywhere, padding included, copied to the device.
  Matrix random_matrix(uint64_t key, int64_t rows, int64_t cols, int64_t ld, float lo = -2.0f, float hi = 2.0f) {
    Matrix m{rows, cols, ld, random_values(key, static_cast<size_t>(rows * ld), lo, hi), {}};
    m.device = cuda::to_device(*pool_, m.host, *stream_);
    return m;
  }

  // NaN everywhere on both sides: the CPU twin writes the host copy, the kernel the device one.
  Matrix poisoned_matrix(int64_t rows, int64_t cols, int64_t ld) {
    Matrix m{rows, cols, ld, std::vector<float>(static_cast<size_t>(rows * ld), kNaN), {}};
    m.device = DeviceBuffer<float>(*pool_, m.host.size(), *stream_);
    cuda::fill(m.device.data(), m.host.size(), kNaN, *stream_);
    return m;
  }

  // Compares the logical elements of the device matrix with the host reference (bit for bit when
  // tol is 0) and checks the padding was left poisoned.
  void expect_matches(Matrix& m, double tol, const char* what) {
    const std::vector<float> got = download(m.device);
    int64_t mismatches = 0;
    for (int64_t r = 0; r < m.rows; ++r) {
      for (int64_t c = 0; c < m.ld; ++c) {
        const size_t i = static_cast<size_t>(r * m.ld + c);
        if (c >= m.cols) {
          if (!std::isnan(got[i]) && ++mismatches <= 3) ADD_FAILURE() << what << ": padding written at " << r << "," << c;
          continue;
        }
        const bool ok = tol == 0.0 ? same_bits(got[i], m.host[i]) : static_cast<bool>(within(got[i], m.host[i], tol));
        if (!ok && ++mismatches <= 3) {
          ADD_FAILURE() << what << " at (" << r << ", " << c << "): got " << got[i] << ", want " << m.host[i];
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << what;
  }
};

// Every rows x cols combination, tight and with a padded leading dimension (+4 keeps float4
// alignment for multiples of 4, +1 breaks it).
template <typename Body>
void for_each_shape(Body&& body) {
  for (int64_t rows : kRows) {
    for (int64_t cols : kCols) {
      for (int64_t pad : {0, 1, 4}) {
        const int64_t ld = cols + pad;
        SCOPED_TRACE(shape_name(rows, cols, ld));
        body(rows, cols, ld);
      }
    }
  }
}

TEST_F(DenseCuda, ReluForwardAndBackwardAreBitIdentical) {
  uint64_t key = 100;
  for_each_shape([&](int64_t rows, int64_t cols, int64_t ld) {
    Matrix x = random_matrix(++key, rows, cols, ld);
    Matrix y = poisoned_matrix(rows, cols, ld);
    relu_forward(x.host_view(), y.host_view());
    relu_forward_cuda(x.device_view(), y.device_view(), *stream_);
    expect_matches(y, 0.0, "relu_forward");

    Matrix g = random_matrix(++key, rows, cols, ld);
    Matrix gi = poisoned_matrix(rows, cols, ld);
    relu_backward(g.host_view(), y.host_view(), gi.host_view());
    relu_backward_cuda(g.device_view(), y.device_view(), gi.device_view(), *stream_);
    expect_matches(gi, 0.0, "relu_backward");
  });
}

TEST_F(DenseCuda, ReluBitMasksAreBitIdentical) {
  uint64_t key = 150;
  // y's mask from the CPU twin into *bits and from relu_mask_cuda into *bits_d: the same words.
  auto masks_of = [&](Matrix& y, std::vector<uint32_t>* bits, DeviceBuffer<uint32_t>* bits_d) {
    bits->assign(static_cast<size_t>(y.rows * relu_mask_words(y.cols)), 0u);
    relu_mask(y.host_view(), bits->data());
    *bits_d = DeviceBuffer<uint32_t>(*pool_, bits->size(), *stream_);
    relu_mask_cuda(y.device_view(), bits_d->data(), *stream_);
    ASSERT_EQ(download(*bits_d), *bits);
  };
  for_each_shape([&](int64_t rows, int64_t cols, int64_t ld) {
    Matrix y = random_matrix(++key, rows, cols, ld);
    std::vector<uint32_t> bits;
    DeviceBuffer<uint32_t> bits_d;
    ASSERT_NO_FATAL_FAILURE(masks_of(y, &bits, &bits_d));
    Matrix g = random_matrix(++key, rows, cols, ld);
    Matrix gi = poisoned_matrix(rows, cols, ld);
    relu_backward_mask(g.host_view(), bits.data(), gi.host_view());
    relu_backward_mask_cuda(g.device_view(), bits_d.data(), gi.device_view(), *stream_);
    expect_matches(gi, 0.0, "relu_backward_mask");
    // With the column sums of what it writes: the same output, sums as column_sum's.
    Matrix gs = poisoned_matrix(rows, cols, ld);
    std::vector<float> want(static_cast<size_t>(cols));
    column_sum(gi.host_view(), want.data(), false);
    gs.host = gi.host;
    DeviceBuffer<float> sums(*pool_, static_cast<size_t>(std::max<int64_t>(cols, 1)), *stream_);
    const size_t ws_bytes = column_sum_workspace_bytes(rows, cols);
    DeviceBuffer<unsigned char> ws(*pool_, std::max<size_t>(ws_bytes, 1), *stream_);
    relu_backward_mask_sum_cuda(g.device_view(), bits_d.data(), gs.device_view(), sums.data(), ws.data(), ws_bytes,
                                *stream_);
    expect_matches(gs, 0.0, "relu_backward_mask with sums");
    const std::vector<float> got = download(sums);
    for (int64_t c = 0; c < cols; ++c) ASSERT_TRUE(within(got[c], want[c], 1e-6)) << "sum of column " << c;
  });
  // Tall: several chunks and column tiles, 100 columns and 256 (16-byte rows), in place.
  for (const int64_t cols : {100, 256}) {
    SCOPED_TRACE("tall, " + std::to_string(cols) + " columns");
    const int64_t rows = 9001;
    Matrix y = random_matrix(++key, rows, cols, cols);
    std::vector<uint32_t> bits;
    DeviceBuffer<uint32_t> bits_d;
    ASSERT_NO_FATAL_FAILURE(masks_of(y, &bits, &bits_d));
    Matrix g = random_matrix(++key, rows, cols, cols);
    std::vector<float> want(static_cast<size_t>(cols));
    relu_backward_mask(g.host_view(), bits.data(), g.host_view());
    column_sum(g.host_view(), want.data(), false);
    DeviceBuffer<float> sums(*pool_, static_cast<size_t>(cols), *stream_);
    const size_t ws_bytes = column_sum_workspace_bytes(rows, cols);
    DeviceBuffer<unsigned char> ws(*pool_, ws_bytes, *stream_);
    relu_backward_mask_sum_cuda(g.device_view(), bits_d.data(), g.device_view(), sums.data(), ws.data(), ws_bytes,
                                *stream_);
    expect_matches(g, 0.0, "relu_backward_mask with sums, in place");
    const std::vector<float> got = download(sums);
    for (int64_t c = 0; c < cols; ++c) ASSERT_TRUE(within(got[c], want[c], 1e-6)) << "tall, sum of column " << c;
  }
}

// ReLU's backward over row panels with the column sums of what it writes (ops::gemm_in_place's
// passes): every panel's values are relu_backward's bit for bit, and after the last panel the sums
// are column_sum_cuda's of the whole written matrix bit for bit, in one chunk, several, and chunks
// of other than 4096 rows, panels of one chunk and of several, out of place and in place (the
// panels written over grad_out, as gemm_in_place's scratch is not). A panel that does not start on
// a chunk is refused.
TEST_F(DenseCuda, ReluBackwardSumsOverRowPanelsAreColumnSumsBitForBit) {
  uint64_t key = 170;
  for (const int64_t rows : {1000, 9001, 20000}) {
    for (const int64_t cols : {7, 33, 256}) {
      const int64_t chunk = column_sum_chunk_rows(rows);
      for (const int64_t chunks_a_panel : {1, 2}) {
        for (const bool in_place : {false, true}) {
          SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + ", panels of " +
                       std::to_string(chunks_a_panel) + " chunks of " + std::to_string(chunk) +
                       (in_place ? ", in place" : ""));
          Matrix y = random_matrix(++key, rows, cols, cols);
          Matrix g = random_matrix(++key, rows, cols, cols);
          Matrix out = poisoned_matrix(rows, cols, cols);  // the reference on the host; written on the device unless in place
          relu_backward(g.host_view(), y.host_view(), out.host_view());
          const size_t ws_bytes = column_sum_workspace_bytes(rows, cols);
          DeviceBuffer<unsigned char> ws(*pool_, ws_bytes, *stream_);
          const int64_t panel = chunks_a_panel * chunk;
          for (int64_t r0 = 0; r0 < rows; r0 += panel) {
            const int64_t n = std::min(panel, rows - r0);
            const auto part = [&](Matrix& m) { return MatrixView{m.device.data() + r0 * cols, n, cols, cols}; };
            relu_backward_sum_rows_cuda(part(g), part(y), part(in_place ? g : out), r0, rows, ws.data(), ws_bytes,
                                        *stream_);
          }
          DeviceBuffer<float> sums(*pool_, static_cast<size_t>(cols), *stream_);
          column_sum_finish_cuda(rows, cols, sums.data(), /*accumulate=*/false, ws.data(), ws_bytes, *stream_);
          Matrix& written = in_place ? g : out;
          if (in_place) g.host = out.host;
          expect_matches(written, 0.0, "relu_backward over panels");
          DeviceBuffer<float> want(*pool_, static_cast<size_t>(cols), *stream_);
          DeviceBuffer<unsigned char> ws2(*pool_, ws_bytes, *stream_);
          column_sum_cuda(written.device_view(), want.data(), false, ws2.data(), ws_bytes, *stream_);
          const std::vector<float> a = download(sums), b = download(want);
          for (int64_t c = 0; c < cols; ++c) ASSERT_TRUE(same_bits(a[c], b[c])) << "column " << c << ": " << a[c] << " against " << b[c];
        }
      }
    }
  }
  Matrix m = random_matrix(++key, 9001, 7, 7);
  const size_t ws_bytes = column_sum_workspace_bytes(9001, 7);
  DeviceBuffer<unsigned char> ws(*pool_, ws_bytes, *stream_);
  const MatrixView part{m.device.data() + 7, 100, 7, 7};  // rows [1, 101): not on a chunk of 3001
  EXPECT_THROW(relu_backward_sum_rows_cuda(part, part, part, 1, 9001, ws.data(), ws_bytes, *stream_), InputError);
}

TEST_F(DenseCuda, ReluInPlaceMatches) {
  Matrix x = random_matrix(7, 37, 33, 33);
  relu_forward(x.host_view(), x.host_view());
  relu_forward_cuda(x.device_view(), x.device_view(), *stream_);
  expect_matches(x, 0.0, "relu_forward in place");
}

TEST_F(DenseCuda, EluForwardAndBackwardMatch) {
  uint64_t key = 200;
  for_each_shape([&](int64_t rows, int64_t cols, int64_t ld) {
    Matrix x = random_matrix(++key, rows, cols, ld, -6.0f, 3.0f);
    Matrix y = poisoned_matrix(rows, cols, ld);
    elu_forward(x.host_view(), y.host_view());
    elu_forward_cuda(x.device_view(), y.device_view(), *stream_);
    expect_matches(y, 1e-6, "elu_forward");  // expm1f vs std::expm1: within an ulp or two

    // Backward from the CPU's y on both sides, so only the backward is compared.
    cuda::copy_to_device(y.device.data(), y.host.data(), y.host.size(), *stream_);
    Matrix g = random_matrix(++key, rows, cols, ld);
    Matrix gi = poisoned_matrix(rows, cols, ld);
    elu_backward(g.host_view(), y.host_view(), gi.host_view());
    elu_backward_cuda(g.device_view(), y.device_view(), gi.device_view(), *stream_);
    expect_matches(gi, 1e-6, "elu_backward");
  });
}

TEST_F(DenseCuda, AddBiasIsBitIdentical) {
  uint64_t key = 300;
  for_each_shape([&](int64_t rows, int64_t cols, int64_t ld) {
    Matrix out = random_matrix(++key, rows, cols, ld);
    // Padding stays NaN so a write past a row shows.
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = cols; c < ld; ++c) out.host[static_cast<size_t>(r * ld + c)] = kNaN;
    }
    cuda::copy_to_device(out.device.data(), out.host.data(), out.host.size(), *stream_);
    const std::vector<float> bias = random_values(++key, static_cast<size_t>(cols), -1.0f, 1.0f);
    DeviceBuffer<float> bias_d = cuda::to_device(*pool_, bias, *stream_);
    add_bias(out.host_view(), bias.data());
    add_bias_cuda(out.device_view(), bias_d.data(), *stream_);
    expect_matches(out, 0.0, "add_bias");
    add_bias_relu(out.host_view(), bias.data());
    add_bias_relu_cuda(out.device_view(), bias_d.data(), *stream_);
    expect_matches(out, 0.0, "add_bias_relu");
  });
}

TEST_F(DenseCuda, AxpyIsBitIdentical) {
  uint64_t key = 350;
  for_each_shape([&](int64_t rows, int64_t cols, int64_t ld) {
    Matrix x = random_matrix(++key, rows, cols, ld);
    Matrix y = random_matrix(++key, rows, cols, ld);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = cols; c < ld; ++c) y.host[static_cast<size_t>(r * ld + c)] = kNaN;
    }
    cuda::copy_to_device(y.device.data(), y.host.data(), y.host.size(), *stream_);
    axpy(x.host_view(), -0.75f, y.host_view());
    axpy_cuda(x.device_view(), -0.75f, y.device_view(), *stream_);
    expect_matches(y, 0.0, "axpy");
  });
}

// A block of a wider matrix (here the logical columns of a padded one) set to one value, the
// padding left alone: 16-byte stores where the block and its rows are aligned, floats elsewhere.
TEST_F(DenseCuda, FillBlockIsBitIdentical) {
  for_each_shape([&](int64_t rows, int64_t cols, int64_t ld) {
    Matrix out = poisoned_matrix(rows, cols, ld);
    fill_block(out.host_view(), -1.5f);
    fill_block_cuda(out.device_view(), -1.5f, *stream_);
    expect_matches(out, 0.0, "fill_block");
  });
}

// Blocks of awkward widths and fewer rows than the output laid side by side into a poisoned output
// (tight and padded): every element written, the blocks' values bit for bit, zeros elsewhere, the
// padding left alone; from one block up to kMaxSideBySide.
TEST_F(DenseCuda, SideBySideIsBitIdentical) {
  uint64_t key = 380;
  for (int64_t rows : kRows) {
    for (int count = 1; count <= kMaxSideBySide; ++count) {
      for (int64_t pad : {0, 1, 4}) {
        // Widths 47, 1, 33, 7 (the first block's 47 of SAGE's last layer), each at a column a
        // 16-float piece after the last, the rest gaps of zeros.
        const int64_t widths[kMaxSideBySide] = {47, 1, 33, 7};
        std::vector<Matrix> sources;
        sources.reserve(kMaxSideBySide);
        std::vector<ColumnBlock> host_blocks, device_blocks;
        int64_t col = 0;
        for (int b = 0; b < count; ++b) {
          const int64_t src_rows = std::max<int64_t>(1, rows - b * 3);
          sources.push_back(random_matrix(++key, src_rows, widths[b], widths[b] + (b % 2)));
          Matrix& m = sources.back();
          host_blocks.push_back({m.host_view(), col});
          device_blocks.push_back({m.device_view(), col});
          col = (col + widths[b] + 15) / 16 * 16;
        }
        const int64_t cols = col + 3, ld = cols + pad;
        SCOPED_TRACE(std::to_string(count) + " blocks into " + shape_name(rows, cols, ld));
        Matrix out = poisoned_matrix(rows, cols, ld);
        side_by_side(host_blocks.data(), count, out.host_view());
        side_by_side_cuda(device_blocks.data(), count, out.device_view(), *stream_);
        expect_matches(out, 0.0, "side_by_side");
      }
    }
  }
}

TEST_F(DenseCuda, DropoutMasksAreBitIdenticalToTheCpu) {
  uint64_t key = 400;
  for (float p : {0.0f, 0.1f, 0.5f, 0.9f}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    for_each_shape([&](int64_t rows, int64_t cols, int64_t ld) {
      const uint64_t mask_key = derive_key(0x5eed, ++key);
      Matrix x = random_matrix(++key, rows, cols, ld);
      Matrix out = poisoned_matrix(rows, cols, ld);
      dropout_forward(x.host_view(), out.host_view(), p, mask_key);
      dropout_forward_cuda(x.device_view(), out.device_view(), p, mask_key, *stream_);
      expect_matches(out, 0.0, "dropout_forward");

      Matrix g = random_matrix(++key, rows, cols, ld);
      Matrix gi = poisoned_matrix(rows, cols, ld);
      dropout_backward(g.host_view(), gi.host_view(), p, mask_key);
      dropout_backward_cuda(g.device_view(), gi.device_view(), p, mask_key, *stream_);
      expect_matches(gi, 0.0, "dropout_backward");
    });
  }
}

TEST_F(DenseCuda, DropoutKeepsTheExpectedFraction) {
  // A sanity check on the GPU mask itself, independent of the CPU: 1000 x 256 draws at p = 0.3.
  Matrix x = random_matrix(1, 1000, 256, 256, 1.0f, 2.0f);  // never zero, so a zero means dropped
  Matrix out = poisoned_matrix(1000, 256, 256);
  dropout_forward_cuda(x.device_view(), out.device_view(), 0.3f, 99, *stream_);
  const std::vector<float> got = download(out.device);
  const double dropped = static_cast<double>(std::count(got.begin(), got.end(), 0.0f)) / got.size();
  EXPECT_NEAR(dropped, 0.3, 0.01);
}

TEST_F(DenseCuda, ColumnSumIsDeterministicAndMatchesTheCpu) {
  uint64_t key = 500;
  auto check = [&](int64_t rows, int64_t cols, int64_t ld) {
    Matrix x = random_matrix(++key, rows, cols, ld);
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
      const std::vector<float> start =
          accumulate ? random_values(++key, static_cast<size_t>(cols), -5.0f, 5.0f)
                     : std::vector<float>(static_cast<size_t>(cols), kNaN);
      std::vector<float> want = start;
      column_sum(x.host_view(), want.data(), accumulate);
      DeviceBuffer<float> first = cuda::to_device(*pool_, start, *stream_);
      DeviceBuffer<float> second = cuda::to_device(*pool_, start, *stream_);
      const size_t ws_bytes = column_sum_workspace_bytes(rows, cols);
      DeviceBuffer<unsigned char> ws(*pool_, ws_bytes, *stream_);
      column_sum_cuda(x.device_view(), first.data(), accumulate, ws.data(), ws_bytes, *stream_);
      column_sum_cuda(x.device_view(), second.data(), accumulate, ws.data(), ws_bytes, *stream_);
      const std::vector<float> a = download(first), b = download(second);
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_TRUE(same_bits(a[c], b[c])) << "column " << c << ": " << a[c] << " then " << b[c];
        // Both sum in double; only the final rounding to float can differ.
        ASSERT_TRUE(within(a[c], want[c], 1e-6)) << "column " << c;
      }
    }
  };
  for_each_shape(check);
  SCOPED_TRACE("tall");
  check(100003, 3, 3);  // many row passes per thread, 25 chunks
  check(4099, 300, 301);  // several column tiles, two chunks
  check(4200000, 5, 5);  // the chunk cap: 1024 chunks of 4102 rows
  // 16-byte rows of 128-512 columns over several chunks.
  check(9001, 256, 256);
  check(5000, 512, 516);
  check(8200, 132, 136);
  check(4097, 128, 128);
}

// Batch normalisation's statistics, apply (in place and into another matrix), backward (gamma's and
// beta's gradients accumulated, the input gradient written over grad_out) and running update,
// against the CPU twins; the statistics twice, bit for bit (deterministic reductions).
TEST_F(DenseCuda, BatchNormMatchesTheCpuAndIsDeterministic) {
  uint64_t key = 550;
  auto columns = [&](int64_t cols, float lo, float hi) { return random_values(++key, static_cast<size_t>(cols), lo, hi); };
  auto check = [&](int64_t rows, int64_t cols, int64_t ld) {
    // Values around an offset, so the centred variance matters.
    const uint64_t x_key = ++key;
    Matrix x = random_matrix(x_key, rows, cols, ld, 1.0f, 4.0f);
    const std::vector<float> gamma = columns(cols, 0.5f, 1.5f), beta = columns(cols, -1.0f, 1.0f);
    std::vector<float> mean(static_cast<size_t>(cols)), var(static_cast<size_t>(cols));
    batch_norm_stats(x.host_view(), mean.data(), var.data());
    const size_t ws_bytes = batch_norm_workspace_bytes(rows, cols);
    DeviceBuffer<unsigned char> ws(*pool_, ws_bytes, *stream_);
    const std::vector<float> poison(static_cast<size_t>(cols), kNaN);
    DeviceBuffer<float> mean_d = cuda::to_device(*pool_, poison, *stream_), var_d = cuda::to_device(*pool_, poison, *stream_);
    DeviceBuffer<float> mean2_d = cuda::to_device(*pool_, poison, *stream_), var2_d = cuda::to_device(*pool_, poison, *stream_);
    batch_norm_stats_cuda(x.device_view(), mean_d.data(), var_d.data(), ws.data(), ws_bytes, *stream_);
    batch_norm_stats_cuda(x.device_view(), mean2_d.data(), var2_d.data(), ws.data(), ws_bytes, *stream_);
    const std::vector<float> gm = download(mean_d), gv = download(var_d), gm2 = download(mean2_d), gv2 = download(var2_d);
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_TRUE(same_bits(gm[c], gm2[c]) && same_bits(gv[c], gv2[c])) << "column " << c;
      ASSERT_TRUE(within(gm[c], mean[c], 1e-6)) << "mean of column " << c;
      ASSERT_TRUE(within(gv[c], var[c], 1e-5)) << "variance of column " << c;
    }
    // The kernels below take the CPU's statistics, so only their own arithmetic is compared.
    DeviceBuffer<float> mean_h = cuda::to_device(*pool_, mean, *stream_), var_h = cuda::to_device(*pool_, var, *stream_);
    DeviceBuffer<float> gamma_d = cuda::to_device(*pool_, gamma, *stream_), beta_d = cuda::to_device(*pool_, beta, *stream_);
    constexpr float kEps = 1e-5f;
    Matrix y = poisoned_matrix(rows, cols, ld);
    batch_norm_apply(x.host_view(), mean.data(), var.data(), kEps, gamma.data(), beta.data(), false, y.host_view());
    batch_norm_apply_cuda(x.device_view(), mean_h.data(), var_h.data(), kEps, gamma_d.data(), beta_d.data(), false,
                          y.device_view(), ws.data(), ws_bytes, *stream_);
    expect_matches(y, 1e-5, "batch_norm_apply");
    Matrix in_place = random_matrix(x_key, rows, cols, ld, 1.0f, 4.0f);  // x's values again
    // In place, through ReLU in the same pass.
    batch_norm_apply(in_place.host_view(), mean.data(), var.data(), kEps, gamma.data(), beta.data(), true,
                     in_place.host_view());
    batch_norm_apply_cuda(in_place.device_view(), mean_h.data(), var_h.data(), kEps, gamma_d.data(), beta_d.data(), true,
                          in_place.device_view(), ws.data(), ws_bytes, *stream_);
    const std::vector<float> got_in_place = download(in_place.device);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float want = std::max(y.host[r * ld + c], 0.0f);
        ASSERT_EQ(in_place.host[r * ld + c], want) << "the CPU's ReLU at " << r << "," << c;
        ASSERT_TRUE(within(got_in_place[r * ld + c], want, 1e-5)) << "in place with ReLU at " << r << "," << c;
      }
    }

    Matrix g = random_matrix(++key, rows, cols, ld);
    std::vector<float> grad_gamma = columns(cols, -1.0f, 1.0f), grad_beta = columns(cols, -1.0f, 1.0f);
    DeviceBuffer<float> grad_gamma_d = cuda::to_device(*pool_, grad_gamma, *stream_);
    DeviceBuffer<float> grad_beta_d = cuda::to_device(*pool_, grad_beta, *stream_);
    const std::vector<float> g_host = g.host;
    // Through a ReLU mask in the same passes, for odd shapes (every other shape without one).
    const bool masked = (rows + cols) % 2 == 1;
    std::vector<uint32_t> bits(static_cast<size_t>(rows * relu_mask_words(cols)));
    for (size_t i = 0; i < bits.size(); ++i)
      bits[i] = static_cast<uint32_t>(random_below(++key, 0, uint64_t{1} << 32));
    DeviceBuffer<uint32_t> bits_d = cuda::to_device(*pool_, bits, *stream_);
    batch_norm_backward(g.host_view(), x.host_view(), mean.data(), var.data(), kEps, gamma.data(),
                        masked ? bits.data() : nullptr, grad_gamma.data(), grad_beta.data(), g.host_view());
    batch_norm_backward_cuda(g.device_view(), x.device_view(), mean_h.data(), var_h.data(), kEps, gamma_d.data(),
                             masked ? bits_d.data() : nullptr, grad_gamma_d.data(), grad_beta_d.data(), g.device_view(),
                             ws.data(), ws_bytes, *stream_);
    const std::vector<float> got = download(g.device), ggamma = download(grad_gamma_d), gbeta = download(grad_beta_d);
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_TRUE(within(ggamma[c], grad_gamma[c], 1e-4)) << "gamma's gradient, column " << c;
      ASSERT_TRUE(within(gbeta[c], grad_beta[c], 1e-4)) << "beta's gradient, column " << c;
    }
    // The input gradient is a difference of terms of the rows' size: compare against its scale.
    double scale = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) scale = std::max(scale, std::fabs(static_cast<double>(g_host[r * ld + c])));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < ld; ++c) {
        const size_t i = static_cast<size_t>(r * ld + c);
        if (c >= cols) {
          ASSERT_TRUE(same_bits(got[i], g_host[i])) << "padding written at " << r << "," << c;
          continue;
        }
        ASSERT_NEAR(got[i], g.host[i], 1e-4 * std::max(1.0, scale)) << "input gradient at " << r << "," << c;
      }
    }

    std::vector<float> running_mean = columns(cols, -1.0f, 1.0f), running_var = columns(cols, 0.5f, 2.0f);
    DeviceBuffer<float> rm_d = cuda::to_device(*pool_, running_mean, *stream_), rv_d = cuda::to_device(*pool_, running_var, *stream_);
    batch_norm_update_running(mean.data(), var.data(), rows, 0.1f, running_mean.data(), running_var.data(), cols);
    batch_norm_update_running_cuda(mean_h.data(), var_h.data(), rows, 0.1f, rm_d.data(), rv_d.data(), cols, *stream_);
    const std::vector<float> grm = download(rm_d), grv = download(rv_d);
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_TRUE(within(grm[c], running_mean[c], 1e-6)) << "running mean, column " << c;
      ASSERT_TRUE(within(grv[c], running_var[c], 1e-6)) << "running variance, column " << c;
    }
  };
  for_each_shape(check);
  SCOPED_TRACE("tall");
  check(100003, 3, 3);
  check(4099, 300, 301);
}

TEST_F(DenseCuda, BatchNormRefusesASmallWorkspaceAndNoRows) {
  DeviceBuffer<float> cols(*pool_, 16, *stream_);
  Matrix x = random_matrix(1, 8, 4, 4);
  const size_t ws_bytes = batch_norm_workspace_bytes(8, 4);
  DeviceBuffer<unsigned char> ws(*pool_, ws_bytes, *stream_);
  EXPECT_THROW(batch_norm_stats_cuda(x.device_view(), cols.data(), cols.data() + 4, ws.data(), ws_bytes - 1, *stream_),
               InputError);
  const MatrixView empty{x.device.data(), 0, 4, 4};
  EXPECT_THROW(batch_norm_stats_cuda(empty, cols.data(), cols.data() + 4, ws.data(), ws_bytes, *stream_), InputError);
}

TEST_F(DenseCuda, AdamMatchesTheCpuOverSeveralSteps) {
  uint64_t key = 600;
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{33001}}) {
    for (float weight_decay : {0.0f, 5e-4f}) {
      SCOPED_TRACE("n = " + std::to_string(n) + ", weight decay " + std::to_string(weight_decay));
      std::vector<float> w = random_values(++key, static_cast<size_t>(n), -1.0f, 1.0f);
      std::vector<float> m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);
      DeviceBuffer<float> w_d = cuda::to_device(*pool_, w, *stream_);
      DeviceBuffer<float> m_d = cuda::to_device(*pool_, m, *stream_);
      DeviceBuffer<float> v_d = cuda::to_device(*pool_, v, *stream_);
      AdamParams params;
      params.lr = 0.01f;
      params.weight_decay = weight_decay;
      for (int64_t step = 1; step <= 3; ++step) {
        params.step = step;
        const std::vector<float> g = random_values(++key, static_cast<size_t>(n), -0.5f, 0.5f);
        DeviceBuffer<float> g_d = cuda::to_device(*pool_, g, *stream_);
        adam_update(w.data(), g.data(), m.data(), v.data(), n, params);
        adam_update_cuda(w_d.data(), g_d.data(), m_d.data(), v_d.data(), n, params, *stream_);
      }
      const std::vector<float> w_got = download(w_d), m_got = download(m_d), v_got = download(v_d);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(within(w_got[i], w[i], 1e-6)) << "w[" << i << "]";
        ASSERT_TRUE(within(m_got[i], m[i], 1e-6)) << "m[" << i << "]";
        ASSERT_TRUE(within(v_got[i], v[i], 1e-6)) << "v[" << i << "]";
      }
    }
  }
}

// A model's step in one launch (32 tensors to a launch): the same bits as one launch per tensor,
// over 40 tensors of mixed sizes (empty, one element, chunk edges) and three steps; and the
// gradients zeroed at once.
TEST_F(DenseCuda, AdamOverManyTensorsMatchesOneTensorAtATimeAndZeroManyZeroes) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("random seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t sizes[] = {0, 1, 37, 4095, 4096, 4097, 33001, 256 * 256};
  std::vector<int64_t> n;
  for (int i = 0; i < 40; ++i) n.push_back(sizes[rng() % 8]);
  uint64_t key = seed;
  struct Set {
    std::vector<DeviceBuffer<float>> w, m, v;
  } one, many;
  for (int64_t count : n) {
    const std::vector<float> w = random_values(++key, static_cast<size_t>(count), -1.0f, 1.0f);
    const std::vector<float> zeros(static_cast<size_t>(count), 0.0f);
    for (Set* s : {&one, &many}) {
      s->w.push_back(cuda::to_device(*pool_, w, *stream_));
      s->m.push_back(cuda::to_device(*pool_, zeros, *stream_));
      s->v.push_back(cuda::to_device(*pool_, zeros, *stream_));
    }
  }
  AdamParams params;
  params.lr = 0.01f;
  params.weight_decay = 5e-4f;
  std::vector<DeviceBuffer<float>> grads;
  for (int64_t step = 1; step <= 3; ++step) {
    params.step = step;
    grads.clear();
    std::vector<AdamTensor> tensors;
    for (size_t i = 0; i < n.size(); ++i) {
      grads.push_back(cuda::to_device(*pool_, random_values(++key, static_cast<size_t>(n[i]), -0.5f, 0.5f), *stream_));
      adam_update_cuda(one.w[i].data(), grads[i].data(), one.m[i].data(), one.v[i].data(), n[i], params, *stream_);
      tensors.push_back({many.w[i].data(), grads[i].data(), many.m[i].data(), many.v[i].data(), n[i]});
    }
    adam_update_many_cuda(tensors.data(), static_cast<int>(tensors.size()), params, *stream_);
  }
  for (size_t i = 0; i < n.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i) + " of " + std::to_string(n[i]));
    EXPECT_EQ(download(many.w[i]), download(one.w[i]));
    EXPECT_EQ(download(many.m[i]), download(one.m[i]));
    EXPECT_EQ(download(many.v[i]), download(one.v[i]));
  }
  std::vector<float*> data;
  for (size_t i = 0; i < n.size(); i += 2) data.push_back(grads[i].data());  // every other one
  std::vector<int64_t> counts;
  for (size_t i = 0; i < n.size(); i += 2) counts.push_back(n[i]);
  zero_many_cuda(data.data(), counts.data(), static_cast<int>(data.size()), *stream_);
  for (size_t i = 0; i < n.size(); ++i) {
    const std::vector<float> got = download(grads[i]);
    size_t zeros = 0;
    for (float x : got) zeros += x == 0.0f;
    if (i % 2 == 0) EXPECT_EQ(zeros, got.size()) << "tensor " << i;
    else EXPECT_LT(zeros, got.size() / 2 + 1) << "tensor " << i << " was not to be zeroed";
  }
}

struct GemmCase {
  int64_t m, n, k;
};

class DenseCudaGemm : public DenseCuda {
 protected:
  void run(bool tf32, double tol) {
    CublasHandle handle(*stream_, *pool_);
    const GemmCase cases[] = {{1, 1, 1}, {37, 7, 33}, {1000, 33, 256}, {33, 256, 7}, {7, 1, 1000}, {37, 33, 0}};
    uint64_t key = tf32 ? 800 : 700;
    for (const GemmCase& gc : cases) {
      for (bool trans_a : {false, true}) {
        for (bool trans_b : {false, true}) {
          for (float beta : {0.0f, 0.5f}) {
            SCOPED_TRACE("m " + std::to_string(gc.m) + " n " + std::to_string(gc.n) + " k " + std::to_string(gc.k) +
                         (trans_a ? " A^T" : " A") + (trans_b ? " B^T" : " B") + " beta " + std::to_string(beta));
            // Stored shapes with a padded leading dimension: A is m x k (k x m transposed).
            const int64_t a_rows = trans_a ? gc.k : gc.m, a_cols = trans_a ? gc.m : gc.k;
            const int64_t b_rows = trans_b ? gc.n : gc.k, b_cols = trans_b ? gc.k : gc.n;
            Matrix a = random_matrix(++key, a_rows, a_cols, a_cols + 3, -1.0f, 1.0f);
            Matrix b = random_matrix(++key, b_rows, b_cols, b_cols + 2, -1.0f, 1.0f);
            // beta = 0 must overwrite a poisoned C; beta != 0 reads a random one.
            Matrix c = beta == 0.0f ? poisoned_matrix(gc.m, gc.n, gc.n + 1) : random_matrix(++key, gc.m, gc.n, gc.n + 1);
            if (beta != 0.0f) {
              for (int64_t r = 0; r < gc.m; ++r) c.host[static_cast<size_t>(r * c.ld + gc.n)] = kNaN;
              cuda::copy_to_device(c.device.data(), c.host.data(), c.host.size(), *stream_);
            }
            const int64_t lda = std::max<int64_t>(1, a.ld), ldb = std::max<int64_t>(1, b.ld);
            gemm(trans_a, trans_b, gc.m, gc.n, gc.k, 1.5f, a.host.data(), lda, b.host.data(), ldb, beta,
                 c.host.data(), c.ld);
            gemm_cuda(handle, trans_a, trans_b, gc.m, gc.n, gc.k, 1.5f, a.device.data(), lda, b.device.data(), ldb,
                      beta, c.device.data(), c.ld, tf32);
            expect_matches(c, tol, tf32 ? "gemm (tf32)" : "gemm");
          }
        }
      }
    }
  }
};

TEST_F(DenseCudaGemm, AllTransposesMatchTheCpuInFp32) { run(false, 1e-4); }

// gemm_bias_cuda (cuBLASLt's bias / bias + ReLU epilogue) against the CPU's gemm then add_bias(_relu),
// transposed or not, overwriting or accumulating; where cuBLASLt declines a shape the caller's
// two-step fallback is what must match.
TEST_F(DenseCudaGemm, BiasEpilogueMatchesGemmThenBias) {
  CublasHandle handle(*stream_, *pool_);
  const GemmCase cases[] = {{1, 1, 1}, {37, 7, 33}, {1000, 33, 256}, {33, 256, 7}, {2048, 256, 100}};
  uint64_t key = 900;
  int fused = 0;
  for (const GemmCase& gc : cases) {
    for (bool trans_a : {false, true}) {
      for (bool trans_b : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          for (bool relu : {false, true}) {
            SCOPED_TRACE("m " + std::to_string(gc.m) + " n " + std::to_string(gc.n) + " k " + std::to_string(gc.k) +
                         (trans_a ? " A^T" : " A") + (trans_b ? " B^T" : " B") + " beta " + std::to_string(beta) +
                         (relu ? " relu" : ""));
            const int64_t a_rows = trans_a ? gc.k : gc.m, a_cols = trans_a ? gc.m : gc.k;
            const int64_t b_rows = trans_b ? gc.n : gc.k, b_cols = trans_b ? gc.k : gc.n;
            Matrix a = random_matrix(++key, a_rows, a_cols, a_cols, -1.0f, 1.0f);
            Matrix b = random_matrix(++key, b_rows, b_cols, b_cols, -1.0f, 1.0f);
            Matrix c = beta == 0.0f ? poisoned_matrix(gc.m, gc.n, gc.n) : random_matrix(++key, gc.m, gc.n, gc.n);
            const std::vector<float> bias = random_values(++key, static_cast<size_t>(gc.n), -1.0f, 1.0f);
            DeviceBuffer<float> bias_d = cuda::to_device(*pool_, bias, *stream_);
            gemm(trans_a, trans_b, gc.m, gc.n, gc.k, 1.0f, a.host.data(), a.ld, b.host.data(), b.ld, beta, c.host.data(),
                 c.ld);
            if (relu) add_bias_relu(c.host_view(), bias.data());
            else add_bias(c.host_view(), bias.data());
            if (gemm_bias_cuda(handle, handle.workspace(), handle.workspace_bytes(), trans_a, trans_b, gc.m, gc.n, gc.k,
                               a.device.data(), a.ld, b.device.data(), b.ld, beta, c.device.data(), c.ld, bias_d.data(),
                               relu)) {
              ++fused;
            } else {
              gemm_cuda(handle, trans_a, trans_b, gc.m, gc.n, gc.k, 1.0f, a.device.data(), a.ld, b.device.data(), b.ld,
                        beta, c.device.data(), c.ld);
              if (relu) add_bias_relu_cuda(c.device_view(), bias_d.data(), *stream_);
              else add_bias_cuda(c.device_view(), bias_d.data(), *stream_);
            }
            expect_matches(c, 1e-4, "gemm_bias");
          }
        }
      }
    }
  }
  EXPECT_GT(fused, 0) << "cuBLASLt took none of the shapes";
}
TEST_F(DenseCudaGemm, AllTransposesMatchTheCpuInTf32) { run(true, 1e-2); }

// transpose_cuda against the CPU's transpose, bit for bit, on shapes that are and are not whole
// tiles, from and into padded rows (the padding of the output left as it was).
TEST_F(DenseCuda, TransposeMatchesTheCpu) {
  uint64_t key = 1100;
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {32, 32}, {100, 256}, {257, 33}, {7, 1000}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    Matrix in = random_matrix(++key, rows, cols, cols + 3);
    Matrix out = poisoned_matrix(cols, rows, rows + 1);
    transpose(ConstMatrixView{in.host.data(), rows, cols, in.ld}, out.host_view());
    transpose_cuda(ConstMatrixView{in.device.data(), rows, cols, in.ld}, out.device_view(), *stream_);
    expect_matches(out, 0.0, "transpose");
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(out.host[static_cast<size_t>(c * out.ld + r)], in.host[static_cast<size_t>(r * in.ld + c)]);
  }
}

// With GEMM tuning on, a product large enough to tune (16384 x 512 x 512, kGemmTuneMacs) is run
// with the heuristic's first candidate, then timed over the candidates on its second call, then
// run with the winner, overwriting (beta 0: the timing runs rerun it in place) and accumulating
// (beta 1), plain and with the bias epilogue, in FP32 and TF32, transposed and not: every result
// against the CPU.
TEST_F(DenseCudaGemm, TunedGemmsMatchTheCpu) {
  CublasHandle handle(*stream_, *pool_);
  set_gemm_tuning(true);
  const int64_t m = 16384, n = 512, k = 512;
  ASSERT_GE(static_cast<double>(m) * n * k, kGemmTuneMacs);
  uint64_t key = 1000;
  for (bool tf32 : {false, true}) {
    for (bool trans_b : {false, true}) {
      SCOPED_TRACE(std::string(tf32 ? "tf32" : "fp32") + (trans_b ? " B^T" : " B"));
      // TF32 rounds each input to 11 significant bits: over 512 products of up to 1 in magnitude the
      // rounding errors add up to ~0.003 (one sigma), and 8M outputs reach ~5 sigma.
      const double tol = tf32 ? 3e-2 : 1e-4;
      Matrix a = random_matrix(++key, m, k, k, -1.0f, 1.0f);
      Matrix b = random_matrix(++key, trans_b ? n : k, trans_b ? k : n, trans_b ? k : n, -1.0f, 1.0f);
      Matrix c = poisoned_matrix(m, n, n);
      for (int call = 0; call < 3; ++call) {  // heuristic, tuning, tuned
        SCOPED_TRACE("call " + std::to_string(call));
        const float beta = call == 2 ? 1.0f : 0.0f;
        gemm(false, trans_b, m, n, k, 1.0f, a.host.data(), a.ld, b.host.data(), b.ld, beta, c.host.data(), c.ld);
        gemm_cuda(handle, false, trans_b, m, n, k, 1.0f, a.device.data(), a.ld, b.device.data(), b.ld, beta,
                  c.device.data(), c.ld, tf32, handle.workspace(), handle.workspace_bytes());
        expect_matches(c, tol, "tuned gemm");
      }
      const std::vector<float> bias = random_values(++key, static_cast<size_t>(n), -1.0f, 1.0f);
      DeviceBuffer<float> bias_d = cuda::to_device(*pool_, bias, *stream_);
      for (int call = 0; call < 3; ++call) {
        SCOPED_TRACE("bias call " + std::to_string(call));
        const float beta = call == 2 ? 1.0f : 0.0f;
        gemm(false, trans_b, m, n, k, 1.0f, a.host.data(), a.ld, b.host.data(), b.ld, beta, c.host.data(), c.ld);
        add_bias_relu(c.host_view(), bias.data());
        ASSERT_TRUE(gemm_bias_cuda(handle, handle.workspace(), handle.workspace_bytes(), false, trans_b, m, n, k,
                                   a.device.data(), a.ld, b.device.data(), b.ld, beta, c.device.data(), c.ld,
                                   bias_d.data(), /*relu=*/true, tf32));
        expect_matches(c, tol, "tuned gemm_bias");
      }
    }
  }
  set_gemm_tuning(false);
}

// The CPU twin on plain arrays: the semantics the CUDA op must reproduce.
double cpu_softmax_cross_entropy(const std::vector<float>& logits, int64_t n, int64_t c, const int32_t* labels,
                                 const std::vector<int64_t>& rows, std::vector<float>* grad, int64_t* correct,
                                 int64_t grad_over = 0) {
  MatrixView g;
  if (grad) {
    grad->assign(static_cast<size_t>(n * c), 0.0f);
    g = matrix(grad->data(), n, c);
  }
  return softmax_cross_entropy_cpu(matrix(logits.data(), n, c), labels, rows.data(),
                                   static_cast<int64_t>(rows.size()), g, correct, grad_over);
}

class DenseCudaSoftmax : public DenseCuda {
 protected:
  struct Result {
    double loss;
    int64_t correct;
    std::vector<float> grad;
  };

  // Runs the CUDA loss on host inputs; grad is skipped when with_grad is false.
  Result run(const std::vector<float>& logits, int64_t n, int64_t c, const std::vector<int32_t>& labels,
             const std::vector<int64_t>& rows, bool with_grad, int64_t grad_over = 0) {
    DeviceBuffer<float> logits_d = cuda::to_device(*pool_, logits, *stream_);
    DeviceBuffer<int32_t> labels_d = cuda::to_device(*pool_, labels, *stream_);
    DeviceBuffer<int64_t> rows_d = cuda::to_device(*pool_, rows, *stream_);
    DeviceBuffer<float> grad_d(*pool_, static_cast<size_t>(n * c), *stream_);
    cuda::fill(grad_d.data(), grad_d.size(), kNaN, *stream_);
    DeviceBuffer<double> loss_d(*pool_, 1, *stream_);
    cuda::fill(loss_d.data(), 1, std::numeric_limits<double>::quiet_NaN(), *stream_);
    DeviceBuffer<int64_t> correct_d(*pool_, 1, *stream_);
    cuda::fill(correct_d.data(), 1, int64_t{-1}, *stream_);
    const size_t ws_bytes = softmax_cross_entropy_workspace_bytes(n, static_cast<int64_t>(rows.size()));
    DeviceBuffer<uint8_t> ws(*pool_, ws_bytes, *stream_);
    cuda::fill(ws.data(), ws.size(), uint8_t{0xff}, *stream_);  // garbage the kernel must not rely on
    const MatrixView grad_view = with_grad ? MatrixView{grad_d.data(), n, c, c} : MatrixView{};
    softmax_cross_entropy_cuda(ConstMatrixView{logits_d.data(), n, c, c}, labels_d.data(), rows_d.data(),
                               static_cast<int64_t>(rows.size()), grad_view, loss_d.data(), correct_d.data(),
                               ws.data(), ws.size(), *stream_, grad_over);
    return {download(loss_d)[0], download(correct_d)[0], download(grad_d)};
  }
};

TEST_F(DenseCudaSoftmax, LossGradAndCorrectMatchTheCpu) {
  uint64_t key = 900;
  // 100003 rows: the loss reduction's first pass spans several blocks.
  for (int64_t n : {kRows[0], kRows[1], kRows[2], int64_t{100003}}) {
    // Class counts on each side of the row groups' sizes (8 lanes up to 64, 16 up to 128, a warp
    // past that) and of the exps the lanes keep (8 x 8, 16 x 8, 32 x 4).
    for (int64_t c : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{47}, int64_t{64}, int64_t{65}, int64_t{128},
                      int64_t{129}, int64_t{256}}) {
      if (n > 1000 && c > 7) continue;
      // Continuous logits, large ones (the shift by the maximum matters), and integers in
      // {0, 1, 2} (ties: the first maximum is the prediction).
      for (int kind = 0; kind < 3; ++kind) {
        SCOPED_TRACE(std::to_string(n) + " rows, " + std::to_string(c) + " classes, kind " + std::to_string(kind));
        std::vector<float> logits = random_values(++key, static_cast<size_t>(n * c), -3.0f, 3.0f);
        if (kind == 1) {
          for (float& z : logits) z *= 40.0f;
        } else if (kind == 2) {
          for (float& z : logits) z = std::floor((z + 3.0f) / 2.0f);
        }
        std::vector<int32_t> labels(static_cast<size_t>(n));
        for (int64_t r = 0; r < n; ++r) labels[r] = static_cast<int32_t>(random_below(++key, 0, static_cast<uint64_t>(c)));
        // About half the rows, drawn with replacement: some rows are listed twice, most not at all.
        std::vector<int64_t> rows(static_cast<size_t>(n / 2 + 1));
        for (int64_t& r : rows) r = static_cast<int64_t>(random_below(++key, 0, static_cast<uint64_t>(n)));

        std::vector<float> want_grad;
        int64_t want_correct = 0;
        const double want_loss = cpu_softmax_cross_entropy(logits, n, c, labels.data(), rows, &want_grad, &want_correct);
        const Result got = run(logits, n, c, labels, rows, true);
        EXPECT_TRUE(within(got.loss, want_loss, 1e-12));
        EXPECT_EQ(got.correct, want_correct);
        int64_t mismatches = 0;
        for (size_t i = 0; i < want_grad.size(); ++i) {
          if (!within(got.grad[i], want_grad[i], 1e-7) && ++mismatches <= 3) {
            ADD_FAILURE() << "grad[" << i / c << "][" << i % c << "]: got " << got.grad[i] << ", want " << want_grad[i];
          }
        }
        EXPECT_EQ(mismatches, 0);

        const Result again = run(logits, n, c, labels, rows, false);
        EXPECT_EQ(std::memcmp(&again.loss, &got.loss, sizeof(double)), 0) << "loss differs between runs";
        EXPECT_EQ(again.correct, got.correct);

        // A worker's share of a step over more rows than it lists (grad_over): the CPU's too.
        if (kind == 0) {
          const int64_t over = 2 * static_cast<int64_t>(rows.size()) + 3;
          std::vector<float> share_want;
          cpu_softmax_cross_entropy(logits, n, c, labels.data(), rows, &share_want, nullptr, over);
          const Result share = run(logits, n, c, labels, rows, true, over);
          EXPECT_EQ(std::memcmp(&share.loss, &got.loss, sizeof(double)), 0) << "the loss stays the listed rows' mean";
          int64_t share_mismatches = 0;
          for (size_t i = 0; i < share_want.size(); ++i) {
            if (!within(share.grad[i], share_want[i], 1e-7) && ++share_mismatches <= 3) {
              ADD_FAILURE() << "grad_over " << over << ": grad[" << i / c << "][" << i % c << "]: got " << share.grad[i]
                            << ", want " << share_want[i];
            }
          }
          EXPECT_EQ(share_mismatches, 0);
        }
      }
    }
  }
}

TEST_F(DenseCudaSoftmax, NoListedRowsGiveZeroLossAndZeroGrad) {
  const std::vector<float> logits = random_values(1, 37 * 7, -1.0f, 1.0f);
  const std::vector<int32_t> labels(37, 3);
  const Result got = run(logits, 37, 7, labels, {}, true);
  EXPECT_EQ(got.loss, 0.0);
  EXPECT_EQ(got.correct, 0);
  for (float g : got.grad) ASSERT_EQ(g, 0.0f);
}

TEST_F(DenseCudaSoftmax, AnOutOfRangeLabelMakesTheLossNan) {
  const std::vector<float> logits = random_values(2, 37 * 7, -1.0f, 1.0f);
  std::vector<int32_t> labels(37, 3);
  labels[5] = 7;  // one past the last class
  const Result got = run(logits, 37, 7, labels, {1, 5, 9}, true);
  EXPECT_TRUE(std::isnan(got.loss));
  for (int64_t k = 0; k < 7; ++k) EXPECT_EQ(got.grad[5 * 7 + k], 0.0f) << "the bad row gets no gradient";
}

// The step's form: every logits row a seed, its label read through the seed's id from the whole
// graph's labels. The same bits as the listing form over rows 0 .. n - 1 and the gathered labels,
// and the CPU twin's values.
TEST_F(DenseCudaSoftmax, TheSeedsFormMatchesTheListingFormBitForBit) {
  uint64_t key = 4100;
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{8193}, int64_t{70001}}) {
    for (int64_t c : {int64_t{7}, int64_t{47}, int64_t{65}, int64_t{129}}) {
      if (n > 10000 && c > 47) continue;
      for (const bool with_ids : {true, false}) {
        SCOPED_TRACE(std::to_string(n) + " rows, " + std::to_string(c) + " classes, ids " + std::to_string(with_ids));
        const std::vector<float> logits = random_values(++key, static_cast<size_t>(n * c), -3.0f, 3.0f);
        const int64_t n_labels = with_ids ? 3 * n + 5 : n;
        std::vector<int32_t> all(static_cast<size_t>(n_labels));
        for (int32_t& y : all) y = static_cast<int32_t>(random_below(++key, 0, static_cast<uint64_t>(c)));
        std::vector<int64_t> ids(static_cast<size_t>(n));
        std::vector<int32_t> gathered(static_cast<size_t>(n));
        std::vector<int64_t> rows(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          ids[i] = with_ids ? static_cast<int64_t>(random_below(++key, 0, static_cast<uint64_t>(n_labels))) : i;
          gathered[i] = all[static_cast<size_t>(ids[i])];
          rows[i] = i;
        }
        const int64_t over = 2 * n + 1;
        const Result want = run(logits, n, c, gathered, rows, true, over);

        DeviceBuffer<float> logits_d = cuda::to_device(*pool_, logits, *stream_);
        DeviceBuffer<int32_t> all_d = cuda::to_device(*pool_, all, *stream_);
        DeviceBuffer<int64_t> ids_d = cuda::to_device(*pool_, ids, *stream_);
        DeviceBuffer<float> grad_d(*pool_, static_cast<size_t>(n * c), *stream_);
        cuda::fill(grad_d.data(), grad_d.size(), kNaN, *stream_);
        DeviceBuffer<double> loss_d(*pool_, 1, *stream_);
        DeviceBuffer<int64_t> correct_d(*pool_, 1, *stream_);
        const size_t ws_bytes = softmax_cross_entropy_workspace_bytes(n, n);
        DeviceBuffer<uint8_t> ws(*pool_, ws_bytes, *stream_);
        cuda::fill(ws.data(), ws.size(), uint8_t{0xff}, *stream_);
        softmax_cross_entropy_seeds_cuda(ConstMatrixView{logits_d.data(), n, c, c}, all_d.data(),
                                         with_ids ? ids_d.data() : nullptr, n_labels, MatrixView{grad_d.data(), n, c, c},
                                         loss_d.data(), correct_d.data(), ws.data(), ws.size(), *stream_, over);
        const double loss = download(loss_d)[0];
        EXPECT_EQ(std::memcmp(&loss, &want.loss, sizeof(double)), 0) << loss << " vs " << want.loss;
        EXPECT_EQ(download(correct_d)[0], want.correct);
        const std::vector<float> grad = download(grad_d);
        EXPECT_EQ(std::memcmp(grad.data(), want.grad.data(), grad.size() * sizeof(float)), 0);

        std::vector<float> cpu_grad(static_cast<size_t>(n * c));
        int64_t cpu_correct = 0;
        const double cpu_loss =
            softmax_cross_entropy_seeds_cpu(matrix(logits.data(), n, c), all.data(), with_ids ? ids.data() : nullptr,
                                            matrix(cpu_grad.data(), n, c), &cpu_correct, over);
        EXPECT_TRUE(within(loss, cpu_loss, 1e-12));
        EXPECT_EQ(download(correct_d)[0], cpu_correct);
        int64_t mismatches = 0;
        for (size_t i = 0; i < grad.size(); ++i) mismatches += within(grad[i], cpu_grad[i], 1e-7) ? 0 : 1;
        EXPECT_EQ(mismatches, 0);
      }
    }
  }
}

TEST_F(DenseCudaSoftmax, TheSeedsFormGivesAnOutOfRangeIdOrLabelANanLoss) {
  const int64_t n = 37, c = 7;
  const std::vector<float> logits = random_values(3, static_cast<size_t>(n * c), -1.0f, 1.0f);
  std::vector<int32_t> all(50, 2);
  all[11] = 7;  // one past the last class
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = i;
  for (const int64_t bad : {int64_t{11}, int64_t{50}, int64_t{-1}}) {
    SCOPED_TRACE("id " + std::to_string(bad));
    ids[4] = bad;
    DeviceBuffer<float> logits_d = cuda::to_device(*pool_, logits, *stream_);
    DeviceBuffer<int32_t> all_d = cuda::to_device(*pool_, all, *stream_);
    DeviceBuffer<int64_t> ids_d = cuda::to_device(*pool_, ids, *stream_);
    DeviceBuffer<float> grad_d(*pool_, static_cast<size_t>(n * c), *stream_);
    DeviceBuffer<double> loss_d(*pool_, 1, *stream_);
    const size_t ws_bytes = softmax_cross_entropy_workspace_bytes(n, n);
    DeviceBuffer<uint8_t> ws(*pool_, ws_bytes, *stream_);
    softmax_cross_entropy_seeds_cuda(ConstMatrixView{logits_d.data(), n, c, c}, all_d.data(), ids_d.data(), 50,
                                     MatrixView{grad_d.data(), n, c, c}, loss_d.data(), nullptr, ws.data(), ws.size(),
                                     *stream_);
    EXPECT_TRUE(std::isnan(download(loss_d)[0]));
    const std::vector<float> grad = download(grad_d);
    for (int64_t k = 0; k < c; ++k) EXPECT_EQ(grad[4 * c + k], 0.0f) << "the bad row gets no gradient";
  }
}

TEST_F(DenseCudaSoftmax, TooSmallAWorkspaceIsRefused) {
  DeviceBuffer<float> logits(*pool_, 37 * 7, *stream_);
  DeviceBuffer<double> loss(*pool_, 1, *stream_);
  EXPECT_THROW(softmax_cross_entropy_cuda(ConstMatrixView{logits.data(), 37, 7, 7}, nullptr, nullptr, 10, MatrixView{},
                                          loss.data(), nullptr, nullptr, 16, *stream_),
               InputError);
}

}  // namespace
}  // namespace gale::kernels
