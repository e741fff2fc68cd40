#include "engine/sampled_inference.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>

#include "engine/devices.hpp"
#include "engine/train/minibatch_epoch.hpp"
#include "engine/train/replicas.hpp"
#include "engine/train/run.hpp"
#include "engine/trainer.hpp"

namespace gale::engine {

namespace {

// Every draw of sampled inference derives from this key (gale predict has no --seed).
constexpr uint64_t kInferenceKey = 0x9ed1c7ULL;

// A training run that trains nothing (TrainOptions::inference): the checkpoint's model on o's
// device and budgets, mini-batches of o.fanouts.
TrainOptions inference_options(const ModelConfig& config, const PredictOptions& o) {
  TrainOptions t;
  t.store = o.store;
  t.model = config;
  t.inference = true;
  t.full_graph = false;
  t.fanouts = o.fanouts;
  t.batch_size = o.batch_size;
  t.epochs = 1;
  t.eval = TrainOptions::Eval::kNone;
  t.threads = o.threads;
  t.device = o.device;
  t.exec = o.exec;
  t.edge_weights = config.edge_weights ? TrainOptions::EdgeWeights::kUse : TrainOptions::EdgeWeights::kIgnore;
  t.gpu_mem_budget = o.gpu_mem_budget;
  t.gpu_mem_budget_text = o.gpu_mem_budget_text;
  t.host_mem_budget = o.host_mem_budget;
  t.host_mem_budget_text = o.host_mem_budget_text;
  t.io_engine = o.io_engine;
  t.temp_dir = o.temp_dir;
  return t;
}

}  // namespace

SampledPredictions sampled_predictions(const CheckpointState& state, const std::filesystem::path& file,
                                       const ModelConfig& config, const PredictOptions& o, bool keep_logits,
                                       PredictReport* report) {
  using namespace train_parts;
  const TrainRun run(inference_options(config, o));
  Replicas replicas(run);
  const UseDevice use_lead(run.lead_device());
  reset_gpu_peak(run.lead_device());
  restore_weights(state, replicas.lead().model.get(), file);
  MiniBatchEpochs batches(run, replicas);
  report->sampled = true;
  report->features = batches.placement().description;
  const auto start = std::chrono::steady_clock::now();
  const int64_t n = run.num_nodes();
  SampledPredictions out;
  out.classes.resize(static_cast<size_t>(n));
  if (keep_logits) out.logits = Tensor::empty(n, config.out_dim);
  std::vector<int64_t> nodes(static_cast<size_t>(n));
  std::iota(nodes.begin(), nodes.end(), int64_t{0});
  report->sampled_batches =
      batches.sampled_logits(nodes, kInferenceKey, [&](const int64_t* seeds, int64_t count, const Tensor& rows) {
        const int64_t width = rows.cols();
        for (int64_t i = 0; i < count; ++i) {
          const float* row = rows.f32() + i * width;
          out.classes[static_cast<size_t>(seeds[i])] = static_cast<int32_t>(std::max_element(row, row + width) - row);
          if (keep_logits) std::copy(row, row + width, out.logits.f32() + seeds[i] * width);
        }
      });
  report->forward_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report->gpu_peak_bytes = gpu_peak_bytes(run.lead_device());
  return out;
}

}  // namespace gale::engine
