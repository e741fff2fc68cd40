// engine/trainer.hpp — node classification training: full-graph or mini-batch, evaluation,
// checkpoints and per-epoch metrics.
//
// Full-graph training runs every layer on the whole graph. Mini-batch training samples blocks
// for each batch of training seeds (fanouts as PyG's num_neighbors) inside the scheduler's TBB
// pipeline, gathers the input features, and steps the optimizer per batch. Evaluation is
// full-neighbourhood inference over the whole graph. Every random draw is keyed on (seed,
// epoch, batch), so a run resumed from a checkpoint continues exactly as an uninterrupted one.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/model.hpp"
#include "engine/ops.hpp"
#include "engine/spmm_auto.hpp"
#include "kernels/device.hpp"
#include "sampler/neighbor_sampler.hpp"
#include "storage/disk_reader.hpp"
#include "storage/host_features.hpp"
#include "storage/store.hpp"

namespace gale::engine {

// How the learning rate moves over the epochs (--lr-schedule), as torch.optim.lr_scheduler's
// schedulers stepped once an epoch:
//   constant;
//   cosine: CosineAnnealingLR over the run's epochs, from lr at epoch 0 towards min_lr;
//   step:N:F: StepLR, times F every N epochs;
//   plateau:P:F: ReduceLROnPlateau on the validation accuracy (mode max), times F once more than P
//     epochs in a row have not raised it above its best (a tie is no rise), then counting anew.
// The rate never goes below min_lr (--min-lr).
struct LrSchedule {
  enum class Kind { kConstant, kCosine, kStep, kPlateau };
  Kind kind = Kind::kConstant;
  int64_t epochs = 0;    // kStep: N; kPlateau: P
  float factor = 1.0f;   // kStep, kPlateau: F in (0, 1)
  float min_lr = 0.0f;
  std::string text = "constant";  // as given
};
// Parses the --lr-schedule spelling above; InputError naming --lr-schedule.
LrSchedule parse_lr_schedule(const std::string& text);
// The rate of `epoch` (0-based) of a run of `epochs` epochs that starts at `lr`; for kPlateau after
// `reductions` reductions so far.
double scheduled_lr(const LrSchedule& s, double lr, int64_t epoch, int64_t epochs, int64_t reductions);

struct TrainOptions {
  std::string store;
  ModelConfig model;                // in_dim / out_dim are taken from the store
  bool full_graph = true;           // false: mini-batch with `fanouts`
  std::vector<int> fanouts;         // hop 1 (seeds' neighbours) first
  int64_t batch_size = 1024;
  int64_t epochs = 200;
  // Early stopping (--patience): the run ends once this many epochs in a row have not raised the
  // validation accuracy (the training accuracy when the store has no validation split) above its
  // best so far; a tie does not count as a rise. 0: off. Needs an evaluation (not Eval::kNone).
  int64_t patience = 0;
  float lr = 0.01f;
  LrSchedule lr_schedule;
  float weight_decay = 5e-4f;
  uint64_t seed = 0;
  bool deterministic = false;       // pin thread counts for bit-identical reruns anywhere
  int threads = 0;                  // 0: all cores
  int prefetch = 0;                 // mini-batches in flight per worker; 0: MiniBatchEpochs::prefetch_depth's default
  std::string checkpoint_dir;       // "" disables checkpoints
  bool resume = false;
  // Without resume, a checkpoint_dir that already holds checkpoints is refused (they are an earlier
  // run's work) unless this is set (--overwrite-checkpoints).
  bool overwrite_checkpoints = false;
  std::string metrics_path;         // "" disables the JSON-lines file
  Device device = Device::cpu();
  // Data-parallel workers, one per entry (--gpus 0,1: one per GPU; --workers N on the CPU: N CPU
  // workers); empty: one worker on `device`. Each has its own model replica, sampler, feature tiers
  // and pipeline; gradients are summed over them every step (NCCL on GPUs, in-process on the CPU).
  std::vector<Device> devices;
  // Compare the replicas' weight checksums after every epoch; a difference is an InternalError.
  bool check_replicas = false;
  // Under mpirun (engine/processes.hpp): each process trains `devices` (its slice of them, with
  // several processes on a host), and the workers of every process form one data-parallel run.
  // A collective or NCCL sum that waits longer than this for the other processes ends the run
  // (ExitCode::kPeer).
  double comm_timeout_s = 600;
  ops::ExecOptions exec;            // --spmm, --tf32
  // --edge-weights: whether GCN, SAGE and GIN aggregate with the store's edge weights
  // (ModelConfig::edge_weights): kAuto when the store has them and the model is not GAT (whose
  // attention weighs the neighbours), kUse insists (InputError without weights, or for GAT).
  enum class EdgeWeights { kAuto, kUse, kIgnore };
  EdgeWeights edge_weights = EdgeWeights::kAuto;
  // --neighbor-sampling: mini-batch neighbours drawn uniformly or in proportion to the store's
  // edge weights (both samplers; needs the weights).
  sampler::Sampling sampling = sampler::Sampling::kUniform;
  // --gpu-mem-budget: every byte Gale allocates on the GPU is charged against it (0 = unlimited);
  // the text is what the user wrote, for messages.
  uint64_t gpu_mem_budget = 0;
  std::string gpu_mem_budget_text;
  // --host-mem-budget: what Gale may keep in host memory on purpose (the topology, features or
  // their cache, IO staging, pinned copies): 0 derives it from what the process may really use
  // (storage/host_memory.hpp: MemAvailable and the cgroup's limit, less a reserve). Features
  // beyond what it leaves are read from the store's features.npy by the disk tier
  // (storage/host_features.hpp). The text is what the user wrote, for messages.
  uint64_t host_mem_budget = 0;
  std::string host_mem_budget_text;
  // The disk tier's reads: io_uring, or a pread thread pool where io_uring is refused (kAuto, or
  // GALE_IO_ENGINE); --io-engine names one.
  storage::IoEngine io_engine = storage::IoEngine::kAuto;
  // Features through the disk tier even when they fit the host budget (measurements, tests).
  bool features_on_disk = false;
  // With the features on disk: the host memory the read-ahead windows may hold
  // (engine/train/read_ahead.hpp), taken from the host cache's share. kAutoReadAhead: a third of
  // that share; 0: no read-ahead (each batch reads its own misses).
  uint64_t read_ahead_bytes = storage::HostFeatures::kAutoReadAhead;
  // With the features on disk, what ranks the rows the GPU cache and the host cache hold: in-degree,
  // or how often one pre-sampled epoch's batches read each node (engine/train/presample.hpp).
  enum class CacheRank { kDegree, kSampled };
  CacheRank cache_rank = CacheRank::kDegree;
  // Where layer-wise evaluation's outputs that fit neither the GPU nor the host budget spill (a
  // scratch file, unlinked at once); "": the directory the store is in.
  std::string temp_dir;
  // Mini-batch on a GPU: sample there (FastGL's fused-map sampler, engine/gpu_batches.hpp) rather
  // than on the CPU. Both draw the same neighbours.
  bool gpu_sampler = true;
  // Mini-batch on a GPU: reuse the rows the previous batch brought to the GPU (FastGL's match).
  bool match = true;
  // Mini-batch: sample this many batches ahead and train them in FastGL's greedy match-reorder
  // order (scheduler/match_reorder.hpp); 0 keeps the sampled order.
  int reorder_window = 0;
  // Mini-batch on a GPU: what the input features may occupy there (all rows when they fit, else a
  // cache of the hottest nodes with every row in pinned host memory). 0: half of the GPU budget.
  uint64_t feature_gpu_bytes = 0;
  // Evaluation: kFull, full-neighbourhood inference over the whole graph at once (needs the graph
  // and every feature on the device); kBatched, the same layer by layer over chunks of nodes
  // (engine/layerwise.hpp: bounded device memory, each layer's outputs on the host); kSampled,
  // mini-batch inference with the training fanouts over at most 2^17 nodes of each split (an
  // estimate, through training's batch sources; mini-batch runs only); kAuto = full when the
  // features are all on the GPU (or on the CPU) and the whole graph's inference fits in half of
  // what the GPU may hold, sampled when the features are on disk (beyond memory), else batched;
  // kNone skips it (timing runs; no accuracy is reported).
  enum class Eval { kAuto, kFull, kBatched, kSampled, kNone };
  Eval eval = Eval::kAuto;
  // Stop early once *stop is non-zero (gale train sets it to the number of a SIGINT or SIGTERM):
  // mini-batch training without a match-reorder window stops before its next step and checkpoints
  // inside the epoch (CheckpointState::batches_done), so --resume goes on from that step (with as
  // many workers); otherwise the run stops after the epoch in progress, with its checkpoint. Several
  // workers or processes vote with their step's gradient sums and all stop after the same step
  // (within two steps of the flag), or after the same epoch.
  const std::atomic<int>* stop = nullptr;
  // With checkpoint_dir: also checkpoint inside an epoch whenever this many seconds have passed
  // since the last checkpoint (0: at epoch ends only), so a run killed outright (SIGKILL, a lost
  // node) loses at most that much work. Mini-batch without a reorder window only. Several workers
  // agree on the step through their gradient sums (as for stop) and end the epoch's pipeline
  // there; the trainer checkpoints and runs the rest of the epoch as a resumed run would.
  double checkpoint_interval_s = 0;
  // Called on the training thread after each mini-batch step of worker 0: the epoch, the batch's
  // index in plan order and the epoch's batch count.
  std::function<void(int64_t epoch, int64_t batch, int64_t batches)> on_step;
  // Called once before the first epoch of mini-batch training (lead process) with where the
  // batches' features come from: the GPU's tiers, host memory, or the disk tier and its reader.
  std::function<void(const std::string& placement)> on_placement;
  // Called once with resume, after the checkpoint is read and checked: the epochs it completed,
  // and the batches it trained of the next one (0: none).
  std::function<void(int64_t epochs_done, int64_t batches_done)> on_resume;
  // The run trains nothing: gale predict's sampled inference (engine/sampled_inference.hpp) builds
  // it for its replica and batch sources only. The store then needs no labels or splits, the
  // model's in_dim and out_dim are the caller's (a checkpoint's), and the batch size is bounded by
  // the store's nodes instead of the training split.
  bool inference = false;
};

// One worker's seconds in each part of a mini-batch epoch (engine/train/minibatch_epoch.cpp): the
// pipeline's stages (scheduler/batch_pipeline.hpp) on its host, its IO stream's and gradient
// sums' GPU time, and the epoch's wall time. Overlapping parts overlap: prepare runs on several
// threads beside compute, io and allreduce on streams beside it.
struct WorkerStageSeconds {
  double prepare_s = 0;        // sampling and host feature reads, summed over the batches
  double host_features_s = 0;  // of prepare: reading or staging the batches' features on the host
  double gpu_sample_s = 0;     // of prepare: sampling on the GPU, with its waits for the device
  double load_s = 0;           // the load stage's host time (enqueueing operands and gathers)
  double io_s = 0;             // GPU time of the IO stream's work (operands, feature gathers)
  double compute_s = 0;        // the steps' host time: forward, backward, Adam, and the two below
  double wait_s = 0;           // the step waiting for a prepared batch
  double reorder_s = 0;        // the match-reorder stage
  double allreduce_s = 0;      // GPU time of the gradient sums (NCCL), 0 on the CPU or alone
  double allreduce_host_s = 0, vote_wait_s = 0;  // of compute: enqueueing the sums, reading the votes
  // GPU time the compute stream stalled waiting for the sums (the update's wait, inside the next
  // step's forward): the part of allreduce, and of the slowest worker's lead, that the step shows.
  double sum_wait_s = 0;
  // Of wait: the first batch's (the pipeline filling); after the last step is enqueued, the
  // worker's wait for its device to finish and for the losses (the epoch's drain).
  double fill_s = 0, drain_s = 0;
  double wall_s = 0;
};

struct EpochMetrics {
  int64_t epoch = 0;                // 0-based
  int64_t epochs = 0;               // total planned
  double loss = 0;
  double train_acc = 0, valid_acc = 0, test_acc = 0;
  double lr = 0;                    // the learning rate the epoch trained with
  double epoch_s = 0;               // wall time of training + evaluation
  double sample_s = 0;              // mini-batch: sampling, summed over the batches (overlapped)
  // Mini-batch on a GPU with its sampler: GPU time of assembling the batches on the IO stream
  // (blocks' operands and the feature gather), overlapped with training on the compute stream.
  double io_s = 0;
  double compute_s = 0;             // forward + backward + optimizer
  double wait_s = 0;                // compute waiting for a prepared batch
  double eval_s = 0;
  int64_t batches = 0;
  uint64_t gpu_peak_bytes = 0;      // peak of the GPU pool during the epoch (0 on the CPU)
  // GPU allocation calls during the epoch over every replica, and those served by kept blocks.
  uint64_t gpu_allocations = 0, gpu_allocations_reused = 0;
  // Mini-batch: input feature rows by where they came from (engine/batch_features.hpp).
  int64_t feature_rows = 0, rows_previous = 0, rows_device = 0, rows_cache = 0, rows_host = 0;
  int64_t host_to_gpu_bytes = 0;
  // Mini-batch with the features on disk (storage/host_features.hpp): rows served by the host
  // cache and from disk, the bytes the reads moved and the rows' own bytes among them (their ratio
  // is the read amplification), the read requests issued (runs of pages merged: against
  // disk_read_s, the rate to set beside `gale bench io`'s), and the seconds spent reading.
  int64_t host_cache_hits = 0, disk_rows = 0;
  uint64_t disk_bytes_read = 0, useful_disk_bytes = 0;
  int64_t disk_read_requests = 0;
  double disk_read_s = 0;
  // With read-ahead: rows served from its windows, windows read, the bytes of the distinct 4 KiB
  // pages the reads needed (the plan's lower bound reads these at random or passes over them),
  // the seconds batches waited for a window, and the seconds the read-ahead spent sampling ahead.
  // Its reading thread's waits: for a window to be planned (idle: the sampling behind), and with
  // one planned, for the windows alive to free its slots (held); the rest of its time it reads.
  int64_t read_ahead_hits = 0, read_ahead_windows = 0;
  uint64_t needed_disk_bytes = 0;
  double read_ahead_wait_s = 0, read_ahead_sample_s = 0;
  double read_ahead_reader_idle_s = 0, read_ahead_reader_held_s = 0;
  // Mini-batch: input nodes over the epoch, and how many of them the previous batch held, in the
  // trained order and had the sampled order been kept (the match-reorder's gain is the difference).
  int64_t input_nodes = 0, reused_nodes = 0, reused_nodes_sampled_order = 0;
  double reorder_s = 0;
  // Several workers: each one's training seeds per second, worker 0's time summing gradients, and
  // the replicas' common weight checksum (with check_replicas).
  std::vector<double> worker_seeds_per_s;
  double allreduce_s = 0;
  std::vector<double> worker_allreduce_s;  // every worker's time summing gradients, in rank order
  // Worker 0's host seconds enqueueing the sums and waiting for the lagged stop votes.
  double allreduce_host_s = 0, vote_wait_s = 0;
  uint64_t replica_checksum = 0;
  // Mini-batch: every worker's seconds by stage, in rank order (the lead process gathers them).
  std::vector<WorkerStageSeconds> worker_stages;
  // `--spmm auto` over the whole graph on a GPU: the kernel measured for each direction and width
  // so far (engine/spmm_auto.hpp), in the order chosen; empty otherwise.
  std::vector<SpmmAutoChoice> spmm_choices;
};

struct TrainResult {
  double best_valid_acc = 0;
  double test_acc_at_best_valid = 0;
  int64_t best_epoch = -1;
  // The last epoch that raised the best accuracy (a tie moves best_epoch, not this).
  int64_t improved_epoch = -1;
  // LrSchedule::kPlateau: the reductions so far and the epoch of the last (-1: none).
  int64_t lr_reductions = 0, lr_reduced_epoch = -1;
  int64_t epochs_run = 0;           // in this invocation (completed epochs)
  int64_t epochs_done = 0;          // by the run, resumed ones included
  // The store has no validation split: the best epoch (and early stopping) went by training accuracy.
  bool selects_on_train = false;
  // TrainOptions::patience ended the run before its last epoch (now, or in the run resumed).
  bool stopped_early = false;
  EpochMetrics last;
  // Non-zero when TrainOptions::stop ended the run before its last epoch: the signal number, and
  // where: after `stopped_batches` of the `stopped_of` batches of epoch `stopped_epoch` (equal
  // when it stopped after the epoch).
  int stop_signal = 0;
  int64_t stopped_epoch = -1, stopped_batches = 0, stopped_of = 0;
};

using EpochCallback = std::function<void(const EpochMetrics&)>;

// What TrainOptions::edge_weights resolves to for `model` on `store` (the same rule the trainer
// applies; the CLI says it before training). Throws InputError as described there.
bool uses_edge_weights(TrainOptions::EdgeWeights choice, const storage::Store& store, const std::string& model);

// Throws InputError naming the flag for an option value that no run can take (the checks that need
// neither the store nor a device): one place that gale train's command line and a library caller
// both go through; train() calls it first.
void check_train_options(const TrainOptions& options);

// Trains as configured. Throws InputError for bad options or a store without features / labels /
// train split, CorruptStoreError for a bad store or checkpoint, DeviceError when the device is
// not available, ResourceError when --gpu-mem-budget is exceeded. With several processes every
// one evaluates (their replicas are identical) but only rank 0 writes metrics and checkpoints and
// calls `on_epoch`.
TrainResult train(const TrainOptions& options, const EpochCallback& on_epoch = {});


}  // namespace gale::engine
