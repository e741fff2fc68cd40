// Data-parallel workers on the CPU device (the same code path as GPUs, with the in-process
// all-reduce standing in for NCCL): 2 workers end with the weights 1 worker reaches on the
// combined batches, to float tolerance (uneven and empty last slices included); the replicas stay
// identical; a communicator that is aborted stops every worker's sums instead of hanging them;
// finishing each step's update inside the next step's forward changes no bit.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "engine/comm.hpp"
#include "engine/processes.hpp"
#include "engine/trainer.hpp"
#include "engine/worker_arena.hpp"
#include "kernels/error.hpp"
#include "scheduler/epoch_plan.hpp"
#include "storage/preprocess.hpp"
#include "tests/training/checkpoint_weights.hpp"
#include "tests/training/cora_options.hpp"

namespace gale::engine {
namespace {

namespace fs = std::filesystem;
using testing::final_weights;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("gale-workers-" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// SAGE on Cora, mini-batch without dropout (its masks follow a batch's row numbers, which differ
// between one combined batch and its slices).
TrainOptions options(int workers, int64_t batch_per_worker, int64_t epochs, const std::string& name) {
  TrainOptions o = testing::pyg_options("sage");
  o.model.dropout = 0;
  o.full_graph = false;
  o.fanouts = {5, 5};
  o.batch_size = batch_per_worker;
  o.epochs = epochs;
  o.eval = TrainOptions::Eval::kNone;
  if (workers > 1) o.devices.assign(static_cast<size_t>(workers), Device::cpu());
  o.checkpoint_dir = fresh_dir(name).string();
  return o;
}

void expect_close(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    for (size_t k = 0; k < a[i].size(); ++k)
      ASSERT_NEAR(a[i][k], b[i][k], 2e-4 + 2e-3 * std::abs(b[i][k])) << "parameter " << i << " element " << k;
  }
}

TEST(Workers, StepSlicesPartitionTheCombinedBatch) {
  std::vector<int64_t> ids(101);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 3;
  const scheduler::EpochPlan one(ids, 30, 7, 2);
  const scheduler::EpochPlan w0(ids, 10, 7, 2, 3, 0), w1(ids, 10, 7, 2, 3, 1), w2(ids, 10, 7, 2, 3, 2);
  ASSERT_EQ(w0.num_batches(), one.num_batches());
  for (int64_t b = 0; b < one.num_batches(); ++b) {
    std::vector<int64_t> joined;
    for (const auto* w : {&w0, &w1, &w2}) {
      EXPECT_EQ(w->step_length(b), one.batch_length(b));
      joined.insert(joined.end(), w->batch(b), w->batch(b) + w->batch_length(b));
      EXPECT_LE(std::abs(w->batch_length(b) - one.batch_length(b) / 3), 1);
    }
    EXPECT_EQ(joined, std::vector<int64_t>(one.batch(b), one.batch(b) + one.batch_length(b)));
  }
}

// Given the graph's row offsets, each step's seeds are dealt to the workers by in-degree (snake
// order): the same seeds a step, the same slice sizes, each slice in its shuffled order, and the
// slices' degree sums far closer than cut as shuffled.
TEST(Workers, StepSlicesBalancedByInDegreeKeepEachStepsSeeds) {
  const int64_t n = 5000;
  std::vector<int64_t> indptr(static_cast<size_t>(n) + 1, 0);
  for (int64_t v = 0; v < n; ++v)  // heavy-tailed in-degrees: a few hubs, most nodes small
    indptr[static_cast<size_t>(v) + 1] = indptr[static_cast<size_t>(v)] + (v % 97 == 0 ? 400 + v % 300 : 1 + v % 7);
  std::vector<int64_t> ids(1003);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 4 + 1;
  const auto degree = [&](int64_t v) { return indptr[static_cast<size_t>(v) + 1] - indptr[static_cast<size_t>(v)]; };
  for (const int workers : {2, 3, 4}) {
    std::vector<scheduler::EpochPlan> cut, balanced;
    for (int r = 0; r < workers; ++r) {
      cut.emplace_back(ids, 100, 7, 2, workers, r);
      balanced.emplace_back(ids, 100, 7, 2, workers, r, indptr.data());
    }
    double spread_cut = 0, spread_balanced = 0;
    for (int64_t b = 0; b < cut[0].num_batches(); ++b) {
      std::vector<int64_t> step_cut, step_balanced;
      std::vector<int64_t> sums_cut, sums_balanced;
      for (int r = 0; r < workers; ++r) {
        const scheduler::EpochPlan &c = cut[static_cast<size_t>(r)], &p = balanced[static_cast<size_t>(r)];
        ASSERT_EQ(p.batch_length(b), c.batch_length(b));
        step_cut.insert(step_cut.end(), c.batch(b), c.batch(b) + c.batch_length(b));
        step_balanced.insert(step_balanced.end(), p.batch(b), p.batch(b) + p.batch_length(b));
        int64_t sum_c = 0, sum_p = 0;
        for (int64_t i = 0; i < c.batch_length(b); ++i) sum_c += degree(c.batch(b)[i]), sum_p += degree(p.batch(b)[i]);
        sums_cut.push_back(sum_c);
        sums_balanced.push_back(sum_p);
      }
      const std::vector<int64_t> shuffled = step_cut;
      std::sort(step_cut.begin(), step_cut.end());
      std::vector<int64_t> sorted_balanced = step_balanced;
      std::sort(sorted_balanced.begin(), sorted_balanced.end());
      EXPECT_EQ(sorted_balanced, step_cut) << workers << " workers, step " << b;
      for (const scheduler::EpochPlan& p : balanced) {  // each slice in the step's shuffled order
        std::vector<int64_t> positions;
        for (int64_t i = 0; i < p.batch_length(b); ++i)
          positions.push_back(std::find(shuffled.begin(), shuffled.end(), p.batch(b)[i]) - shuffled.begin());
        EXPECT_TRUE(std::is_sorted(positions.begin(), positions.end())) << workers << " workers, step " << b;
      }
      const auto spread = [](const std::vector<int64_t>& sums) {
        return static_cast<double>(*std::max_element(sums.begin(), sums.end()) - *std::min_element(sums.begin(), sums.end()));
      };
      spread_cut += spread(sums_cut);
      spread_balanced += spread(sums_balanced);
    }
    EXPECT_LT(spread_balanced, 0.5 * spread_cut) << workers << " workers";
  }
}

// The steps are dealt in parallel; each must come out as the sequential dealing (a stable sort
// by in-degree, snake order) makes it, and for_rank must give each rank its own plan.
TEST(Workers, StepsDealtInParallelMatchTheSequentialDealingAndForRank) {
  const int64_t n = 200000;
  std::vector<int64_t> indptr(static_cast<size_t>(n) + 1, 0);
  for (int64_t v = 0; v < n; ++v)  // many equal in-degrees, so ties are common
    indptr[static_cast<size_t>(v) + 1] = indptr[static_cast<size_t>(v)] + (v * 7919 % 13 == 0 ? 50 + v % 11 : v % 5);
  std::vector<int64_t> ids;
  for (int64_t v = 0; v < n; v += 3) ids.push_back(v);
  const auto degree = [&](int64_t v) { return indptr[static_cast<size_t>(v) + 1] - indptr[static_cast<size_t>(v)]; };
  for (const int workers : {2, 3, 4}) {
    const int64_t batch = 37;  // steps of 74-148 seeds: hundreds of steps, the last one short
    const scheduler::EpochPlan cut(ids, batch, 5, 1, workers, 0);
    std::vector<int64_t> expected = cut.order();  // the sequential dealing, step by step
    const int64_t step = batch * workers;
    for (int64_t first = 0; first < static_cast<int64_t>(expected.size()); first += step) {
      const int64_t len = std::min<int64_t>(step, static_cast<int64_t>(expected.size()) - first);
      const std::vector<int64_t> seeds(expected.begin() + first, expected.begin() + first + len);
      std::vector<int64_t> by_degree(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) by_degree[static_cast<size_t>(i)] = i;
      std::stable_sort(by_degree.begin(), by_degree.end(), [&](int64_t x, int64_t y) {
        return degree(seeds[static_cast<size_t>(x)]) > degree(seeds[static_cast<size_t>(y)]);
      });
      std::vector<std::vector<int64_t>> slices(static_cast<size_t>(workers));
      std::vector<int64_t> room(static_cast<size_t>(workers));
      for (int r = 0; r < workers; ++r) room[static_cast<size_t>(r)] = len * (r + 1) / workers - len * r / workers;
      int r = 0, direction = 1;
      const auto advance = [&] {
        r += direction;
        if (r == workers) r = workers - 1, direction = -1;
        if (r < 0) r = 0, direction = 1;
      };
      for (int64_t i : by_degree) {
        while (room[static_cast<size_t>(r)] == 0) advance();
        slices[static_cast<size_t>(r)].push_back(i);
        --room[static_cast<size_t>(r)];
        advance();
      }
      int64_t at = first;
      for (std::vector<int64_t>& slice : slices) {
        std::sort(slice.begin(), slice.end());
        for (int64_t i : slice) expected[static_cast<size_t>(at++)] = seeds[static_cast<size_t>(i)];
      }
    }
    const scheduler::EpochPlan balanced(ids, batch, 5, 1, workers, 0, indptr.data());
    EXPECT_EQ(balanced.order(), expected) << workers << " workers";
    for (int rank = 0; rank < workers; ++rank) {
      const scheduler::EpochPlan own(ids, batch, 5, 1, workers, rank, indptr.data());
      const scheduler::EpochPlan shared = balanced.for_rank(rank);
      ASSERT_EQ(shared.num_batches(), own.num_batches());
      for (int64_t b = 0; b < own.num_batches(); ++b) {
        ASSERT_EQ(shared.batch_length(b), own.batch_length(b)) << "rank " << rank << ", step " << b;
        EXPECT_TRUE(std::equal(own.batch(b), own.batch(b) + own.batch_length(b), shared.batch(b)))
            << "rank " << rank << ", step " << b;
      }
    }
    EXPECT_THROW(balanced.for_rank(workers), InternalError);
  }
}

TEST(Workers, TwoWorkersEndWhereOneWorkerOnTheCombinedBatchEnds) {
  std::vector<double> one_loss, two_loss;
  const TrainOptions one = options(1, 32, 3, "one");
  const TrainOptions two = options(2, 16, 3, "two");
  train(one, [&](const EpochMetrics& m) { one_loss.push_back(m.loss); });
  train(two, [&](const EpochMetrics& m) {
    two_loss.push_back(m.loss);
    EXPECT_EQ(m.worker_seeds_per_s.size(), 2u);
  });
  ASSERT_EQ(one_loss.size(), two_loss.size());
  for (size_t e = 0; e < one_loss.size(); ++e) EXPECT_NEAR(one_loss[e], two_loss[e], 1e-4 * one_loss[e]) << e;
  expect_close(final_weights(two), final_weights(one));
}

// 140 seeds in steps of 3: the last step has 2 seeds, so one of 3 workers has none and only joins
// the sums.
TEST(Workers, AWorkerWithoutSeedsInTheLastStepStillJoinsTheSums) {
  const TrainOptions one = options(1, 3, 1, "one-small");
  const TrainOptions three = options(3, 1, 1, "three-small");
  train(one);
  train(three);
  expect_close(final_weights(three), final_weights(one));
}

TEST(Workers, ReplicasStayIdentical) {
  TrainOptions o = options(2, 32, 3, "replicas");
  o.check_replicas = true;
  o.model.dropout = 0.5f;  // each worker its own masks: the sums still keep the replicas equal
  uint64_t last = 0;
  train(o, [&](const EpochMetrics& m) {
    EXPECT_NE(m.replica_checksum, 0u);
    EXPECT_NE(m.replica_checksum, last);  // the weights moved
    last = m.replica_checksum;
  });
}

// Each step's update (the wait for the sums, Adam) finishes inside the next step's forward, after
// its first layer's aggregation, which reads no parameter (Worker::overlap_update). On a store of
// 32 features and a first layer of 64 (aggregate-first), with dropout and 3 workers (one of them
// without seeds in the last step), the runs with and without it end on the same bits, epoch after
// epoch, for SAGE, GCN and GIN.
TEST(Workers, FinishingEachUpdateInsideTheNextForwardChangesNoBit) {
  storage::PreprocessOptions p;
  p.generate = "sbm:nodes=2000,classes=4,avg-degree=8,feature-dim=32,seed=3";
  p.output = (fresh_dir("overlap-store") / "s.gale").string();
  storage::preprocess(p);
  for (const std::string model : {"sage", "gcn", "gin"}) {
    std::vector<std::vector<double>> losses(2);
    std::vector<std::vector<std::vector<float>>> weights(2);
    for (const int overlap : {1, 0}) {
      TrainOptions o = options(3, 29, 2, "overlap-" + model + std::to_string(overlap));
      o.store = p.output;
      o.model = testing::pyg_options(model).model;
      o.model.hidden = 64;
      o.model.dropout = 0.3f;
      ::setenv("GALE_UPDATE_OVERLAP", overlap ? "1" : "0", 1);
      train(o, [&](const EpochMetrics& m) { losses[overlap].push_back(m.loss); });
      weights[overlap] = final_weights(o);
    }
    ::unsetenv("GALE_UPDATE_OVERLAP");
    EXPECT_EQ(losses[1], losses[0]) << model;
    EXPECT_EQ(weights[1], weights[0]) << model;
    ASSERT_EQ(losses[1].size(), 2u);
  }
}

// How the next epoch's plan is made (one thread, four, TBB's whole arena) and whether a bucket's
// packed gradients go as one sum or tensor by tensor change where work runs, never a bit: 3
// workers (one without seeds in the last step), SAGE with batch norm, four epochs.
TEST(Workers, ThePlansThreadsAndMergedSumsChangeNoBit) {
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<std::vector<float>>> weights;
  const std::vector<std::pair<const char*, const char*>> settings = {{"1", "1"}, {"0", "1"}, {"4", "0"}};
  for (const auto& [threads, merge] : settings) {
    TrainOptions o = options(3, 29, 4, std::string("plan-") + threads + "-" + merge);
    o.model.norm = Norm::kBatch;
    ::setenv("GALE_PLAN_THREADS", threads, 1);
    ::setenv("GALE_MERGE_SUMS", merge, 1);
    losses.emplace_back();
    train(o, [&](const EpochMetrics& m) { losses.back().push_back(m.loss); });
    weights.push_back(final_weights(o));
  }
  ::unsetenv("GALE_PLAN_THREADS");
  ::unsetenv("GALE_MERGE_SUMS");
  ASSERT_EQ(losses[0].size(), 4u);
  for (size_t i = 1; i < settings.size(); ++i) {
    EXPECT_EQ(losses[i], losses[0]) << i;
    EXPECT_EQ(weights[i], weights[0]) << i;
  }
}

// GALE_OP_PROFILE=1 prints each worker's ops of its steps per epoch, by kind and by op.
TEST(Workers, TheOpProfilePrintsEveryWorkersOpsPerEpoch) {
  const TrainOptions o = options(2, 16, 2, "op-profile");
  ::setenv("GALE_OP_PROFILE", "1", 1);
  ::testing::internal::CaptureStderr();
  train(o);
  const std::string text = ::testing::internal::GetCapturedStderr();
  ::unsetenv("GALE_OP_PROFILE");
  for (const char* line : {"op-profile worker 0 epoch 0: kinds ", "op-profile worker 1 epoch 1: kinds ",
                           "op-profile worker 0 epoch 1: softmax_cross_entropy ", "op-profile worker 1 epoch 0: adam ",
                           "op-profile worker 0 epoch 0: idle before "})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text.substr(0, 2000);
}

// Every worker reports its own seconds by stage, in rank order; the parts fit inside its epoch.
TEST(Workers, EveryWorkerReportsItsStageSeconds) {
  const TrainOptions o = options(2, 16, 2, "stages");
  int epochs = 0;
  train(o, [&](const EpochMetrics& m) {
    ++epochs;
    ASSERT_EQ(m.worker_stages.size(), 2u);
    for (const WorkerStageSeconds& w : m.worker_stages) {
      EXPECT_GT(w.wall_s, 0.0);
      EXPECT_GT(w.prepare_s, 0.0);
      EXPECT_GT(w.compute_s, 0.0);
      EXPECT_LE(w.compute_s + w.wait_s, w.wall_s * 1.01);
      EXPECT_LE(w.host_features_s, w.prepare_s);
      EXPECT_EQ(w.io_s, 0.0);  // no IO stream on the CPU
    }
    EXPECT_EQ(m.worker_stages[0].compute_s, m.compute_s);  // worker 0's are the epoch's time split
  });
  EXPECT_EQ(epochs, 2);
}

// Where the workers' threads run (GALE_WORKER_THREADS, engine/worker_arena.hpp) changes nothing
// they compute: each policy ends on the same bits.
TEST(Workers, ThreadPoliciesTrainTheSameWeights) {
  std::vector<std::vector<std::vector<float>>> weights;
  for (const char* policy : {"shared", "arenas", "pinned"}) {
    ::setenv("GALE_WORKER_THREADS", policy, 1);
    TrainOptions o = options(2, 16, 2, std::string("policy-") + policy);
    o.check_replicas = true;
    train(o);
    weights.push_back(final_weights(o));
  }
  ::unsetenv("GALE_WORKER_THREADS");
  EXPECT_EQ(weights[1], weights[0]);
  EXPECT_EQ(weights[2], weights[0]);
}

// `gale` joins TBB's worker threads before main returns (apps/main.cpp), so their thread-local
// library handles die before the libraries do: that join can only happen once no arena of the run
// is left. After a run of 2 workers in arenas of their own, tbb::finalize joins every thread; while
// an arena lives it refuses, so the check can fail.
TEST(Workers, NoArenaOutlivesARunSoTbbsThreadsCanBeJoinedAtExit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        TbbThreadsJoinedAtExit threads;
        ::setenv("GALE_WORKER_THREADS", "pinned", 1);
        train(options(2, 16, 1, "joined-at-exit"));
        std::exit(threads.join() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        TbbThreadsJoinedAtExit threads;
        tbb::task_arena arena(2);
        arena.initialize();
        arena.execute([] {});
        std::exit(threads.join() ? 0 : 1);
      },
      ::testing::ExitedWithCode(1), "");
}

// Batch normalisation: each replica normalises its own slice and keeps its own running
// statistics, but gamma's and beta's gradients are summed like every parameter's, so the replicas'
// weights stay identical; the run evaluates (worker 0's statistics) far above chance.
TEST(Workers, BatchNormReplicasKeepIdenticalWeights) {
  TrainOptions o = options(2, 32, 40, "batch-norm");
  o.check_replicas = true;
  o.model.norm = Norm::kBatch;
  o.eval = TrainOptions::Eval::kAuto;
  const TrainResult r = train(o, [&](const EpochMetrics& m) { EXPECT_NE(m.replica_checksum, 0u); });
  EXPECT_GT(r.test_acc_at_best_valid, 0.5);  // 7 classes
}

TEST(Workers, FullGraphWithSeveralWorkersIsAnInputError) {
  TrainOptions o = options(2, 32, 1, "full");
  o.full_graph = true;
  EXPECT_THROW(train(o), InputError);
}

TEST(InProcessGroup, SumsAreIdenticalEverywhereAndAbortStopsWaiters) {
  auto group = make_in_process_group(3);
  std::vector<Tensor> t(3);
  for (int r = 0; r < 3; ++r) t[r] = Tensor::from_vector({1.0f * (r + 1), 0.5f, -2.0f * r}, 1, 3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      group[r]->all_reduce_sum({&t[r]});
      EXPECT_EQ(group[r]->all_gather(static_cast<uint64_t>(r * 10)), (std::vector<uint64_t>{0, 10, 20}));
    });
  for (auto& th : threads) th.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(t[r].to_vector(), (std::vector<float>{6.0f, 1.5f, -6.0f}));

  // Worker 2 fails before its sum: the two waiting in theirs get an error, not a hang.
  std::vector<std::string> errors(2);
  threads.clear();
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        group[r]->all_reduce_sum({&t[r]});
      } catch (const ResourceError& e) {
        errors[r] = e.what();
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  group[2]->abort("worker 2 failed: test");
  for (auto& th : threads) th.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "worker 2 failed: test");
  EXPECT_THROW(group[0]->all_gather(1), ResourceError);  // and every later call
}

}  // namespace
}  // namespace gale::engine

namespace gale::scheduler {
namespace {

TEST(SeedPools, BalancedFromOwnPartsAndEverySeedOnceAnEpoch) {
  // 3 parts of very different sizes over 1000 nodes, 2 and 3 workers.
  std::vector<int32_t> part(1000);
  for (int v = 0; v < 1000; ++v) part[v] = v < 700 ? 0 : v < 900 ? 1 : 2;
  std::vector<int64_t> seeds;
  for (int64_t v = 0; v < 1000; v += 3) seeds.push_back(v);
  for (int workers : {2, 3}) {
    const auto pools = balance_seed_pools(seeds, part.data(), workers);
    ASSERT_EQ(static_cast<int>(pools.size()), workers);
    size_t lo = seeds.size(), hi = 0, total = 0, own = 0;
    for (int w = 0; w < workers; ++w) {
      lo = std::min(lo, pools[w].size());
      hi = std::max(hi, pools[w].size());
      total += pools[w].size();
      for (int64_t v : pools[w]) own += part[static_cast<size_t>(v)] % workers == w;
    }
    EXPECT_LE(hi - lo, 1u);
    EXPECT_EQ(total, seeds.size());
    EXPECT_GE(own, seeds.size() * 6 / 10);  // most seeds stay with their part's worker
    // Every seed once per epoch; all workers take the same number of steps; step_length adds up.
    std::vector<int64_t> seen;
    std::vector<EpochPlan> plans;
    for (int w = 0; w < workers; ++w) plans.emplace_back(pools, 40, 5, 1, w);
    for (int64_t b = 0; b < plans[0].num_batches(); ++b) {
      int64_t step = 0;
      for (const EpochPlan& p : plans) {
        EXPECT_EQ(p.num_batches(), plans[0].num_batches());
        EXPECT_EQ(p.step_length(b), plans[0].step_length(b));
        seen.insert(seen.end(), p.batch(b), p.batch(b) + p.batch_length(b));
        step += p.batch_length(b);
      }
      EXPECT_EQ(step, plans[0].step_length(b));
    }
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, seeds);
  }
}

}  // namespace
}  // namespace gale::scheduler

namespace gale::engine {
namespace {

// Two workers on a partitioned Cora store draw from their own parts and keep identical replicas.
TEST(Workers, PartitionedStoreSplitsSeedsByPart) {
  const fs::path dir = fresh_dir("partitioned");
  storage::PreprocessOptions p;
  p.inputs = {std::string(GALE_SOURCE_DIR) + "/tests/data/cora"};
  p.output = (dir / "cora.gale").string();
  p.normalize_features_row = true;
  p.partitions = 2;
  storage::preprocess(p);
  TrainOptions o = options(2, 16, 3, "partitioned-run");
  o.store = p.output;
  o.check_replicas = true;
  o.eval = TrainOptions::Eval::kFull;
  o.epochs = 30;
  o.model.dropout = 0.5f;
  const TrainResult r = train(o);
  EXPECT_GE(r.test_acc_at_best_valid, 0.70);
  EXPECT_NE(r.last.replica_checksum, 0u);
}

// Processes sharing a host split the --gpus list in local-rank order; CPU workers and a lone
// process keep theirs; a list that does not divide, or a GALE_GPUS_PER_PROCESS past its end, is
// an InputError naming the cause.
TEST(Workers, ProcessesOnAHostSplitTheirGpus) {
  ::unsetenv("GALE_GPUS_PER_PROCESS");
  const std::vector<Device> four = {Device::cuda(0), Device::cuda(1), Device::cuda(2), Device::cuda(3)};
  EXPECT_EQ(place_devices(four, 0, 1, "h"), four);
  EXPECT_EQ(place_devices(four, 1, 2, "h"), (std::vector<Device>{Device::cuda(2), Device::cuda(3)}));
  EXPECT_EQ(place_devices(four, 3, 4, "h"), std::vector<Device>{Device::cuda(3)});
  const std::vector<Device> cpus(2, Device::cpu());
  EXPECT_EQ(place_devices(cpus, 1, 2, "h"), cpus);
  try {
    place_devices(four, 0, 3, "node7");
    ADD_FAILURE() << "4 GPUs among 3 processes";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("node7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("GALE_GPUS_PER_PROCESS"), std::string::npos) << e.what();
  }
  ::setenv("GALE_GPUS_PER_PROCESS", "1", 1);
  EXPECT_EQ(place_devices(four, 2, 3, "h"), std::vector<Device>{Device::cuda(2)});
  EXPECT_EQ(place_devices(four, 0, 1, "h"), std::vector<Device>{Device::cuda(0)});
  ::setenv("GALE_GPUS_PER_PROCESS", "3", 1);
  EXPECT_THROW(place_devices(four, 1, 2, "h"), InputError);
  ::setenv("GALE_GPUS_PER_PROCESS", "two", 1);
  EXPECT_THROW(place_devices(four, 0, 2, "h"), InputError);
  ::unsetenv("GALE_GPUS_PER_PROCESS");
}

}  // namespace
}  // namespace gale::engine
