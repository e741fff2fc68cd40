#include "engine/train/evaluation.hpp"

#include <algorithm>

#include "engine/devices.hpp"
#include "engine/layerwise.hpp"
#include "engine/ops.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"

namespace gale::engine::train_parts {

namespace {

// Accuracy of argmax(logits) over the listed rows (i64 ids on the logits' device); 0 for none.
double accuracy(const Tensor& logits, const Tensor& labels, const Tensor& rows) {
  if (rows.numel() == 0) return 0;
  const ops::LossResult r = ops::softmax_cross_entropy(logits, labels, rows, nullptr);
  return static_cast<double>(r.correct) / static_cast<double>(rows.numel());
}

// At most this many nodes of a split, drawn uniformly with the evaluation's key, estimate its
// accuracy in sampled evaluation (a standard error under 0.14 points at 2^17).
constexpr int64_t kSampledEvalNodes = int64_t{1} << 17;

std::vector<int64_t> evaluated_nodes(const std::vector<int64_t>& split, uint64_t key) {
  if (static_cast<int64_t>(split.size()) <= kSampledEvalNodes) return split;
  std::vector<int64_t> nodes = split;
  kernels::CounterRng rng(key);
  for (int64_t i = 0; i < kSampledEvalNodes; ++i) {  // a partial Fisher-Yates shuffle
    const uint64_t left = nodes.size() - static_cast<size_t>(i);
    std::swap(nodes[static_cast<size_t>(i)], nodes[static_cast<size_t>(i) + rng.below(left)]);
  }
  nodes.resize(static_cast<size_t>(kSampledEvalNodes));
  return nodes;
}

}  // namespace

Evaluation::Evaluation(const TrainRun& run, Replica& lead, storage::HostFeatures* host_features, WholeGraph& whole,
                       MiniBatchEpochs* minibatch)
    : run_(run),
      lead_(lead),
      host_features_(host_features),
      whole_(whole),
      minibatch_(minibatch),
      replicas_host_on_disk_(host_features != nullptr && host_features->on_disk()) {
  const TrainOptions& opt = run.opt();
  // Beyond memory (the features on disk) auto samples: layer-wise inference would pass over every
  // node's features and spill its tables to disk (R-MAT 21 in 2 GB: 337 s against a 1.7 s epoch).
  sampled_ = minibatch != nullptr &&
             (opt.eval == TrainOptions::Eval::kSampled || (opt.eval == TrainOptions::Eval::kAuto && replicas_host_on_disk_));
  if (opt.eval == TrainOptions::Eval::kSampled && minibatch == nullptr)
    throw InputError("--eval sampled: needs mini-batch training (--fanouts)");
  // Eval::kAuto evaluates the whole graph at once when the features are all on the GPU (or this is
  // the CPU) and the whole graph's inference fits in half of what the GPU may hold beside them,
  // else layer by layer.
  const auto whole_graph_inference_fits = [&] {
    if (replicas_host_on_disk_) return false;  // every feature in memory is what the disk tier avoids
    if (!lead.dev.is_cuda()) return true;
    if (lead.batch_features && !lead.batch_features->resident()) return false;
    const storage::Store& store = run.store();
    return whole_graph_inference_bytes(store.num_nodes(), store.num_edges(), store.feature_dim(),
                                       lead.model->widest_dim(), run.attention() ? std::max(1, opt.model.heads) : 0) <=
           gpu_room(lead.dev, opt.gpu_mem_budget) / 2;
  };
  whole_graph_ = opt.full_graph || opt.eval == TrainOptions::Eval::kFull ||
                 (opt.eval == TrainOptions::Eval::kAuto && !sampled_ && whole_graph_inference_fits());
}

void Evaluation::evaluate(EpochMetrics* m) {
  if (run_.opt().eval == TrainOptions::Eval::kNone) return;  // the accuracies stay 0
  if (whole_graph_) {
    Tensor logits = lead_.model->forward(whole_.graphs(), whole_.features(), /*training=*/false, 0);
    m->train_acc = accuracy(logits, lead_.labels_all, whole_.train_rows());
    m->valid_acc = accuracy(logits, lead_.labels_all, whole_.valid_rows());
    m->test_acc = accuracy(logits, lead_.labels_all, whole_.test_rows());
    return;
  }
  if (sampled_) {
    const uint64_t key = kernels::derive_key(run_.epoch_key(m->epoch), 0x5a3b1ULL);
    m->train_acc = minibatch_->sampled_accuracy(evaluated_nodes(run_.train_ids(), key), m->epoch);
    m->valid_acc = minibatch_->sampled_accuracy(evaluated_nodes(run_.valid_ids(), key + 1), m->epoch);
    m->test_acc = minibatch_->sampled_accuracy(evaluated_nodes(run_.test_ids(), key + 2), m->epoch);
  } else {
    const Tensor logits = layerwise_logits_on_host();
    const Tensor labels = Tensor::from_host(run_.labels(), run_.num_nodes(), 1, DType::kI32, Device::cpu());
    m->train_acc = accuracy(logits, labels, ids_tensor(run_.train_ids(), Device::cpu()));
    m->valid_acc = accuracy(logits, labels, ids_tensor(run_.valid_ids(), Device::cpu()));
    m->test_acc = accuracy(logits, labels, ids_tensor(run_.test_ids(), Device::cpu()));
  }
  // Evaluation's reads are not the epoch's.
  if (lead_.batch_features) lead_.batch_features->take_stats();
  if (host_features_ != nullptr) host_features_->take_stats();
}

// Every node's logits by layer-wise inference, a chunk of nodes at a time, sized on a GPU by what
// its budget leaves free when the evaluation starts; the input features come through the
// batches' feature tiers.
Tensor Evaluation::layerwise_logits_on_host() {
  Replica& r = lead_;
  const storage::Store& store = run_.store();
  LayerwiseOptions lo;
  lo.attention = run_.attention();
  if (r.dev.is_cuda())
    lo = layerwise_options_for(gpu_room_left(r.dev, run_.opt().gpu_mem_budget), r.model->widest_dim(), run_.attention());
  // The layers' host tables are charged to the host budget; beyond it they spill to --temp-dir.
  lo.host_budget = &run_.host_budget();
  lo.spill_dir = spill_dir_for(run_.opt().temp_dir, store);
  const HostRowReader read = [&](const int64_t* rows, int64_t count, float* out) {
    if (host_features_ != nullptr) host_features_->read_rows(rows, count, out);
    else store.read_feature_rows(rows, count, out);
  };
  const InputRows from_host = host_input_rows(read, store.feature_dim(), r.dev, &run_.host_budget());
  const InputRows input_rows = [&](const std::vector<int64_t>& ids) {
    return r.batch_features ? r.batch_features->load(ids, read) : from_host(ids);
  };
  return layerwise_logits(*r.model, store, input_rows, lo);
}

}  // namespace gale::engine::train_parts
