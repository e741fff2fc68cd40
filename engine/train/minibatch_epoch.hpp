// engine/train/minibatch_epoch.hpp — one epoch of mini-batch training over every worker of this
// process: each worker runs its share of the epoch's steps through its own pipeline
// (scheduler/batch_pipeline.hpp: sample ahead, reorder a window, load features, train), sums its
// gradients with the others as backward produces them, and votes with them on stopping and on
// interval checkpoints, so every worker ends after the same step. Every random draw is keyed on
// (seed, epoch, batch), so an epoch resumed at a step continues exactly as an uninterrupted one.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "engine/ops.hpp"
#include "engine/train/checkpoints.hpp"
#include "engine/train/metrics_log.hpp"
#include "engine/train/read_ahead.hpp"
#include "engine/train/replicas.hpp"
#include "engine/train/run.hpp"
#include "engine/trainer.hpp"
#include "sampler/neighbor_sampler.hpp"
#include "scheduler/epoch_plan.hpp"

namespace gale::engine::train_parts {

// How a mini-batch epoch ended.
struct MiniBatchEpochEnd {
  int stop_signal = 0;       // TrainOptions::stop as the workers agreed on it (several workers)
  bool inside = false;       // stopped between steps, before the epoch's last one
  int64_t batches_done = 0;  // with `inside`: the batches trained, in plan order
};

class MiniBatchEpochs {
 public:
  // The CPU sampler, every replica's batch sources (Replicas::place_batch_sources), the seed
  // pools of a partitioned store, and the full-graph degrees blocks normalise by.
  MiniBatchEpochs(const TrainRun& run, Replicas& replicas);
  ~MiniBatchEpochs();

  // The epoch's batches, for the worker of rank `rank`.
  scheduler::EpochPlan plan(int64_t epoch, int rank) const;

  // Trains epoch `epoch` on every worker (rank 0 on this thread, the others on threads of their
  // own; one that fails aborts the group and its error is rethrown, naming the worker). Starts at
  // `start.batch` with its loss sums when `start` is given (the epoch a run resumes inside).
  // Checkpoints inside the epoch when stopped or when an interval checkpoint falls due; fills m's
  // loss, time split, feature and reuse counts.
  MiniBatchEpochEnd train_epoch(int64_t epoch, uint64_t epoch_key, const ResumePoint* start,
                                CheckpointPolicy& checkpoints, EpochMetrics* m);

  // Sampled evaluation (--eval sampled): the share of `nodes` whose argmax is their label, from
  // mini-batch inference with the training fanouts on the lead replica, through the same batch
  // sources as training (GPU or CPU sampler, feature tiers, staged rows, the disk tier).
  double sampled_accuracy(const std::vector<int64_t>& nodes, int64_t epoch);

  // Sampled inference (gale predict --fanouts, engine/sampled_inference.hpp): `nodes` through the
  // lead replica's pipeline in batches of the run's batch size, the entries dealt round them
  // (scheduler::EpochPlan::strided: no batch of hubs alone in a store numbered by degree), each forward
  // in evaluation mode with every draw keyed on `key` and the batch's number only. `sink` takes
  // each batch's seeds and their logits (one host row per seed), in order. Returns the batches.
  // Features on disk: a read-ahead samples these batches ahead and reads their misses in sorted
  // passes, window by window, as training's does.
  using LogitsSink = std::function<void(const int64_t* seeds, int64_t count, const Tensor& logits)>;
  int64_t sampled_logits(const std::vector<int64_t>& nodes, uint64_t key, const LogitsSink& sink);

  // Where the lead replica's batches come from, for the metrics.
  FeaturePlacement placement() const;

  // Batches in flight per worker: --prefetch, else 2, or 8 when a GPU's batches are staged from
  // the disk tier (their prepare stage, GPU sampling and the host's pick and read of the rows its
  // GPU cache lacks, takes longer than a step, so several batches are prepared at once).
  int prefetch_depth() const;

  struct Worker;  // one worker's epoch (minibatch_epoch.cpp)

 private:
  // plan(epoch, first rank of this process), made while the epoch before trained when it could be;
  // then the next epoch's plan starts on a thread of its own (a sliced plan shuffles every seed
  // and deals every step: 25-40 ms on R-MAT 23's 839K seeds, 3-7% of a 2-GPU epoch).
  scheduler::EpochPlan first_plan(int64_t epoch);
  // The threads that make the next epoch's plan beside this epoch's steps (0: TBB's whole arena).
  int plan_threads() const;
  // The disk tier's counters of the epoch into m (nothing unless the features are on disk).
  void take_disk_stats(EpochMetrics* m);
  // Worker `local`'s read-ahead for its pipeline from batch `first` of `epoch` (nullptr when the
  // features are not on disk or --read-ahead is 0): the one running since an earlier epoch when it
  // has come exactly there, else a new one from there to the run's last epoch.
  ReadAhead* read_ahead_for(int local, int64_t epoch, int64_t first);
  // Features on disk: a read-ahead over `plan`'s batches alone (sampled inference; epoch 0, keyed
  // like the worker that runs them), or nullptr.
  std::unique_ptr<ReadAhead> inference_read_ahead(const scheduler::EpochPlan& plan, uint64_t key);
  // A new read-ahead for worker `local` from batch `first` of `epoch` (the old one stopped first).
  void start_read_ahead(int local, int64_t epoch, int64_t first);

  const TrainRun& run_;
  Replicas& replicas_;
  std::unique_ptr<sampler::NeighborSampler> sampler_;
  std::vector<std::vector<int64_t>> seed_pools_;
  std::vector<float> full_degree_;
  struct ReadAheadAt {
    std::unique_ptr<ReadAhead> ahead;
    int64_t epoch = 0, first = 0;  // where the worker's next pipeline must begin to go on with it
  };
  std::vector<ReadAheadAt> read_aheads_;  // per worker; last: its threads sample through the members above
  // GALE_OP_PROFILE=1 (for measuring): each worker's ops of its steps timed on its compute stream,
  // printed per epoch to stderr; one profile per worker, its events reused from epoch to epoch.
  std::vector<std::unique_ptr<ops::OpProfile>> op_profiles_;
  std::future<scheduler::EpochPlan> next_plan_;  // first_plan's, for epoch next_plan_epoch_ (waited for when destroyed)
  int64_t next_plan_epoch_ = -1;
  // One thread at first: dealing in TBB's whole arena took cores from the steps' host threads (2
  // processes on 2 H200s: epochs 1.3% longer than with one thread). Doubled whenever an epoch had
  // to wait for its plan.
  int plan_threads_ = 1;
};

}  // namespace gale::engine::train_parts
