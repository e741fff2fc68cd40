// Match-reorder on batches the CPU NeighborSampler draws from generated graphs: in every window,
// the released order reuses at least as many input nodes as the sampled order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/random.hpp"
#include "sampler/neighbor_sampler.hpp"
#include "scheduler/batch_pipeline.hpp"
#include "scheduler/epoch_plan.hpp"
#include "scheduler/match_reorder.hpp"
#include "storage/generators.hpp"
#include "tests/common/owned_csr.hpp"

namespace gale::scheduler {
namespace {

using Graph = gale::testing::OwnedCsr;

// The generator's edges, symmetrised, without duplicates or self loops (as `gale preprocess
// --undirected` stores them).
Graph generated_graph(const std::string& spec) {
  storage::GeneratorSpec g = storage::parse_generator(spec);
  g.seed = 3;
  g.seed_given = true;
  const int64_t n = storage::generator_nodes(g);
  std::vector<std::vector<int32_t>> in(static_cast<size_t>(n));
  storage::generate_edges(g, [&](int64_t s, int64_t d) {
    if (s == d) return;
    in[static_cast<size_t>(d)].push_back(static_cast<int32_t>(s));
    in[static_cast<size_t>(s)].push_back(static_cast<int32_t>(d));
  });
  Graph graph;
  graph.indptr.push_back(0);
  for (auto& row : in) {
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    graph.indices.insert(graph.indices.end(), row.begin(), row.end());
    graph.indptr.push_back(static_cast<int64_t>(graph.indices.size()));
  }
  return graph;
}

struct Totals {
  int64_t nodes = 0, reused_sampled = 0, reused = 0, windows = 0, kept_sampled = 0, reordered_better = 0;
};

// One epoch of batches through run_batch_pipeline with a reorder window; checks each window's
// reuse against its sampled order (same carried-in batch) and returns the totals.
Totals run_epoch(const Graph& graph, const std::vector<int>& fanouts, int64_t batch_size, int window) {
  const kernels::CsrView csr = graph.view();
  const sampler::NeighborSampler sampler(csr, fanouts);
  std::vector<int64_t> seeds(static_cast<size_t>(csr.rows));
  std::iota(seeds.begin(), seeds.end(), 0);
  const EpochPlan plan(seeds, batch_size, 11, 0);
  std::vector<std::vector<int64_t>> node_sets(static_cast<size_t>(plan.num_batches()));
  std::vector<int64_t> consumed;
  const PipelineTimes times = run_batch_pipeline<sampler::SampledBatch>(
      plan.num_batches(), 4, window,
      [&](int64_t b) { return sampler.sample(plan.batch(b), plan.batch_length(b), kernels::derive_key(11, b)); },
      [](const sampler::SampledBatch& s) -> const std::vector<int64_t>& { return s.input_nodes(); },
      [&](int64_t b, sampler::SampledBatch& s) {
        node_sets[static_cast<size_t>(b)] = s.input_nodes();
        consumed.push_back(b);
      });

  Totals t;
  const std::vector<int64_t>* carried = nullptr;
  for (size_t first = 0; first < consumed.size(); first += static_cast<size_t>(window)) {
    const size_t n = std::min(static_cast<size_t>(window), consumed.size() - first);
    std::vector<std::vector<int64_t>> sets;
    std::vector<int> released, sampled(n);
    for (size_t i = 0; i < n; ++i) {
      sets.push_back(node_sets[first + i]);
      released.push_back(static_cast<int>(consumed[first + i] - static_cast<int64_t>(first)));
      sampled[i] = static_cast<int>(i);
    }
    const int64_t r = reuse_of_order(sets, released, carried);
    const int64_t s = reuse_of_order(sets, sampled, carried);
    EXPECT_GE(r, s) << "window at batch " << first;
    t.reordered_better += r > s;
    t.kept_sampled += released == sampled;
    t.windows += 1;
    carried = &node_sets[static_cast<size_t>(consumed[first + n - 1])];
  }
  for (const auto& s : node_sets) t.nodes += static_cast<int64_t>(s.size());
  for (size_t i = 1; i < consumed.size(); ++i) {
    t.reused += reused_nodes(node_sets[static_cast<size_t>(consumed[i - 1])], node_sets[static_cast<size_t>(consumed[i])]);
    t.reused_sampled += reused_nodes(node_sets[i - 1], node_sets[i]);
  }
  EXPECT_EQ(times.reuse.nodes, t.nodes);
  EXPECT_EQ(times.reuse.reused, t.reused);
  EXPECT_EQ(times.reuse.reused_sampled_order, t.reused_sampled);
  return t;
}

void report(const std::string& name, int window, const Totals& t) {
  std::printf("%-34s window %2d: %lld input nodes; match alone reuses %lld (%.1f%%), match-reorder %lld (%.1f%%): "
              "%+.1f%% fewer loads; %lld/%lld windows reordered for more reuse, %lld in sampled order\n",
              name.c_str(), window, static_cast<long long>(t.nodes), static_cast<long long>(t.reused_sampled),
              100.0 * static_cast<double>(t.reused_sampled) / static_cast<double>(t.nodes),
              static_cast<long long>(t.reused), 100.0 * static_cast<double>(t.reused) / static_cast<double>(t.nodes),
              100.0 * static_cast<double>(t.reused - t.reused_sampled) / static_cast<double>(t.nodes - t.reused_sampled),
              static_cast<long long>(t.reordered_better), static_cast<long long>(t.windows),
              static_cast<long long>(t.kept_sampled));
}

TEST(SampledReuse, ReorderReusesAtLeastTheSampledOrderOnRmatBatches) {
  const Graph g = generated_graph("rmat:scale=14,edge-factor=8");
  for (int window : {4, 8, 16}) {
    const Totals t = run_epoch(g, {10, 5}, 128, window);
    report("rmat scale 14, fanouts 10,5, b 128", window, t);
    // The guard holds per window; over the epoch the reuse across window boundaries differs
    // between the two orders, so the epoch totals are printed, not asserted.
    EXPECT_GT(t.reordered_better, 0);
  }
}

TEST(SampledReuse, ReorderReusesAtLeastTheSampledOrderOnSbmBatches) {
  const Graph g = generated_graph("sbm:nodes=16K,classes=8,avg-degree=12");
  for (int window : {4, 8, 16}) {
    const Totals t = run_epoch(g, {10, 5}, 256, window);
    report("sbm 16K nodes, fanouts 10,5, b 256", window, t);
    EXPECT_GT(t.reused_sampled, 0);
  }
}

}  // namespace
}  // namespace gale::scheduler
