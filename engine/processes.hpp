// engine/processes.hpp — the processes of one training run, and the watchdog that keeps a run from
// hanging.
//
// A plain start is one process. Under `mpirun -np H gale train ...` (OpenMPI's OMPI_COMM_WORLD_SIZE,
// or PMI_SIZE / PMIX_RANK of other launchers, in the environment) the first call to get() starts
// MPI and the run has H processes: one per host, or one per GPU (GALE_GPUS_PER_PROCESS, see
// place_devices). `gale train --processes N` starts N processes on this host itself, without MPI
// (engine/local_processes.hpp): their collectives go through the process that started them. MPI
// only carries small things: the NCCL unique id, the options' fingerprint, per-epoch metrics and
// CPU workers' gradient sums; NCCL carries the GPUs' tensors.
//
// Failures end the whole run, never hang it:
//   - a process that fails reports "rank R (host): ..." and calls fail(), which takes every other
//     process down with it (MPI_Abort) and exits with the error's code;
//   - a process that dies (killed, crashed) is noticed by mpirun, which stops the others;
//   - a collective that gets no answer for --comm-timeout seconds (a hung or lost peer), or a
//     watched check that reports a problem (NCCL's asynchronous errors, a stalled NCCL sum), makes
//     the watchdog print the reason and exit with ExitCode::kPeer; mpirun then stops the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/device.hpp"

namespace gale::engine {

namespace local {
struct Link;
}

class Processes {
 public:
  // This run's processes; the first call starts MPI when a launcher started this one.
  static Processes& get();
  // True when a launcher started this process (whether or not get() has run yet).
  static bool launched();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the processes on this host
  int local_size() const { return local_size_; }
  const std::string& host() const { return host_; }
  bool distributed() const { return size_ > 1; }
  // "rank 1 (host)": how messages name this process.
  std::string name() const;

  // How long a collective, or a watched operation, may wait for the other processes (seconds, > 0).
  void set_timeout(double seconds);
  double timeout() const { return timeout_s_; }

  // Collectives: every process makes the same calls in the same order. `what` names the call in
  // the watchdog's message. A single process returns its own data.
  void broadcast(void* data, size_t bytes, const std::string& what);  // rank 0's bytes to everyone
  // Every process's `bytes` bytes, concatenated in rank order.
  std::vector<uint8_t> all_gather(const void* data, size_t bytes, const std::string& what);

  // Polled by the watchdog (every 0.2 s) until removed: a non-empty return is why the run cannot
  // go on. Checks run on the watchdog's thread and must be thread-safe.
  int watch(std::function<std::string()> check);
  void unwatch(int id);

  // The end of a failed run, after its message was printed: in a distributed run every process
  // exits (MPI_Abort with `code`); a single process just returns.
  void fail(int code);

  Processes(const Processes&) = delete;
  Processes& operator=(const Processes&) = delete;
  ~Processes();

 private:
  Processes();
  struct Watchdog;
  // The watchdog's deadline around a blocking collective.
  class Deadline;

  local::Link link() const;

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  int link_fd_ = -1;  // started by gale train --processes: the socket to the launcher
  std::string host_;
  bool mpi_ = false;
  double timeout_s_ = 600;
  Watchdog* watchdog_ = nullptr;  // started with the first collective or check
};

// The GPUs this process trains on: with several processes on one host, each takes its own slice of
// `devices` (the --gpus list), in local-rank order: GALE_GPUS_PER_PROCESS GPUs each when set, else
// an equal share. One process per host keeps the whole list; CPU workers are never sliced.
// InputError when the list does not divide, or the slice would run past its end. `local_rank` and
// `local_size` are this process's place among the processes on `host`.
std::vector<Device> place_devices(const std::vector<Device>& devices, int local_rank, int local_size,
                                  const std::string& host);

}  // namespace gale::engine
