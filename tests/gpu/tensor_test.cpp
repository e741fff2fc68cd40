// Tensors on a CUDA device: allocated from the device context's budgeted pool, copied to and
// from the host, cloned, filled and sliced.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "engine/device_context.hpp"
#include "engine/devices.hpp"
#include "engine/ops.hpp"
#include "engine/tensor.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/dense.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "tests/gpu/fault_device.hpp"
#include "tests/gpu/random_inputs.hpp"

namespace gale::engine {
namespace {

class GpuTensor : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  }
};

TEST_F(GpuTensor, RoundTripsThroughTheDevice) {
  std::vector<float> values(37 * 129);
  for (size_t i = 0; i < values.size(); ++i) values[i] = kernels::random_uniform(3, i) - 0.5f;
  const Tensor host = Tensor::from_vector(values, 37, 129);
  const Tensor dev = host.to(Device::cuda(0));
  EXPECT_TRUE(dev.device().is_cuda());
  EXPECT_EQ(dev.to_vector(), values);
  const Tensor copy = dev.clone();
  EXPECT_EQ(copy.to_vector(), values);
  const Tensor rows = dev.rows_slice(5, 9);
  EXPECT_EQ(rows.to_vector(), std::vector<float>(values.begin() + 5 * 129, values.begin() + 9 * 129));
}

// ops::gemm and ops::gemm_bias on products that run on a transposed copy of the weight
// (kernels::weight_transposed_first) and on one row fewer (the weight as stored): the CPU's
// results, in FP32 and TF32, overwriting and accumulating, the weight unchanged.
TEST_F(GpuTensor, GemmOnATransposedWeightMatchesTheCpu) {
  auto random = [](uint64_t key, int64_t rows, int64_t cols) {
    return Tensor::from_vector(kernels::testing::uniform(key, static_cast<size_t>(rows * cols), -1.0f, 1.0f), rows, cols);
  };
  struct Shape {
    int64_t m, n, k;
  };
  const Device gpu = Device::cuda(0);
  uint64_t key = 40;
  for (const Shape sh : {Shape{kernels::kWeightTransposedRows, 256, 100}, Shape{kernels::kWeightTransposedRows, 48, 256},
                         Shape{kernels::kWeightTransposedRows - 1, 256, 100}}) {
    for (bool tf32 : {false, true}) {
      SCOPED_TRACE(std::to_string(sh.m) + " x " + std::to_string(sh.n) + " x " + std::to_string(sh.k) +
                   (tf32 ? " tf32" : " fp32") +
                   (kernels::weight_transposed_first(sh.m, sh.n, sh.k, tf32) ? ", weight transposed" : ", weight as stored"));
      // TF32 rounds each input to 11 significant bits: over depth 256 of products up to 1 the
      // errors reach ~0.01 (a few sigma over 12M outputs).
      const float tol = tf32 ? 3e-2f : 1e-4f;
      const Tensor a = random(++key, sh.m, sh.k), w = random(++key, sh.k, sh.n), bias = random(++key, 1, sh.n);
      const Tensor c0 = random(++key, sh.m, sh.n);
      const Tensor a_d = a.to(gpu), w_d = w.to(gpu), bias_d = bias.to(gpu);
      auto expect_close = [&](const Tensor& want, const Tensor& got, const char* what) {
        const std::vector<float> x = want.to_vector(), y = got.to_vector();
        ASSERT_EQ(x.size(), y.size());
        size_t far = 0;
        for (size_t i = 0; i < x.size(); ++i) far += !(std::fabs(x[i] - y[i]) <= tol * (1.0f + std::fabs(x[i])));
        EXPECT_EQ(far, 0u) << what;
      };
      for (float beta : {0.0f, 1.0f}) {
        Tensor want = c0.clone(), got = c0.to(gpu);
        ops::gemm(a, false, w, false, beta, &want, tf32);
        ops::gemm(a_d, false, w_d, false, beta, &got, tf32);
        expect_close(want, got, beta == 0.0f ? "gemm" : "gemm, accumulating");
      }
      for (bool relu : {false, true}) {
        Tensor want = c0.clone(), got = c0.to(gpu);
        ops::gemm_bias(a, w, 0.0f, &want, bias, relu, tf32);
        ops::gemm_bias(a_d, w_d, 0.0f, &got, bias_d, relu, tf32);
        expect_close(want, got, relu ? "gemm_bias with ReLU" : "gemm_bias");
      }
      EXPECT_EQ(w_d.to_vector(), w.to_vector()) << "the weight changed";
    }
  }
}

// ops::gemm_in_place with the column sums of what it writes (GIN's MLP backward: the first Linear's
// bias gradient): the product through ReLU's backward as on the CPU, and the sums column_sum's of
// the result bit for bit on the GPU, with the default panels, with panels smaller than a sum chunk
// (rounded up to one), over one chunk and several, and without ReLU (a column_sum pass then).
TEST_F(GpuTensor, GemmInPlaceSumsWhatItWritesAsColumnSumDoes) {
  auto random = [](uint64_t key, int64_t rows, int64_t cols) {
    return Tensor::from_vector(kernels::testing::uniform(key, static_cast<size_t>(rows * cols), -1.0f, 1.0f), rows, cols);
  };
  const Device gpu = Device::cuda(0);
  uint64_t key = 60;
  for (const int64_t rows : {1000, 9001}) {
    for (const int64_t panel_rows : {int64_t{0}, int64_t{700}, int64_t{5000}}) {
      for (const bool relu : {true, false}) {
        SCOPED_TRACE(std::to_string(rows) + " rows, panels of " + std::to_string(panel_rows) + (relu ? ", ReLU" : ""));
        const Tensor a = random(++key, rows, 48), w = random(++key, 48, 48), y = random(++key, rows, 48);
        Tensor want = a.clone(), got = a.to(gpu);
        Tensor want_sums = Tensor::empty(1, 48), got_sums = Tensor::empty(1, 48, DType::kF32, gpu);
        ops::gemm_in_place(&want, w, /*trans_b=*/true, /*tf32=*/false, panel_rows, relu ? &y : nullptr, &want_sums);
        const Tensor y_d = y.to(gpu);
        ops::gemm_in_place(&got, w.to(gpu), true, false, panel_rows, relu ? &y_d : nullptr, &got_sums);
        const std::vector<float> x = want.to_vector(), z = got.to_vector();
        size_t far = 0;
        for (size_t i = 0; i < x.size(); ++i) far += !(std::fabs(x[i] - z[i]) <= 1e-4f * (1.0f + std::fabs(x[i])));
        EXPECT_EQ(far, 0u) << "the product";
        Tensor again = Tensor::empty(1, 48, DType::kF32, gpu);
        ops::column_sum(got, &again, /*accumulate=*/false);
        const std::vector<float> sums = got_sums.to_vector(), col = again.to_vector(), cpu = want_sums.to_vector();
        for (int c = 0; c < 48; ++c) {
          EXPECT_EQ(0, std::memcmp(&sums[c], &col[c], sizeof(float))) << "column " << c << ": " << sums[c] << " against " << col[c];
          EXPECT_NEAR(sums[c], cpu[c], 1e-3f * (1.0f + std::fabs(cpu[c]))) << "column " << c;
        }
      }
    }
  }
}

// ops::copy_columns takes a column block out of a wider tensor bit for bit, as on the CPU, at an
// unaligned width and offset as well as an aligned one.
TEST_F(GpuTensor, CopyColumnsTakesTheBlockAsTheCpuDoes) {
  const Device gpu = Device::cuda(0);
  const Tensor x = Tensor::from_vector(kernels::testing::uniform(70, 1001 * 96, -1.0f, 1.0f), 1001, 96);
  const Tensor x_d = x.to(gpu);
  for (const auto& [col, cols] : {std::pair<int64_t, int64_t>{48, 47}, {3, 33}, {0, 96}}) {
    Tensor want = Tensor::empty(1001, cols), got = Tensor::empty(1001, cols, DType::kF32, gpu);
    ops::copy_columns(x, col, &want);
    ops::copy_columns(x_d, col, &got);
    const std::vector<float> w = want.to_vector(), g = got.to_vector(), all = x.to_vector();
    EXPECT_EQ(w, g) << "columns from " << col;
    EXPECT_EQ(w[static_cast<size_t>(cols) + 1], all[96 + static_cast<size_t>(col) + 1]) << "columns from " << col;
  }
}

TEST_F(GpuTensor, ZerosAndFillWriteTheDeviceStorage) {
  Tensor z = Tensor::zeros(1000, 3, DType::kF32, Device::cuda(0));
  EXPECT_EQ(z.to_vector(), std::vector<float>(3000, 0.0f));
  Tensor view = z.rows_slice(10, 20);
  view.fill(2.5f);  // writes through to the shared storage
  const auto all = z.to_vector();
  for (int64_t i = 0; i < 3000; ++i) EXPECT_EQ(all[i], (i >= 30 && i < 60) ? 2.5f : 0.0f) << i;
}

TEST_F(GpuTensor, AllocationsAreChargedToThePoolAndReturned) {
  DeviceContext& ctx = DeviceContext::get(0);
  const uint64_t before = ctx.pool().in_use();
  {
    Tensor t = Tensor::empty(1 << 20, 4, DType::kF32, Device::cuda(0));
    EXPECT_EQ(ctx.pool().in_use(), before + (uint64_t{16} << 20));
  }
  EXPECT_EQ(ctx.pool().in_use(), before);
}

// What the data-parallel workers' stop votes rely on: each slot returns the values its tensor held
// when copied (the work before the copy included), with later work queued behind it and other slots
// copied since; a slot's tensor is rewritten only after the slot was read, as the workers do.
TEST_F(GpuTensor, LaggedReadsReturnEachSlotsValuesAsCopied) {
  const Device gpu = Device::cuda(0);
  LaggedReads reads(gpu, 3, 2);
  const auto values = [&reads](int slot) {
    const float* v = reads.read(slot);
    return std::vector<float>(v, v + 2);
  };
  std::vector<Tensor> t;
  for (int slot = 0; slot < 3; ++slot) t.push_back(Tensor::zeros(1, 2, DType::kF32, gpu));
  for (int step = 0; step < 8; ++step) {
    Tensor busy = Tensor::zeros(4096, 1024, DType::kF32, gpu);  // work before the values on the stream
    busy.fill(1.0f);
    t[static_cast<size_t>(step % 3)].fill(static_cast<float>(step));
    reads.copy(step % 3, t[static_cast<size_t>(step % 3)]);
    busy.fill(2.0f);  // later work on the same stream
    if (step >= 2) EXPECT_EQ(values((step - 2) % 3), std::vector<float>(2, static_cast<float>(step - 2))) << step;
  }
  EXPECT_EQ(values(7 % 3), std::vector<float>(2, 7.0f));
  EXPECT_EQ(values(6 % 3), std::vector<float>(2, 6.0f));
}

// A worker that fails on a faulting device unwinds through its LaggedReads (and BatchFeatures):
// their destructors wait for their copies, and a wait that fails there must not throw, which would
// end the process with SIGABRT instead of the failure's one-line error and exit code. In a child
// process (the fault breaks every later CUDA call), which must end with the code it chose.
TEST_F(GpuTensor, LaggedReadsEndQuietlyOnAFaultingDevice) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const Device gpu = Device::cuda(0);
        {
          LaggedReads reads(gpu, 2, 2);
          const Tensor t = Tensor::zeros(1, 2, DType::kF32, gpu);
          reads.copy(0, t);
          testing_support::fault_device(DeviceContext::get(0).stream());
          try {
            reads.copy(1, t);  // the side stream's copy waits on the faulting work
          } catch (const Error&) {  // or the fault shows here already: either way it unwinds next
          }
          (void)cudaDeviceSynchronize();  // the fault has happened: every wait now fails
        }
        std::_Exit(7);
      },
      ::testing::ExitedWithCode(7), "");
}

// The same for a tensor of the IO stream (a batch's features): its free is ordered after the IO
// stream's work by an event, and where recording that event fails the destructor waits instead,
// with a wait that must not throw either.
TEST_F(GpuTensor, IoTensorsAreFreedQuietlyOnAFaultingDevice) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        {
          const Tensor t = Tensor::empty_io(64, 4, DType::kF32, Device::cuda(0));
          testing_support::fault_device(DeviceContext::get(0).io_stream());
          (void)cudaDeviceSynchronize();  // the fault has happened: every record and wait now fails
        }
        std::_Exit(7);
      },
      ::testing::ExitedWithCode(7), "");
}

// Layer outputs beyond the host budget (issue 36): a MappedHostTable charged to the budget when it
// fits, else in an unlinked scratch file of the spill directory; either way the rows written are
// the rows gathered and read back, and nothing is left in the directory or charged afterwards.
TEST_F(GpuTensor, HostTablesAreChargedOrSpillToAScratchFile) {
  const int64_t rows = 3001, cols = 70;
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < values.size(); ++i) values[i] = kernels::random_uniform(9, i) - 0.5f;
  const Tensor all = Tensor::from_vector(values, rows, cols).to(Device::cuda(0));
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 777; ++i) ids.push_back((i * 37) % rows);
  const Tensor at = Tensor::from_host(ids.data(), static_cast<int64_t>(ids.size()), 1, DType::kI64, Device::cuda(0));
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("gale-spill-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const bool small : {false, true}) {
    SCOPED_TRACE(small ? "spilled" : "pinned");
    kernels::cuda::MemoryBudget budget(small ? 4096 : uint64_t{64} << 20, "--host-mem-budget");
    {
      MappedHostTable table(Device::cuda(0), rows, cols, &budget, dir);
      EXPECT_EQ(table.spilled(), small);
      EXPECT_EQ(budget.in_use(), small ? 0u : values.size() * sizeof(float));
      table.write_rows(0, all.rows_slice(0, 1000));
      table.write_rows(1000, all.rows_slice(1000, rows));
      EXPECT_EQ(table.to_host().to_vector(), values);
      // Many rows (a pass over the file when spilled) and a few (a read each).
      for (const size_t count : {ids.size(), size_t{50}}) {
        const Tensor some = at.rows_slice(0, static_cast<int64_t>(count));
        const std::vector<float> got = table.gather(some).to_vector();
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(0, std::memcmp(got.data() + i * cols, values.data() + ids[i] * cols, cols * sizeof(float)))
              << count << " rows, row " << i;
      }
      EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the scratch file is unlinked at once";
    }
    EXPECT_EQ(budget.in_use(), 0u);
  }
  // No spill directory: the budget's refusal stands.
  kernels::cuda::MemoryBudget tiny(4096, "--host-mem-budget");
  EXPECT_THROW(MappedHostTable(Device::cuda(0), rows, cols, &tiny), ResourceError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale::engine
