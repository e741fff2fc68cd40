// A run's lease of the GPU memory budget (engine/devices.hpp), the parts that need no GPU: one run
// holds a GPU at a time, a second is refused with a ResourceError naming the holder and records
// nothing, and a refused or failed lease gives its claim back. The leases themselves, on a GPU,
// are in tests/gpu/training_test.cpp (GpuCora.EachRunInOneProcessHasItsOwnBudget).
#include <gtest/gtest.h>

#include <string>

#include "engine/devices.hpp"
#include "kernels/error.hpp"

namespace gale::engine {
namespace {

TEST(GpuHolders, OneRunHoldsAGpuAtATime) {
  GpuHolders holders;
  holders.claim({0}, "run A");
  EXPECT_EQ(holders.holder(0), "run A");
  try {
    holders.claim({1, 0}, "run B");
    FAIL() << "run B claimed a GPU run A holds";
  } catch (const ResourceError& e) {
    EXPECT_EQ(e.code(), ExitCode::kResource);
    EXPECT_NE(std::string(e.what()).find("cuda:0 is in use by run A"), std::string::npos) << e.what();
  }
  EXPECT_EQ(holders.holder(1), "") << "a refused claim records nothing";
  EXPECT_EQ(holders.holder(0), "run A");
  holders.release({0});
  EXPECT_EQ(holders.holder(0), "");
  holders.claim({1, 0}, "run B");  // once run A has ended
  EXPECT_EQ(holders.holder(0), "run B");
  EXPECT_EQ(holders.holder(1), "run B");
}

TEST(DeviceBudgetLease, OnTheCpuHoldsNoGpu) {
  const DeviceBudgetLease lease({Device::cpu()}, 1 << 20, "1M", "a CPU run");
  EXPECT_EQ(gpu_holders().holder(0), "");
}

TEST(DeviceBudgetLease, ARunOnAHeldGpuIsRefusedNamingTheHolder) {
  gpu_holders().claim({0}, "the training run on cora.gale under --gpu-mem-budget 8G");
  try {
    const DeviceBudgetLease lease({Device::cuda(0)}, 1 << 30, "1G", "the prediction from best.ckpt");
    ADD_FAILURE() << "leased a GPU another run holds";
  } catch (const ResourceError& e) {
    EXPECT_EQ(e.code(), ExitCode::kResource);
    EXPECT_NE(std::string(e.what()).find("cuda:0 is in use by the training run on cora.gale under --gpu-mem-budget 8G"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(gpu_holders().holder(0), "the training run on cora.gale under --gpu-mem-budget 8G");
  gpu_holders().release({0});
}

// Without a GPU the lease fails where the device is first used (a CUDA build) or holds the claim
// until it ends (a CPU-only build, where train and predict refuse the device before leasing it):
// either way no claim outlives it.
TEST(DeviceBudgetLease, NoClaimOutlivesTheLease) {
  if (gpu_count() > 0) GTEST_SKIP() << "needs a machine without a GPU";
  try {
    const DeviceBudgetLease lease({Device::cuda(0)}, 0, "", "a run");
  } catch (const Error&) {
  }
  EXPECT_EQ(gpu_holders().holder(0), "");
}

}  // namespace
}  // namespace gale::engine
