#include "scheduler/match_reorder.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "kernels/error.hpp"
#include "tests/scheduler/reference_reorder.hpp"

namespace gale::scheduler {
namespace {

using testing::identity_order;
using testing::NodeSets;
using testing::random_window;
using testing::reference_algorithm1;
using testing::reference_overlap;
using testing::reference_reuse;

std::vector<int64_t> range(int64_t begin, int64_t end) {
  std::vector<int64_t> v(static_cast<size_t>(end - begin));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

std::vector<int64_t> join(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(SortedOverlap, MergeAndGallopingAgreeWithTheReference) {
  kernels::CounterRng rng(41);
  for (int trial = 0; trial < 300; ++trial) {
    // Sizes from equal to a thousand times apart, so both the merge and the galloping path run.
    std::vector<int64_t> a, b;
    const uint64_t na = rng.below(30), nb = rng.below(2) ? rng.below(30) : 500 + rng.below(20000);
    const uint64_t universe = 1 + rng.below(40000);
    for (uint64_t k = 0; k < na; ++k) a.push_back(static_cast<int64_t>(rng.below(universe)));
    for (uint64_t k = 0; k < nb; ++k) b.push_back(static_cast<int64_t>(rng.below(universe)));
    const std::vector<int64_t> sa = make_node_set(a), sb = make_node_set(b);
    const int64_t expected = reference_overlap(a, b);
    EXPECT_EQ(sorted_overlap(sa.data(), static_cast<int64_t>(sa.size()), sb.data(), static_cast<int64_t>(sb.size())),
              expected);
    EXPECT_EQ(sorted_overlap(sb.data(), static_cast<int64_t>(sb.size()), sa.data(), static_cast<int64_t>(sa.size())),
              expected);
    EXPECT_EQ(reused_nodes(a, b), expected);   // unsorted, with duplicates
    EXPECT_EQ(reused_nodes(sb, sa), expected);
  }
  const std::vector<int64_t> few = {-5, 7, 10000, 20001};
  const std::vector<int64_t> many = range(0, 20001);
  EXPECT_EQ(sorted_overlap(few.data(), 4, many.data(), 20001), 2);
  EXPECT_EQ(sorted_overlap(few.data(), 0, many.data(), 20001), 0);
}

TEST(MakeNodeSet, SortsAndDropsDuplicates) {
  EXPECT_EQ(make_node_set({5, 1, 5, 3, 1}), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(make_node_set({}), std::vector<int64_t>{});
  EXPECT_EQ(make_node_set({-2, 4, 9}), (std::vector<int64_t>{-2, 4, 9}));
}

TEST(GreedyReorder, EqualsTheReferenceAlgorithm1OnRandomWindows) {
  kernels::CounterRng rng(2024);
  int reordered = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(rng.below(12));
    const NodeSets window = random_window(rng, n, 20 + static_cast<int64_t>(rng.below(300)));
    const std::vector<int> expected = reference_algorithm1(window);
    const std::vector<int> got = greedy_reorder(window);
    ASSERT_EQ(got, expected) << "trial " << trial << ", window of " << n;
    if (got != identity_order(window.size())) ++reordered;
  }
  EXPECT_GT(reordered, 1000);   // the windows exercise the reorder, not just the sampled order
  EXPECT_TRUE(greedy_reorder({}).empty());
}

TEST(GreedyReorder, FollowsFastGLFigure6) {
  // SubG1 shares more with SubG3 than with SubG2 (m13 > m12), so SubG3 goes second.
  const NodeSets window = {{0, 3, 4, 7, 9}, {0, 5, 8, 11, 12}, {0, 3, 4, 10, 12}};
  EXPECT_EQ(greedy_reorder(window), (std::vector<int>{0, 2, 1}));
}

TEST(GreedyReorder, TiesGoToTheLowestIndex) {
  // Batches 1, 2 and 3 all match batch 0 at M = 1/2; 1 wins. From 1, batch 3 (M = 1/2) beats
  // batch 2 (M = 0). A window with no overlap keeps its order.
  const NodeSets window = {
      range(0, 8),                                  // 0
      join(range(0, 4), range(100, 104)),           // 1: M01 = 4/8
      join(range(4, 8), range(200, 204)),           // 2: M02 = 4/8, M12 = 0
      join(range(0, 4), range(204, 208)),           // 3: M03 = 4/8, M13 = 4/8
  };
  EXPECT_EQ(greedy_reorder(window), (std::vector<int>{0, 1, 3, 2}));
  EXPECT_EQ(greedy_reorder(window), reference_algorithm1(window));
  const NodeSets exact_tie = {{1, 2, 3, 4}, {9, 10, 1, 2}, {3, 4, 20, 21}, {1, 2, 3, 4, 5, 6, 7, 8}};
  // From 0: M01 = 2/4, M02 = 2/4, M03 = 4/4 -> 3; from 3: M31 = 2/4, M32 = 2/4 -> 1 (lowest).
  EXPECT_EQ(greedy_reorder(exact_tie), (std::vector<int>{0, 3, 1, 2}));
  // Equal fractions from different counts: M01 = 3/6 and M02 = 2/4 tie; 1 wins. Swapped, 1 still wins.
  const NodeSets fractions = {range(0, 8), join(range(0, 3), range(50, 53)), join(range(4, 6), range(60, 62))};
  EXPECT_EQ(greedy_reorder(fractions), (std::vector<int>{0, 1, 2}));
  const NodeSets swapped = {fractions[0], fractions[2], fractions[1]};
  EXPECT_EQ(greedy_reorder(swapped), (std::vector<int>{0, 1, 2}));
  const NodeSets disjoint = {range(0, 5), range(10, 12), {}, range(20, 29), range(30, 31)};
  EXPECT_EQ(greedy_reorder(disjoint), identity_order(5));
  const NodeSets copies = {range(0, 5), range(0, 5), range(0, 5)};
  EXPECT_EQ(greedy_reorder(copies), identity_order(3));
}

TEST(ReuseOfOrder, CountsConsecutiveOverlapsAndTheCarriedInBatch) {
  kernels::CounterRng rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + static_cast<int>(rng.below(10));
    const NodeSets window = random_window(rng, n + 1, 50);
    const NodeSets sets(window.begin() + 1, window.end());
    std::vector<int> order = identity_order(sets.size());
    for (size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[rng.below(k)]);
    EXPECT_EQ(reuse_of_order(sets, order), reference_reuse(sets, order));
    EXPECT_EQ(reuse_of_order(sets, order, &window[0]), reference_reuse(sets, order, &window[0]));
  }
  const NodeSets two = {{1, 2}, {2, 3}};
  EXPECT_THROW(reuse_of_order(two, {0, 0}), InputError);
  EXPECT_THROW(reuse_of_order(two, {0}), InputError);
  EXPECT_THROW(reuse_of_order(two, {0, 2}), InputError);
  EXPECT_EQ(reuse_of_order({}, {}), 0);
}

TEST(MatchReorderWindow, NeverReusesFewerNodesThanTheSampledOrder) {
  kernels::CounterRng rng(99);
  int kept_sampled = 0, strictly_better = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int n = 1 + static_cast<int>(rng.below(12));
    const NodeSets all = random_window(rng, n + 1, 20 + static_cast<int64_t>(rng.below(200)));
    const NodeSets window(all.begin() + 1, all.end());
    const std::vector<int64_t>* carried = rng.below(2) ? &all[0] : nullptr;
    const WindowOrder w = match_reorder_window(window, carried);
    const int64_t sampled = reference_reuse(window, identity_order(window.size()), carried);
    const int64_t greedy = reference_reuse(window, reference_algorithm1(window), carried);
    ASSERT_EQ(w.reused, reference_reuse(window, w.order, carried));
    ASSERT_EQ(w.reused_sampled, sampled);
    ASSERT_GE(w.reused, sampled) << "trial " << trial;
    ASSERT_EQ(w.reused, std::max(greedy, sampled));
    ASSERT_EQ(w.order, greedy >= sampled ? reference_algorithm1(window) : identity_order(window.size()));
    ASSERT_EQ(w.greedy, greedy >= sampled);
    kept_sampled += !w.greedy;
    strictly_better += w.reused > sampled;
  }
  EXPECT_GT(kept_sampled, 0);      // the guard is exercised
  EXPECT_GT(strictly_better, 500);
}

TEST(MatchReorderWindow, ReorderStrictlyBeatsTheSampledOrderWhereBatchesInterleave) {
  // Sampled order alternates two neighbourhoods (A, B, A', B'); greedy groups them.
  const NodeSets window = {join(range(0, 10), range(50, 52)), range(100, 110), join(range(0, 9), range(60, 62)),
                           join(range(100, 109), range(70, 73))};
  const WindowOrder w = match_reorder_window(window);
  EXPECT_TRUE(w.greedy);
  EXPECT_EQ(w.order, (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(w.reused_sampled, 0);
  EXPECT_EQ(w.reused, 9 + 0 + 9);
  EXPECT_GT(reuse_of_order(window, w.order), reuse_of_order(window, identity_order(4)));
}

TEST(MatchReorderWindow, KeepsTheSampledOrderWhereGreedyReusesFewer) {
  // Batch 2 is a single node of batch 0: M02 = 1 beats M01 = 1/2, but it reuses 1 node where
  // batch 1 reuses 50. Greedy (0, 2, 1) reuses 2 nodes, the sampled order 51.
  const NodeSets window = {range(0, 100), join(range(0, 50), range(200, 250)), {0}};
  EXPECT_EQ(greedy_reorder(window), (std::vector<int>{0, 2, 1}));
  const WindowOrder w = match_reorder_window(window);
  EXPECT_FALSE(w.greedy);
  EXPECT_EQ(w.order, identity_order(3));
  EXPECT_EQ(w.reused, 51);
  EXPECT_EQ(w.reused_sampled, 51);
}

// Pushes `batches` through MatchReorder in sampled order and checks every release against
// match_reorder_window with the previously released batch carried in.
void check_match_reorder(const NodeSets& batches, int window) {
  MatchReorder<int> reorder(window);
  const int w = std::max(1, window);
  std::vector<int> released;
  const std::vector<int64_t>* carried = nullptr;
  auto check = [&](const std::vector<int>& out, size_t first) {
    const NodeSets sets(batches.begin() + static_cast<std::ptrdiff_t>(first),
                        batches.begin() + static_cast<std::ptrdiff_t>(first + out.size()));
    const WindowOrder expected = match_reorder_window(sets, carried);
    ASSERT_EQ(out.size(), expected.order.size());
    for (size_t t = 0; t < out.size(); ++t) ASSERT_EQ(out[t], static_cast<int>(first) + expected.order[t]);
    released.insert(released.end(), out.begin(), out.end());
    if (!out.empty()) carried = &batches[static_cast<size_t>(out.back())];
  };
  size_t window_start = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    const std::vector<int> out = reorder.push(static_cast<int>(b), batches[b]);
    if ((b + 1) % static_cast<size_t>(w) == 0) {
      ASSERT_EQ(out.size(), static_cast<size_t>(w));
      check(out, window_start);
      window_start = b + 1;
    } else {
      ASSERT_TRUE(out.empty());
    }
  }
  const std::vector<int> rest = reorder.flush();
  ASSERT_EQ(rest.size(), batches.size() - window_start);
  check(rest, window_start);
  EXPECT_TRUE(reorder.flush().empty());
  // Every batch once; the counts are the match's reuse along the released and the sampled order.
  std::vector<int> sorted = released;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, identity_order(batches.size()));
  const ReuseCounts& c = reorder.counts();
  EXPECT_EQ(c.batches, static_cast<int64_t>(batches.size()));
  int64_t nodes = 0;
  for (const auto& s : batches) nodes += testing::reference_distinct(s);
  EXPECT_EQ(c.nodes, nodes);
  EXPECT_EQ(c.reused, reference_reuse(batches, released));
  EXPECT_EQ(c.reused_sampled_order, reference_reuse(batches, identity_order(batches.size())));
  EXPECT_EQ(c.windows, static_cast<int64_t>((batches.size() + static_cast<size_t>(w) - 1) / static_cast<size_t>(w)));
  EXPECT_EQ(c.loaded(), c.nodes - c.reused);
  if (w == 1) EXPECT_EQ(released, identity_order(batches.size()));
}

TEST(MatchReorder, ReleasesWindowsInGuardedGreedyOrderAndCountsTheMatch) {
  kernels::CounterRng rng(5);
  for (int window : {0, 1, 2, 3, 5, 8, 13}) {
    for (int count : {0, 1, 2, 7, 16, 40}) {
      const NodeSets batches = random_window(rng, count, 150);
      SCOPED_TRACE("window " + std::to_string(window) + ", batches " + std::to_string(count));
      check_match_reorder(batches, window);
    }
  }
}

TEST(MatchWindow, AddingToAFullWindowIsAnInternalError) {
  MatchWindow w(2);
  w.add({1, 2});
  w.add({2, 3});
  EXPECT_TRUE(w.full());
  EXPECT_THROW(w.add({4}), InternalError);
  ReuseCounts counts;
  EXPECT_EQ(w.release(counts).size(), 2u);
  EXPECT_EQ(counts.reused, 1);
  EXPECT_TRUE(w.release(counts).empty());
}

}  // namespace
}  // namespace gale::scheduler
