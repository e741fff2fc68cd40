// The CUDA device runtime on a real GPU: budgets, pools, buffers, copies, streams, events, cuBLAS.
// Every test skips with a reason when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/fill.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/random.hpp"

namespace gale::kernels::cuda {
namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;

class GpuRuntime : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  }
};

TEST_F(GpuRuntime, BudgetExceededThrowsBeforeTouchingTheDevice) {
  MemoryPool pool(0, 1 * kMiB, "1M");
  Stream stream(0);
  DeviceBuffer<uint8_t> held(pool, 768 * kKiB, stream);
  const uint64_t reserved_before = pool.reserved();
  try {
    DeviceBuffer<uint8_t> refused(pool, 512 * kKiB, stream);
    FAIL() << "allocation past the budget did not throw";
  } catch (const ResourceError& e) {
    EXPECT_STREQ(e.what(), "--gpu-mem-budget 1M exceeded: allocating 512 KiB with 768 KiB in use");
  }
  EXPECT_EQ(pool.in_use(), 768 * kKiB);
  EXPECT_EQ(pool.reserved(), reserved_before);
  DeviceBuffer<uint8_t> fits(pool, 256 * kKiB, stream);  // exactly up to the budget is allowed
  EXPECT_EQ(pool.in_use(), 1 * kMiB);
}

// Within the budget (none here) but more than the device has: exit 4's ResourceError, saying
// what the device has free and in all, the pool left as it was.
TEST_F(GpuRuntime, MoreThanTheDeviceHasIsAResourceErrorSayingWhatItHas) {
  MemoryPool pool(0);
  Stream stream(0);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  try {
    // A petabyte: refused at once, where a request just above the device's size would hold most
    // of its memory while the driver fails it, and starve other processes' tests.
    DeviceBuffer<uint8_t> refused(pool, std::max<uint64_t>(total_bytes, uint64_t{1} << 50), stream);
    FAIL() << "an allocation larger than the device did not throw";
  } catch (const ResourceError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("cuda:0 out of memory: allocating ", 0), 0u) << what;
    EXPECT_NE(what.find(" free of the device's "), std::string::npos) << what;
    EXPECT_NE(what.find("the run needs more GPU memory than is free"), std::string::npos) << what;
  }
  EXPECT_EQ(pool.in_use(), 0u);
  DeviceBuffer<uint8_t> fits(pool, kMiB, stream);  // the pool still works
  EXPECT_EQ(pool.in_use(), kMiB);
}

TEST_F(GpuRuntime, PeakIsTheHighWaterMarkOfLiveBytes) {
  MemoryPool pool(0);
  Stream stream(0);
  DeviceBuffer<float> a(pool, kMiB / sizeof(float), stream);
  {
    DeviceBuffer<float> b(pool, 2 * kMiB / sizeof(float), stream);
    EXPECT_EQ(pool.in_use(), 3 * kMiB);
  }
  DeviceBuffer<float> c(pool, 512 * kKiB / sizeof(float), stream);
  EXPECT_EQ(pool.in_use(), 1 * kMiB + 512 * kKiB);
  EXPECT_EQ(pool.peak(), 3 * kMiB);
  pool.reset_peak();
  EXPECT_EQ(pool.peak(), pool.in_use());
}

TEST_F(GpuRuntime, FreedBuffersReturnInUseToZeroAndTheirMemoryIsReused) {
  MemoryPool pool(0);
  Stream stream(0);
  {
    DeviceBuffer<int64_t> a(pool, 1000, stream);
    DeviceBuffer<int64_t> moved(std::move(a));
    EXPECT_TRUE(a.empty());
    DeviceBuffer<int64_t> b(pool, 3000, stream);
    b = std::move(moved);  // frees b's 3000 elements, takes a's 1000
    EXPECT_EQ(pool.in_use(), 1000 * sizeof(int64_t));
    DeviceBuffer<int64_t> c(pool, 0, stream);
    EXPECT_EQ(c.data(), nullptr);
  }
  EXPECT_EQ(pool.in_use(), 0u);

  // The release threshold keeps freed memory in the pool across synchronisations, so a second
  // round of the same allocations needs nothing new from the driver.
  { DeviceBuffer<uint8_t> first(pool, 64 * kMiB, stream); }
  stream.synchronize();
  const uint64_t reserved = pool.reserved();
  EXPECT_GE(reserved, 64 * kMiB);
  { DeviceBuffer<uint8_t> second(pool, 64 * kMiB, stream); }
  stream.synchronize();
  EXPECT_EQ(pool.reserved(), reserved);
  EXPECT_EQ(pool.in_use(), 0u);
}

TEST_F(GpuRuntime, BlocksFreedOnACachingStreamServeItsNextAllocationsInSizeClasses) {
  MemoryPool pool(0);
  Stream cached(0), plain(0);
  pool.cache_frees_on(cached);
  void* first = pool.allocate(1000, cached);
  EXPECT_EQ(pool.in_use(), 1024u);  // the class is charged: 1000 bytes round to 1024
  pool.deallocate(first, 1000, cached);
  EXPECT_EQ(pool.in_use(), 0u);
  EXPECT_EQ(pool.cached_bytes(), 1024u);
  void* second = pool.allocate(900, cached);  // the same class: the kept block, no driver call
  EXPECT_EQ(second, first);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.counts().allocations, 2u);
  EXPECT_EQ(pool.counts().reused, 1u);
  // Another stream neither rounds nor takes kept blocks; a block of the caching stream freed on
  // another stream is not kept.
  void* other = pool.allocate(1000, plain);
  EXPECT_EQ(pool.in_use(), 1024u + 1000u);
  pool.deallocate(other, 1000, plain);
  pool.deallocate(second, 900, plain);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.in_use(), 0u);
  // Classes: 256 bytes at least, an eighth of a power of two apart, exact past kMaxCachedBlock.
  const std::pair<size_t, size_t> classes[] = {{1, 256}, {256, 256}, {257, 512}, {4096, 4096}, {4097, 4608},
                                               {5000, 5120}, {(size_t{3} << 20) + 1, (size_t{3} << 20) + 256 * kKiB},
                                               {MemoryPool::kMaxCachedBlock + 1, MemoryPool::kMaxCachedBlock + 1}};
  for (const auto& [bytes, cls] : classes) {
    void* p = pool.allocate(bytes, cached);
    EXPECT_EQ(pool.in_use(), cls) << bytes;
    pool.deallocate(p, bytes, cached);
  }
  EXPECT_EQ(pool.in_use(), 0u);
  cached.synchronize();
}

TEST_F(GpuRuntime, AnotherCachingStreamTakesAKeptBlockOnlyOnceItsFreeHasFinished) {
  MemoryPool pool(0);
  Stream a(0), b(0);
  pool.cache_frees_on(a);
  pool.cache_frees_on(b);
  void* block = pool.allocate(4000, a);
  fill<int32_t>(static_cast<int32_t*>(block), 1000, 7, a);
  pool.deallocate(block, 4000, a);
  // Nothing tells yet whether a's free has happened: a new block (the try seals a's frees).
  void* early = pool.allocate(4000, b);
  EXPECT_NE(early, block);
  a.synchronize();
  void* later = pool.allocate(4000, b);  // the sealed generation has finished now
  EXPECT_EQ(later, block);
  EXPECT_EQ(pool.counts().reused, 1u);
  pool.deallocate(early, 4000, b);
  pool.deallocate(later, 4000, b);
  void* own = pool.allocate(4000, b);  // b's own kept blocks come back at once
  EXPECT_TRUE(own == early || own == later);
  pool.deallocate(own, 4000, b);
  pool.stop_caching(a);
  pool.stop_caching(b);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  b.synchronize();
}

TEST_F(GpuRuntime, KeptBlocksGiveWayToLiveOnesUnderTheBudgetAndWhenTheStreamStopsCaching) {
  MemoryPool pool(0, 16 * kMiB, "16M");  // keeps at most a quarter of the budget: 4 MiB
  Stream stream(0);
  pool.cache_frees_on(stream);
  { DeviceBuffer<uint8_t> a(pool, 3 * kMiB, stream); }
  EXPECT_EQ(pool.cached_bytes(), 3 * kMiB);
  { DeviceBuffer<uint8_t> too_many(pool, 5 * kMiB, stream); }  // would pass the 4 MiB kept: freed
  EXPECT_EQ(pool.cached_bytes(), 3 * kMiB);
  {
    // 14 MiB live with 3 MiB kept would pass the budget: the kept block goes back first.
    DeviceBuffer<uint8_t> big(pool, 14 * kMiB, stream);
    EXPECT_EQ(pool.cached_bytes(), 0u);
    EXPECT_EQ(pool.in_use(), 14 * kMiB);
    EXPECT_THROW(DeviceBuffer<uint8_t>(pool, 3 * kMiB, stream), ResourceError);  // the budget still holds
  }
  EXPECT_EQ(pool.cached_bytes(), 0u);  // 14 MiB is past the 4 MiB the pool keeps
  { DeviceBuffer<uint8_t> b(pool, 2 * kMiB, stream); }
  EXPECT_EQ(pool.cached_bytes(), 2 * kMiB);
  pool.stop_caching(stream);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  { DeviceBuffer<uint8_t> c(pool, 2 * kMiB, stream); }
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.in_use(), 0u);
  stream.synchronize();
}

TEST_F(GpuRuntime, ThreadsReuseTheirStreamsKeptBlocksWithTheirDataIntact) {
  const uint64_t key = std::random_device{}();
  SCOPED_TRACE("random key " + std::to_string(key));
  MemoryPool pool(0, 256 * kMiB, "256M");
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Stream stream(0);
      pool.cache_frees_on(stream);
      std::mt19937_64 rng(key + static_cast<uint64_t>(t));
      for (int i = 0; i < 100; ++i) {
        const size_t n = 1 + rng() % (kMiB / 4);  // reuses across sizes of one class
        const auto value = static_cast<int32_t>(rng());
        DeviceBuffer<int32_t> buffer(pool, n, stream);
        fill<int32_t>(buffer.data(), n, value, stream);
        std::vector<int32_t> back(n);
        copy_to_host(back.data(), buffer.data(), n, stream);
        stream.synchronize();
        for (int32_t v : back) wrong[t] += v != value;
      }
      pool.stop_caching(stream);
      stream.synchronize();
    });
  }
  for (auto& thread : threads) thread.join();
  for (int w : wrong) EXPECT_EQ(w, 0);
  EXPECT_EQ(pool.in_use(), 0u);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_GT(pool.counts().reused, 0u);
}

TEST_F(GpuRuntime, RandomDataSurvivesARoundTripAndFillSetsOnlyItsRange) {
  const uint64_t key = std::random_device{}();
  SCOPED_TRACE("random key " + std::to_string(key));
  constexpr size_t kCount = 1'000'003;  // not a multiple of the block size
  std::vector<float> host(kCount);
  for (size_t i = 0; i < kCount; ++i) host[i] = random_uniform(key, i) * 2.0f - 1.0f;

  MemoryPool pool(0);
  Stream stream(0);
  DeviceBuffer<float> x = to_device(pool, host, stream);
  EXPECT_EQ(to_host_and_wait(x.view(), stream), host);

  const size_t begin = kCount / 3, count = kCount / 4;
  fill(x.data() + begin, count, 7.5f, stream);
  for (size_t i = begin; i < begin + count; ++i) host[i] = 7.5f;
  EXPECT_EQ(to_host_and_wait(x.view(), stream), host);

  DeviceBuffer<int64_t> ids(pool, 4097, stream);
  fill<int64_t>(ids.data(), ids.size(), -1, stream);
  EXPECT_EQ(to_host_and_wait(ids.view(), stream), std::vector<int64_t>(4097, -1));
}

TEST_F(GpuRuntime, EventsTimeStreamWorkAndOrderOtherStreams) {
  MemoryPool pool(0);
  Stream producer(0), consumer(0);
  constexpr size_t kCount = size_t{64} << 20;  // 256 MiB of floats: long enough to time
  DeviceBuffer<float> x(pool, kCount, producer);
  Event start(0, Event::Timing::kEnabled), end(0, Event::Timing::kEnabled);
  start.record(producer);
  fill(x.data(), kCount, 3.0f, producer);
  end.record(producer);

  // The consumer copies the tail only after the producer's fill, without the host waiting.
  Event filled(0);
  filled.record(producer);
  consumer.wait(filled);
  std::vector<float> tail(1024);
  copy_to_host(tail.data(), x.data() + kCount - tail.size(), tail.size(), consumer);
  consumer.synchronize();
  EXPECT_EQ(tail, std::vector<float>(1024, 3.0f));

  const float ms = elapsed_ms(start, end);
  EXPECT_GT(ms, 0.0f);
  EXPECT_LT(ms, 10'000.0f);
  EXPECT_TRUE(end.ready());
}

// A failed call is reported once: its DeviceError. The error it left as the thread's last error is
// cleared, so the next launch's check (cudaGetLastError) does not blame an unrelated kernel where the
// caller goes on (seen in the multi-GPU suite: one test's failed copy failed the next test's gather).
TEST_F(GpuRuntime, AFailedCallIsReportedOnceAndNotAgainByTheNextLaunch) {
  MemoryPool pool(0);
  Stream stream(0);
  DeviceBuffer<float> x(pool, 1024, stream);
  const auto bad_direction = static_cast<cudaMemcpyKind>(42);
  EXPECT_THROW(GALE_CHECK_CUDA(cudaMemcpyAsync(x.data(), x.data(), 16, bad_direction, stream)), DeviceError);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  fill(x.data(), 1024, 3.0f, stream);  // its launch check reads the last error
  std::vector<float> back(1024);
  copy_to_host(back.data(), x.data(), 1024, stream);
  stream.synchronize();
  EXPECT_EQ(back.front(), 3.0f);
  EXPECT_EQ(back.back(), 3.0f);
}

// A high-priority stream (the training step's) gets the device's greatest priority, a normal one
// (the sampler's, the feature loads') the default, and work on both still completes in order.
TEST_F(GpuRuntime, HighPriorityStreamsTakeTheDevicesGreatestPriority) {
  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  Stream high(0, Stream::Priority::kHigh), normal(0);
  int p_high = 1, p_normal = 1;
  ASSERT_EQ(cudaStreamGetPriority(high, &p_high), cudaSuccess);
  ASSERT_EQ(cudaStreamGetPriority(normal, &p_normal), cudaSuccess);
  EXPECT_EQ(p_high, greatest);
  EXPECT_EQ(p_normal, least);
  EXPECT_LT(greatest, least);  // numerically lower is more urgent; Hopper has several levels

  MemoryPool pool(0);
  constexpr size_t kCount = size_t{1} << 20;
  DeviceBuffer<float> x(pool, kCount, normal);
  fill(x.data(), kCount, 1.0f, normal);
  Event filled(0);
  filled.record(normal);
  high.wait(filled);
  fill(x.data() + kCount / 2, kCount / 2, 2.0f, high);
  std::vector<float> back(kCount);
  copy_to_host(back.data(), x.data(), kCount, high);
  high.synchronize();
  EXPECT_EQ(back[kCount / 2 - 1], 1.0f);
  EXPECT_EQ(back[kCount / 2], 2.0f);
  EXPECT_EQ(back.back(), 2.0f);
}

TEST_F(GpuRuntime, CublasWorkspaceIsChargedToThePool) {
  MemoryPool pool(0);
  Stream stream(0);
  {
    CublasHandle cublas(stream, pool);
    EXPECT_EQ(pool.in_use(), CublasHandle::kDefaultWorkspaceBytes);
    // C = A·B with 2×2 column-major matrices: [1 3; 2 4]·[5 7; 6 8] = [23 31; 34 46].
    DeviceBuffer<float> a = to_device(pool, std::vector<float>{1, 2, 3, 4}, stream);
    DeviceBuffer<float> b = to_device(pool, std::vector<float>{5, 6, 7, 8}, stream);
    DeviceBuffer<float> c(pool, 4, stream);
    const float alpha = 1.0f, beta = 0.0f;
    GALE_CHECK_CUBLAS(cublasSgemm(cublas, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, a.data(), 2,
                                  b.data(), 2, &beta, c.data(), 2));
    EXPECT_EQ(to_host_and_wait(c.view(), stream), (std::vector<float>{23, 34, 31, 46}));
  }
  EXPECT_EQ(pool.in_use(), 0u);
}

TEST_F(GpuRuntime, ConcurrentAllocationsFromManyThreadsStayWithinTheBudget) {
  constexpr uint64_t kBudget = 64 * kMiB;
  MemoryPool pool(0, kBudget);
  std::vector<std::thread> threads;
  std::vector<int> refused(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, &refused, t] {
      Stream stream(0);
      for (int i = 0; i < 200; ++i) {
        try {
          DeviceBuffer<uint8_t> buffer(pool, 12 * kMiB, stream);
          fill<uint8_t>(buffer.data(), buffer.size(), 1, stream);
        } catch (const ResourceError&) {
          ++refused[t];
        }
      }
      stream.synchronize();
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(pool.in_use(), 0u);
  EXPECT_LE(pool.peak(), kBudget);
  for (int r : refused) EXPECT_EQ(r, 0);  // 4 threads × 12 MiB always fit in 64 MiB
}

TEST_F(GpuRuntime, ASecondPoolOnOneDeviceIsABug) {
  MemoryPool pool(0);
  EXPECT_THROW(MemoryPool second(0), InternalError);
}

TEST_F(GpuRuntime, MissingDeviceIsADeviceError) {
  EXPECT_THROW(require_device(99), DeviceError);
  EXPECT_THROW(Stream stream(99), DeviceError);
  EXPECT_THROW(MemoryPool pool(99), DeviceError);
}

TEST_F(GpuRuntime, DeviceInfoDescribesDeviceZero) {
  const DeviceInfo info = device_info(0);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.total_memory, 0u);
  EXPECT_GT(info.multiprocessors, 0);
  EXPECT_GE(info.compute_major, 7);
}

}  // namespace
}  // namespace gale::kernels::cuda
