// engine/comm.hpp — what data-parallel workers exchange: gradient sums and replica checksums.
//
// One Communicator per worker thread of this process, made together as a group. With several
// processes (engine/processes.hpp: mpirun) every process makes its group with the same number of
// workers, and the group spans the run: worker w of process p has rank p * workers + w.
// Two implementations:
//   - CPU (make_in_process_group): worker threads on the CPU device. Every worker adds its
//     process's tensors in rank order; the processes' sums are then added in process order (over
//     MPI), so all replicas see bit-identical sums and a run does not depend on thread timing;
//     blocking.
//   - NCCL (make_nccl_group, CUDA builds): one worker per GPU. The sums run on a communication
//     stream of each device, after the compute stream's work so far, so a layer's gradients travel
//     while the layers below it still run backward; wait() makes the compute stream wait for them.
//     NCCL's all-reduce leaves the same bits on every rank. Across processes MPI hands out NCCL's
//     unique id; NCCL carries the tensors.
// Every worker must make the same calls with the same shapes in the same order. A worker that fails
// calls abort(): the others in its process see their pending and later calls throw instead of
// waiting forever; the other processes are stopped by Processes::fail.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.hpp"

namespace gale::engine {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums each f32 tensor (on this worker's device) over the workers, in place.
  virtual void all_reduce_sum(const std::vector<Tensor*>& tensors) = 0;
  // Orders the compute stream after every sum issued so far (nothing to do when blocking).
  virtual void wait() = 0;
  // Every worker's values (the same count on each), concatenated in rank order (blocking; for
  // checksums and metrics, not tensors). Worker 0 of each process must call it from the thread
  // that makes the run's MPI calls (the one that called train()).
  virtual std::vector<uint64_t> all_gather(const std::vector<uint64_t>& values) = 0;
  std::vector<uint64_t> all_gather(uint64_t value) { return all_gather(std::vector<uint64_t>{value}); }
  // Seconds spent in sums since the last call (GPU time of the communication stream with NCCL,
  // wall time in-process), and the reset. May wait for the device.
  virtual double take_seconds() = 0;
  // Seconds the compute stream stalled in wait() since the last call, and the reset: GPU time from
  // the work before the wait to the sums' end, where they had not ended (NCCL: one GPU's sum waits
  // for the slowest worker's backward). 0 where wait() blocks nothing. May wait for the device.
  virtual double take_wait_seconds() { return 0; }
  // Makes every worker's pending and later calls throw ResourceError naming `reason`.
  virtual void abort(const std::string& reason) = 0;
};

class Processes;

// `workers` communicators for worker threads of this process on the CPU device; `procs` (may be
// null: this process alone) joins them with the other processes' workers.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int workers, Processes* procs = nullptr);

// One communicator per device of this process (CUDA builds; DeviceError otherwise), ranks in the
// order given after the earlier processes' devices. `procs` as above; a NCCL sum that makes no
// progress for its --comm-timeout ends the run through its watchdog.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Device>& devices,
                                                           Processes* procs = nullptr);

}  // namespace gale::engine
