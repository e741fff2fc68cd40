#include "engine/train/checkpoints.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/devices.hpp"
#include "kernels/error.hpp"

namespace gale::engine::train_parts {

namespace {

// "hidden 16 there, 32 here": what differs between a checkpoint's run and this one.
std::string identity_difference(const std::string& there, const std::string& here) {
  std::string diff;
  try {
    const nlohmann::json was = nlohmann::json::parse(there), now = nlohmann::json::parse(here);
    for (auto it = now.begin(); it != now.end(); ++it) {
      const auto old = was.find(it.key());
      if (old != was.end() && *old == it.value()) continue;
      diff += (diff.empty() ? "" : ", ") + it.key() + " " + (old == was.end() ? "absent" : old->dump()) + " there, " +
              it.value().dump() + " here";
    }
    for (auto it = was.begin(); it != was.end(); ++it)
      if (!now.contains(it.key()))
        diff += (diff.empty() ? "" : ", ") + it.key() + " " + it.value().dump() + " there, absent here";
  } catch (const nlohmann::json::exception&) {
    diff = "an unreadable description";
  }
  return diff;
}

// --checkpoint-dir must be a directory that takes files, or a path where save_checkpoint can make
// one (its nearest existing ancestor a writable directory): checked before the first epoch, not
// found out when that epoch ends and its checkpoint cannot be written.
void require_writable_checkpoint_dir(const std::filesystem::path& dir, const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path existing = dir;
  while (!existing.empty() && !fs::exists(existing, ec)) existing = existing.parent_path();
  if (existing.empty()) existing = ".";
  const std::string head = "--checkpoint-dir " + text + ": ";
  if (!fs::is_directory(existing, ec))
    throw InputError(head + (existing == dir ? std::string("not a directory") : existing.string() + " is not a directory"));
  if (::access(existing.c_str(), W_OK | X_OK) != 0)
    throw InputError(head + "cannot write in " + existing.string() + ": " + std::strerror(errno));
}

// Without --resume or --overwrite-checkpoints, a --checkpoint-dir (`text` as given) that holds
// an earlier run's checkpoints is refused: they are that run's work.
void refuse_earlier_checkpoints(const std::filesystem::path& dir, const std::string& text) {
  for (const char* name : {"latest.ckpt", "best.ckpt"})
    if (std::filesystem::exists(dir / name))
      throw InputError("--checkpoint-dir " + text + ": holds an earlier run's " + name +
                       "; pass --resume to continue that run, --overwrite-checkpoints to start over there, or "
                       "another directory");
}

// A checkpoint read `from` must be of this run's model, store and batch setup (`identity`).
void require_same_run(const CheckpointState& s, const std::filesystem::path& from, const std::string& identity) {
  if (s.config_json != identity)
    throw CorruptStoreError(from.string() + ": checkpoint of another model, store or batch setup (" +
                            identity_difference(s.config_json, identity) +
                            "); resume with the options it was written with, or use another --checkpoint-dir");
}

// Sets a replica's parameters, Adam moments and step count, and its buffers, from the checkpoint
// read from `file`; CorruptStoreError when they do not match its model.
void restore_replica(const CheckpointState& s, const std::filesystem::path& file, Replica& r, bool lead) {
  const UseDevice use(r.dev);
  // Tensor::to keeps a tensor already on the device: every replica after the first takes its
  // own copy, or CPU replicas would share (and each step) one set of weights and moments.
  auto own = [&](const Tensor& t) { return !lead && t.device() == r.dev ? t.clone() : t.to(r.dev); };
  auto params = r.model->parameters();
  if (s.names.size() != params.size()) throw CorruptStoreError(file.string() + ": parameter count differs from the model");
  for (size_t i = 0; i < params.size(); ++i) {
    if (s.names[i] != params[i]->name || s.params[i].rows() != params[i]->value.rows() ||
        s.params[i].cols() != params[i]->value.cols())
      throw CorruptStoreError(file.string() + ": parameter " + s.names[i] + " does not match the model");
    params[i]->value = own(s.params[i]);
    r.adam->first_moments()[i] = own(s.adam_m[i]);
    r.adam->second_moments()[i] = own(s.adam_v[i]);
  }
  r.adam->set_steps(s.adam_steps);
  restore_buffers(s, r.model.get(), file);
}

// The run's bookkeeping (best and improved epochs, plateau reductions) from the checkpoint.
void restore_progress(const CheckpointState& s, TrainResult* result) {
  result->best_valid_acc = s.best_valid_acc;
  result->test_acc_at_best_valid = s.test_acc_at_best_valid;
  result->best_epoch = s.best_epoch;
  result->improved_epoch = s.improved_epoch;
  result->lr_reductions = s.lr_reductions;
  result->lr_reduced_epoch = s.lr_reduced_epoch;
}

// Where the checkpoint read from `file` resumes; InputError when it stopped inside an epoch that
// this run cannot go on with (another number of workers, or a run that does not stop at a step).
ResumePoint resume_point(const CheckpointState& s, const std::filesystem::path& file, const TrainRun& run) {
  ResumePoint point;
  point.epochs_done = s.epoch + 1;
  point.batch = s.batches_done;
  point.loss_sums = s.partial_loss_sums;
  if (point.batch > 0 && (!run.step_stops() || static_cast<int>(point.loss_sums.size()) != run.world())) {
    const size_t n = point.loss_sums.size();
    throw InputError(file.string() + ": stopped inside epoch " + std::to_string(point.epochs_done + 1) + " by a run with " +
                     (n == 1 ? std::string("one worker") : std::to_string(n) + " workers") +
                     " and no --reorder-window; resume it that way (the epoch's batches cannot be dealt out anew)");
  }
  return point;
}

// A host copy of t that training will not write (Tensor::to keeps a host tensor as it is).
Tensor host_copy(const Tensor& t) { return t.device().is_cpu() ? t.clone() : t.to(Device::cpu()); }

}  // namespace

CheckpointPolicy::CheckpointPolicy(const TrainRun& run, Replica& lead, const TrainResult& progress)
    : run_(run),
      lead_(lead),
      progress_(progress),
      dir_(run.opt().checkpoint_dir),
      writes_(!run.opt().checkpoint_dir.empty() && run.lead_process()) {}

ResumePoint CheckpointPolicy::start(Replicas& replicas, TrainResult* result) {
  const TrainOptions& opt = run_.opt();
  if (writes_) {
    require_writable_checkpoint_dir(dir_, opt.checkpoint_dir);
    if (!opt.resume && !opt.overwrite_checkpoints) refuse_earlier_checkpoints(dir_, opt.checkpoint_dir);
  }
  if (!opt.resume) return ResumePoint();
  const auto file = dir_ / "latest.ckpt";
  const std::optional<CheckpointState> s = find_resumable(file);
  if (!s) return ResumePoint();
  for (Replica& r : replicas) restore_replica(*s, file, r, &r == &replicas.lead());
  restore_progress(*s, result);
  ResumePoint point = resume_point(*s, file, run_);
  if (opt.on_resume && run_.lead_process()) opt.on_resume(point.epochs_done, point.batch);
  return point;
}

// The checkpoint to resume, `file` (latest.ckpt), checked to be of this run; none when the
// directory holds only the first epoch's best.ckpt (this run starts over).
std::optional<CheckpointState> CheckpointPolicy::find_resumable(const std::filesystem::path& file) const {
  if (!std::filesystem::exists(file)) {
    // best.ckpt is written before latest.ckpt (so that a run killed between them trains that
    // epoch again and rewrites it): a run killed between its first two leaves best.ckpt of the
    // first epoch alone. There is nothing to resume, so this run starts over.
    const auto best = dir_ / "best.ckpt";
    if (!std::filesystem::exists(best)) throw InputError("--resume: no checkpoint at " + file.string());
    const CheckpointState first = load_checkpoint(best);
    require_same_run(first, best, run_.identity());
    if (first.epoch != 0)
      throw InputError("--resume: no checkpoint at " + file.string() + " (only best.ckpt, of epoch " +
                       std::to_string(first.epoch + 1) + ")");
    return std::nullopt;
  }
  CheckpointState s = load_checkpoint(file);
  require_same_run(s, file, run_.identity());
  return s;
}

void CheckpointPolicy::save_latest(int64_t epoch, int64_t batches_done, std::vector<double> loss_sums) {
  if (writes_) save(dir_ / "latest.ckpt", epoch, batches_done, std::move(loss_sums));
}

void CheckpointPolicy::save_best(int64_t epoch) {
  if (writes_) save(dir_ / "best.ckpt", epoch, 0, {});
}

bool CheckpointPolicy::interval_due() const {
  const double interval = run_.opt().checkpoint_interval_s;
  return interval > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - last_).count() >= interval;
}

void CheckpointPolicy::save(const std::filesystem::path& file, int64_t epoch, int64_t batches_done,
                            std::vector<double> loss_sums) {
  Model& model = *lead_.model;
  Adam& adam = *lead_.adam;
  CheckpointState s;
  s.epoch = epoch;
  s.batches_done = batches_done;
  s.partial_loss_sums = std::move(loss_sums);
  s.adam_steps = adam.steps();
  s.best_valid_acc = progress_.best_valid_acc;
  s.test_acc_at_best_valid = progress_.test_acc_at_best_valid;
  s.best_epoch = progress_.best_epoch;
  s.improved_epoch = progress_.improved_epoch;
  s.lr_reductions = progress_.lr_reductions;
  s.lr_reduced_epoch = progress_.lr_reduced_epoch;
  s.config_json = run_.identity();
  auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    s.names.push_back(params[i]->name);
    s.params.push_back(host_copy(params[i]->value));
    s.adam_m.push_back(host_copy(adam.first_moments()[i]));
    s.adam_v.push_back(host_copy(adam.second_moments()[i]));
  }
  for (Buffer* b : model.buffers()) {
    s.buffer_names.push_back(b->name);
    s.buffers.push_back(host_copy(b->value));
  }
  writer_.submit(file, std::move(s));
  last_ = std::chrono::steady_clock::now();
}

}  // namespace gale::engine::train_parts
