// Data-parallel training on several GPUs of one process (NCCL): the replicas stay identical
// epoch after epoch, two GPUs end where one GPU on the combined batches ends (to float
// tolerance), and the model still learns Cora. Skips with a reason below two GPUs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "engine/devices.hpp"
#include "engine/trainer.hpp"
#include "tests/training/checkpoint_weights.hpp"
#include "tests/training/cora_options.hpp"

namespace gale::engine {
namespace {

namespace fs = std::filesystem;
using testing::final_weights;

class MultiGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_count() < 2) GTEST_SKIP() << "needs two GPUs, found " << gpu_count();
  }
};

TrainOptions options(int gpus, int64_t batch_per_gpu, const std::string& name) {
  TrainOptions o = testing::pyg_options("sage", Device::cuda(0));
  o.full_graph = false;
  o.fanouts = {10, 10};
  o.batch_size = batch_per_gpu;
  for (int g = 0; g < gpus; ++g) o.devices.push_back(Device::cuda(g));
  const fs::path d = fs::temp_directory_path() / ("gale-multi-gpu-" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  o.checkpoint_dir = d.string();
  return o;
}

TEST_F(MultiGpu, ReplicasStayIdenticalAcrossThreeEpochs) {
  TrainOptions o = options(2, 32, "replicas");
  o.epochs = 3;
  o.check_replicas = true;
  std::vector<uint64_t> sums;
  train(o, [&](const EpochMetrics& m) {
    sums.push_back(m.replica_checksum);
    EXPECT_EQ(m.worker_seeds_per_s.size(), 2u);
  });
  ASSERT_EQ(sums.size(), 3u);
  EXPECT_NE(sums[0], sums[1]);
  EXPECT_NE(sums[1], sums[2]);
}

TEST_F(MultiGpu, TwoGpusEndWhereOneGpuOnTheCombinedBatchEnds) {
  TrainOptions one = options(1, 32, "one"), two = options(2, 16, "two");
  for (TrainOptions* o : {&one, &two}) {
    o->model.dropout = 0;
    o->epochs = 3;
    o->eval = TrainOptions::Eval::kNone;
  }
  train(one);
  train(two);
  const auto a = final_weights(two), b = final_weights(one);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < a[i].size(); ++k)
      ASSERT_NEAR(a[i][k], b[i][k], 5e-4 + 5e-3 * std::abs(b[i][k])) << "parameter " << i << " element " << k;
}

TEST_F(MultiGpu, TwoGpusLearnCora) {
  TrainOptions o = options(2, 512, "cora");
  o.checkpoint_dir.clear();
  EXPECT_GE(train(o).test_acc_at_best_valid, 0.76);
}

}  // namespace
}  // namespace gale::engine
