// engine/train/checkpoints.hpp — a run's checkpoint policy: a --checkpoint-dir that holds an
// earlier run's checkpoints is refused unless resumed or overwritten; --resume loads latest.ckpt
// into every replica and the run's bookkeeping; latest.ckpt is written after every epoch (and
// inside one, when stopped or when --checkpoint-interval has passed), best.ckpt at each new best.
// Only the lead process writes; writes go to disk on a thread of their own (CheckpointWriter).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "engine/checkpoint.hpp"
#include "engine/train/replicas.hpp"
#include "engine/train/run.hpp"
#include "engine/trainer.hpp"

namespace gale::engine::train_parts {

// Where a run starts: after `epochs_done` epochs, and `batch` batches into the next (a checkpoint
// written inside an epoch) with each worker rank's loss sum over them.
struct ResumePoint {
  int64_t epochs_done = 0;
  int64_t batch = 0;
  std::vector<double> loss_sums;
};

class CheckpointPolicy {
 public:
  // `lead`: the replica whose weights and moments are saved; `progress`: the bookkeeping saved
  // beside them (best and improved epochs, plateau reductions), read at each save.
  CheckpointPolicy(const TrainRun& run, Replica& lead, const TrainResult& progress);
  CheckpointPolicy(const CheckpointPolicy&) = delete;
  CheckpointPolicy& operator=(const CheckpointPolicy&) = delete;

  // Refuses a directory with an earlier run's checkpoints (InputError) unless resuming or told to
  // overwrite; with --resume loads latest.ckpt into every replica and *result, checks it belongs
  // to this run (CorruptStoreError naming what differs) and calls TrainOptions::on_resume.
  ResumePoint start(Replicas& replicas, TrainResult* result);

  // latest.ckpt: the state after `epoch` (0-based; -1 before the first), or inside epoch + 1 after
  // its first `batches_done` batches with each worker rank's loss sum. Nothing without a
  // --checkpoint-dir or outside the lead process.
  void save_latest(int64_t epoch, int64_t batches_done = 0, std::vector<double> loss_sums = {});
  void save_best(int64_t epoch);
  // --checkpoint-interval has passed since this run's last checkpoint (or its start).
  bool interval_due() const;
  // Returns once every checkpoint submitted is on disk (a failed write throws here).
  void wait() { writer_.wait(); }

 private:
  // The checkpoint --resume goes on from (latest.ckpt, `file`), checked to be of this run; none
  // when only the first epoch's best.ckpt is there.
  std::optional<CheckpointState> find_resumable(const std::filesystem::path& file) const;
  void save(const std::filesystem::path& file, int64_t epoch, int64_t batches_done, std::vector<double> loss_sums);

  const TrainRun& run_;
  Replica& lead_;
  const TrainResult& progress_;
  const std::filesystem::path dir_;
  const bool writes_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  // Last: its destructor finishes the writes submitted before the members above go.
  CheckpointWriter writer_;
};

}  // namespace gale::engine::train_parts
