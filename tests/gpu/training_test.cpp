// Training on the GPU: one training step of every model on the GPU matches the same step on the
// CPU (logits, loss and every parameter gradient, with dropout and attention dropout drawing the
// same masks on both), on fresh random graphs with empty rows and a hub, symmetric and not, for
// both fused aggregation kernels; full-graph and mini-batch training reach PyG's accuracy on Cora
// on the GPU; the GPU memory budget is enforced. Skips with a reason when no device is present.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/device_context.hpp"
#include "engine/devices.hpp"
#include "engine/graph.hpp"
#include "engine/model.hpp"
#include "engine/ops.hpp"
#include "engine/predict.hpp"
#include "engine/trainer.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "storage/npy.hpp"
#include "tests/training/cora_options.hpp"
#include "tests/training/layerwise_checks.hpp"

namespace gale::engine {
namespace {

bool have_gpu() { return kernels::cuda::device_count() > 0; }

struct RandomGraph {
  int64_t n = 0;
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  std::vector<float> weights;  // optional (with_weights)
  kernels::CsrView view() const {
    return {n, n, indptr.data(), indices.data(), weights.empty() ? nullptr : weights.data()};
  }
};

// The graph with edge weights in [0.25, 1.75), a function of the unordered pair, so a symmetric
// graph keeps symmetric weights (and its operand shares the CSR as its CSC).
RandomGraph with_weights(RandomGraph g) {
  for (int64_t r = 0; r < g.n; ++r)
    for (int64_t e = g.indptr[r]; e < g.indptr[r + 1]; ++e) {
      const int64_t c = g.indices[e];
      const uint64_t pair = static_cast<uint64_t>(std::min(r, c) * g.n + std::max(r, c));
      g.weights.push_back(0.25f + 1.5f * kernels::random_uniform(91, pair));
    }
  return g;
}

// Every sixth row empty, row 3 a hub over a third of the nodes, others 1-9 distinct neighbours;
// `symmetric` adds every reverse edge.
RandomGraph random_graph(uint64_t key, int64_t n, bool symmetric) {
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(n));
  uint64_t c = 0;
  for (int64_t r = 0; r < n; ++r) {
    int64_t deg = 1 + static_cast<int64_t>(kernels::random_below(key, c++, 9));
    if (r % 6 == 0) deg = 0;
    if (r == 3) deg = n / 3;
    for (int64_t k = 0; k < deg; ++k) {
      const auto s = static_cast<int32_t>(kernels::random_below(key, c++, static_cast<uint64_t>(n)));
      if (s == r) continue;
      rows[r].push_back(s);
      if (symmetric) rows[s].push_back(static_cast<int32_t>(r));
    }
  }
  RandomGraph g;
  g.n = n;
  g.indptr.push_back(0);
  for (auto& row : rows) {
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    g.indices.insert(g.indices.end(), row.begin(), row.end());
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  return g;
}

ModelConfig config_for(const std::string& model) {
  ModelConfig c;
  c.model = model;
  c.layers = 3;
  c.in_dim = 37;
  c.hidden = model == "gat" ? 12 : 48;
  c.heads = 3;
  c.out_dim = 11;  // a width GAR gathers from padded rows (as 37 and 48)
  c.dropout = 0.3f;
  c.attn_dropout = 0.2f;
  c.activation = model == "gat" ? Activation::kElu : Activation::kRelu;
  return c;
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct StepResult {
  std::vector<float> logits;
  double loss = 0;
  std::vector<std::vector<float>> grads;
  std::vector<std::vector<float>> buffers;  // running statistics after the step
};

StepResult step(const ModelConfig& cfg, const RandomGraph& g, const Device& dev, kernels::SpmmKind kind,
                bool fold_relu = true) {
  Model model(cfg, 11);
  model.to(dev);
  model.set_exec({kind, false});
  model.set_fold_relu(fold_relu);
  const GraphOperand op = GraphOperand(g.view()).to(dev, cfg.model == "gat");
  const std::vector<const GraphOperand*> graphs(static_cast<size_t>(cfg.layers), &op);
  std::vector<float> xs(static_cast<size_t>(g.n * cfg.in_dim));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = kernels::random_uniform(77, i) * 2.0f - 1.0f;
  std::vector<int32_t> labels(static_cast<size_t>(g.n));
  std::vector<int64_t> rows;
  for (int64_t v = 0; v < g.n; ++v) {
    labels[v] = static_cast<int32_t>(kernels::random_below(78, static_cast<uint64_t>(v), cfg.out_dim));
    if (v % 3 != 1) rows.push_back(v);
  }
  model.zero_grad();
  const Tensor x = Tensor::from_vector(xs, g.n, cfg.in_dim).to(dev);
  const Tensor logits = model.forward(graphs, x, /*training=*/true, 1234);
  Tensor grad = Tensor::empty(logits.rows(), logits.cols(), DType::kF32, dev);
  StepResult r;
  r.loss = ops::softmax_cross_entropy(logits, Tensor::from_host(labels.data(), g.n, 1, DType::kI32, dev),
                                      Tensor::from_host(rows.data(), static_cast<int64_t>(rows.size()), 1, DType::kI64, dev),
                                      &grad)
               .loss;
  r.logits = logits.to_vector();
  model.backward(std::move(grad));
  for (Parameter* p : model.parameters()) r.grads.push_back(p->grad.to_vector());
  for (Buffer* b : model.buffers()) r.buffers.push_back(b->value.to_vector());
  return r;
}

double norm(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += static_cast<double>(x) * x;
  return std::sqrt(sum);
}

// The GPU step against the CPU step: logits, loss and every parameter gradient. A gradient that is
// zero in exact arithmetic (the bias of a layer whose output is batch-normalised: the
// normalisation subtracts any per-column constant) is rounding noise on both devices, so it must
// only stay below 1e-5 of the largest parameter gradient there.
void expect_same_step(const StepResult& gpu, const StepResult& cpu, const std::string& what) {
  EXPECT_LT(rel_error(gpu.logits, cpu.logits), 1e-4) << what;
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-4 * std::abs(cpu.loss)) << what;
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size()) << what;
  double largest = 0;
  for (const auto& g : cpu.grads) largest = std::max(largest, norm(g));
  for (size_t i = 0; i < cpu.grads.size(); ++i) {
    if (norm(cpu.grads[i]) < 1e-5 * largest) {
      EXPECT_LT(norm(gpu.grads[i]), 1e-5 * largest) << what << " parameter " << i << " (zero in exact arithmetic)";
      continue;
    }
    EXPECT_LT(rel_error(gpu.grads[i], cpu.grads[i]), 1e-3) << what << " parameter " << i;
  }
  ASSERT_EQ(gpu.buffers.size(), cpu.buffers.size()) << what;
  for (size_t i = 0; i < cpu.buffers.size(); ++i)
    EXPECT_LT(rel_error(gpu.buffers[i], cpu.buffers[i]), 1e-5) << what << " buffer " << i;
}

class GpuModelStep : public ::testing::TestWithParam<std::tuple<std::string, bool, kernels::SpmmKind>> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  }
};

TEST_P(GpuModelStep, MatchesTheCpuStep) {
  const auto [model, symmetric, kind] = GetParam();
  const RandomGraph g = random_graph(symmetric ? 5 : 6, 301, symmetric);
  const ModelConfig cfg = config_for(model);
  const StepResult cpu = step(cfg, g, Device::cpu(), kind);
  const StepResult gpu = step(cfg, g, Device::cuda(0), kind);
  expect_same_step(gpu, cpu, model);
}

// MaxK between the layers: top-k selects the same columns on both devices (bit-identical kernels on
// nearly identical inputs), then SpGEMM / SSpMM against their CPU twins inside the whole step.
TEST_P(GpuModelStep, MatchesTheCpuStepWithMaxK) {
  const auto [model, symmetric, kind] = GetParam();
  if (model == "gat") GTEST_SKIP() << "MaxK is for gcn, sage and gin";
  const RandomGraph g = random_graph(symmetric ? 15 : 16, 301, symmetric);
  ModelConfig cfg = config_for(model);
  cfg.activation = Activation::kMaxK;
  cfg.maxk = 8;
  const StepResult cpu = step(cfg, g, Device::cpu(), kind);
  const StepResult gpu = step(cfg, g, Device::cuda(0), kind);
  expect_same_step(gpu, cpu, model);
}

// ReLU's backward folded into the next layer's (Model::set_fold_relu, on in every step above): GCN's
// and GIN's 48 -> 48 hidden layer masks its input gradient in GAR's epilogue (under GAS the layer
// declines, and the model's own pass masks it). Without dropout and with it, the GPU step matches
// the CPU's, and with GAR (deterministic) it is the unfolded GPU step bit for bit.
TEST_P(GpuModelStep, MatchesTheCpuStepWithReluFoldedIntoTheNextLayer) {
  const auto [model, symmetric, kind] = GetParam();
  if (model == "gat") GTEST_SKIP() << "GAT takes no ReLU";
  const RandomGraph g = random_graph(symmetric ? 45 : 46, 301, symmetric);
  for (const float dropout : {0.0f, 0.3f}) {
    ModelConfig cfg = config_for(model);
    cfg.dropout = dropout;
    const std::string what = model + " relu folded, dropout " + std::to_string(dropout);
    const StepResult cpu = step(cfg, g, Device::cpu(), kind);
    const StepResult gpu = step(cfg, g, Device::cuda(0), kind);
    expect_same_step(gpu, cpu, what);
    if (kind != kernels::SpmmKind::kGar) continue;
    const StepResult own_pass = step(cfg, g, Device::cuda(0), kind, /*fold_relu=*/false);
    EXPECT_EQ(gpu.logits, own_pass.logits) << what;
    ASSERT_EQ(gpu.grads.size(), own_pass.grads.size());
    for (size_t i = 0; i < gpu.grads.size(); ++i) EXPECT_EQ(gpu.grads[i], own_pass.grads[i]) << what << " parameter " << i;
  }
}

// Edge weights (ModelConfig::edge_weights: GCN's weighted degrees, weighted messages), with ReLU
// and with MaxK's SpGEMM / SSpMM: the GPU step matches the CPU's.
TEST_P(GpuModelStep, MatchesTheCpuStepWithEdgeWeights) {
  const auto [model, symmetric, kind] = GetParam();
  if (model == "gat") GTEST_SKIP() << "GAT weighs its neighbours by attention";
  const RandomGraph g = with_weights(random_graph(symmetric ? 25 : 26, 301, symmetric));
  ModelConfig cfg = config_for(model);
  cfg.edge_weights = true;
  for (const bool maxk : {false, true}) {
    cfg.activation = maxk ? Activation::kMaxK : Activation::kRelu;
    cfg.maxk = maxk ? 8 : 0;
    const StepResult cpu = step(cfg, g, Device::cpu(), kind);
    const StepResult gpu = step(cfg, g, Device::cuda(0), kind);
    expect_same_step(gpu, cpu, model + (maxk ? " maxk" : " relu") + " weighted");
  }
  if (symmetric) EXPECT_TRUE(GraphOperand(g.view()).symmetric());
}

// Batch normalisation after the hidden layers (the whole graph's statistics): with ReLU (then after
// the normalisation), ELU and MaxK; gamma's and beta's gradients and the running statistics too.
TEST_P(GpuModelStep, MatchesTheCpuStepWithBatchNorm) {
  const auto [model, symmetric, kind] = GetParam();
  const RandomGraph g = random_graph(symmetric ? 35 : 36, 301, symmetric);
  ModelConfig cfg = config_for(model);
  cfg.norm = Norm::kBatch;
  for (const Activation a : {Activation::kRelu, Activation::kElu, Activation::kMaxK}) {
    if (model == "gat" && a == Activation::kMaxK) continue;
    cfg.activation = a;
    cfg.maxk = 8;
    const StepResult cpu = step(cfg, g, Device::cpu(), kind);
    const StepResult gpu = step(cfg, g, Device::cuda(0), kind);
    ASSERT_EQ(cpu.buffers.size(), 4u);
    expect_same_step(gpu, cpu, model + " batch norm " + activation_name(cfg));
  }
}

// MaxK at k = 32 on a symmetric graph of 4501 nodes whose node 3 is read by a quarter of them: each
// layer's SSpMM takes the graph's hub plan (node 3 among its hubs: more than 1024 entries), and
// the whole step still matches the CPU's. Below k = 32 the operand gives no plan.
TEST(GpuMaxkHubPlan, TheStepWithTheGraphsHubPlanMatchesTheCpuStep) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  const RandomGraph g = random_graph(17, 4501, true);
  {
    const GraphOperand op = GraphOperand(g.view()).to(Device::cuda(0), false);
    const kernels::SspmmHubsView hubs = op.sspmm_hubs(32);
    ASSERT_EQ(hubs.capacity, kernels::sspmm_hub_capacity(32));
    std::vector<int32_t> ids(static_cast<size_t>(hubs.capacity));
    kernels::cuda::Stream& stream = DeviceContext::get(0).stream();
    kernels::cuda::copy_to_host(ids.data(), hubs.ids, ids.size(), stream);
    stream.synchronize();
    EXPECT_TRUE(std::binary_search(ids.begin(), ids.end(), 3));
    EXPECT_EQ(op.sspmm_hubs(16).capacity, 0);
  }
  for (const char* model : {"sage", "gcn"}) {
    ModelConfig cfg = config_for(model);
    cfg.hidden = 64;
    cfg.activation = Activation::kMaxK;
    cfg.maxk = 32;
    const StepResult cpu = step(cfg, g, Device::cpu(), kernels::SpmmKind::kAuto);
    const StepResult gpu = step(cfg, g, Device::cuda(0), kernels::SpmmKind::kAuto);
    expect_same_step(gpu, cpu, model);
  }
}

// Wider layers, in every order: 170 -> 160 transforms first, 160 -> 160 aggregates first (GCN,
// GIN: the hidden layer keeps A x) or transforms first (SAGE), 160 -> 11 transforms first; widths
// that GAR gathers from padded rows, in whole tiles plus a tail launch.
TEST(GpuWideModelStep, EveryLayerOrderMatchesTheCpuStep) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  const RandomGraph g = random_graph(25, 401, true);
  for (const std::string model : {"gcn", "sage", "gin"}) {
    ModelConfig cfg = config_for(model);
    cfg.in_dim = 170;  // wider than the hidden layers: the first one transforms first too
    cfg.hidden = 160;
    const StepResult cpu = step(cfg, g, Device::cpu(), kernels::SpmmKind::kGar);
    const StepResult gpu = step(cfg, g, Device::cuda(0), kernels::SpmmKind::kGar);
    expect_same_step(gpu, cpu, model);
  }
}

// TC-GNN's tensor-core SpMM in every aggregation, forward and backward (the CSC's own translation on
// the directed graph), against the CPU step that runs its TF32 twin: the two round the same terms,
// so only the order of the sums and the rare value on a TF32 rounding boundary differ.
TEST(GpuTensorCoreStep, MatchesTheCpuStepWithItsTf32Twin) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  for (const bool symmetric : {true, false}) {
    const RandomGraph g = random_graph(symmetric ? 35 : 36, 301, symmetric);
    for (const std::string model : {"gcn", "sage", "gin", "sage-maxk"}) {
      ModelConfig cfg = config_for(model == "sage-maxk" ? "sage" : model);
      if (model == "sage-maxk") {  // the hidden layers aggregate CBSR; the narrowing one takes tc
        cfg.activation = Activation::kMaxK;
        cfg.maxk = 8;
      }
      const StepResult cpu = step(cfg, g, Device::cpu(), kernels::SpmmKind::kTensorCore);
      const StepResult gpu = step(cfg, g, Device::cuda(0), kernels::SpmmKind::kTensorCore);
      const std::string what = model + (symmetric ? " symmetric" : " directed");
      EXPECT_LT(rel_error(gpu.logits, cpu.logits), 1e-3) << what;
      EXPECT_NEAR(gpu.loss, cpu.loss, 1e-3 * std::abs(cpu.loss)) << what;
      ASSERT_EQ(gpu.grads.size(), cpu.grads.size()) << what;
      for (size_t i = 0; i < cpu.grads.size(); ++i) EXPECT_LT(rel_error(gpu.grads[i], cpu.grads[i]), 3e-3) << what << " parameter " << i;
      // And the twin stays within TF32's reach of the exact step.
      const StepResult exact = step(cfg, g, Device::cpu(), kernels::SpmmKind::kGar);
      EXPECT_LT(rel_error(cpu.logits, exact.logits), 3e-3) << what;
      EXPECT_GT(rel_error(cpu.logits, exact.logits), 0.0) << what << ": the twin rounded nothing";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, GpuModelStep,
    ::testing::Combine(::testing::Values("gcn", "sage", "gin", "gat"), ::testing::Bool(),
                       ::testing::Values(kernels::SpmmKind::kGar, kernels::SpmmKind::kGas)),
    [](const auto& info) {
      return std::get<0>(info.param) + (std::get<1>(info.param) ? "_symmetric_" : "_directed_") +
             kernels::spmm_kind_name(std::get<2>(info.param));
    });

// ---- Cora on the GPU ---------------------------------------------------------------------------

// Layer-wise inference (Eval::kBatched) on the GPU: every model and activation, the logits of
// ~50 chunks a layer (Cora's hubs alone) and of one chunk, with the layers' outputs on the host
// and on the GPU, against the whole-graph forward's.
TEST(GpuLayerwise, EqualsTheWholeGraphForward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  const Device gpu = Device::cuda(0);
  for (const uint64_t tables : {uint64_t{0}, uint64_t{1} << 30}) {
    for (const int64_t max_rows : {int64_t{100}, int64_t{1} << 20}) {
      for (const char* kind : {"gcn", "sage", "gin", "gat"}) {
        testing::expect_layerwise_equals_whole_graph(kind, kind == std::string("gat") ? "elu" : "relu", gpu, max_rows,
                                                     tables);
      }
      for (const char* kind : {"gcn", "sage", "gin"}) {
        testing::expect_layerwise_equals_whole_graph(kind, "maxk:8", gpu, max_rows, tables);
        testing::expect_layerwise_equals_whole_graph(kind, "relu", gpu, max_rows, tables, /*edge_weights=*/true);
        testing::expect_layerwise_equals_whole_graph(kind, "relu", gpu, max_rows, tables, false, Norm::kBatch);
      }
    }
  }
}

class GpuCora : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  }
};

TrainOptions pyg_options(const std::string& model) { return testing::pyg_options(model, Device::cuda(0)); }
using testing::mean_test_accuracy;

// The CPU thresholds of tests/training/cora_accuracy_test.cpp; the mean is printed for the record.
void expect_mean_accuracy_at_least(const std::string& model, double threshold) {
  const double acc = mean_test_accuracy(pyg_options(model), 5);
  std::printf("  gpu %s: mean test accuracy %.4f (5 seeds)\n", model.c_str(), acc);
  EXPECT_GE(acc, threshold) << model;
}
TEST_F(GpuCora, GcnReachesPyg) { expect_mean_accuracy_at_least("gcn", 0.80); }
TEST_F(GpuCora, SageReachesPyg) { expect_mean_accuracy_at_least("sage", 0.79); }
TEST_F(GpuCora, GinReachesPyg) { expect_mean_accuracy_at_least("gin", 0.75); }
TEST_F(GpuCora, GatReachesPyg) { expect_mean_accuracy_at_least("gat", 0.80); }
// tests/training/cora_accuracy_test.cpp's bound against PyG with BatchNorm1d (GCN 0.747 at hidden
// 16, 0.794 at hidden 256: bench/pyg_accuracy.py --norm batch, 5 seeds, H100).
TEST_F(GpuCora, GcnWithBatchNormMatchesPyg) {
  TrainOptions o = pyg_options("gcn");
  o.model.norm = Norm::kBatch;
  const double narrow = mean_test_accuracy(o, 5);
  o.model.hidden = 256;
  const double wide = mean_test_accuracy(o, 5);
  std::printf("  gcn with batch norm: hidden 16 %.4f, hidden 256 %.4f\n", narrow, wide);
  EXPECT_GE(narrow, 0.747 - 0.015);
  EXPECT_GE(wide, 0.794 - 0.015);
}

TEST_F(GpuCora, SageWithMaxK32IsWithinOnePointFiveOfRelu) {
  TrainOptions o = pyg_options("sage");
  o.model.hidden = 256;
  const double relu = mean_test_accuracy(o, 5);
  o.model.activation = Activation::kMaxK;
  o.model.maxk = 32;
  const double maxk = mean_test_accuracy(o, 5);
  std::printf("  gpu sage hidden 256: relu %.4f, maxk:32 %.4f\n", relu, maxk);
  EXPECT_GE(maxk, relu - 0.015);
}

TEST_F(GpuCora, GasKernelReachesPygToo) {
  TrainOptions o = pyg_options("gcn");
  o.exec.spmm = kernels::SpmmKind::kGas;
  EXPECT_GE(mean_test_accuracy(o, 3), 0.80);
}

// `--spmm tc`: every aggregation of GCN and SAGE on tensor cores (TF32) keeps the CPU thresholds.
TEST_F(GpuCora, TensorCoreSpmmReachesPygToo) {
  for (const auto& [model, threshold] : {std::pair<std::string, double>{"gcn", 0.80}, {"sage", 0.79}}) {
    TrainOptions o = pyg_options(model);
    o.exec.spmm = kernels::SpmmKind::kTensorCore;
    const double acc = mean_test_accuracy(o, 5);
    std::printf("  gpu %s with --spmm tc: %.4f\n", model.c_str(), acc);
    EXPECT_GE(acc, threshold) << model;
  }
}

// PyG's options for `model`, mini-batch with fanouts 10,10 in batches of `batch`.
TrainOptions minibatch_options(const std::string& model, int64_t batch) {
  TrainOptions o = pyg_options(model);
  o.full_graph = false;
  o.fanouts = {10, 10};
  o.batch_size = batch;
  return o;
}

TEST_F(GpuCora, MiniBatchSageWithFanouts10x10) { EXPECT_GE(mean_test_accuracy(minibatch_options("sage", 1024), 5), 0.78); }

// The default mini-batch path on a GPU samples there; the CPU sampler draws the same neighbours,
// so without dropout (whose masks follow local row numbers, which differ) the two train the same
// model up to float summation order.
TEST_F(GpuCora, GpuSamplerTrainsLikeTheCpuSampler) {
  TrainOptions o = minibatch_options("sage", 64);
  o.epochs = 4;
  o.model.dropout = 0;
  auto losses = [&](bool gpu_sampler) {
    o.gpu_sampler = gpu_sampler;
    std::vector<double> out;
    train(o, [&](const EpochMetrics& m) { out.push_back(m.loss); });
    return out;
  };
  const std::vector<double> gpu = losses(true), cpu = losses(false);
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t e = 0; e < gpu.size(); ++e) EXPECT_NEAR(gpu[e], cpu[e], 1e-3 * std::abs(cpu[e])) << "epoch " << e;
}

// Features through the disk tier (storage/host_features.hpp: rows read on the host, copied with
// each batch) train as the GPU's tiers do: the same rows, so without dropout the losses agree up
// to float summation order, with either sampler, and the run learns Cora.
TEST_F(GpuCora, FeaturesOnDiskTrainLikeTheGpuTiers) {
  for (const bool gpu_sampler : {false, true}) {
    TrainOptions o = minibatch_options("sage", 64);
    o.epochs = 4;
    o.model.dropout = 0;
    o.gpu_sampler = gpu_sampler;
    // A GPU cache of 500 of Cora's 2708 rows (1433 wide): the tiers read the rest from pinned host
    // memory, the disk tier stages each batch's rest from its host cache and features.npy.
    o.feature_gpu_bytes = 2708 * 4 + 500 * 1433 * 4;
    auto losses = [&](bool on_disk) {
      o.features_on_disk = on_disk;
      std::vector<double> out;
      std::string placement;
      o.on_placement = [&](const std::string& p) { placement = p; };
      train(o, [&](const EpochMetrics& m) {
        out.push_back(m.loss);
        if (on_disk) EXPECT_GT(m.disk_bytes_read + static_cast<uint64_t>(m.host_cache_hits), 0u);
        if (on_disk) EXPECT_GT(m.rows_host, 0) << "staged rows";
        EXPECT_GT(m.rows_cache, 0);
      });
      EXPECT_EQ(placement.find("host cache") != std::string::npos, on_disk) << placement;
      return out;
    };
    const std::vector<double> tiers = losses(false), disk = losses(true);
    ASSERT_EQ(tiers.size(), disk.size());
    for (size_t e = 0; e < tiers.size(); ++e)
      EXPECT_NEAR(disk[e], tiers[e], 1e-3 * std::abs(tiers[e])) << "epoch " << e << ", gpu sampler " << gpu_sampler;
  }
  TrainOptions o = minibatch_options("sage", 1024);
  o.features_on_disk = true;
  const double acc = mean_test_accuracy(o, 3);
  std::printf("  gpu sage, features on disk: mean test accuracy %.4f (3 seeds)\n", acc);
  EXPECT_GE(acc, 0.78);
}

TEST_F(GpuCora, MiniBatchOnTheCpuSamplerToo) {
  TrainOptions o = minibatch_options("sage", 1024);
  o.gpu_sampler = false;
  EXPECT_GE(mean_test_accuracy(o, 3), 0.78);
}

// GPU sampling with the match-reorder window (node sets copied back for it), deeper prefetch and
// GAT (whose blocks need the edge map): every configuration still learns Cora.
TEST_F(GpuCora, GpuSamplerWithReorderWindowPrefetchAndGat) {
  TrainOptions o = minibatch_options("sage", 32);
  o.prefetch = 3;
  o.reorder_window = 4;
  EpochMetrics last;
  o.epochs = 100;
  const TrainResult r = train(o, [&](const EpochMetrics& m) { last = m; });
  EXPECT_GE(r.test_acc_at_best_valid, 0.76);
  EXPECT_EQ(last.batches, 5);  // 140 seeds in batches of 32
  EXPECT_GT(last.input_nodes, 0);
  EXPECT_GT(last.reused_nodes, 0);
  EXPECT_EQ(last.feature_rows, last.input_nodes);
  // Steady steps allocate from blocks the pool kept (kernels/cuda/runtime.hpp), not the driver.
  EXPECT_GT(last.gpu_allocations, 0u);
  EXPECT_GT(last.gpu_allocations_reused, last.gpu_allocations / 2);
  EXPECT_GE(train(minibatch_options("gat", 64)).test_acc_at_best_valid, 0.76);
}

// The values of an f32 .npy file.
std::vector<float> read_f32_npy(const std::string& path) {
  const storage::NpyHeader h = storage::read_npy_header(path);
  std::vector<float> v(static_cast<size_t>(h.count()));
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(h.data_offset));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

// How many of a's entries lie farther than float summation order (1e-3, absolute and relative) from b's.
size_t far_from(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += !(std::fabs(a[i] - b[i]) <= 1e-3f + 1e-3f * std::fabs(b[i]));
  return n;
}

// A prediction of logits only (no classes file) on `device` from the checkpoints `o` wrote.
PredictOptions logits_prediction(const TrainOptions& o, const Device& device, const std::string& embeddings) {
  PredictOptions p;
  p.store = o.store;
  p.checkpoint = o.checkpoint_dir;
  p.device = device;
  p.out = "";
  p.embeddings = embeddings;
  return p;
}

// `gale predict --device cuda`: a checkpoint trained on the GPU predicts the same classes and
// logits on the GPU as on the CPU (up to float summation order), for each model family, MaxK too.
TEST_F(GpuCora, PredictOnTheGpuMatchesTheCpu) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("gale_gpu_predict_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const std::string model : {"gcn", "sage", "gin", "gat", "sage-maxk"}) {
    TrainOptions o = pyg_options(model == "sage-maxk" ? "sage" : model);
    if (model == "sage-maxk") {
      o.model.hidden = 64;
      o.model.activation = Activation::kMaxK;
      o.model.maxk = 16;
    }
    o.epochs = 40;
    o.checkpoint_dir = (dir / model).string();
    const TrainResult trained = train(o);
    PredictOptions p;
    p.store = o.store;
    p.checkpoint = o.checkpoint_dir;
    p.out = (dir / (model + "_cpu_pred.npy")).string();
    p.embeddings = (dir / (model + "_cpu_logits.npy")).string();
    const PredictReport cpu = predict(p);
    p.device = Device::cuda(0);
    p.out = (dir / (model + "_gpu_pred.npy")).string();
    p.embeddings = (dir / (model + "_gpu_logits.npy")).string();
    const PredictReport gpu = predict(p);
    EXPECT_EQ(gpu.num_nodes, 2708);
    EXPECT_GT(gpu.gpu_peak_bytes, 0u) << model;
    EXPECT_NEAR(gpu.test_acc, cpu.test_acc, 0.003) << model;
    EXPECT_NEAR(gpu.test_acc, trained.test_acc_at_best_valid, 0.003) << model << ": the best checkpoint's test accuracy";
    const std::vector<float> lc = read_f32_npy(dir / (model + "_cpu_logits.npy")), lg = read_f32_npy(dir / (model + "_gpu_logits.npy"));
    ASSERT_EQ(lc.size(), lg.size());
    EXPECT_EQ(far_from(lg, lc), 0u) << model << ": GPU logits far from the CPU's";
    if (model == "gcn" || model == "sage") {  // and through the tensor-core SpMM (TF32)
      p.exec.spmm = kernels::SpmmKind::kTensorCore;
      p.out = (dir / (model + "_tc_pred.npy")).string();
      p.embeddings.clear();
      const PredictReport tc = predict(p);
      EXPECT_NEAR(tc.test_acc, cpu.test_acc, 0.01) << model << " with --spmm tc";
    }
  }
  std::filesystem::remove_all(dir);
}

// ES-SpMM in `gale predict --spmm sampled:S`: with S above Cora's largest degree (168) the
// estimate is the product; at S = 4 (most rows have at most 4 entries) the GPU and the CPU give
// the same logits and the accuracy stays within 3 points of the exact product's.
TEST_F(GpuCora, SampledPredictionOnTheGpuMatchesItsCpuTwinAndKeepsAccuracy) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("gale_gpu_sampled_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const std::string model : {"gcn", "sage"}) {
    TrainOptions o = pyg_options(model);
    o.checkpoint_dir = (dir / model).string();
    train(o);
    auto run = [&](const Device& device, int64_t s, const std::string& name) {
      PredictOptions p = logits_prediction(o, device, (dir / (model + "_" + name + ".npy")).string());
      if (s > 0) {
        p.exec.spmm = kernels::SpmmKind::kSampled;
        p.exec.spmm_sample_width = s;
      }
      const PredictReport r = predict(p);
      const std::vector<float> v = read_f32_npy(p.embeddings);
      return std::make_pair(r.test_acc, v);
    };
    const auto exact = run(Device::cuda(0), 0, "exact"), all = run(Device::cuda(0), 256, "s256");
    const auto gpu4 = run(Device::cuda(0), 4, "gpu4"), cpu4 = run(Device::cpu(), 4, "cpu4");
    EXPECT_EQ(far_from(all.second, exact.second), 0u) << model << ": S above every degree";
    EXPECT_EQ(far_from(gpu4.second, cpu4.second), 0u) << model << ": GPU against CPU at S = 4";
    EXPECT_GT(far_from(gpu4.second, exact.second), 0u) << model << ": S = 4 samples some rows";
    std::printf("  %s: exact %.4f, sampled:4 %.4f (gpu) %.4f (cpu)\n", model.c_str(), exact.first, gpu4.first, cpu4.first);
    EXPECT_GE(gpu4.first, exact.first - 0.03) << model;
  }
  std::filesystem::remove_all(dir);
}

// `gale predict --fanouts` on a GPU (the GPU sampler, which draws the CPU sampler's neighbours, and
// the GPU's feature tiers): the CPU's sampled logits up to float summation order, and with every
// neighbour (-1) the whole graph's.
TEST_F(GpuCora, SampledInferenceOnTheGpuPredictsAsOnTheCpu) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("gale_gpu_sampled_predict_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  TrainOptions o = pyg_options("sage");
  o.checkpoint_dir = (dir / "sage").string();
  train(o);
  auto run = [&](const Device& device, int fanout, const std::string& name) {
    PredictOptions p = logits_prediction(o, device, (dir / (name + ".npy")).string());
    if (fanout != 0) p.fanouts.assign(static_cast<size_t>(o.model.layers), fanout);
    p.batch_size = 1000;
    const PredictReport r = predict(p);
    EXPECT_EQ(r.sampled, fanout != 0) << name;
    if (fanout != 0) EXPECT_EQ(r.sampled_batches, 3) << name;
    return read_f32_npy(p.embeddings);
  };
  const std::vector<float> gpu5 = run(Device::cuda(0), 5, "gpu5"), cpu5 = run(Device::cpu(), 5, "cpu5");
  EXPECT_EQ(far_from(gpu5, cpu5), 0u) << "fanouts 5: GPU against CPU";
  const std::vector<float> every = run(Device::cuda(0), -1, "gpu_every"), whole = run(Device::cuda(0), 0, "whole");
  EXPECT_EQ(far_from(every, whole), 0u) << "every neighbour against the whole graph";
  std::filesystem::remove_all(dir);
}

// A GPU budget too small for the whole graph's inference (Cora's 1433 features alone take 15.5 MB,
// cuBLAS's workspace 32 MiB) makes predict run layer by layer, ~50 chunks of nodes a layer: the
// logits of the CPU's whole-graph forward, within the budget. (After the suite's unbudgeted runs on
// the same device: the budget belongs to the prediction, not to the process.)
TEST_F(GpuCora, PredictRunsLayerByLayerWhenTheWholeGraphDoesNotFit) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("gale_gpu_layerwise_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const std::string model : {"gcn", "gat"}) {
    TrainOptions o = testing::pyg_options(model, Device::cpu());  // trained on the CPU: no GPU budget yet
    o.epochs = 5;
    o.checkpoint_dir = (dir / model).string();
    train(o);
    auto run = [&](const Device& device) {
      PredictOptions p;
      p.store = o.store;
      p.checkpoint = o.checkpoint_dir;
      p.device = device;
      if (device.is_cuda()) {
        p.gpu_mem_budget = 64ull << 20;
        p.gpu_mem_budget_text = "64M";
      }
      p.out = "";
      p.embeddings = (dir / (model + (device.is_cuda() ? "_gpu.npy" : "_cpu.npy"))).string();
      const PredictReport r = predict(p);
      const std::vector<float> v = read_f32_npy(p.embeddings);
      return std::make_pair(r, v);
    };
    const auto cpu = run(Device::cpu());
    const auto gpu = run(Device::cuda(0));
    EXPECT_GT(gpu.first.layerwise_chunks, 20) << model;
    EXPECT_LE(gpu.first.gpu_peak_bytes, 64ull << 20) << model;
    ASSERT_EQ(gpu.second.size(), cpu.second.size());
    size_t far = 0;
    for (size_t i = 0; i < cpu.second.size(); ++i)
      far += !(std::fabs(gpu.second[i] - cpu.second[i]) <= 1e-4f + 1e-4f * std::fabs(cpu.second[i]));
    EXPECT_EQ(far, 0u) << model;
    EXPECT_NEAR(gpu.first.test_acc, cpu.first.test_acc, 0.002) << model;
  }
  std::filesystem::remove_all(dir);
}

// Both ways past a budget name the flag: one that cuBLAS's workspace alone passes (the run is
// refused as it starts), and one that Cora's features pass. Neither needs a process of its own.
TEST_F(GpuCora, ExceededBudgetNamesTheFlag) {
  for (const auto& [bytes, text] : {std::pair<uint64_t, std::string>{1 << 20, "1M"}, {40ull << 20, "40M"}}) {
    TrainOptions o = pyg_options("gcn");
    o.epochs = 1;
    o.gpu_mem_budget = bytes;
    o.gpu_mem_budget_text = text;
    try {
      train(o);
      ADD_FAILURE() << "a " << text << " budget cannot hold cuBLAS's 32 MiB workspace and Cora's 15.5 MB of features";
    } catch (const ResourceError& e) {
      EXPECT_NE(std::string(e.what()).find("--gpu-mem-budget " + text), std::string::npos) << e.what();
    }
    EXPECT_EQ(gpu_holders().holder(0), "") << "the refused run gave the device back";
  }
}

// Budgets belong to runs, not to the process: in one process a budgeted training run, then a
// prediction under another budget (small enough to go layer by layer), then a training run with
// no budget at all each run under their own, and each gives the device back when it ends.
TEST_F(GpuCora, EachRunInOneProcessHasItsOwnBudget) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("gale_gpu_run_budgets_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  TrainOptions budgeted = pyg_options("gcn");
  budgeted.epochs = 50;
  budgeted.gpu_mem_budget = 256ull << 20;
  budgeted.gpu_mem_budget_text = "256M";
  budgeted.checkpoint_dir = (dir / "budgeted").string();
  uint64_t train_peak = 0;
  const TrainResult first = train(budgeted, [&](const EpochMetrics& m) { train_peak = std::max(train_peak, m.gpu_peak_bytes); });
  EXPECT_GT(train_peak, 0u);
  EXPECT_LE(train_peak, 256ull << 20);
  EXPECT_EQ(gpu_holders().holder(0), "");

  PredictOptions p;
  p.store = budgeted.store;
  p.checkpoint = budgeted.checkpoint_dir;
  p.device = Device::cuda(0);
  p.gpu_mem_budget = 64ull << 20;
  p.gpu_mem_budget_text = "64M";
  p.out = "";
  p.embeddings = (dir / "logits.npy").string();
  const PredictReport predicted = predict(p);
  EXPECT_GT(predicted.layerwise_chunks, 0) << "64M leaves no room for the whole graph's inference";
  EXPECT_LE(predicted.gpu_peak_bytes, 64ull << 20);
  EXPECT_GT(predicted.test_acc, 0.6);
  EXPECT_EQ(gpu_holders().holder(0), "");

  TrainOptions unbudgeted = pyg_options("gcn");
  unbudgeted.epochs = 50;
  const TrainResult last = train(unbudgeted);
  EXPECT_EQ(last.epochs_run, 50);
  EXPECT_GT(first.test_acc_at_best_valid, 0.6);
  EXPECT_GT(last.test_acc_at_best_valid, 0.6);
  EXPECT_EQ(gpu_holders().holder(0), "");
  std::filesystem::remove_all(dir);
}

// Overlapping runs on one GPU do not share it: while one run holds the device, another is refused
// with a ResourceError (exit 4) naming the run that holds it, and starts once that one has ended.
TEST_F(GpuCora, ASecondRunOnAHeldGpuIsRefusedNamingTheHolder) {
  TrainOptions o = pyg_options("gcn");
  o.epochs = 2;
  {
    const DeviceBudgetLease held({Device::cuda(0)}, 512ull << 20, "512M", "the test's run");
    try {
      train(o);
      ADD_FAILURE() << "trained on a GPU another run holds";
    } catch (const ResourceError& e) {
      EXPECT_EQ(e.code(), ExitCode::kResource);
      EXPECT_NE(std::string(e.what()).find("cuda:0 is in use by the test's run under --gpu-mem-budget 512M"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(gpu_holders().holder(0), "the test's run under --gpu-mem-budget 512M");
  }
  EXPECT_EQ(train(o).epochs_run, 2);
}

}  // namespace
}  // namespace gale::engine
