// What the process may use of host memory: MemAvailable and the cgroup limit read from fake
// /proc and /sys trees for each cgroup layout (v2, v1, hybrid, none), the default budget's
// arithmetic, and one look at the real machine.
#include <gtest/gtest.h>

#include "storage/host_memory.hpp"
#include "tests/storage/test_files.hpp"

namespace gale::storage {
namespace {

using testing::TempDir;
using testing::write_text;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

void write_meminfo(const TempDir& root, const std::string& available_kb) {
  write_text(root / "proc/meminfo",
             "MemTotal:       65536000 kB\nMemFree:         1000000 kB\nMemAvailable:   " + available_kb +
                 " kB\nBuffers:          100000 kB\n");
}

// A unified (v2-only) machine: the process sits in /user.slice/job, whose memory.max is `max`.
void write_v2(const TempDir& root, const std::string& max, const std::string& current) {
  write_text(root / "proc/self/cgroup", "0::/user.slice/job\n");
  write_text(root / "proc/self/mountinfo",
             "24 1 0:22 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n");
  write_text(root / "sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n");
  write_text(root / "sys/fs/cgroup/user.slice/job/memory.max", max + "\n");
  write_text(root / "sys/fs/cgroup/user.slice/job/memory.current", current + "\n");
}

// A v1 machine (with the hybrid's empty unified hierarchy, which must not be taken for v2).
void write_v1(const TempDir& root, const std::string& limit, const std::string& usage) {
  write_text(root / "proc/self/cgroup", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n");
  write_text(root / "proc/self/mountinfo",
             "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
             "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
             "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
  write_text(root / "sys/fs/cgroup/unified/cgroup.controllers", "\n");
  write_text(root / "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  write_text(root / "sys/fs/cgroup/memory/memory.usage_in_bytes", "999999999\n");
  write_text(root / "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", limit + "\n");
  write_text(root / "sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", usage + "\n");
}

TEST(HostMemory, CgroupV2LimitAndUsageAreRead) {
  TempDir root;
  write_meminfo(root, "20971520");  // 20 GiB
  write_v2(root, std::to_string(8 * kGiB), std::to_string(kGiB + kGiB / 4));
  const HostMemory m = detect_host_memory(root.path());
  EXPECT_EQ(m.mem_available, 20 * kGiB);
  EXPECT_EQ(m.cgroup_version, 2);
  EXPECT_EQ(m.cgroup_path, "/user.slice/job");
  EXPECT_EQ(m.cgroup_limit, 8 * kGiB);
  EXPECT_EQ(m.cgroup_usage, kGiB + kGiB / 4);
  EXPECT_EQ(describe(m), "MemAvailable 20 GiB, cgroup v2 limit 8 GiB (1.2 GiB used)");
}

// Page cache charged to the cgroup is reclaimed before the OOM killer comes: it is not counted as
// used (a store's topology just copied to a GPU through the page cache must not shrink the budget).
TEST(HostMemory, CgroupPageCacheIsNotCountedAsUsed) {
  TempDir root;
  write_meminfo(root, "20971520");
  write_v2(root, std::to_string(8 * kGiB), std::to_string(5 * kGiB));
  write_text(root / "sys/fs/cgroup/user.slice/job/memory.stat",
             "anon 1073741824\nfile 4294967296\nactive_file 1073741824\ninactive_file 3221225472\nshmem 0\n");
  const HostMemory m = detect_host_memory(root.path());
  EXPECT_EQ(m.cgroup_usage, 5 * kGiB);
  EXPECT_EQ(m.cgroup_page_cache, 4 * kGiB);
  EXPECT_EQ(describe(m), "MemAvailable 20 GiB, cgroup v2 limit 8 GiB (5 GiB used, 4 GiB of it page cache)");
  // 8 GiB less the 1 GiB not page cache, less a tenth.
  EXPECT_EQ(default_host_budget(m), 7 * kGiB - 7 * kGiB / 10);
  // A malformed or larger-than-usage figure never makes the usage negative.
  write_text(root / "sys/fs/cgroup/user.slice/job/memory.stat", "active_file 99999999999999\ninactive_file x\n");
  EXPECT_EQ(detect_host_memory(root.path()).cgroup_page_cache, 5 * kGiB);

  TempDir v1;
  write_meminfo(v1, "20971520");
  write_v1(v1, std::to_string(6 * kGiB), std::to_string(3 * kGiB));
  write_text(v1 / "sys/fs/cgroup/memory/docker/abc/memory.stat",
             "cache 2147483648\nactive_file 1\ninactive_file 1\ntotal_active_file 1073741824\ntotal_inactive_file 1073741824\n");
  const HostMemory m1 = detect_host_memory(v1.path());
  EXPECT_EQ(m1.cgroup_page_cache, 2 * kGiB);
  EXPECT_EQ(default_host_budget(m1), 5 * kGiB - 5 * kGiB / 10);

}

TEST(HostMemory, CgroupV2MaxMeansNoLimit) {
  TempDir root;
  write_meminfo(root, "20971520");
  write_v2(root, "max", "4096");
  const HostMemory m = detect_host_memory(root.path());
  EXPECT_EQ(m.cgroup_version, 2);
  EXPECT_EQ(m.cgroup_limit, 0u);
  EXPECT_EQ(m.cgroup_usage, 4096u);
  EXPECT_EQ(describe(m), "MemAvailable 20 GiB, cgroup v2 no limit");
  EXPECT_EQ(default_host_budget(m), 18 * kGiB);
}

TEST(HostMemory, CgroupV2AncestorsTightestLimitApplies) {
  TempDir root;
  write_meminfo(root, "20971520");
  write_v2(root, "max", "4096");
  write_text(root / "sys/fs/cgroup/user.slice/memory.max", std::to_string(2 * kGiB));
  write_text(root / "sys/fs/cgroup/user.slice/memory.current", std::to_string(kGiB));
  const HostMemory m = detect_host_memory(root.path());
  EXPECT_EQ(m.cgroup_limit, 2 * kGiB);
  EXPECT_EQ(m.cgroup_usage, kGiB);
}

TEST(HostMemory, CgroupV2WithoutMountinfoUsesTheUsualMount) {
  TempDir root;
  write_meminfo(root, "20971520");
  write_v2(root, std::to_string(3 * kGiB), "0");
  std::filesystem::remove(root / "proc/self/mountinfo");
  EXPECT_EQ(detect_host_memory(root.path()).cgroup_limit, 3 * kGiB);
}

TEST(HostMemory, CgroupInvisibleToTheContainerFallsBackToTheMountRoot) {
  TempDir root;
  write_meminfo(root, "20971520");
  write_text(root / "proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  write_text(root / "proc/self/mountinfo", "24 1 0:22 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n");
  write_text(root / "sys/fs/cgroup/cgroup.controllers", "memory pids\n");
  write_text(root / "sys/fs/cgroup/memory.max", std::to_string(4 * kGiB));
  write_text(root / "sys/fs/cgroup/memory.current", std::to_string(kGiB));
  const HostMemory m = detect_host_memory(root.path());
  EXPECT_EQ(m.cgroup_version, 2);
  EXPECT_EQ(m.cgroup_limit, 4 * kGiB);
  EXPECT_EQ(m.cgroup_usage, kGiB);
}

TEST(HostMemory, CgroupV1LimitIsReadOnAHybridMachine) {
  TempDir root;
  write_meminfo(root, "20971520");
  write_v1(root, std::to_string(6 * kGiB), std::to_string(512 * kMiB));
  const HostMemory m = detect_host_memory(root.path());
  EXPECT_EQ(m.cgroup_version, 1);
  EXPECT_EQ(m.cgroup_path, "/docker/abc");
  EXPECT_EQ(m.cgroup_limit, 6 * kGiB);
  EXPECT_EQ(m.cgroup_usage, 512 * kMiB);
  EXPECT_EQ(describe(m), "MemAvailable 20 GiB, cgroup v1 limit 6 GiB (512 MiB used)");
}

TEST(HostMemory, CgroupV1HugeLimitMeansUnlimited) {
  TempDir root;
  write_meminfo(root, "20971520");
  write_v1(root, "9223372036854771712", "1000");
  const HostMemory m = detect_host_memory(root.path());
  EXPECT_EQ(m.cgroup_version, 1);
  EXPECT_EQ(m.cgroup_limit, 0u);
  EXPECT_EQ(m.cgroup_usage, 1000u);
  EXPECT_EQ(describe(m), "MemAvailable 20 GiB, cgroup v1 no limit");
}

TEST(HostMemory, NoCgroupFilesLeaveTheCgroupFieldsZero) {
  TempDir root;
  write_meminfo(root, "1048576");
  const HostMemory m = detect_host_memory(root.path());
  EXPECT_EQ(m.mem_available, kGiB);
  EXPECT_EQ(m.cgroup_version, 0);
  EXPECT_EQ(m.cgroup_limit, 0u);
  EXPECT_EQ(m.cgroup_usage, 0u);
  EXPECT_EQ(describe(m), "MemAvailable 1 GiB, no cgroup memory controller found");
}

TEST(HostMemory, MissingMeminfoLeavesMemAvailableZero) {
  TempDir root;
  write_v2(root, std::to_string(8 * kGiB), "0");
  const HostMemory m = detect_host_memory(root.path());
  EXPECT_EQ(m.mem_available, 0u);
  EXPECT_EQ(m.cgroup_limit, 8 * kGiB);
  EXPECT_EQ(describe(m), "MemAvailable unknown, cgroup v2 limit 8 GiB (0 B used)");
}

TEST(HostMemory, MalformedNumbersAreIgnored) {
  TempDir root;
  write_meminfo(root, "12x34");
  write_v2(root, "8G", "-1");
  const HostMemory m = detect_host_memory(root.path());
  EXPECT_EQ(m.mem_available, 0u);
  EXPECT_EQ(m.cgroup_version, 2);
  EXPECT_EQ(m.cgroup_limit, 0u);
  EXPECT_EQ(m.cgroup_usage, 0u);
}

TEST(HostMemory, AnEmptyTreeIsNotAnError) {
  TempDir root;
  const HostMemory m = detect_host_memory(root.path() / "does-not-exist");
  EXPECT_EQ(m.mem_available, 0u);
  EXPECT_EQ(m.cgroup_version, 0);
  EXPECT_EQ(default_host_budget(m), 0u);
}

TEST(DefaultHostBudget, ReservesTenPercentOfLargeFigures) {
  HostMemory m;
  m.mem_available = 20 * kGiB;
  EXPECT_EQ(default_host_budget(m), 18 * kGiB);
}

TEST(DefaultHostBudget, ReservesAtLeast256MiB) {
  HostMemory m;
  m.mem_available = kGiB;  // 10 % would be 102.4 MiB
  EXPECT_EQ(default_host_budget(m), kGiB - 256 * kMiB);
  m.mem_available = 200 * kMiB;
  EXPECT_EQ(default_host_budget(m), 0u);
}

TEST(DefaultHostBudget, CgroupHeadroomBelowMemAvailableWins) {
  HostMemory m;
  m.mem_available = 20 * kGiB;
  m.cgroup_version = 2;
  m.cgroup_limit = 8 * kGiB;
  m.cgroup_usage = 3 * kGiB;
  EXPECT_EQ(default_host_budget(m), 9 * kGiB / 2);
  m.cgroup_limit = 40 * kGiB;  // MemAvailable is then the smaller
  EXPECT_EQ(default_host_budget(m), 18 * kGiB);
}

TEST(DefaultHostBudget, UsageAtTheLimitLeavesNothing) {
  HostMemory m;
  m.mem_available = 20 * kGiB;
  m.cgroup_limit = 2 * kGiB;
  m.cgroup_usage = 3 * kGiB;
  EXPECT_EQ(default_host_budget(m), 0u);
}

TEST(DefaultHostBudget, CgroupAloneWhenMemAvailableIsUnknown) {
  HostMemory m;
  m.cgroup_limit = 10 * kGiB;
  EXPECT_EQ(default_host_budget(m), 9 * kGiB);
}

TEST(HostMemory, ThisMachineHasMemoryAvailableAndABudgetWithinIt) {
  const HostMemory m = detect_host_memory();
  EXPECT_GT(m.mem_available, 0u) << describe(m);
  EXPECT_LE(default_host_budget(m), m.mem_available) << describe(m);
  RecordProperty("host_memory", describe(m));
}

// The run's processes on one host (mpirun's, or gale train --processes) split the default budget:
// each measured the same memory at start-up. A budget given on the command line is each one's.
TEST(HostMemory, TheDefaultBudgetIsSplitAmongTheHostsProcesses) {
  const auto given = make_host_budget(uint64_t{1} << 30, "1G", 4);
  EXPECT_EQ(given->limit(), uint64_t{1} << 30);
  const auto shared = make_host_budget(0, "", 2);
  if (shared->limit() == kernels::cuda::MemoryBudget::kUnlimited) GTEST_SKIP() << "no MemAvailable or cgroup limit here";
  EXPECT_NE(shared->limit_text().find("shared by the run's 2 processes on this host"), std::string::npos)
      << shared->limit_text();
  const auto alone = make_host_budget(0, "", 1);
  EXPECT_EQ(alone->limit_text().find("shared by"), std::string::npos) << alone->limit_text();
  EXPECT_LT(shared->limit(), alone->limit() * 3 / 4);  // about half (MemAvailable moves between reads)
}

}  // namespace
}  // namespace gale::storage
