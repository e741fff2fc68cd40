#include "engine/worker_arena.hpp"

#include <sched.h>
#include <tbb/task_scheduler_observer.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "kernels/error.hpp"
#if GALE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gale::engine {

WorkerThreads worker_threads_from_env(bool gpu_workers) {
  const char* env = std::getenv("GALE_WORKER_THREADS");
  // Unset: pinned for GPU workers (measured on 4 H200s, R-MAT 23: 3.50x on 4 GPUs in one process
  // against shared's 2.99x, 1.82x against 1.77x on 2; docs/performance.md), shared for CPU workers
  // (engine/train/replicas.cpp says why).
  if (env == nullptr || *env == '\0') return gpu_workers ? WorkerThreads::kPinned : WorkerThreads::kShared;
  const std::string v = env;
  if (v == "shared") return WorkerThreads::kShared;
  if (v == "arenas") return WorkerThreads::kArenas;
  if (v == "pinned") return WorkerThreads::kPinned;
  throw InputError("GALE_WORKER_THREADS: expected shared, arenas or pinned, found '" + v + "'");
}

const char* worker_threads_name(WorkerThreads policy) {
  switch (policy) {
    case WorkerThreads::kShared: return "shared";
    case WorkerThreads::kArenas: return "arenas";
    case WorkerThreads::kPinned: return "pinned";
  }
  return "?";
}

CpuList parse_cpu_list(const std::string& text) {
  CpuList out;
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  if (s.empty()) return {};
  std::istringstream items(s);
  std::string item;
  // Far beyond any machine: a corrupt range must not allocate without bound.
  constexpr long kMaxCpu = 1 << 16;
  while (std::getline(items, item, ',')) {
    const size_t dash = item.find('-');
    char* end = nullptr;
    const long first = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || first < 0 || first > kMaxCpu) return {};
    long last = first;
    if (dash != std::string::npos) {
      const char* from = item.c_str() + dash + 1;
      last = std::strtol(from, &end, 10);
      if (end == from || static_cast<size_t>(end - item.c_str()) != item.size() || last < first || last > kMaxCpu) return {};
    } else if (*end != '\0') {
      return {};
    }
    for (long c = first; c <= last; ++c) out.push_back(static_cast<int>(c));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string format_cpu_list(const CpuList& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<CpuList> share_cpus(const std::vector<CpuList>& near, const CpuList& allowed,
                                const std::function<int(int)>& core_of) {
  const size_t n = near.size();
  std::vector<CpuList> pool(n);
  for (size_t i = 0; i < n; ++i) {
    std::set_intersection(near[i].begin(), near[i].end(), allowed.begin(), allowed.end(), std::back_inserter(pool[i]));
    if (pool[i].empty()) pool[i] = allowed;
  }
  std::vector<CpuList> out(n);
  std::vector<bool> placed(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (placed[i]) continue;
    std::vector<size_t> members;
    for (size_t j = i; j < n; ++j) {
      if (placed[j] || pool[j] != pool[i]) continue;
      placed[j] = true;
      members.push_back(j);
    }
    // The pool's physical cores, in the order of their first CPU.
    std::vector<CpuList> cores;
    std::map<int, size_t> core_index;
    for (int cpu : pool[i]) {
      const auto [it, added] = core_index.emplace(core_of(cpu), cores.size());
      if (added) cores.emplace_back();
      cores[it->second].push_back(cpu);
    }
    const size_t k = members.size(), c = cores.size();
    if (c == 0) continue;
    for (size_t m = 0; m < k; ++m) {
      CpuList& share = out[members[m]];
      if (c >= k) {
        for (size_t x = m * c / k; x < (m + 1) * c / k; ++x) share.insert(share.end(), cores[x].begin(), cores[x].end());
      } else {
        share = cores[m % c];
      }
      std::sort(share.begin(), share.end());
    }
  }
  return out;
}

namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return line;
}

CpuList to_list(const cpu_set_t& set) {
  CpuList out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

cpu_set_t to_set(const CpuList& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return set;
}

// The sysfs folder of GPU `ordinal`'s PCI device ("/sys/bus/pci/devices/0000:1b:00.0"), or "".
std::string gpu_pci_dir(int ordinal) {
#if GALE_WITH_CUDA
  char bus_id[64] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  // CUDA may write the domain with 8 digits ("00000000:1B:00.0"); sysfs names it with 4, in lower case.
  std::string id = bus_id;
  const size_t colon = id.find(':');
  if (colon == std::string::npos) return "";
  if (colon > 4) id = id.substr(colon - 4);
  for (char& ch : id) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return "/sys/bus/pci/devices/" + id;
#else
  (void)ordinal;
  return "";
#endif
}

}  // namespace

CpuList allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {};
  return to_list(set);
}

int physical_core(int cpu) {
  const CpuList siblings =
      parse_cpu_list(read_line("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/thread_siblings_list"));
  return siblings.empty() ? cpu : siblings.front();
}

CpuList gpu_near_cpus(int ordinal) {
  const std::string dir = gpu_pci_dir(ordinal);
  return dir.empty() ? CpuList() : parse_cpu_list(read_line(dir + "/local_cpulist"));
}

int gpu_numa_node(int ordinal) {
  const std::string dir = gpu_pci_dir(ordinal);
  const std::string node = dir.empty() ? "" : read_line(dir + "/numa_node");
  return node.empty() ? -1 : std::atoi(node.c_str());
}

std::vector<CpuList> gpu_worker_cpus(const std::vector<int>& gpus) {
  std::vector<CpuList> near;
  for (int g : gpus) near.push_back(gpu_near_cpus(g));
  return share_cpus(near, allowed_cpus(), physical_core);
}

std::vector<CpuList> cpu_worker_cpus(int host_workers) {
  return share_cpus(std::vector<CpuList>(static_cast<size_t>(std::max(0, host_workers))), allowed_cpus(), physical_core);
}

// Pins each TBB thread to the arena's CPUs when it joins the arena, and gives it the affinity of
// the thread that made the arena (the process's) when it leaves: not the mask it came with, which
// may be another arena's, since a TBB thread starts with the mask of the thread that woke it (a
// pinned worker's). The thread calling execute() is pinned there instead, around the call.
class WorkerArena::Pinning : public tbb::task_scheduler_observer {
 public:
  Pinning(tbb::task_arena& arena, const CpuList& cpus) : tbb::task_scheduler_observer(arena), set_(to_set(cpus)) {
    CPU_ZERO(&leave_);
    leave_valid_ = sched_getaffinity(0, sizeof leave_, &leave_) == 0;
    observe(true);
  }
  ~Pinning() override { observe(false); }

  void on_scheduler_entry(bool is_worker) override {
    if (is_worker) (void)sched_setaffinity(0, sizeof set_, &set_);
  }
  void on_scheduler_exit(bool is_worker) override {
    if (is_worker && leave_valid_) (void)sched_setaffinity(0, sizeof leave_, &leave_);
  }
  const cpu_set_t& set() const { return set_; }

 private:
  cpu_set_t set_, leave_;
  bool leave_valid_ = false;
};

WorkerArena::WorkerArena(CpuList cpus, bool pin)
    : cpus_(std::move(cpus)), arena_(std::max(1, static_cast<int>(cpus_.size()))) {
  arena_.initialize();
  if (pin && !cpus_.empty()) pinning_ = std::make_unique<Pinning>(arena_, cpus_);
}

// TBB's threads leave an arena soon after its work runs out, long before a run ends, so none is
// left pinned when the observer goes.
WorkerArena::~WorkerArena() { pinning_.reset(); }

void WorkerArena::execute(const std::function<void()>& f) {
  struct Restore {
    cpu_set_t mask;
    bool valid = false;
    ~Restore() {
      if (valid) (void)sched_setaffinity(0, sizeof mask, &mask);
    }
  } restore;
  if (pinning_) {
    restore.valid = sched_getaffinity(0, sizeof restore.mask, &restore.mask) == 0;
    if (restore.valid) (void)sched_setaffinity(0, sizeof pinning_->set(), &pinning_->set());
  }
  arena_.execute(f);
}

std::string WorkerArena::describe() const {
  return "cpus " + format_cpu_list(cpus_) + (pinned() ? " pinned" : " (" + std::to_string(arena_.max_concurrency()) + " threads)");
}

}  // namespace gale::engine
