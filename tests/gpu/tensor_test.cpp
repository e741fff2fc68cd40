// Tensors on a CUDA device: allocated from the device context's budgeted pool, copied to and
// from the host, cloned, filled and sliced.
#include <gtest/gtest.h>

#include <vector>

#include "engine/device_context.hpp"
#include "engine/devices.hpp"
#include "engine/tensor.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"

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
// when copied, though the tensor is overwritten right after and other slots are copied since.
TEST_F(GpuTensor, LaggedReadsReturnEachSlotsValuesAsCopied) {
  const Device gpu = Device::cuda(0);
  LaggedReads reads(gpu, 3, 2);
  const auto values = [&reads](int slot) {
    const float* v = reads.read(slot);
    return std::vector<float>(v, v + 2);
  };
  Tensor t = Tensor::zeros(1, 2, DType::kF32, gpu);
  for (int step = 0; step < 7; ++step) {
    t.fill(static_cast<float>(step));
    reads.copy(step % 3, t);
    Tensor busy = Tensor::zeros(4096, 1024, DType::kF32, gpu);  // later work on the same stream
    busy.fill(1.0f);
    if (step >= 2) EXPECT_EQ(values((step - 2) % 3), std::vector<float>(2, static_cast<float>(step - 2))) << step;
  }
  t.fill(-1.0f);
  EXPECT_EQ(values(6 % 3), std::vector<float>(2, 6.0f));
}

}  // namespace
}  // namespace gale::engine
