#include "engine/train/run.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/devices.hpp"
#include "kernels/error.hpp"
#include "kernels/threads.hpp"
#include "storage/host_memory.hpp"

namespace gale::engine {

void check_train_options(const TrainOptions& o) {
  const ModelConfig& m = o.model;
  const bool gat = m.model == "gat";
  if (o.epochs < 1) throw InputError("--epochs: expected at least 1, found " + std::to_string(o.epochs));
  if (o.patience < 0) throw InputError("--patience: expected 0 (off) or more epochs, found " + std::to_string(o.patience));
  if (o.patience > 0 && o.eval == TrainOptions::Eval::kNone)
    throw InputError("--patience: stops when the validation accuracy stops rising, and --eval none measures none");
  if (o.lr_schedule.kind == LrSchedule::Kind::kPlateau && o.eval == TrainOptions::Eval::kNone)
    throw InputError("--lr-schedule plateau: lowers the rate when the validation accuracy stops rising, and --eval none "
                     "measures none");
  // Each comparison is written so that NaN fails it into the error.
  if (!(o.lr > 0 && std::isfinite(o.lr)))
    throw InputError("--lr: expected a positive, finite learning rate, found " + std::to_string(o.lr));
  if (!(o.lr_schedule.min_lr >= 0.0f && o.lr_schedule.min_lr <= o.lr))
    throw InputError("--min-lr: expected a value from 0 to --lr (" + std::to_string(o.lr) + "), found " +
                     std::to_string(o.lr_schedule.min_lr));
  if (!(o.weight_decay >= 0 && std::isfinite(o.weight_decay)))
    throw InputError("--weight-decay: expected a finite value >= 0, found " + std::to_string(o.weight_decay));
  if (m.layers < 1) throw InputError("--layers: expected at least 1");
  if (m.hidden < 1) throw InputError("--hidden: expected at least 1");
  // Far past any GNN's widths, and a typo's size would only surface as an allocation failure.
  constexpr int64_t kMaxWidth = int64_t{1} << 16;
  if (m.hidden > kMaxWidth)
    throw InputError("--hidden: expected at most " + std::to_string(kMaxWidth) + ", found " + std::to_string(m.hidden));
  if (m.heads < 1) throw InputError("--heads: expected at least 1");
  if (gat && m.heads * m.hidden > kMaxWidth)
    throw InputError("--heads: expected heads x hidden at most " + std::to_string(kMaxWidth) + ", found " +
                     std::to_string(m.heads) + " x " + std::to_string(m.hidden));
  if (m.gin_mlp_layers != 1 && m.gin_mlp_layers != 2) throw InputError("--gin-mlp-layers: expected 1 or 2");
  if (!(m.dropout >= 0 && m.dropout < 1))
    throw InputError("--dropout: expected a value in [0, 1), found " + std::to_string(m.dropout));
  if (!(m.attn_dropout >= 0 && m.attn_dropout < 1))
    throw InputError("--attn-dropout: expected a value in [0, 1), found " + std::to_string(m.attn_dropout));
  if (!std::isfinite(m.gin_eps)) throw InputError("--gin-eps: expected a finite number, found " + std::to_string(m.gin_eps));
  if (!o.full_graph && static_cast<int>(o.fanouts.size()) != m.layers)
    throw InputError("--fanouts: expected one fanout per layer (" + std::to_string(m.layers) + "), found " +
                     std::to_string(o.fanouts.size()));
  if (o.batch_size < 1)  // whole-graph training has no batches, but a negative size is no size
    throw InputError("--batch-size: expected at least 1, found " + std::to_string(o.batch_size));
  if (o.reorder_window < 0) throw InputError("--reorder-window: expected 0 (off) or more");
  if (o.prefetch < 0) throw InputError("--prefetch: expected at least 1");
  if (o.threads < 0) throw InputError("--threads: expected 0 (all cores) or more");
  if (o.exec.spmm == kernels::SpmmKind::kTensorCore) {
    if (!o.full_graph)
      throw InputError("--spmm tc: the tensor-core SpMM aggregates a whole graph translated once (--full-graph); "
                       "sampled blocks change every step");
    if (o.deterministic)
      throw InputError("--spmm tc: cannot be combined with --deterministic (a hub's rows are summed by atomics)");
    if (gat) throw InputError("--spmm tc: aggregates gcn, sage and gin; gat's attention has kernels of its own");
  }
  if (o.checkpoint_interval_s < 0) throw InputError("--checkpoint-interval: expected 0 or more seconds");
  if (o.checkpoint_interval_s > 0 && o.checkpoint_dir.empty())
    throw InputError("--checkpoint-interval: needs --checkpoint-dir");
  if (o.checkpoint_interval_s > 0 && (o.full_graph || o.reorder_window > 1))
    throw InputError("--checkpoint-interval: checkpoints inside an epoch need mini-batch training without "
                     "--reorder-window");
  if (o.resume && o.checkpoint_dir.empty()) throw InputError("--resume: needs --checkpoint-dir");
}

namespace train_parts {

namespace {

std::string identity_json(const TrainOptions& o, const storage::Store& store) {
  const ModelConfig& m = o.model;
  nlohmann::json j = {
      {"model", m.model}, {"layers", m.layers}, {"in_dim", m.in_dim}, {"hidden", m.hidden},
      {"out_dim", m.out_dim}, {"heads", m.heads}, {"gin_mlp_layers", m.gin_mlp_layers},
      {"gin_eps", m.gin_eps}, {"activation", activation_name(m)},
      {"num_nodes", store.num_nodes()}, {"num_edges", store.num_edges()}, {"seed", o.seed},
      {"full_graph", o.full_graph}, {"fanouts", o.fanouts}, {"batch_size", o.batch_size}};
  // Named only when set, so that checkpoints written before these options resume as they were.
  if (m.edge_weights) j["edge_weights"] = true;
  if (m.norm != Norm::kNone) j["norm"] = norm_name(m.norm);
  if (o.sampling == sampler::Sampling::kWeighted) j["neighbor_sampling"] = "weighted";
  return j.dump();
}

}  // namespace

TrainRun::TrainRun(const TrainOptions& options) : opt_(options), procs_(&Processes::get()) {
  opt_.exec.deterministic = opt_.deterministic;  // auto's kernels compete only if deterministic
  procs_->set_timeout(opt_.comm_timeout_s);
  place_workers();
  check_train_options(opt_);
  if (world_ > 1 && opt_.full_graph)
    throw InputError(std::string(procs_->distributed() ? "mpirun" : devices_[0].is_cpu() ? "--workers" : "--gpus") +
                     ": several workers train mini-batches; give --fanouts");
  gpu_budget_ = DeviceBudgetLease(devices_, opt_.gpu_mem_budget, opt_.gpu_mem_budget_text,
                                  (opt_.inference ? "the sampled prediction on " : "the training run on ") + opt_.store);
  bound_thread_pools();
  // The host budget before the store opens: what the process may use is measured before it maps anything.
  // The processes of the run on this host (mpirun's, or --processes) share the default.
  host_budget_ = storage::make_host_budget(opt_.host_mem_budget, opt_.host_mem_budget_text, procs_->local_size());

  store_ = storage::Store::open(opt_.store);
  if (!store_.has_features()) throw InputError(opt_.store + ": the store has no features.npy; training needs node features");
  if (opt_.inference) {
    opt_.batch_size = std::min<int64_t>(opt_.batch_size, std::max<int64_t>(1, store_.num_nodes()));
    opt_.model.edge_weights = uses_edge_weights(opt_.edge_weights, store_, opt_.model.model);
    return;
  }
  read_labelled_splits();
  fit_model_to_store();
  identity_ = identity_json(opt_, store_);
  if (procs_->distributed()) check_processes_agree();
}

void TrainRun::place_workers() {
  devices_ = place_devices(opt_.devices.empty() ? std::vector<Device>{opt_.device} : opt_.devices,
                           procs_->local_rank(), procs_->local_size(), procs_->host());
  world_ = workers() * procs_->size();
  first_rank_ = procs_->rank() * workers();
  for (const Device& d : devices_) {
    require(d);
    if (d.is_cpu() != devices_[0].is_cpu()) throw InputError("--gpus: workers must all be GPUs or all the CPU");
    if (d.is_cuda() && std::count(devices_.begin(), devices_.end(), d) > 1)
      throw InputError("--gpus: GPU " + std::to_string(d.ordinal) + " is listed twice");
  }
}

void TrainRun::bound_thread_pools() {
  // Both thread pools: --threads, or one thread with --deterministic so results do not depend on
  // the machine's core count.
  const int threads = opt_.deterministic ? 1 : opt_.threads;
  if (threads > 0) {
    thread_limit_.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(threads));
    kernels::set_blas_threads(threads);
  }
}

void TrainRun::read_labelled_splits() {
  if (!store_.has_labels()) throw InputError(opt_.store + ": the store has no labels.npy; training needs node labels");
  if (store_.num_classes() < 1)
    throw InputError(opt_.store + ": labels.npy labels no node (every label is -1); training needs labelled nodes");
  const auto labelled = [&](const std::string& name) {
    std::vector<int64_t> ids;
    for (int64_t v : store_.split(name))
      if (store_.labels()[v] >= 0) ids.push_back(v);
    return ids;
  };
  train_ids_ = labelled("train");
  valid_ids_ = labelled("valid");
  test_ids_ = labelled("test");
  if (train_ids_.empty()) throw InputError(opt_.store + ": the store has no labelled training nodes (splits/train.npy)");
  // More seeds than there are make the same single batch; buffers are sized by the batch.
  if (!opt_.full_graph) opt_.batch_size = std::min<int64_t>(opt_.batch_size, static_cast<int64_t>(train_ids_.size()));
}

void TrainRun::fit_model_to_store() {
  opt_.model.in_dim = store_.feature_dim();
  opt_.model.out_dim = store_.num_classes();
  opt_.model.edge_weights = uses_edge_weights(opt_.edge_weights, store_, opt_.model.model);
  if (opt_.sampling == sampler::Sampling::kWeighted) {
    if (opt_.full_graph) throw InputError("--neighbor-sampling weighted: draws mini-batch neighbours; give --fanouts");
    if (store_.weights() == nullptr)
      throw InputError("--neighbor-sampling weighted: " + opt_.store + " has no edge weights (graph/weights.npy)");
  }
}

void TrainRun::check_processes_agree() const {
  // Every process must train the same model on the same store with as many workers: compare
  // each one's worker count and a fingerprint of its options and store with rank 0's.
  const std::string mine = identity_ + "|" + std::to_string(opt_.epochs) + "|" + std::to_string(opt_.patience) + "|" +
                           std::to_string(opt_.lr) + "|" + opt_.lr_schedule.text + "|" +
                           std::to_string(opt_.lr_schedule.min_lr) + "|" + std::to_string(store_.has_partition());
  const uint64_t fields[2] = {static_cast<uint64_t>(workers()), XXH64(mine.data(), mine.size(), 0)};
  const std::vector<uint8_t> all = procs_->all_gather(fields, sizeof fields, "comparing the processes' options");
  const auto* theirs = reinterpret_cast<const uint64_t*>(all.data());
  for (int p = 1; p < procs_->size(); ++p) {
    if (theirs[2 * p] != theirs[0])
      throw InputError("mpirun: rank " + std::to_string(p) + " has " + std::to_string(theirs[2 * p]) +
                       " workers, rank 0 has " + std::to_string(theirs[0]) + " (every process needs as many GPUs)");
    if (theirs[2 * p + 1] != theirs[1])
      throw InputError("mpirun: rank " + std::to_string(p) + "'s model, options or store differ from rank 0's");
  }
}

}  // namespace train_parts

}  // namespace gale::engine
