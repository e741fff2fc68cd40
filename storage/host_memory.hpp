// storage/host_memory.hpp — how much host memory this process may really use: the kernel's
// MemAvailable and the memory limit of the cgroup it runs in (v2 memory.max or v1
// memory.limit_in_bytes), and from them the default for `--host-mem-budget`.
//
// A container or a batch scheduler often grants far less than the machine has, and /proc/meminfo
// does not know: a budget from MemAvailable alone gets the process OOM-killed inside its cgroup.
// Sizes given on the command line go through apps::parse_size (apps/parse.cpp), as for
// --gpu-mem-budget.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "kernels/cuda/budget.hpp"

namespace gale::storage {

struct HostMemory {
  uint64_t mem_available = 0;  // /proc/meminfo MemAvailable in bytes; 0 = unknown
  uint64_t cgroup_limit = 0;   // the tightest memory limit of this cgroup and its ancestors; 0 = none
  uint64_t cgroup_usage = 0;   // memory.current (v2) / memory.usage_in_bytes (v1) of the cgroup
                               // that sets cgroup_limit, or of this process's cgroup without one
  uint64_t cgroup_page_cache = 0;  // of cgroup_usage, the page cache the kernel reclaims under the
                                   // limit (memory.stat active_file + inactive_file, v1: total_*)
  int cgroup_version = 0;      // 0: no memory controller found; 1 or 2
  std::string cgroup_path;     // this process's cgroup as /proc/self/cgroup names it ("/a/b")
};

// v1 reports "no limit" as a page-rounded 2^63 - 1; anything this large is treated as none.
inline constexpr uint64_t kCgroupV1Unlimited = uint64_t{1} << 60;

// Reads root/proc/meminfo, root/proc/self/cgroup and root/proc/self/mountinfo and the cgroup files
// under the mounts mountinfo names (root/sys/fs/cgroup for v2, root/sys/fs/cgroup/memory for v1
// when mountinfo is missing). `root` lets tests point at a fake tree. Never throws: a missing file
// or a malformed number leaves its field 0. A cgroup v2 hierarchy with the memory controller is
// preferred over v1; a cgroup directory that is not visible (a container without a cgroup
// namespace) falls back to the mount's root, which is then the container's own cgroup.
HostMemory detect_host_memory(const std::filesystem::path& root = "/");

// Reserve kept back from the available figure: the process's own code, libraries, allocator slack
// and the page cache it cannot avoid (npy headers, the graph files it streams) are not budgeted.
inline constexpr uint64_t kHostReserveMin = uint64_t{256} << 20;
inline constexpr uint64_t kHostReserveDivisor = 10;

// The default --host-mem-budget: the smaller of MemAvailable and the cgroup headroom
// (cgroup_limit - (cgroup_usage - cgroup_page_cache)), less a reserve of max(256 MiB, 10 %) of that
// figure; 0 when the figure is no larger than its reserve, or when neither MemAvailable nor a
// cgroup limit is known (then the caller has nothing to go on and should leave the budget
// unlimited or ask for one). The cgroup's page cache is not counted as used: the kernel reclaims
// it before it kills (a store whose files were just read, e.g. the topology copied to a GPU, would
// otherwise leave a budget smaller by their size, depending on what the process happened to read).
uint64_t default_host_budget(const HostMemory& m);

// A run's --host-mem-budget: `bytes` as the user gave them (`text` for messages), or, for 0, the
// default above (unlimited when neither MemAvailable nor a cgroup limit can be read; a default of
// 0 refuses every charge, naming the flag), split evenly among `sharing` processes of the run on
// this host, which all measured the same memory at start-up. A given budget is each process's.
std::unique_ptr<kernels::cuda::MemoryBudget> make_host_budget(uint64_t bytes, const std::string& text, int sharing = 1);

// "MemAvailable 21.3 GiB, cgroup v2 limit 8 GiB (1.2 GiB used)", "..., cgroup v1 no limit",
// "..., no cgroup memory controller found"; MemAvailable 0 reads "MemAvailable unknown".
std::string describe(const HostMemory& m);

}  // namespace gale::storage
