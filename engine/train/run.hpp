// engine/train/run.hpp — what a training run is, fixed before its first epoch: the options checked
// once and completed from the store, who trains (this process's workers and the run's), and what it
// trains on (the store, the labelled splits). Every other part of a run reads this and owns the
// rest (engine/train/*.hpp); nothing here changes once the run has started.
//
// The parts, in the order train() composes them (docs/architecture.md, "A training run"):
//   TrainRun        set-up: options, devices, store, splits          engine/train/run.hpp
//   Replicas        a model, optimizer, labels and communicator per worker   replicas.hpp
//   CheckpointPolicy  resume, latest / best / interval checkpoints           checkpoints.hpp
//   MetricsLog      the JSON-lines record of each epoch and the run          metrics_log.hpp
//   WholeGraph      the whole graph and its features on the lead device      whole_graph.hpp
//   MiniBatchEpochs one mini-batch epoch of every worker (pipeline, sums, votes)  minibatch_epoch.hpp
//   Evaluation      every node's logits, whole-graph or layer-wise          evaluation.hpp
#pragma once

#include <tbb/global_control.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/devices.hpp"
#include "engine/processes.hpp"
#include "kernels/cuda/budget.hpp"
#include "engine/trainer.hpp"
#include "kernels/device.hpp"
#include "kernels/random.hpp"
#include "storage/store.hpp"

namespace gale::engine::train_parts {

class TrainRun {
 public:
  // Checks the options, places this process's workers on their devices, bounds the thread pools,
  // opens the store and completes the model's dimensions from it. Throws as train() documents.
  explicit TrainRun(const TrainOptions& options);
  TrainRun(const TrainRun&) = delete;
  TrainRun& operator=(const TrainRun&) = delete;

  const TrainOptions& opt() const { return opt_; }
  const storage::Store& store() const { return store_; }
  Processes& procs() const { return *procs_; }

  // This process's workers (its slice of --gpus when several processes share a host), and the
  // run's: world() workers, this process's ranked from first_rank().
  const std::vector<Device>& devices() const { return devices_; }
  int workers() const { return static_cast<int>(devices_.size()); }
  int world() const { return world_; }
  int first_rank() const { return first_rank_; }
  bool lead_process() const { return procs_->rank() == 0; }
  const Device& lead_device() const { return devices_[0]; }  // evaluation, checkpoints, metrics

  int64_t num_nodes() const { return store_.num_nodes(); }
  const int32_t* labels() const { return store_.labels(); }
  // The labelled nodes of each split.
  const std::vector<int64_t>& train_ids() const { return train_ids_; }
  const std::vector<int64_t>& valid_ids() const { return valid_ids_; }
  const std::vector<int64_t>& test_ids() const { return test_ids_; }

  bool attention() const { return opt_.model.model == "gat"; }
  // Mini-batch training without a match-reorder window stops (and checkpoints) between steps.
  bool step_stops() const { return !opt_.full_graph && opt_.reorder_window <= 1; }
  // The key of every random draw of epoch `epoch` (dropout, sampling), derived from --seed.
  uint64_t epoch_key(int64_t epoch) const { return kernels::derive_key(opt_.seed, static_cast<uint64_t>(epoch)); }
  // Several workers on a partitioned store draw their seeds from their own parts.
  bool seeds_by_partition() const { return world_ > 1 && !opt_.full_graph && store_.has_partition(); }
  // What must match between a checkpoint and the run resuming from it.
  const std::string& identity() const { return identity_; }
  // --host-mem-budget, or what the process may really use (storage/host_memory.hpp); every byte
  // the run keeps in host memory on purpose is charged to it (charging is thread-safe).
  kernels::cuda::MemoryBudget& host_budget() const { return *host_budget_; }

 private:
  // The constructor's steps, in its order.
  // This process's workers on their devices (its slice of --gpus on a shared host), and their ranks.
  void place_workers();
  // --threads, or one thread with --deterministic, for TBB and the BLAS.
  void bound_thread_pools();
  // The labelled nodes of each split; a store without labels or labelled training nodes is an
  // InputError. Caps the batch at the training nodes.
  void read_labelled_splits();
  // The model's input and output widths, edge weights and weighted sampling from the store.
  void fit_model_to_store();
  // Under mpirun: every process has as many workers and the same model, options and store as rank 0.
  void check_processes_agree() const;

  TrainOptions opt_;
  Processes* procs_;
  std::vector<Device> devices_;
  // --gpu-mem-budget (or none) on this process's GPUs for the run's life; a GPU another run of the
  // process holds refuses the run (ResourceError, engine/devices.hpp). The other parts are built
  // after TrainRun and destroyed before it, so the run's GPU memory is freed before the lease ends.
  DeviceBudgetLease gpu_budget_;
  int world_ = 1, first_rank_ = 0;
  std::optional<tbb::global_control> thread_limit_;
  storage::Store store_;
  std::vector<int64_t> train_ids_, valid_ids_, test_ids_;
  std::string identity_;
  std::unique_ptr<kernels::cuda::MemoryBudget> host_budget_;
};

}  // namespace gale::engine::train_parts
