// Learning is tested, not assumed: PyG's hyper-parameters on Cora (2 layers, hidden 16, GAT 8
// heads x 8, dropout 0.5 / 0.6, Adam lr 0.01 / 0.005, weight decay 5e-4, 200 epochs), mean over
// 5 seeds of the test accuracy at the best-validation epoch, against PyG's 82.0 / 81.4 / 78.3 /
// 82.9 (tests/data/README.md) less a small margin.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include "engine/trainer.hpp"
#include "tests/training/cora_options.hpp"

namespace gale::engine {
namespace {

using testing::mean_test_accuracy;
using testing::pyg_options;

TEST(CoraAccuracy, GcnReachesPyg) { EXPECT_GE(mean_test_accuracy(pyg_options("gcn"), 5), 0.80); }
TEST(CoraAccuracy, SageReachesPyg) { EXPECT_GE(mean_test_accuracy(pyg_options("sage"), 5), 0.79); }
TEST(CoraAccuracy, GinReachesPyg) { EXPECT_GE(mean_test_accuracy(pyg_options("gin"), 5), 0.75); }
TEST(CoraAccuracy, GatReachesPyg) { EXPECT_GE(mean_test_accuracy(pyg_options("gat"), 5), 0.80); }

TEST(CoraAccuracy, MiniBatchSageWithFanouts10x10) {
  TrainOptions o = pyg_options("sage");
  o.full_graph = false;
  o.fanouts = {10, 10};
  o.batch_size = 1024;
  EXPECT_GE(mean_test_accuracy(o, 5), 0.78);
}

// MaxK-GNN's claim at Cora's scale: SAGE with hidden 256 and MaxK (k = 32) in place of ReLU stays
// within 1.5 points of the same model with ReLU (mean of 5 seeds each).
TEST(CoraAccuracy, SageWithMaxK32IsWithinOnePointFiveOfRelu) {
  TrainOptions o = pyg_options("sage");
  o.model.hidden = 256;
  const double relu = mean_test_accuracy(o, 5);
  o.model.activation = Activation::kMaxK;
  o.model.maxk = 32;
  const double maxk = mean_test_accuracy(o, 5);
  std::printf("  sage hidden 256: relu %.4f, maxk:32 %.4f\n", relu, maxk);
  EXPECT_GE(maxk, relu - 0.015);
}

// Batch normalisation after the hidden layer: PyG's GCNConv / SAGEConv with BatchNorm1d in the
// same places (bench/pyg_accuracy.py --norm batch, 5 seeds, H100) reached 0.747 (GCN) and 0.744
// (SAGE) with hidden 16 (0.794 for GCN with hidden 256, tests/gpu/training_test.cpp): batch statistics over all of Cora's nodes
// under dropout cost these models points there, in PyG as here. Gale must come within 1.5 points.
TEST(CoraAccuracy, BatchNormMatchesPygWithBatchNorm) {
  TrainOptions o = pyg_options("gcn");
  o.model.norm = Norm::kBatch;
  const double gcn = mean_test_accuracy(o, 5);
  o.model.model = "sage";
  const double sage = mean_test_accuracy(o, 5);
  std::printf("  batch norm: gcn %.4f, sage %.4f\n", gcn, sage);
  EXPECT_GE(gcn, 0.747 - 0.015);
  EXPECT_GE(sage, 0.744 - 0.015);
}

}  // namespace
}  // namespace gale::engine
