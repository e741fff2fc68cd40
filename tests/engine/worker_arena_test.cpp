// Where a worker's host threads run (engine/worker_arena.hpp): cpulist text both ways, the shares
// of the cores (by NUMA pool, whole cores, in rank order), the policy switch, and an arena that
// pins its threads while they work in it and gives the caller its own affinity back.
#include <gtest/gtest.h>
#include <sched.h>
#include <tbb/parallel_for.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>

#include "engine/worker_arena.hpp"
#include "kernels/error.hpp"

namespace gale::engine {
namespace {

CpuList range(int first, int last) {
  CpuList out;
  for (int c = first; c <= last; ++c) out.push_back(c);
  return out;
}

CpuList concat(CpuList a, const CpuList& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Two sockets of 8 cores with 2 hyperthreads each, Linux's numbering: CPU c and c + 16 share a core.
int hyperthread_core(int cpu) { return cpu % 16; }

TEST(CpuList, ParsesAndFormatsTheKernelsRanges) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (CpuList{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), (CpuList{5}));
  EXPECT_EQ(parse_cpu_list(" 2-3 , 1 "), (CpuList{1, 2, 3}));
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_cpu_list({}), "");
  for (const char* bad : {"", "x", "3-1", "1-", "-2", "1,,2", "0-99999999", "1x"}) EXPECT_TRUE(parse_cpu_list(bad).empty()) << bad;
}

TEST(ShareCpus, GpusOnOneNodeSplitItsWholeCoresInRankOrder) {
  const CpuList node0 = concat(range(0, 7), range(16, 23)), node1 = concat(range(8, 15), range(24, 31));
  const CpuList all = range(0, 31);
  const std::vector<CpuList> shares = share_cpus({node0, node0, node1, node1}, all, hyperthread_core);
  ASSERT_EQ(shares.size(), 4u);
  EXPECT_EQ(shares[0], concat(range(0, 3), range(16, 19)));  // both hyperthreads of cores 0-3
  EXPECT_EQ(shares[1], concat(range(4, 7), range(20, 23)));
  EXPECT_EQ(shares[2], concat(range(8, 11), range(24, 27)));
  EXPECT_EQ(shares[3], concat(range(12, 15), range(28, 31)));
}

TEST(ShareCpus, UnknownPlacementSplitsTheAllowedCpus) {
  const std::vector<CpuList> shares = share_cpus({{}, {}, {}}, range(0, 6), [](int c) { return c; });
  EXPECT_EQ(shares[0], range(0, 1));
  EXPECT_EQ(shares[1], range(2, 3));
  EXPECT_EQ(shares[2], range(4, 6));
  // Near CPUs the process may not use count as unknown.
  EXPECT_EQ(share_cpus({range(10, 11)}, range(0, 3), [](int c) { return c; })[0], range(0, 3));
  // Those it may use are the pool.
  EXPECT_EQ(share_cpus({range(2, 11)}, range(0, 3), [](int c) { return c; })[0], range(2, 3));
}

TEST(ShareCpus, MoreWorkersThanCoresShareThemRoundRobin) {
  const std::vector<CpuList> shares = share_cpus({{}, {}, {}}, {0, 1}, [](int c) { return c; });
  EXPECT_EQ(shares[0], CpuList{0});
  EXPECT_EQ(shares[1], CpuList{1});
  EXPECT_EQ(shares[2], CpuList{0});
  EXPECT_TRUE(share_cpus({{}}, {}, [](int c) { return c; })[0].empty());
}

TEST(WorkerThreads, PolicyComesFromTheEnvironment) {
  ::unsetenv("GALE_WORKER_THREADS");
  EXPECT_EQ(worker_threads_from_env(/*gpu_workers=*/true), WorkerThreads::kPinned);  // measured fastest
  EXPECT_EQ(worker_threads_from_env(/*gpu_workers=*/false), WorkerThreads::kShared);
  ::setenv("GALE_WORKER_THREADS", "shared", 1);
  EXPECT_EQ(worker_threads_from_env(true), WorkerThreads::kShared);
  ::setenv("GALE_WORKER_THREADS", "arenas", 1);
  EXPECT_EQ(worker_threads_from_env(false), WorkerThreads::kArenas);
  ::setenv("GALE_WORKER_THREADS", "pinned", 1);
  EXPECT_EQ(worker_threads_from_env(false), WorkerThreads::kPinned);
  ::setenv("GALE_WORKER_THREADS", "numa", 1);
  EXPECT_THROW(worker_threads_from_env(true), InputError);
  ::unsetenv("GALE_WORKER_THREADS");
  EXPECT_STREQ(worker_threads_name(WorkerThreads::kArenas), "arenas");
}

TEST(WorkerArena, PinsItsThreadsWhileTheyWorkAndRestoresTheCaller) {
  const CpuList before = allowed_cpus();
  ASSERT_FALSE(before.empty());
  // Two of the CPUs where there are more (so TBB's threads join the arena), else one.
  const CpuList mine = before.size() >= 3 ? CpuList{before[1], before[2]} : CpuList{before.back()};
  WorkerArena arena(mine, /*pin=*/true);
  EXPECT_TRUE(arena.pinned());
  EXPECT_EQ(arena.describe(), "cpus " + format_cpu_list(mine) + " pinned");
  std::atomic<int> outside{0};
  arena.execute([&] {
    EXPECT_EQ(allowed_cpus(), mine);
    tbb::parallel_for(0, 64, [&](int) {
      if (allowed_cpus() != mine) ++outside;
    });
  });
  EXPECT_EQ(outside.load(), 0);
  EXPECT_EQ(allowed_cpus(), before);
  // An exception leaves the arena, and the caller's affinity, as it found them.
  EXPECT_THROW(arena.execute([] { throw std::runtime_error("worker failed"); }), std::runtime_error);
  EXPECT_EQ(allowed_cpus(), before);
}

TEST(WorkerArena, UnpinnedArenaIsAsWideAsItsShare) {
  const CpuList before = allowed_cpus();
  WorkerArena arena(before, /*pin=*/false);
  EXPECT_FALSE(arena.pinned());
  int concurrency = 0;
  arena.execute([&] { concurrency = tbb::this_task_arena::max_concurrency(); });
  EXPECT_EQ(concurrency, static_cast<int>(before.size()));
  EXPECT_EQ(allowed_cpus(), before);
}

}  // namespace
}  // namespace gale::engine
