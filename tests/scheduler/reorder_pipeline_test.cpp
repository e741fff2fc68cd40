#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "scheduler/batch_pipeline.hpp"
#include "scheduler/match_reorder.hpp"
#include "tests/scheduler/reference_reorder.hpp"

namespace gale::scheduler {
namespace {

using testing::identity_order;
using testing::NodeSets;

// Counts the payloads alive at once.
struct LiveCount {
  std::atomic<int> live{0}, peak{0};
};

class Alive {
 public:
  explicit Alive(LiveCount* c) : c_(c) {
    const int now = ++c_->live;
    int seen = c_->peak.load();
    while (now > seen && !c_->peak.compare_exchange_weak(seen, now)) {
    }
  }
  ~Alive() { --c_->live; }
  Alive(const Alive&) = delete;
  Alive& operator=(const Alive&) = delete;

 private:
  LiveCount* c_;
};

struct Payload {
  int64_t batch = -1;
  std::vector<int64_t> nodes;
  std::unique_ptr<Alive> alive;
  bool loaded = false;  // set by the load stage
};

// The consume order the pipeline must produce: windows cut in plan order, each in greedy_reorder's
// order unless that reuses fewer nodes than the sampled order, with the previously consumed batch
// carried in.
std::vector<int64_t> expected_order(const NodeSets& batches, int window) {
  const size_t w = static_cast<size_t>(std::max(1, window));
  std::vector<int64_t> order;
  const std::vector<int64_t>* carried = nullptr;
  for (size_t first = 0; first < batches.size(); first += w) {
    const size_t n = std::min(w, batches.size() - first);
    const NodeSets sets(batches.begin() + static_cast<std::ptrdiff_t>(first),
                        batches.begin() + static_cast<std::ptrdiff_t>(first + n));
    const std::vector<int> greedy = greedy_reorder(sets);
    const std::vector<int> sampled = identity_order(n);
    const bool keep_greedy = reuse_of_order(sets, greedy, carried) >= reuse_of_order(sets, sampled, carried);
    for (int i : keep_greedy ? greedy : sampled) order.push_back(static_cast<int64_t>(first) + i);
    carried = &batches[static_cast<size_t>(order.back())];
  }
  return order;
}

TEST(ReorderPipeline, DeliversEveryBatchOnceInMatchReorderOrderWithBoundedMemory) {
  kernels::CounterRng rng(17);
  for (int prefetch : {1, 2, 4}) {
    for (int window : {0, 1, 3, 8}) {
      for (int64_t count : {0, 1, 5, 17}) {
        SCOPED_TRACE("prefetch " + std::to_string(prefetch) + ", window " + std::to_string(window) + ", batches " +
                     std::to_string(count));
        const NodeSets batches = testing::random_window(rng, static_cast<int>(count), 120);
        LiveCount live;
        std::atomic<int> consuming{0};
        std::vector<int64_t> consumed, loaded;
        const PipelineTimes times = run_batch_pipeline<Payload>(
            count, prefetch, window,
            [&](int64_t b) {
              // Uneven preparation times, so batches finish out of plan order.
              std::this_thread::sleep_for(std::chrono::microseconds(200 * ((b * 7) % 5)));
              return Payload{b, batches[static_cast<size_t>(b)], std::make_unique<Alive>(&live)};
            },
            [](const Payload& p) -> const std::vector<int64_t>& { return p.nodes; },
            [&](int64_t b, Payload& p) {  // load: serial, in consume order, ahead of consume
              EXPECT_EQ(p.batch, b);
              EXPECT_FALSE(p.loaded);
              p.loaded = true;
              loaded.push_back(b);
            },
            [&](int64_t b, Payload& p) {
              EXPECT_EQ(consuming.fetch_add(1), 0) << "consume ran concurrently";
              EXPECT_EQ(p.batch, b);
              EXPECT_TRUE(p.loaded) << "consumed before its load stage";
              consumed.push_back(b);
              std::this_thread::sleep_for(std::chrono::microseconds(300));
              consuming.fetch_sub(1);
            });
        EXPECT_EQ(consumed, expected_order(batches, window));
        EXPECT_EQ(loaded, consumed);
        std::vector<int64_t> sorted = consumed;
        std::sort(sorted.begin(), sorted.end());
        for (int64_t b = 0; b < count; ++b) ASSERT_EQ(sorted[static_cast<size_t>(b)], b);
        EXPECT_EQ(live.live.load(), 0);
        EXPECT_LE(live.peak.load(), prefetch + std::max(1, window));
        EXPECT_EQ(times.reuse.batches, count);
        std::vector<int> order;
        for (int64_t b : consumed) order.push_back(static_cast<int>(b));
        EXPECT_EQ(times.reuse.reused, testing::reference_reuse(batches, order));
        EXPECT_EQ(times.reuse.reused_sampled_order, testing::reference_reuse(batches, identity_order(batches.size())));
        EXPECT_GE(times.reorder_s, 0.0);
      }
    }
  }
}

TEST(ReorderPipeline, WithoutANodeSetFunctionBatchesArriveInPlanOrder) {
  std::vector<int64_t> consumed;
  const PipelineTimes times = run_batch_pipeline<int64_t>(
      9, 3, [](int64_t b) { return b * 10; },
      [&](int64_t b, int64_t& v) {
        EXPECT_EQ(v, b * 10);
        consumed.push_back(b);
      });
  EXPECT_EQ(consumed, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(times.reuse.nodes, 0);
  EXPECT_EQ(times.reuse.reused, 0);
}

TEST(ReorderPipeline, NodeSetMayBeReturnedByValue) {
  std::vector<int64_t> consumed;
  const PipelineTimes times = run_batch_pipeline<int>(
      4, 2, 4, [](int64_t b) { return static_cast<int>(b); },
      [](const int& b) {
        // Batches 0 and 2 share everything, 1 and 3 nothing with anyone.
        return b % 2 == 0 ? std::vector<int64_t>{1, 2, 3} : std::vector<int64_t>{100 + b};
      },
      [&](int64_t b, int&) { consumed.push_back(b); });
  EXPECT_EQ(consumed, (std::vector<int64_t>{0, 2, 1, 3}));
  EXPECT_EQ(times.reuse.reused, 3);
  EXPECT_EQ(times.reuse.reused_sampled_order, 0);
  EXPECT_EQ(times.reuse.nodes, 8);
}

// A run that starts at a later batch and is asked to stop after a step consumes exactly a range
// of the plan (gale train's mid-epoch checkpoints rely on it); prepared batches past it are
// dropped, and no batch before `first` is prepared.
TEST(ReorderPipeline, StartsAtFirstAndStopsAfterTheStepThatAsked) {
  for (int prefetch : {1, 3, 8}) {
    std::atomic<int> stop{0};
    std::atomic<int64_t> lowest_prepared{1000};
    std::vector<int64_t> consumed;
    const auto load = [](int64_t, int64_t&) {};
    const PipelineTimes times = run_batch_pipeline<int64_t>(
        20, prefetch, 0,
        [&](int64_t b) {
          int64_t seen = lowest_prepared.load();
          while (b < seen && !lowest_prepared.compare_exchange_weak(seen, b)) {
          }
          return b;
        },
        [](const int64_t&) { return std::vector<int64_t>(); }, load,
        [&](int64_t b, int64_t&) {
          consumed.push_back(b);
          if (b == 9) stop.store(2);
        },
        PipelineRange{5, &stop});
    EXPECT_EQ(consumed, (std::vector<int64_t>{5, 6, 7, 8, 9})) << "prefetch " << prefetch;
    EXPECT_EQ(times.consumed_end, 10);
    EXPECT_EQ(lowest_prepared.load(), 5);
  }
}

TEST(ReorderPipeline, AReorderWindowRunsTheWholeEpochWhateverTheStopFlag) {
  std::atomic<int> stop{1};
  std::vector<int64_t> consumed;
  const PipelineTimes times = run_batch_pipeline<int>(
      6, 2, 3, [](int64_t b) { return static_cast<int>(b); },
      [](const int& b) { return std::vector<int64_t>{b}; }, [](int64_t, int&) {},
      [&](int64_t b, int&) { consumed.push_back(b); }, PipelineRange{0, &stop});
  EXPECT_EQ(consumed.size(), 6u);
  EXPECT_EQ(times.consumed_end, 6);
}

}  // namespace
}  // namespace gale::scheduler
