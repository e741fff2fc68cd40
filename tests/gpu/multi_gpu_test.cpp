// Data-parallel training on several GPUs of one process (NCCL): the replicas stay identical
// epoch after epoch, two GPUs end where one GPU on the combined batches ends (to float
// tolerance), the model still learns Cora, and two GPUs stop, checkpoint and resume inside an
// epoch bit for bit (their votes travel with the step's NCCL sums); under every thread policy
// each worker reports its stages; after a run, TBB's threads can be joined (as `gale` joins them at
// exit); tensors move between GPUs from any thread. Skips with a reason below two GPUs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>

#include "engine/devices.hpp"
#include "engine/tensor.hpp"
#include "engine/trainer.hpp"
#include "engine/worker_arena.hpp"
#include "tests/training/checkpoint_weights.hpp"
#include "tests/training/cora_options.hpp"
#include "tests/training/resume_checks.hpp"

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

// Under every placement of the workers' threads (GALE_WORKER_THREADS, engine/worker_arena.hpp)
// the replicas stay identical, and every worker reports its stages: IO-stream and NCCL time on
// its GPU, the steps on its host.
TEST_F(MultiGpu, EveryThreadPolicyKeepsReplicasIdenticalAndReportsEachWorkersStages) {
  for (const char* policy : {"pinned", "arenas", "shared"}) {
    ::setenv("GALE_WORKER_THREADS", policy, 1);
    TrainOptions o = options(2, 32, std::string("threads-") + policy);
    o.epochs = 2;
    o.check_replicas = true;
    o.eval = TrainOptions::Eval::kNone;
    train(o, [&](const EpochMetrics& m) {
      EXPECT_NE(m.replica_checksum, 0u) << policy;
      ASSERT_EQ(m.worker_stages.size(), 2u) << policy;
      for (const WorkerStageSeconds& w : m.worker_stages) {
        EXPECT_GT(w.io_s, 0.0) << policy;
        EXPECT_GT(w.allreduce_s, 0.0) << policy;
        // The compute stream's stall for the sums: timed on the GPU, never negative, within the epoch.
        EXPECT_GE(w.sum_wait_s, 0.0) << policy;
        EXPECT_LT(w.sum_wait_s, w.wall_s) << policy;
        EXPECT_GT(w.compute_s, 0.0) << policy;
        EXPECT_LE(w.compute_s + w.wait_s, w.wall_s * 1.01) << policy;
      }
    });
  }
  ::unsetenv("GALE_WORKER_THREADS");
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

// A tensor moves to, from and between GPUs whichever GPU is the calling thread's current one: the
// copy (or the zero fill) makes its GPU current for the call and restores the thread's.
TEST_F(MultiGpu, TensorsMoveToAndBetweenGpusThatAreNotTheThreadsCurrentOne) {
  const UseDevice use(Device::cuda(0));
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  const Tensor on1 = Tensor::from_vector(a, 2, 3).to(Device::cuda(1));
  EXPECT_EQ(on1.to(Device::cpu()).to_vector(), a);
  EXPECT_EQ(on1.to(Device::cuda(0)).to(Device::cpu()).to_vector(), a);  // GPU 1 to GPU 0
  EXPECT_EQ(Tensor::zeros(2, 3, DType::kF32, Device::cuda(1)).to(Device::cpu()).to_vector(), std::vector<float>(6, 0.0f));
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
}

// `gale` joins TBB's worker threads before main returns (apps/main.cpp): they hold thread-local
// cuBLASLt and cuSPARSE handles and the CUDA runtime's per-thread state from the pipelines' stages,
// and left to exit during the static destructors, some ended a finished 2-GPU run in SIGABRT. The
// join needs every arena of the run gone: after 2 GPUs in one process, tbb::finalize joins them.
TEST_F(MultiGpu, NoArenaOutlivesATwoGpuRunSoTbbsThreadsCanBeJoinedAtExit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        TbbThreadsJoinedAtExit threads;
        TrainOptions o = options(2, 32, "joined-at-exit");
        o.epochs = 1;
        o.eval = TrainOptions::Eval::kNone;
        train(o);
        std::exit(threads.join() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// Two GPUs, bit for bit from run to run: one thread, and the CPU sampler (the GPU sampler numbers
// a block's nodes in the order its threads reach them). 140 training seeds, 8 a GPU: 9 steps an
// epoch.
TrainOptions deterministic_options() {
  TrainOptions o = options(2, 8, "unused");
  o.checkpoint_dir.clear();
  o.gpu_sampler = false;
  o.deterministic = true;
  return o;
}

// The flag is raised after GPU 0's step 1. GPU 0 votes it in step 2's NCCL sums; GPU 1's host may
// lag GPU 0's by up to the vote lag (the sums wait on the device, not the host), so it may see the
// flag one or two steps earlier and vote it in step 1 or 0 (seen on 4 H200s). Whichever step s
// carries it, both read the same sums two steps later and train steps 0 to s + 2 (3 to 5 of the
// epoch's 9), checkpoint there, and the resumed run ends where a straight one ends (checkpoint
// bytes, loss, metrics lines).
TEST_F(MultiGpu, TwoGpusStopInsideAnEpochTogetherAndResumeExactly) {
  const TrainResult s = testing::check_stop_and_resume(
      deterministic_options(), "gpu-stop", [](TrainOptions& first, std::atomic<int>& stop) {
        first.on_step = [&stop](int64_t epoch, int64_t batch, int64_t) {
          if (epoch == 1 && batch == 1) stop.store(SIGINT);
        };
      });
  EXPECT_EQ(s.stopped_epoch, 1);
  EXPECT_GE(s.stopped_batches, 3);
  EXPECT_LE(s.stopped_batches, 5);
  EXPECT_EQ(s.stopped_of, 9);
  EXPECT_EQ(s.epochs_run, 1);
}

// Interval checkpoints agreed through the NCCL sums every 3 steps change nothing, and a death at
// step 7 of the second epoch resumes from the checkpoint after step 5 (6 batches done).
TEST_F(MultiGpu, TwoGpusIntervalCheckpointsSurviveADeathInsideAnEpoch) {
  const CheckpointState c = testing::check_interval_checkpoints(deterministic_options(), "gpu-interval", 7);
  EXPECT_EQ(c.batches_done, 6);
  EXPECT_EQ(c.partial_loss_sums.size(), 2u);
}

}  // namespace
}  // namespace gale::engine
