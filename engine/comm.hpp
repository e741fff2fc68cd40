// engine/comm.hpp — what data-parallel workers exchange: gradient sums and replica checksums.
//
// One Communicator per worker, made together as a group. Two implementations:
//   - in-process (make_in_process_group): worker threads on the CPU device. Every worker adds the
//     group's tensors in rank order into its own copy, so all replicas see bit-identical sums and
//     a run does not depend on thread timing; blocking.
//   - NCCL (make_nccl_group, CUDA builds): one worker per GPU of this process. The sums run on a
//     communication stream of each device, after the compute stream's work so far, so a layer's
//     gradients travel while the layers below it still run backward; wait() makes the compute
//     stream wait for them. NCCL's all-reduce leaves the same bits on every rank.
// Every worker must make the same calls with the same shapes in the same order. A worker that fails
// calls abort(): the others' pending and later calls throw instead of waiting forever.
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
  // Every worker's value, in rank order (blocking; for checksums and counts, not tensors).
  virtual std::vector<uint64_t> all_gather(uint64_t value) = 0;
  // Seconds spent in sums since the last call (GPU time of the communication stream with NCCL,
  // wall time in-process), and the reset. May wait for the device.
  virtual double take_seconds() = 0;
  // Makes every worker's pending and later calls throw ResourceError naming `reason`.
  virtual void abort(const std::string& reason) = 0;
};

// `workers` communicators for worker threads of this process on the CPU device.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int workers);

// One communicator per device (CUDA builds; DeviceError otherwise), ranks in the order given.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<Device>& devices);

}  // namespace gale::engine
