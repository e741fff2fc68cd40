// engine/devices.hpp — what the engine needs to know about devices, without CUDA headers: which
// device `--device auto` means, a run's lease of the GPU memory budget, its peak, and waiting for
// a device.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/budget.hpp"
#include "kernels/device.hpp"

namespace gale::engine {

class Tensor;

// The first GPU when this build has CUDA and one is present, else the CPU.
Device default_device();
// GPUs present (0 without CUDA or a driver).
int gpu_count();
// Throws DeviceError unless `device` is the CPU or a present GPU (and the build has CUDA).
void require(const Device& device);

// For a run on several GPUs: asks CUDA to load every kernel when a GPU's context is made instead
// of at each kernel's first launch (kernels/cuda/runtime.hpp says what it costs and gains). Call it
// before anything touches a GPU; the user's CUDA_MODULE_LOADING stands.
void load_kernels_eagerly();
// How CUDA loads kernels in this process: "eager", "lazy", or "" (no CUDA or no driver).
std::string kernel_loading();

// Which run holds each GPU now (DeviceBudgetLease): one at a time. Thread-safe.
class GpuHolders {
 public:
  // Records `holder` on every ordinal; when one of them is held already, records nothing and
  // throws ResourceError naming the run that holds it.
  void claim(const std::vector<int>& ordinals, const std::string& holder);
  void release(const std::vector<int>& ordinals) noexcept;
  // The run holding `ordinal`, or "" when none does.
  std::string holder(int ordinal) const;

 private:
  mutable std::mutex mutex_;
  std::map<int, std::string> holders_;
};
// The process's.
GpuHolders& gpu_holders();

// A run's GPU memory budget on the GPUs it uses, for the run's life (RAII): every allocation on
// them is charged against `bytes` (0: no cap) until the lease ends, and the devices are then
// unbudgeted again with their unused memory returned to the driver. Budgets belong to runs, not to
// the process: one process may train under one budget, predict under another, then train without.
// One run holds a GPU at a time: a lease on a GPU that another lease holds is refused with a
// ResourceError (exit 4) naming `holder` of the other ("the training run on cora.gale") and its
// budget; overlapping runs are not shared under the sum of their budgets, since each sizes its
// caches and chunks by the room its budget leaves. What the GPU already holds live when the lease
// starts (cuBLAS's workspace, tensors of work outside any run) counts against the budget
// (engine/device_context.hpp). CPU devices are skipped: host budgets are per-run objects already
// (storage::make_host_budget). `text` is the budget as the user wrote it ("8G").
class DeviceBudgetLease {
 public:
  DeviceBudgetLease() = default;  // holds nothing
  DeviceBudgetLease(const std::vector<Device>& devices, uint64_t bytes, const std::string& text, const std::string& holder);
  ~DeviceBudgetLease();
  DeviceBudgetLease(DeviceBudgetLease&& other) noexcept;
  DeviceBudgetLease& operator=(DeviceBudgetLease&& other) noexcept;
  DeviceBudgetLease(const DeviceBudgetLease&) = delete;
  DeviceBudgetLease& operator=(const DeviceBudgetLease&) = delete;

 private:
  void end() noexcept;
  std::vector<int> ordinals_;  // the GPUs held
};
// Bytes Gale holds allocated on `device` now (0 on the CPU).
uint64_t gpu_in_use_bytes(const Device& device);
// Peak bytes allocated on `device` since the last reset (0 on the CPU), and the reset.
uint64_t gpu_peak_bytes(const Device& device);
void reset_gpu_peak(const Device& device);
// Allocation calls on `device` since the process started, and how many of them a block kept on the
// compute stream served without a driver call ({0, 0} on the CPU).
struct GpuAllocationCounts {
  uint64_t calls = 0, reused = 0;
};
GpuAllocationCounts gpu_allocation_counts(const Device& device);
// Waits until the work queued on `device` (its compute and IO streams) has finished (nothing on
// the CPU).
void synchronize(const Device& device);
// Total memory of a GPU in bytes (0 on the CPU).
uint64_t device_memory(const Device& device);
// What Gale may hold on a GPU: `gpu_mem_budget`, or 90% of the card when it is 0 (no cap).
uint64_t gpu_room(const Device& device, uint64_t gpu_mem_budget);
// What of that is not allocated now: the room an inference may size itself by.
uint64_t gpu_room_left(const Device& device, uint64_t gpu_mem_budget);
// A GPU's L2 cache in bytes (0 on the CPU).
int64_t device_l2_bytes(const Device& device);
// "NVIDIA H100 80GB HBM3" or "cpu".
std::string device_name(const Device& device);

// Makes a GPU the calling thread's current device for a scope (kernel launches need it; worker
// threads and TBB's pipeline threads run for several GPUs); nothing for the CPU.
class UseDevice {
 public:
  explicit UseDevice(const Device& device);
  ~UseDevice();
  UseDevice(const UseDevice&) = delete;
  UseDevice& operator=(const UseDevice&) = delete;

 private:
  int previous_ = -1;
};

// GPU time of the work enqueued on a device's IO stream between begin() and end(), summed over
// spans (timing events, so the host never waits until take_seconds). Does nothing on the CPU.
class IoTimer {
 public:
  explicit IoTimer(const Device& device);
  ~IoTimer();
  IoTimer(const IoTimer&) = delete;
  IoTimer& operator=(const IoTimer&) = delete;
  void begin();
  void end();
  // Seconds over the spans so far (waits for the last to finish), and the reset.
  double take_seconds();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Small f32 tensors read on the host some steps after they were made, without waiting for the
// device's later work: copy(slot, t) queues t's values into page-locked slot `slot` behind the
// work so far on t's device (compute stream), on a side stream of its own, so the compute stream
// never waits for the copy; read(slot) waits for that copy alone. t must not change until then
// (the caller reads a slot before it copies into it again). On the CPU the copy happens at once;
// read's pointer holds the slot's values until its next copy. Data-parallel workers read their
// summed stop votes this way: reading a step's vote two steps later costs no wait (nor an
// allocation), where a plain read would drain the queue each step.
class LaggedReads {
 public:
  LaggedReads(const Device& device, int slots, int64_t values);
  ~LaggedReads();
  LaggedReads(const LaggedReads&) = delete;
  LaggedReads& operator=(const LaggedReads&) = delete;
  void copy(int slot, const Tensor& t);
  const float* read(int slot);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A rows x cols f32 table in host memory that a GPU's kernels read over UVA (page-locked, mapped):
// what layer-wise inference keeps there when a layer's outputs do not fit on the GPU, so a chunk's
// rows are gathered by the GPU itself (only those rows cross the bus, with no staging copy). For a
// GPU only.
//
// Charged to `host_budget` when given. When the budget cannot hold it and `spill_dir` is given,
// the table lives in a scratch file there instead (created and unlinked at once, so nothing is
// left behind however the process ends): rows are written to it and a chunk's rows read back by
// the host, through the page cache, which the kernel may reclaim under a memory limit.
class MappedHostTable {
 public:
  MappedHostTable(const Device& device, int64_t rows, int64_t cols, kernels::cuda::MemoryBudget* host_budget = nullptr,
                  const std::filesystem::path& spill_dir = {});
  // Whether the table lives in a scratch file.
  bool spilled() const;
  ~MappedHostTable();
  MappedHostTable(const MappedHostTable&) = delete;
  MappedHostTable& operator=(const MappedHostTable&) = delete;
  // Rows [begin, begin + t.rows()) = t, a tensor on the device (queued on its compute stream).
  void write_rows(int64_t begin, const Tensor& t);
  // Rows `ids` (i64, n x 1, on the device), gathered into a new tensor on the device (queued on
  // its compute stream, after the writes).
  Tensor gather(const Tensor& ids) const;
  // The whole table as a host tensor (a copy, after the writes).
  Tensor to_host() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gale::engine
