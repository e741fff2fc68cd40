// Layer-wise inference (engine/layerwise.hpp): its chunks, and its logits against the whole-graph
// forward's on the CPU for every model and activation.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "engine/layerwise.hpp"
#include "engine/trainer.hpp"
#include "tests/training/cora_options.hpp"
#include "tests/training/layerwise_checks.hpp"

namespace gale::engine {
namespace {

TEST(LayerwiseChunks, CoverEveryNodeWithinTheRowBoundOrAloneWhenWider) {
  // Degrees 3, 0, 9, 1, 1, 2, 0, 12, 4: with at most 6 entries plus nodes, [0, 2) holds 5, node 2
  // (10) and node 7 (13) are chunks alone, [3, 5) holds 4 and [5, 7) 4 (all four would be 8).
  const std::vector<int64_t> degrees = {3, 0, 9, 1, 1, 2, 0, 12, 4};
  std::vector<int64_t> indptr(degrees.size() + 1, 0);
  std::partial_sum(degrees.begin(), degrees.end(), indptr.begin() + 1);
  const int64_t n = static_cast<int64_t>(degrees.size());
  const std::vector<int64_t> bounds = layerwise_chunks(indptr.data(), n, 6);
  EXPECT_EQ(bounds, (std::vector<int64_t>{0, 2, 3, 5, 7, 8, 9}));
  for (size_t c = 0; c + 1 < bounds.size(); ++c) {
    const int64_t rows = indptr[bounds[c + 1]] - indptr[bounds[c]] + bounds[c + 1] - bounds[c];
    EXPECT_TRUE(rows <= 6 || bounds[c + 1] - bounds[c] == 1) << c;
  }
  EXPECT_EQ(layerwise_chunks(indptr.data(), n, 1000), (std::vector<int64_t>{0, 9}));
  EXPECT_EQ(layerwise_chunks(indptr.data(), 0, 6), (std::vector<int64_t>{0}));
}

// Chunks of at most 100 rows: ~50 chunks a layer, Cora's hubs (up to 168 in-neighbours) alone.
TEST(Layerwise, EqualsTheWholeGraphForwardOnTheCpu) {
  for (const char* kind : {"gcn", "sage", "gin", "gat"})
    testing::expect_layerwise_equals_whole_graph(kind, kind == std::string("gat") ? "elu" : "relu", Device::cpu(), 100);
  for (const char* kind : {"gcn", "sage", "gin"}) testing::expect_layerwise_equals_whole_graph(kind, "maxk:8", Device::cpu(), 100);
  testing::expect_layerwise_equals_whole_graph("sage", "relu", Device::cpu(), 1 << 20);  // one chunk
}

// Batch normalisation in inference normalises by the running statistics, so chunks of nodes give
// what the whole graph gives.
TEST(Layerwise, BatchNormEqualsTheWholeGraphForwardOnTheCpu) {
  for (const char* kind : {"gcn", "sage", "gin", "gat"})
    testing::expect_layerwise_equals_whole_graph(kind, kind == std::string("gat") ? "elu" : "relu", Device::cpu(), 100, 0,
                                                 false, engine::Norm::kBatch);
  testing::expect_layerwise_equals_whole_graph("sage", "maxk:8", Device::cpu(), 100, 0, false, engine::Norm::kBatch);
}

// With edge weights: each chunk's outer sources take GCN's weighted degrees of the whole graph.
TEST(Layerwise, WeightedEqualsTheWholeGraphForwardOnTheCpu) {
  for (const char* kind : {"gcn", "sage", "gin"}) {
    testing::expect_layerwise_equals_whole_graph(kind, "relu", Device::cpu(), 100, 0, /*edge_weights=*/true);
    testing::expect_layerwise_equals_whole_graph(kind, "maxk:8", Device::cpu(), 100, 0, /*edge_weights=*/true);
  }
}

// Mini-batch training evaluated layer-wise (--eval batched) reports what whole-graph evaluation
// reports, epoch by epoch: the same weights, the same function.
TEST(Layerwise, BatchedEvaluationReportsTheWholeGraphsAccuracies) {
  std::vector<EpochMetrics> seen[2];
  for (const TrainOptions::Eval eval : {TrainOptions::Eval::kFull, TrainOptions::Eval::kBatched}) {
    TrainOptions o = testing::pyg_options("sage");
    o.epochs = 5;
    o.fanouts = {10, 5};
    o.batch_size = 256;
    o.eval = eval;
    train(o, [&](const EpochMetrics& m) { seen[eval == TrainOptions::Eval::kBatched].push_back(m); });
  }
  ASSERT_EQ(seen[0].size(), 5u);
  ASSERT_EQ(seen[1].size(), 5u);
  for (size_t e = 0; e < 5; ++e) {
    EXPECT_EQ(seen[1][e].loss, seen[0][e].loss) << e;  // the same training
    EXPECT_NEAR(seen[1][e].train_acc, seen[0][e].train_acc, 1e-12) << e;
    EXPECT_NEAR(seen[1][e].valid_acc, seen[0][e].valid_acc, 1e-12) << e;
    EXPECT_NEAR(seen[1][e].test_acc, seen[0][e].test_acc, 1e-12) << e;
  }
  EXPECT_GT(seen[1].back().test_acc, 0.5);  // it learned (chance is 1/7)
}

}  // namespace
}  // namespace gale::engine
