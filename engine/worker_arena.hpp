// engine/worker_arena.hpp — where a data-parallel worker's host threads run. Each worker of a
// mini-batch run trains its epoch (pipeline, sampler, feature reads, the step's launches and
// syncs) inside a TBB arena of its own, as wide as its share of the cores, and by default its
// threads are pinned to that share: the cores of its GPU's NUMA node (the PCI device's
// local_cpulist in sysfs), split by whole cores among the run's GPUs of the host on that node
// (CPU workers keep TBB's default arenas unless asked: engine/train/replicas.cpp says why).
//
//   const std::vector<CpuList> shares = gpu_worker_cpus(run_gpus);
//   WorkerArena arena(shares[w], /*pin=*/true);
//   arena.execute([&] { train_worker(w); });   // the calling thread, and TBB's threads in the
//                                               // arena, run on shares[w]; restored after
//
// Why: without it, each worker thread's pipeline is an implicit arena as wide as the machine,
// served by one pool of TBB threads that move between the workers' arenas and across sockets, so
// one worker's sampling and feature reads run on cores another worker just used, far from its
// GPU. GALE_WORKER_THREADS picks the policy, for measuring what it buys (engine/train/replicas.cpp).
#pragma once

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gale::engine {

// GALE_WORKER_THREADS: "shared" (TBB's default arenas, the layout before per-worker arenas),
// "arenas" (one arena per worker, as wide as its share, threads unpinned) or "pinned" (the same
// arenas, a GPU worker's threads pinned to its share; CPU workers' stay unpinned). Unset: pinned
// for GPU workers (the fastest measured on 2 and 4 GPUs), shared for CPU workers. InputError on
// another value.
enum class WorkerThreads { kShared, kArenas, kPinned };
WorkerThreads worker_threads_from_env(bool gpu_workers);
const char* worker_threads_name(WorkerThreads policy);

// CPU ids, ascending and distinct.
using CpuList = std::vector<int>;

// "0-3,8,10-11" (the kernel's cpulist format; blanks and a trailing newline allowed) -> ids;
// empty for empty or malformed text.
CpuList parse_cpu_list(const std::string& text);
// The inverse: ranges joined by commas ("0-3,8").
std::string format_cpu_list(const CpuList& cpus);

// What each worker gets, from `near` (per worker, in rank order: the CPUs close to its device,
// empty when unknown), the CPUs the process may use, and `core_of` (a CPU's physical core, so
// hyperthreads of one core go to one worker). Each worker's near CPUs that are allowed (all the
// allowed ones when none is) are its pool; workers with the same pool split it into runs of whole
// cores in rank order, sizes differing by at most one core (more workers than cores: core
// w mod cores). Never empty when `allowed` is not.
std::vector<CpuList> share_cpus(const std::vector<CpuList>& near, const CpuList& allowed,
                                const std::function<int(int)>& core_of);

// The machine's view, through sysfs and sched_getaffinity:
CpuList allowed_cpus();                 // the calling thread's affinity (the process's, before pinning)
int physical_core(int cpu);             // the first CPU of its thread_siblings_list, or cpu itself
CpuList gpu_near_cpus(int ordinal);     // its PCI device's local_cpulist, empty when unknown
int gpu_numa_node(int ordinal);         // its PCI device's numa_node, -1 when unknown
// Shares for GPU workers (`gpus`: every GPU the run trains on on this host, in rank order) and for
// the `host_workers` CPU workers of this host, in host order. The processes on a host compute the
// same shares (each takes its own workers'), so theirs do not overlap.
std::vector<CpuList> gpu_worker_cpus(const std::vector<int>& gpus);
std::vector<CpuList> cpu_worker_cpus(int host_workers);

class WorkerArena {
 public:
  // An arena of cpus.size() threads (at least 1); with `pin` every thread that works in it (the
  // one calling execute, and TBB's) is pinned to `cpus` while it does. A failed pin is ignored
  // (the CPUs are a hint: a cgroup may have taken some away).
  WorkerArena(CpuList cpus, bool pin);
  ~WorkerArena();
  WorkerArena(const WorkerArena&) = delete;
  WorkerArena& operator=(const WorkerArena&) = delete;

  // Runs f in the arena on the calling thread (its affinity restored after); rethrows what f throws.
  void execute(const std::function<void()>& f);

  const CpuList& cpus() const { return cpus_; }
  bool pinned() const { return pinning_ != nullptr; }
  // "cpus 0-15 pinned" / "cpus 0-15 (16 threads)".
  std::string describe() const;

 private:
  class Pinning;  // the observer that pins TBB's threads as they join and restores them as they leave
  CpuList cpus_;
  tbb::task_arena arena_;
  std::unique_ptr<Pinning> pinning_;
};

// TBB's worker threads, joined when this object goes (a program declares it first in main, so it
// goes last, after every arena). Those threads run the pipelines' stages, so each may hold
// thread-local cuBLASLt and cuSPARSE handles and the CUDA runtime's per-thread state. Left alone,
// oneTBB lets them exit while the process's static destructors run, and a thread whose
// thread-local destructors reach a library already torn down ended finished runs in "free():
// invalid pointer" and SIGABRT (one process on 2 H200s, 5 runs in 82, after the last epoch's
// metrics were written). Joined first, they end while everything they hold is alive.
class TbbThreadsJoinedAtExit {
 public:
  TbbThreadsJoinedAtExit() = default;
  ~TbbThreadsJoinedAtExit() { (void)join(); }
  TbbThreadsJoinedAtExit(const TbbThreadsJoinedAtExit&) = delete;
  TbbThreadsJoinedAtExit& operator=(const TbbThreadsJoinedAtExit&) = delete;

  // Joins them now. False, joining none, while an arena (or another thread in TBB) still lives.
  bool join() noexcept { return tbb::finalize(handle_, std::nothrow); }

 private:
  tbb::task_scheduler_handle handle_{tbb::attach{}};
};

}  // namespace gale::engine
