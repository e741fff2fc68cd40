#include "engine/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "engine/devices.hpp"
#include "engine/train/checkpoints.hpp"
#include "engine/train/evaluation.hpp"
#include "engine/train/full_graph_epoch.hpp"
#include "engine/train/metrics_log.hpp"
#include "engine/train/minibatch_epoch.hpp"
#include "engine/train/replicas.hpp"
#include "engine/train/run.hpp"
#include "engine/train/whole_graph.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"

namespace gale::engine {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// An epoch's metrics as it starts: its number and learning rate (set on every replica), and each
// GPU's allocation counters before it.
EpochMetrics begin_epoch(const TrainOptions& opt, int64_t epoch, const TrainResult& result,
                         train_parts::Replicas& replicas, GpuAllocationCounts* allocations_before) {
  EpochMetrics m;
  m.epoch = epoch;
  m.epochs = opt.epochs;
  m.lr = scheduled_lr(opt.lr_schedule, opt.lr, epoch, opt.epochs, result.lr_reductions);
  for (train_parts::Replica& r : replicas) r.adam->set_lr(static_cast<float>(m.lr));
  for (const train_parts::Replica& r : replicas) reset_gpu_peak(r.dev);
  for (const train_parts::Replica& r : replicas) {
    const GpuAllocationCounts c = gpu_allocation_counts(r.dev);
    allocations_before->calls += c.calls;
    allocations_before->reused += c.reused;
  }
  return m;
}

// The epoch's GPU memory peak and allocation calls over every replica.
void end_epoch_counters(const train_parts::Replicas& replicas, const GpuAllocationCounts& before, EpochMetrics* m) {
  for (const train_parts::Replica& r : replicas) {
    m->gpu_peak_bytes = std::max(m->gpu_peak_bytes, gpu_peak_bytes(r.dev));
    const GpuAllocationCounts c = gpu_allocation_counts(r.dev);
    m->gpu_allocations += c.calls;
    m->gpu_allocations_reused += c.reused;
  }
  m->gpu_allocations -= before.calls;
  m->gpu_allocations_reused -= before.reused;
}

// Model selection after an evaluated epoch: the best accuracy (validation, or training without a
// validation split; ties go to the later epoch, as in PyG's reference script), the last rise of it
// (early stopping and the plateau schedule count from there). Returns whether the epoch is the new
// best. Every process evaluates its own replica; rank 0's bookkeeping holds for all, so that a
// last-bit difference in another's accuracy cannot set its rate or its stop apart.
bool select_model(const train_parts::TrainRun& run, int64_t epoch, const EpochMetrics& m, TrainResult* result) {
  const TrainOptions& opt = run.opt();
  const double select = run.valid_ids().empty() ? m.train_acc : m.valid_acc;
  if (select > result->best_valid_acc) result->improved_epoch = epoch;
  if (run.procs().distributed() && (opt.patience > 0 || opt.lr_schedule.kind == LrSchedule::Kind::kPlateau))
    run.procs().broadcast(&result->improved_epoch, sizeof result->improved_epoch, "agreeing on the best epoch");
  if (opt.lr_schedule.kind == LrSchedule::Kind::kPlateau &&
      epoch - std::max(result->improved_epoch, result->lr_reduced_epoch) > opt.lr_schedule.epochs) {
    ++result->lr_reductions;
    result->lr_reduced_epoch = epoch;
  }
  if (select < result->best_valid_acc) return false;
  result->best_valid_acc = select;
  result->test_acc_at_best_valid = m.test_acc;
  result->best_epoch = epoch;
  return true;
}

// Early stopping: `epoch` has gone opt.patience epochs past the last rise of the best accuracy.
bool patience_spent(const TrainOptions& opt, const TrainResult& result, int64_t epoch) {
  return opt.patience > 0 && result.improved_epoch >= 0 && epoch - result.improved_epoch >= opt.patience;
}

// A run stopped by TrainOptions::stop after `batches` of epoch `epoch`'s `of` batches.
TrainResult& stopped(TrainResult& result, int signal, int64_t epoch, int64_t batches, int64_t of,
                     train_parts::CheckpointPolicy& checkpoints) {
  result.stop_signal = signal;
  result.stopped_epoch = epoch;
  result.stopped_batches = batches;
  result.stopped_of = of;
  checkpoints.wait();  // so a stopped run's message is true
  return result;
}

}  // namespace

LrSchedule parse_lr_schedule(const std::string& text) {
  LrSchedule s;
  s.text = text;
  if (text == "constant") return s;
  if (text == "cosine") {
    s.kind = LrSchedule::Kind::kCosine;
    return s;
  }
  const auto bad = [&] {
    return InputError("--lr-schedule: expected constant, cosine, step:N:F or plateau:P:F (N, P whole epochs, F in "
                      "(0, 1)), found '" + text + "'");
  };
  const size_t first = text.find(':'), second = text.find(':', first == std::string::npos ? first : first + 1);
  if (first == std::string::npos || second == std::string::npos) throw bad();
  const std::string kind = text.substr(0, first);
  if (kind == "step") s.kind = LrSchedule::Kind::kStep;
  else if (kind == "plateau") s.kind = LrSchedule::Kind::kPlateau;
  else throw bad();
  const std::string n = text.substr(first + 1, second - first - 1), f = text.substr(second + 1);
  size_t used = 0;
  try {
    s.epochs = std::stoll(n, &used);
    if (used != n.size()) throw bad();
    s.factor = std::stof(f, &used);
    if (used != f.size()) throw bad();
  } catch (const std::logic_error&) {
    throw bad();
  }
  if (s.epochs < (s.kind == LrSchedule::Kind::kStep ? 1 : 0) || !(s.factor > 0.0f && s.factor < 1.0f)) throw bad();
  return s;
}

double scheduled_lr(const LrSchedule& s, double lr, int64_t epoch, int64_t epochs, int64_t reductions) {
  double rate = lr;
  switch (s.kind) {
    case LrSchedule::Kind::kConstant: break;
    case LrSchedule::Kind::kCosine:
      rate = s.min_lr + (lr - s.min_lr) * 0.5 *
                            (1.0 + std::cos(std::acos(-1.0) * static_cast<double>(epoch) / static_cast<double>(std::max<int64_t>(epochs, 1))));
      break;
    case LrSchedule::Kind::kStep: rate = lr * std::pow(static_cast<double>(s.factor), static_cast<double>(epoch / s.epochs)); break;
    case LrSchedule::Kind::kPlateau: rate = lr * std::pow(static_cast<double>(s.factor), static_cast<double>(reductions)); break;
  }
  return std::max<double>(rate, s.min_lr);
}

bool uses_edge_weights(TrainOptions::EdgeWeights choice, const storage::Store& store, const std::string& model) {
  const bool weighted = store.weights() != nullptr;
  switch (choice) {
    case TrainOptions::EdgeWeights::kIgnore: return false;
    case TrainOptions::EdgeWeights::kAuto: return weighted && model != "gat";
    case TrainOptions::EdgeWeights::kUse:
      if (!weighted)
        throw InputError("--edge-weights use: " + store.path().string() + " has no edge weights (graph/weights.npy)");
      if (model == "gat")
        throw InputError("--edge-weights use: GAT weighs its neighbours by attention, not by edge weights; "
                         "use gcn, sage or gin, or --edge-weights ignore");
      return true;
  }
  return false;
}

// The run's shape: set up, resume, then for each epoch train it, evaluate, select, checkpoint and
// record, and decide whether to stop. Each part owns its state (engine/train/run.hpp lists them).
TrainResult train(const TrainOptions& options, const EpochCallback& on_epoch) {
  using namespace train_parts;
  const TrainRun run(options);
  const TrainOptions& opt = run.opt();
  Replicas replicas(run);
  // This thread trains worker 0 (and runs evaluation and checkpoints) on the lead device: make it
  // the current device for the whole run, so --device cuda:N launches its kernels there.
  const UseDevice use_lead(run.lead_device());
  TrainResult result;
  result.best_valid_acc = -1;
  result.selects_on_train = run.valid_ids().empty();
  CheckpointPolicy checkpoints(run, replicas.lead(), result);
  const ResumePoint resume = checkpoints.start(replicas, &result);
  MetricsLog metrics(run);
  std::optional<MiniBatchEpochs> minibatch;
  if (!opt.full_graph) minibatch.emplace(run, replicas);
  if (minibatch && opt.on_placement && run.lead_process()) opt.on_placement(minibatch->placement().description);
  WholeGraph whole(run, run.lead_device());
  Evaluation evaluation(run, replicas.lead(), replicas.host_features(), whole, minibatch ? &*minibatch : nullptr);

  result.epochs_done = resume.epochs_done;
  // A resumed run that had already stopped early (after a whole epoch) trains no more.
  result.stopped_early = resume.batch == 0 && resume.epochs_done < opt.epochs &&
                         patience_spent(opt, result, resume.epochs_done - 1);
  for (int64_t epoch = resume.epochs_done; epoch < opt.epochs && !result.stopped_early; ++epoch) {
    const auto t_epoch = Clock::now();
    GpuAllocationCounts allocations_before;
    EpochMetrics m = begin_epoch(opt, epoch, result, replicas, &allocations_before);
    const uint64_t epoch_key = run.epoch_key(epoch);
    int stop_signal = 0;  // agreed by every worker after a mini-batch epoch with several of them
    if (opt.full_graph) {
      train_full_graph_epoch(replicas.lead(), whole, epoch_key, &m);
    } else {
      const MiniBatchEpochEnd end = minibatch->train_epoch(
          epoch, epoch_key, epoch == resume.epochs_done ? &resume : nullptr, checkpoints, &m);
      // With several processes the signal may have reached another one only.
      if (end.inside)
        return stopped(result, std::max(end.stop_signal, opt.stop != nullptr ? opt.stop->load() : 0), epoch,
                       end.batches_done, m.batches, checkpoints);
      stop_signal = end.stop_signal;
    }
    const auto t_eval = Clock::now();
    evaluation.evaluate(&m);
    m.eval_s = since(t_eval);
    m.spmm_choices = whole.spmm_choices();
    end_epoch_counters(replicas, allocations_before, &m);
    if (select_model(run, epoch, m, &result)) checkpoints.save_best(epoch);
    m.epoch_s = since(t_epoch);
    checkpoints.save_latest(epoch);
    metrics.epoch(m, minibatch ? minibatch->placement() : FeaturePlacement());
    result.last = m;
    ++result.epochs_run;
    result.epochs_done = epoch + 1;
    if (on_epoch && run.lead_process()) on_epoch(m);
    if (run.world() == 1 && opt.stop) stop_signal = opt.stop->load();
    if (stop_signal != 0 && epoch + 1 < opt.epochs) return stopped(result, stop_signal, epoch, m.batches, m.batches, checkpoints);
    if (epoch + 1 < opt.epochs && patience_spent(opt, result, epoch)) result.stopped_early = true;
  }
  metrics.final(result);
  checkpoints.wait();
  return result;
}

}  // namespace gale::engine
