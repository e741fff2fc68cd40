#include "sampler/neighbor_sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "kernels/error.hpp"
#include "kernels/random.hpp"

namespace gale::sampler {
namespace {

// A random graph with a hub (node 0 has every other node as in-neighbour) and empty rows.
struct TestGraph {
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  kernels::CsrView view() const {
    return {static_cast<int64_t>(indptr.size()) - 1, static_cast<int64_t>(indptr.size()) - 1, indptr.data(),
            indices.data(), nullptr};
  }
};

TestGraph random_graph(int64_t n, uint64_t seed) {
  TestGraph g;
  kernels::CounterRng rng(seed);
  g.indptr.push_back(0);
  for (int64_t v = 0; v < n; ++v) {
    std::set<int32_t> nbrs;
    if (v == 0) {
      for (int32_t u = 1; u < n; ++u) nbrs.insert(u);
    } else if (v % 7 != 3) {  // every 7th row is empty
      const int64_t deg = static_cast<int64_t>(rng.below(20));
      for (int64_t k = 0; k < deg; ++k) nbrs.insert(static_cast<int32_t>(rng.below(static_cast<uint64_t>(n))));
    }
    g.indices.insert(g.indices.end(), nbrs.begin(), nbrs.end());
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  return g;
}

TEST(NeighborSampler, SampledEdgesExistAreDistinctAndRespectFanouts) {
  const TestGraph g = random_graph(500, 11);
  const kernels::CsrView csr = g.view();
  const std::vector<int> fanouts = {5, 3, 7};
  NeighborSampler sampler(csr, fanouts);
  std::vector<int64_t> seeds = {0, 3, 10, 42, 77, 499, 250};
  const SampledBatch batch = sampler.sample(seeds.data(), static_cast<int64_t>(seeds.size()), 99);
  ASSERT_EQ(batch.blocks.size(), fanouts.size());
  // The last block's destinations are the seeds in order.
  EXPECT_EQ(std::vector<int64_t>(batch.blocks.back().src_ids.begin(),
                                 batch.blocks.back().src_ids.begin() + batch.num_seeds()),
            seeds);
  for (size_t l = 0; l < batch.blocks.size(); ++l) {
    const Block& b = batch.blocks[l];
    const int fanout = fanouts[fanouts.size() - 1 - l];
    // Local ids are dense and map to distinct global ids.
    std::set<int64_t> distinct(b.src_ids.begin(), b.src_ids.end());
    EXPECT_EQ(distinct.size(), b.src_ids.size());
    if (l + 1 < batch.blocks.size()) {
      // A block's destinations are exactly the next block's sources, in order.
      const Block& next = batch.blocks[l + 1];
      ASSERT_EQ(b.num_dst(), next.num_src());
      for (int64_t i = 0; i < b.num_dst(); ++i) EXPECT_EQ(b.src_ids[i], next.src_ids[i]);
    }
    for (int64_t d = 0; d < b.num_dst(); ++d) {
      const int64_t v = b.src_ids[d];
      const int64_t deg = csr.degree(v);
      const int64_t taken = b.indptr[d + 1] - b.indptr[d];
      EXPECT_EQ(taken, std::min<int64_t>(deg, fanout)) << "node " << v;
      std::set<int64_t> picked;
      for (int64_t e = b.indptr[d]; e < b.indptr[d + 1]; ++e) {
        ASSERT_GE(b.indices[e], 0);
        ASSERT_LT(b.indices[e], b.num_src());
        const int64_t u = b.src_ids[b.indices[e]];
        EXPECT_TRUE(std::binary_search(csr.indices + csr.indptr[v], csr.indices + csr.indptr[v + 1], u))
            << u << " -> " << v << " is not an edge";
        picked.insert(u);
      }
      EXPECT_EQ(static_cast<int64_t>(picked.size()), taken) << "duplicate neighbour of " << v;
    }
  }
}

TEST(NeighborSampler, SameKeySamplesTheSameBlocks) {
  const TestGraph g = random_graph(300, 5);
  NeighborSampler sampler(g.view(), {4, 4});
  std::vector<int64_t> seeds = {0, 1, 2, 3, 200};
  const SampledBatch a = sampler.sample(seeds.data(), 5, 7);
  const SampledBatch b = sampler.sample(seeds.data(), 5, 7);
  const SampledBatch c = sampler.sample(seeds.data(), 5, 8);
  for (size_t l = 0; l < a.blocks.size(); ++l) {
    EXPECT_EQ(a.blocks[l].src_ids, b.blocks[l].src_ids);
    EXPECT_EQ(a.blocks[l].indices, b.blocks[l].indices);
  }
  EXPECT_NE(a.blocks[0].src_ids, c.blocks[0].src_ids);
}

TEST(NeighborSampler, HubNeighbourFrequenciesAreUniform) {
  // Node 0 has 499 in-neighbours; draw 5 of them many times and check each is picked about
  // equally often (chi-square with 498 degrees of freedom; 99.9% quantile is about 605).
  const TestGraph g = random_graph(500, 3);
  NeighborSampler sampler(g.view(), {5});
  std::map<int64_t, int64_t> counts;
  const int draws = 20000;
  const int64_t seed = 0;
  for (int k = 0; k < draws; ++k) {
    const SampledBatch s = sampler.sample(&seed, 1, static_cast<uint64_t>(k));
    const Block& b = s.blocks[0];
    for (int64_t e = b.indptr[0]; e < b.indptr[1]; ++e) counts[b.src_ids[b.indices[e]]]++;
  }
  ASSERT_EQ(counts.size(), 499u);
  const double expected = draws * 5.0 / 499.0;
  double chi2 = 0;
  for (const auto& [node, c] : counts) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 605.0);
}

TEST(NeighborSampler, FanoutMinusOneTakesAllNeighbours) {
  const TestGraph g = random_graph(100, 2);
  NeighborSampler sampler(g.view(), {-1});
  const int64_t seed = 0;
  const SampledBatch s = sampler.sample(&seed, 1, 1);
  EXPECT_EQ(s.blocks[0].indptr[1], 99);
}

TEST(NeighborSampler, BadFanoutsAndSeedsAreInputErrors) {
  const TestGraph g = random_graph(10, 2);
  EXPECT_THROW(NeighborSampler(g.view(), {}), InputError);
  EXPECT_THROW(NeighborSampler(g.view(), {0}), InputError);
  NeighborSampler sampler(g.view(), {2});
  const int64_t bad = 10;
  EXPECT_THROW(sampler.sample(&bad, 1, 0), InputError);
}

// Positive weights for every entry of g: 0.1 to 10, log-uniform.
std::vector<float> random_weights(const TestGraph& g, uint64_t key) {
  std::vector<float> w(g.indices.size());
  for (size_t e = 0; e < w.size(); ++e) w[e] = std::pow(10.0f, 2.0f * kernels::random_uniform(key, e) - 1.0f);
  return w;
}

// Upper tail of chi-square with `dof` degrees of freedom (Wilson-Hilferty normal approximation).
double chi2_p_value(double chi2, double dof) {
  const double z = (std::cbrt(chi2 / dof) - (1 - 2 / (9 * dof))) / std::sqrt(2 / (9 * dof));
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

TEST(NeighborSampler, WeightedSamplesExistAreDistinctAndRespectFanouts) {
  const TestGraph g = random_graph(400, 21);
  const std::vector<float> weights = random_weights(g, 22);
  kernels::CsrView csr = g.view();
  csr.weights = weights.data();
  const std::vector<int> fanouts = {6, 4};
  NeighborSampler sampler(csr, fanouts, Sampling::kWeighted);
  std::vector<int64_t> seeds = {0, 5, 17, 3, 399};
  const SampledBatch batch = sampler.sample(seeds.data(), static_cast<int64_t>(seeds.size()), 5);
  for (size_t l = 0; l < batch.blocks.size(); ++l) {
    const Block& b = batch.blocks[l];
    const int fanout = fanouts[fanouts.size() - 1 - l];
    for (int64_t d = 0; d < b.num_dst(); ++d) {
      const int64_t v = b.src_ids[d];
      EXPECT_EQ(b.indptr[d + 1] - b.indptr[d], std::min<int64_t>(csr.degree(v), fanout));
      std::set<int64_t> picked;
      int64_t previous = -1;
      for (int64_t e = b.indptr[d]; e < b.indptr[d + 1]; ++e) {
        const int64_t u = b.src_ids[b.indices[e]];
        EXPECT_TRUE(std::binary_search(csr.indices + csr.indptr[v], csr.indices + csr.indptr[v + 1], u));
        EXPECT_GT(u, previous) << "not in graph order";  // rows are sorted, picks keep row order
        previous = u;
        picked.insert(u);
      }
    }
  }
  // The same key draws the same neighbours; another key others.
  const SampledBatch again = sampler.sample(seeds.data(), static_cast<int64_t>(seeds.size()), 5);
  EXPECT_EQ(again.blocks[0].src_ids, batch.blocks[0].src_ids);
  const SampledBatch other = sampler.sample(seeds.data(), static_cast<int64_t>(seeds.size()), 6);
  EXPECT_NE(other.blocks[0].src_ids, batch.blocks[0].src_ids);
}

// One neighbour of node 0 drawn per key: each with probability w / sum(w).
TEST(NeighborSampler, WeightedSingleDrawFollowsTheWeights) {
  const TestGraph g = random_graph(60, 23);
  std::vector<float> weights(g.indices.size());
  for (size_t e = 0; e < weights.size(); ++e) weights[e] = 1.0f + static_cast<float>(e % 4);  // 1 to 4
  kernels::CsrView csr = g.view();
  csr.weights = weights.data();
  NeighborSampler sampler(csr, {1}, Sampling::kWeighted);
  const int64_t degree = csr.degree(0);
  double total = 0;
  for (int64_t j = 0; j < degree; ++j) total += weights[static_cast<size_t>(j)];
  const int draws = 40000;
  std::vector<int64_t> counts(static_cast<size_t>(degree), 0);
  const int64_t seed = 0;
  for (int k = 0; k < draws; ++k) {
    const Block b = sampler.sample(&seed, 1, static_cast<uint64_t>(k)).blocks[0];
    ASSERT_EQ(b.indptr[1], 1);
    const int64_t u = b.src_ids[b.indices[0]];
    counts[static_cast<size_t>(std::lower_bound(g.indices.begin(), g.indices.begin() + degree, u) - g.indices.begin())]++;
  }
  double chi2 = 0;
  for (int64_t j = 0; j < degree; ++j) {
    const double expected = draws * weights[static_cast<size_t>(j)] / total;
    chi2 += (counts[j] - expected) * (counts[j] - expected) / expected;
  }
  EXPECT_GT(chi2_p_value(chi2, static_cast<double>(degree - 1)), 0.001) << "chi2 " << chi2;
}

// Two neighbours of node 0 per key: neighbour j is in the pair with probability
// p_j (1 + sum_{i != j} p_i / (1 - p_i)), p = w / sum(w) (first draw, or second after some i).
TEST(NeighborSampler, WeightedPairsFollowSuccessiveSampling) {
  const TestGraph g = random_graph(40, 24);
  const std::vector<float> weights = random_weights(g, 25);
  kernels::CsrView csr = g.view();
  csr.weights = weights.data();
  NeighborSampler sampler(csr, {2}, Sampling::kWeighted);
  const int64_t degree = csr.degree(0);
  std::vector<double> p(static_cast<size_t>(degree));
  double total = 0;
  for (int64_t j = 0; j < degree; ++j) total += weights[static_cast<size_t>(j)];
  for (int64_t j = 0; j < degree; ++j) p[j] = weights[static_cast<size_t>(j)] / total;
  double sum_ratio = 0;
  for (int64_t i = 0; i < degree; ++i) sum_ratio += p[i] / (1 - p[i]);
  const int draws = 30000;
  std::vector<int64_t> counts(static_cast<size_t>(degree), 0);
  const int64_t seed = 0;
  for (int k = 0; k < draws; ++k) {
    const Block b = sampler.sample(&seed, 1, static_cast<uint64_t>(k)).blocks[0];
    ASSERT_EQ(b.indptr[1], 2);
    for (int64_t e = 0; e < 2; ++e) {
      const int64_t u = b.src_ids[b.indices[e]];
      counts[static_cast<size_t>(std::lower_bound(g.indices.begin(), g.indices.begin() + degree, u) - g.indices.begin())]++;
    }
  }
  double chi2 = 0;
  for (int64_t j = 0; j < degree; ++j) {
    const double pi = p[j] * (1 + sum_ratio - p[j] / (1 - p[j]));
    const double expected = draws * pi;
    chi2 += (counts[j] - expected) * (counts[j] - expected) / (expected * (1 - pi));
  }
  EXPECT_GT(chi2_p_value(chi2, static_cast<double>(degree - 1)), 0.001) << "chi2 " << chi2;
}

// weighted_offsets keeps only the candidates below a threshold; the k smallest priorities of the
// whole row (ties to the lower entry), computed here directly, must be what it returns: every
// row length and k, flat and skewed weights (where the first threshold catches too few).
TEST(NeighborSampler, WeightedOffsetsAreTheKSmallestPriorities) {
  std::vector<int64_t> got;
  for (int skew = 0; skew < 3; ++skew) {
    for (const int64_t degree : {2, 5, 33, 300, 5000}) {
      std::vector<float> w(static_cast<size_t>(degree));
      for (int64_t j = 0; j < degree; ++j) {
        const float u = kernels::random_uniform(40 + skew, static_cast<uint64_t>(j));
        w[j] = skew == 0 ? 1.0f : skew == 1 ? 0.1f + u : std::pow(10.0f, 8.0f * u - 4.0f);
      }
      for (const int64_t k : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{64}, int64_t{65}, degree - 1}) {
        if (k < 1 || k >= degree) continue;
        const uint64_t row_key = kernels::derive_key(99, static_cast<uint64_t>(degree * 131 + k));
        std::vector<std::pair<double, int64_t>> all;
        for (int64_t j = 0; j < degree; ++j)
          all.emplace_back(kernels::random_exponential(row_key, static_cast<uint64_t>(j)) / static_cast<double>(w[j]), j);
        std::sort(all.begin(), all.end());
        std::vector<int64_t> want;
        for (int64_t i = 0; i < k; ++i) want.push_back(all[static_cast<size_t>(i)].second);
        std::sort(want.begin(), want.end());
        weighted_offsets(row_key, w.data(), degree, k, &got);
        EXPECT_EQ(got, want) << "skew " << skew << " degree " << degree << " k " << k;
      }
    }
  }
}

TEST(NeighborSampler, WeightedNeedsPositiveWeights) {
  const TestGraph g = random_graph(30, 26);
  EXPECT_THROW(NeighborSampler(g.view(), {2}, Sampling::kWeighted), InputError);
  std::vector<float> weights(g.indices.size(), 1.0f);
  weights[3] = 0.0f;  // an entry of node 0's row, which has 29 entries
  kernels::CsrView csr = g.view();
  csr.weights = weights.data();
  NeighborSampler sampler(csr, {2}, Sampling::kWeighted);
  const int64_t seed = 0;
  EXPECT_THROW(sampler.sample(&seed, 1, 1), InputError);
  weights[3] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(sampler.sample(&seed, 1, 1), InputError);
  weights[3] = 2.0f;
  EXPECT_NO_THROW(sampler.sample(&seed, 1, 1));
}

// Blocks with weights (weighted aggregation): every entry carries the weight of the graph edge it
// was drawn from, in both modes, with the same draws as blocks without.
TEST(NeighborSampler, BlockWeightsAreTheSampledEdgesWeights) {
  const TestGraph g = random_graph(300, 27);
  const std::vector<float> weights = random_weights(g, 28);
  kernels::CsrView csr = g.view();
  csr.weights = weights.data();
  EXPECT_THROW(NeighborSampler(g.view(), {3}, Sampling::kUniform, /*block_weights=*/true), InputError);
  const std::vector<int64_t> seeds = {0, 7, 42, 299, 150};
  for (const Sampling mode : {Sampling::kUniform, Sampling::kWeighted}) {
    const NeighborSampler with(csr, {4, 3}, mode, /*block_weights=*/true);
    const NeighborSampler without(csr, {4, 3}, mode);
    const SampledBatch batch = with.sample(seeds.data(), static_cast<int64_t>(seeds.size()), 9);
    const SampledBatch plain = without.sample(seeds.data(), static_cast<int64_t>(seeds.size()), 9);
    for (size_t l = 0; l < batch.blocks.size(); ++l) {
      const Block& b = batch.blocks[l];
      EXPECT_EQ(b.indices, plain.blocks[l].indices);
      EXPECT_EQ(b.src_ids, plain.blocks[l].src_ids);
      EXPECT_TRUE(plain.blocks[l].weights.empty());
      ASSERT_EQ(b.weights.size(), b.indices.size());
      EXPECT_EQ(b.csr().weights, b.weights.data());
      for (int64_t d = 0; d < b.num_dst(); ++d) {
        const int64_t v = b.src_ids[d];
        for (int64_t e = b.indptr[d]; e < b.indptr[d + 1]; ++e) {
          const int32_t u = static_cast<int32_t>(b.src_ids[b.indices[e]]);
          const int32_t* row = csr.indices + csr.indptr[v];
          const int64_t at = std::lower_bound(row, csr.indices + csr.indptr[v + 1], u) - csr.indices;
          EXPECT_EQ(b.weights[e], weights[at]) << v << " <- " << u;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gale::sampler
