// The parts of the CUDA runtime that need no GPU: they run on CPU-only machines too.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/budget.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/runtime.hpp"

namespace gale::kernels::cuda {
namespace {

TEST(DeviceCount, DoesNotThrowWithOrWithoutAGpu) {
  int count = -1;
  EXPECT_NO_THROW(count = device_count());
  EXPECT_GE(count, 0);
}

TEST(RequireDevice, MissingOrdinalIsADeviceError) {
  const std::string expected =
      "no CUDA device 99 (found " + std::to_string(device_count()) + ")";
  try {
    require_device(99);
    FAIL() << "require_device(99) did not throw";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.what(), expected);
    EXPECT_EQ(e.code(), ExitCode::kResource);
  }
  EXPECT_THROW(require_device(-1), DeviceError);
}

cudaError_t rejected_call(int /*argument*/) { return cudaErrorInvalidValue; }

TEST(CheckCuda, FailedCallNamesTheCallTheErrorAndThePlace) {
  try {
    GALE_CHECK_CUDA(rejected_call(42));
    FAIL() << "GALE_CHECK_CUDA did not throw";
  } catch (const DeviceError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("rejected_call(...) failed: invalid argument (cudaErrorInvalidValue) at ", 0),
              0u)
        << message;
    EXPECT_NE(message.find("runtime_host_test.cpp:"), std::string::npos) << message;
  }
}

TEST(CheckCuda, OutOfMemoryIsAResourceError) {
  EXPECT_THROW(GALE_CHECK_CUDA(cudaErrorMemoryAllocation), ResourceError);
  EXPECT_NO_THROW(GALE_CHECK_CUDA(cudaSuccess));
}

TEST(CheckCublas, FailedStatusIsADeviceErrorAndAllocFailureAResourceError) {
  EXPECT_THROW(GALE_CHECK_CUBLAS(CUBLAS_STATUS_INVALID_VALUE), DeviceError);
  EXPECT_THROW(GALE_CHECK_CUBLAS(CUBLAS_STATUS_ALLOC_FAILED), ResourceError);
  EXPECT_NO_THROW(GALE_CHECK_CUBLAS(CUBLAS_STATUS_SUCCESS));
}

TEST(FormatBytes, UsesBinaryUnitsWithOneDecimal) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(512ULL << 10), "512 KiB");
  EXPECT_EQ(format_bytes(3ULL << 29), "1.5 GiB");
  EXPECT_EQ(format_bytes(8ULL << 30), "8 GiB");
}

TEST(MemoryBudget, ExceedingItThrowsAndChargesNothing) {
  MemoryBudget budget(8ULL << 30, "--gpu-mem-budget", "8G");
  budget.charge(7ULL << 30);
  try {
    budget.charge(3ULL << 29);
    FAIL() << "charge past the budget did not throw";
  } catch (const ResourceError& e) {
    EXPECT_STREQ(e.what(), "--gpu-mem-budget 8G exceeded: allocating 1.5 GiB with 7 GiB in use");
  }
  EXPECT_EQ(budget.in_use(), 7ULL << 30);
  budget.charge(1ULL << 30);  // exactly at the limit is allowed
  EXPECT_EQ(budget.in_use(), 8ULL << 30);
  EXPECT_THROW(budget.charge(1), ResourceError);
}

TEST(MemoryBudget, PeakIsTheHighWaterMark) {
  MemoryBudget budget(1000);
  budget.charge(300);
  budget.charge(500);
  budget.release(500);
  budget.charge(100);
  EXPECT_EQ(budget.in_use(), 400u);
  EXPECT_EQ(budget.peak(), 800u);
  budget.reset_peak();
  EXPECT_EQ(budget.peak(), 400u);
}

// A pool outlives runs, each with its budget (engine/device_context.hpp): a new limit and text
// apply to what is charged from then on, and bytes still in use count against it.
TEST(MemoryBudget, ANewLimitCountsWhatIsInUse) {
  MemoryBudget budget;  // unlimited, as a device before any run leases it
  budget.charge(3ULL << 20);
  budget.set_limit(4ULL << 20, "4M");
  EXPECT_EQ(budget.limit(), 4ULL << 20);
  EXPECT_EQ(budget.limit_text(), "4M");
  EXPECT_FALSE(budget.unlimited());
  budget.charge(1ULL << 20);  // up to the new limit
  try {
    budget.charge(1);
    FAIL() << "charge past the new limit did not throw";
  } catch (const ResourceError& e) {
    EXPECT_STREQ(e.what(), "--gpu-mem-budget 4M exceeded: allocating 1 B with 4 MiB in use");
  }
  budget.set_limit(2ULL << 20);  // below what is in use: every charge fails until enough is released
  EXPECT_EQ(budget.limit_text(), "2 MiB");
  EXPECT_THROW(budget.charge(1), ResourceError);
  budget.release(3ULL << 20);
  budget.charge(1ULL << 20);
  budget.set_limit(MemoryBudget::kUnlimited);
  EXPECT_TRUE(budget.unlimited());
  budget.charge(1ULL << 40);
}

TEST(MemoryBudget, ConcurrentChargesNeverPassTheLimit) {
  constexpr uint64_t kLimit = 1000;
  MemoryBudget budget(kLimit);
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        try {
          budget.charge(7);
          budget.release(7);
        } catch (const ResourceError&) {
          refused.fetch_add(1);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(budget.in_use(), 0u);
  EXPECT_LE(budget.peak(), kLimit);
  EXPECT_EQ(refused.load(), 0);  // 8 threads × 7 bytes always fit in 1000
}

}  // namespace
}  // namespace gale::kernels::cuda
