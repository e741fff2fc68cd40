// engine/checkpoint.hpp — training state on disk, written atomically.
//
// One file per checkpoint (DIR/latest.ckpt, DIR/best.ckpt): an 8-byte magic, a format version, a
// JSON header (epoch, model config, store identity, best-validation bookkeeping, tensor table),
// the raw f32 tensors, and an xxHash64 of everything before it. Written to a temporary file in
// DIR, fsynced, renamed over the old one, and the directory fsynced: a crash leaves the previous
// checkpoint or the new one, never a torn file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/model.hpp"
#include "engine/tensor.hpp"

namespace gale::engine {

struct CheckpointState {
  int64_t epoch = -1;                // last completed epoch (0-based)
  // A run stopped inside epoch + 1 (gale train interrupted): its first batches_done batches in plan
  // order are trained (each worker's share of them), and partial_loss_sums[w] is the sum of worker
  // rank w's per-seed losses over its batches, one entry per worker of the run. 0: none.
  int64_t batches_done = 0;
  std::vector<double> partial_loss_sums;
  int64_t adam_steps = 0;
  double best_valid_acc = -1;
  double test_acc_at_best_valid = 0;
  int64_t best_epoch = -1;
  // The last epoch that raised best_valid_acc (early stopping counts from it); checkpoints written
  // before it was kept read best_epoch here.
  int64_t improved_epoch = -1;
  // --lr-schedule plateau: its reductions so far and the epoch of the last; 0 and -1 otherwise.
  int64_t lr_reductions = 0, lr_reduced_epoch = -1;
  std::string config_json;           // model config + store identity, checked on resume
  std::vector<std::string> names;    // parameter names, in model order
  std::vector<Tensor> params, adam_m, adam_v;
  // Tensors the model keeps without learning (Model::buffers: normalisations' running
  // statistics), by name, after the parameters' groups; none in checkpoints of models without.
  std::vector<std::string> buffer_names;
  std::vector<Tensor> buffers;
};

constexpr int kCheckpointVersion = 1;

// Writes `state` to `file` atomically (a hidden temporary beside it, renamed over it), first
// removing the temporaries of `file` that a killed run on this host left; throws InputError /
// ResourceError on IO failure.
void save_checkpoint(const std::filesystem::path& file, const CheckpointState& state);
// Reads a checkpoint; throws CorruptStoreError naming the file when it is torn, corrupt or of
// another version.
CheckpointState load_checkpoint(const std::filesystem::path& file);

// The model's buffers (Model::buffers) set from the checkpoint's, copied onto the model's device;
// CorruptStoreError naming `file` when their names or shapes differ.
void restore_buffers(const CheckpointState& state, Model* model, const std::filesystem::path& file);
// The model's parameters (a copy of their own, on the model's device) and then its buffers set
// from the checkpoint's, for inference; CorruptStoreError naming `file` when they do not match.
void restore_weights(const CheckpointState& state, Model* model, const std::filesystem::path& file);

// Writes checkpoints on a thread of its own, in the order submitted, so training does not wait for
// the disk (an fsync per epoch cost a full-graph GPU run ~9 ms an epoch). The states handed over
// must be host tensors nothing else writes. An error of a write is thrown by the next submit() or
// wait(); the destructor finishes what was submitted and drops errors (the run is failing already).
class CheckpointWriter {
 public:
  CheckpointWriter();
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  void submit(std::filesystem::path file, CheckpointState state);
  // Returns once every submitted checkpoint is on disk.
  void wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gale::engine
