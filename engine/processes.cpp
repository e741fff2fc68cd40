#include "engine/processes.hpp"

// The C API only: no MPI C++ bindings (removed from the standard; not linked).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "engine/local_processes.hpp"
#include "kernels/error.hpp"

namespace gale::engine {

namespace {

using Clock = std::chrono::steady_clock;

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw PeerError(std::string("MPI: ") + call + ": " + std::string(text, static_cast<size_t>(len)));
}

}  // namespace

// One thread that wakes every 0.2 s: it ends the process when the current collective's deadline
// has passed or a watched check reports a problem. Exiting (not throwing) is deliberate: the
// thread that would have to throw is blocked inside MPI or waiting on a GPU that never finishes.
struct Processes::Watchdog {
  explicit Watchdog(const Processes& procs) : procs_(procs), thread_([this] { loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void arm(const std::string& what, double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    what_ = what;
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    armed_ = true;
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
  }
  int add(std::function<std::string()> check) {
    std::lock_guard<std::mutex> lock(mutex_);
    checks_.emplace(next_id_, std::move(check));
    return next_id_++;
  }
  void remove(int id) {
    std::lock_guard<std::mutex> lock(mutex_);
    checks_.erase(id);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(200));
      if (stop_) break;
      std::string reason;
      if (armed_ && Clock::now() > deadline_) {
        char secs[32];
        std::snprintf(secs, sizeof secs, "%g", procs_.timeout());
        reason = what_ + " got no answer from the other processes within --comm-timeout " + secs +
                 " s (a peer was lost or stopped answering)";
      }
      for (auto it = checks_.begin(); reason.empty() && it != checks_.end(); ++it) reason = it->second();
      if (reason.empty()) continue;
      std::fprintf(stderr, "gale: error: %s: %s\n", procs_.name().c_str(), reason.c_str());
      std::fflush(stderr);
      std::_Exit(static_cast<int>(ExitCode::kPeer));  // mpirun sees the exit and stops the others
    }
  }

  const Processes& procs_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool armed_ = false;
  std::string what_;
  Clock::time_point deadline_;
  std::map<int, std::function<std::string()>> checks_;
  int next_id_ = 0;
  std::thread thread_;  // last: starts once the members above exist
};

class Processes::Deadline {
 public:
  Deadline(Processes& procs, const std::string& what) : procs_(procs) {
    if (!procs_.watchdog_) procs_.watchdog_ = new Watchdog(procs_);
    procs_.watchdog_->arm(what, procs_.timeout_s_);
  }
  ~Deadline() { procs_.watchdog_->disarm(); }

 private:
  Processes& procs_;
};

bool Processes::launched() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var) != nullptr) return true;
  return local::started_by_launcher();
}

Processes& Processes::get() {
  static Processes procs;
  return procs;
}

Processes::Processes() {
  const std::optional<local::Link> link = local::link_from_environment();
  if (!launched() || link) {
    char name[256] = {};
    host_ = ::gethostname(name, sizeof name - 1) == 0 ? name : "localhost";
    if (link) {  // started by gale train --processes: one host, the launcher carries the collectives
      rank_ = local_rank_ = link->rank;
      size_ = local_size_ = link->size;
      link_fd_ = link->fd;
    }
    return;
  }
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  mpi_ = true;
  if (provided < MPI_THREAD_SERIALIZED)  // one thread at a time calls MPI, not always the same one
    throw PeerError("MPI: the library offers no MPI_THREAD_SERIALIZED support, which Gale needs");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  MPI_Comm local;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  host_.assign(name, static_cast<size_t>(len));
}

Processes::~Processes() {
  delete watchdog_;
  if (mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

local::Link Processes::link() const {
  local::Link l;
  l.rank = rank_;
  l.size = size_;
  l.fd = link_fd_;
  return l;
}

std::string Processes::name() const { return "rank " + std::to_string(rank_) + " (" + host_ + ")"; }

void Processes::set_timeout(double seconds) {
  if (!(seconds > 0)) throw InputError("--comm-timeout: expected a positive number of seconds");
  timeout_s_ = seconds;
}

void Processes::broadcast(void* data, size_t bytes, const std::string& what) {
  if (!distributed()) return;
  const Deadline deadline(*this, what);
  if (link_fd_ >= 0) {
    const std::vector<uint8_t> rank0 = local::exchange(link(), local::Kind::kBroadcast, data, bytes);
    if (bytes > 0) std::memcpy(data, rank0.data(), bytes);
    return;
  }
  check_mpi(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
}

std::vector<uint8_t> Processes::all_gather(const void* data, size_t bytes, const std::string& what) {
  std::vector<uint8_t> out(bytes * static_cast<size_t>(size_));
  if (!distributed()) {
    if (bytes > 0) std::memcpy(out.data(), data, bytes);
    return out;
  }
  const Deadline deadline(*this, what);
  if (link_fd_ >= 0) return local::exchange(link(), local::Kind::kGather, data, bytes);
  check_mpi(MPI_Allgather(data, static_cast<int>(bytes), MPI_BYTE, out.data(), static_cast<int>(bytes), MPI_BYTE,
                          MPI_COMM_WORLD),
            "MPI_Allgather");
  return out;
}

int Processes::watch(std::function<std::string()> check) {
  if (!watchdog_) watchdog_ = new Watchdog(*this);
  return watchdog_->add(std::move(check));
}

void Processes::unwatch(int id) {
  if (watchdog_) watchdog_->remove(id);
}

void Processes::fail(int code) {
  if (link_fd_ >= 0 && distributed()) {  // the launcher stops the others
    std::fflush(stderr);
    local::report_failure(link(), code);
    std::_Exit(code);
  }
  if (!mpi_ || !distributed()) return;
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this is for libraries that do
}

std::vector<Device> place_devices(const std::vector<Device>& devices, int local_rank, int local_size,
                                  const std::string& host) {
  const char* env = std::getenv("GALE_GPUS_PER_PROCESS");
  if (devices.empty() || !devices[0].is_cuda() || (local_size == 1 && env == nullptr)) return devices;
  const int total = static_cast<int>(devices.size());
  int each = 0;
  if (env != nullptr) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end == env || *end != '\0' || v < 1)
      throw InputError(std::string("GALE_GPUS_PER_PROCESS: expected a positive number of GPUs, found '") + env + "'");
    each = static_cast<int>(v);
  } else {
    if (total % local_size != 0)
      throw InputError("--gpus: " + std::to_string(total) + " GPUs do not divide among the " + std::to_string(local_size) +
                       " processes on " + host + " (set GALE_GPUS_PER_PROCESS)");
    each = total / local_size;
  }
  const int first = local_rank * each;
  if (first + each > total)
    throw InputError("GALE_GPUS_PER_PROCESS=" + std::to_string(each) + ": process " + std::to_string(local_rank) +
                     " on " + host + " needs GPUs " + std::to_string(first) + "-" +
                     std::to_string(first + each - 1) + " of --gpus, which lists " + std::to_string(total));
  return std::vector<Device>(devices.begin() + first, devices.begin() + first + each);
}

}  // namespace gale::engine
