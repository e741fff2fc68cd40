#include "scheduler/batch_pipeline.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/error.hpp"
#include "scheduler/epoch_plan.hpp"

namespace gale::scheduler {
namespace {

TEST(EpochPlan, EveryEpochIsAPermutationThatDependsOnlyOnSeedAndEpoch) {
  std::vector<int64_t> ids(1000);
  std::iota(ids.begin(), ids.end(), 5000);
  const EpochPlan a(ids, 64, 1, 3), b(ids, 64, 1, 3), c(ids, 64, 1, 4);
  EXPECT_EQ(a.order(), b.order());
  EXPECT_NE(a.order(), c.order());
  std::vector<int64_t> sorted = a.order();
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, ids);
  EXPECT_EQ(a.num_batches(), 16);
  EXPECT_EQ(a.batch_length(15), 1000 - 15 * 64);
}

TEST(EpochPlan, InOrderBatchesAreConsecutiveSeedsAsGiven) {
  std::vector<int64_t> ids(1000);
  std::iota(ids.begin(), ids.end(), 0);
  const EpochPlan plan = EpochPlan::in_order(ids, 300);
  EXPECT_EQ(plan.order(), ids);
  ASSERT_EQ(plan.num_batches(), 4);
  for (int64_t b = 0; b < 4; ++b) {
    EXPECT_EQ(plan.batch(b)[0], b * 300);
    EXPECT_EQ(plan.batch_length(b), b < 3 ? 300 : 100);
    EXPECT_EQ(plan.step_length(b), plan.batch_length(b));
  }
}

// Dealt round: batch b of B holds seeds[b], seeds[b + B], ...; every seed once; the batches' sizes
// differ by at most one; W consecutive batches hold runs of W consecutive seeds.
TEST(EpochPlan, StridedDealsTheSeedsRoundTheBatches) {
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{999}, int64_t{1000}, int64_t{1001}}) {
    std::vector<int64_t> ids(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), 100);
    const EpochPlan plan = EpochPlan::strided(ids, 300);
    const int64_t batches = (n + 299) / 300;
    ASSERT_EQ(plan.num_batches(), batches) << n;
    std::vector<int> seen(static_cast<size_t>(n), 0);
    for (int64_t b = 0; b < batches; ++b) {
      const int64_t len = plan.batch_length(b);
      EXPECT_EQ(plan.step_length(b), len);
      EXPECT_GE(len, n / batches);
      EXPECT_LE(len, n / batches + 1);
      for (int64_t i = 0; i < len; ++i) {
        EXPECT_EQ(plan.batch(b)[i], 100 + b + i * batches) << n << " " << b << " " << i;
        seen[static_cast<size_t>(plan.batch(b)[i] - 100)]++;
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n);
  }
  EXPECT_THROW(EpochPlan::strided({1, 2}, 0), InputError);
}

TEST(BatchPipeline, DeliversEverySeedExactlyOnceInPlanOrderForAnyPrefetch) {
  std::vector<int64_t> ids(777);
  std::iota(ids.begin(), ids.end(), 0);
  for (int prefetch : {1, 2, 3, 8}) {
    for (int64_t batch : {1, 50, 100, 1000}) {
      const EpochPlan plan(ids, batch, 9, 0);
      std::vector<int> seen(ids.size(), 0);
      int64_t expected_batch = 0;
      run_batch_pipeline<std::vector<int64_t>>(
          plan.num_batches(), prefetch,
          [&](int64_t b) { return std::vector<int64_t>(plan.batch(b), plan.batch(b) + plan.batch_length(b)); },
          [&](int64_t b, std::vector<int64_t>& seeds) {
            EXPECT_EQ(b, expected_batch++);
            for (int64_t s : seeds) seen[s]++;
          });
      EXPECT_EQ(expected_batch, plan.num_batches());
      for (int c : seen) ASSERT_EQ(c, 1) << "prefetch " << prefetch << " batch " << batch;
    }
  }
}

}  // namespace
}  // namespace gale::scheduler
