// Partitioning (`gale preprocess --partitions P`): METIS finds planted clusters, is deterministic
// for a seed, LDG takes over under a small memory budget, and partition.npy travels through the
// store like every other array.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <vector>

#include "kernels/error.hpp"
#include "storage/partition.hpp"
#include "storage/preprocess.hpp"
#include "storage/store.hpp"
#include "tests/common/owned_csr.hpp"
#include "tests/storage/test_files.hpp"

namespace gale::storage {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
// Built from (src, dst) pairs by from_edges.
using Graph = gale::testing::OwnedCsr;

Graph from_edges(int64_t n, std::vector<std::pair<int32_t, int32_t>> edges, bool sort_rows = true) {
  std::stable_sort(edges.begin(), edges.end(), [&](auto a, auto b) {
    return sort_rows ? std::make_pair(a.second, a.first) < std::make_pair(b.second, b.first) : a.second < b.second;
  });
  Graph g;
  g.indptr.assign(static_cast<size_t>(n + 1), 0);
  for (const auto& [s, d] : edges) ++g.indptr[d + 1];
  for (int64_t v = 0; v < n; ++v) g.indptr[v + 1] += g.indptr[v];
  for (const auto& [s, d] : edges) g.indices.push_back(s);
  return g;
}

// `blocks` clusters of `size` nodes, interleaved in id order (node v is in block v % blocks, so
// contiguous id ranges say nothing); each intra-block pair is an edge with probability p_in, and
// `bridges` random edges join different blocks. Undirected: both directions stored.
struct Planted {
  Graph graph;
  int blocks;
  int64_t planted_cut = 0;  // CSR entries between blocks (2 per bridge)
};

Planted planted_blocks(int blocks, int64_t size, double p_in, int bridges, uint32_t seed) {
  const int64_t n = blocks * size;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> coin(0, 1);
  std::set<std::pair<int32_t, int32_t>> undirected;
  for (int64_t u = 0; u < n; ++u)
    for (int64_t v = u + 1; v < n; ++v)
      if (u % blocks == v % blocks && coin(rng) < p_in) undirected.insert({static_cast<int32_t>(u), static_cast<int32_t>(v)});
  std::uniform_int_distribution<int32_t> node(0, static_cast<int32_t>(n - 1));
  int64_t cut = 0;
  while (cut < bridges) {
    int32_t u = node(rng), v = node(rng);
    if (u % blocks == v % blocks) continue;
    if (u > v) std::swap(u, v);
    cut += undirected.insert({u, v}).second;
  }
  std::vector<std::pair<int32_t, int32_t>> edges;
  for (const auto& [u, v] : undirected) {
    edges.push_back({u, v});
    edges.push_back({v, u});
  }
  return {from_edges(n, edges), blocks, 2 * cut};
}

std::vector<int64_t> part_sizes(const std::vector<int32_t>& part, int parts) {
  std::vector<int64_t> size(static_cast<size_t>(parts), 0);
  for (int32_t p : part) {
    EXPECT_TRUE(p >= 0 && p < parts) << p;
    if (p >= 0 && p < parts) ++size[p];
  }
  return size;
}

// Expected cut of a uniformly random assignment: each non-loop entry crosses with prob 1 - 1/P.
double random_cut(const kernels::CsrView& g, int parts) {
  int64_t entries = 0;
  for (int64_t d = 0; d < g.rows; ++d)
    for (int64_t k = g.indptr[d]; k < g.indptr[d + 1]; ++k) entries += g.indices[k] != d;
  return static_cast<double>(entries) * (1.0 - 1.0 / parts);
}

constexpr uint64_t kPlenty = uint64_t{1} << 32;

TEST(Partition, MetisRecoversPlantedBlocks) {
  const Planted p = planted_blocks(4, 150, 0.15, 30, 7);
  const kernels::CsrView g = p.graph.view();
  std::string method;
  const std::vector<int32_t> part = partition_graph(g, 4, kPlenty, 1, &method);
  EXPECT_EQ(method, "metis");
  ASSERT_EQ(part.size(), 600u);
  // Every block lands whole in its own part.
  std::set<int32_t> used;
  for (int b = 0; b < 4; ++b) {
    std::map<int32_t, int> count;
    for (int64_t v = b; v < 600; v += 4) ++count[part[v]];
    EXPECT_EQ(count.size(), 1u) << "block " << b << " is split over " << count.size() << " parts";
    used.insert(count.begin()->first);
  }
  EXPECT_EQ(used.size(), 4u);
  const int64_t cut = edge_cut(g, part.data());
  EXPECT_EQ(cut, p.planted_cut);
  EXPECT_LT(static_cast<double>(cut), 0.05 * random_cut(g, 4));
  for (int64_t s : part_sizes(part, 4)) EXPECT_EQ(s, 150);
}

TEST(Partition, MetisBalancesNodeCounts) {
  // Unequal planted blocks (more clusters than parts): METIS must still balance node counts
  // within its default 3 % imbalance.
  const Planted p = planted_blocks(7, 90, 0.1, 200, 11);
  const std::vector<int32_t> part = partition_graph(p.graph.view(), 4, kPlenty, 3, nullptr);
  for (int64_t s : part_sizes(part, 4)) {
    EXPECT_LE(s, part_capacity(630, 4)) << s;
    EXPECT_GT(s, 0);
  }
  EXPECT_LT(static_cast<double>(edge_cut(p.graph.view(), part.data())), 0.6 * random_cut(p.graph.view(), 4));
}

TEST(Partition, SameSeedGivesTheSameParts) {
  const Planted p = planted_blocks(6, 100, 0.05, 400, 3);
  const auto a = partition_graph(p.graph.view(), 5, kPlenty, 42, nullptr);
  const auto b = partition_graph(p.graph.view(), 5, kPlenty, 42, nullptr);
  EXPECT_EQ(a, b);
  std::string method;
  const auto c = partition_graph(p.graph.view(), 5, 1, 42, &method);
  const auto d = partition_graph(p.graph.view(), 5, 1, 7, nullptr);
  EXPECT_EQ(method, "ldg");
  EXPECT_EQ(c, d);  // LDG has no randomness: node order decides
}

TEST(Partition, TinyBudgetStreamsBalancedPartsBeatingRandom) {
  const Planted p = planted_blocks(8, 250, 0.03, 1500, 5);
  const kernels::CsrView g = p.graph.view();
  ASSERT_GT(metis_memory_bytes(g), 4096u);
  for (const int parts : {2, 4, 8}) {
    std::string method;
    const std::vector<int32_t> part = partition_graph(g, parts, 4096, 9, &method);
    EXPECT_EQ(method, "ldg");
    // max(ceil(N / P), floor(1.03 N / P)).
    const auto capacity = std::max(static_cast<int64_t>(std::ceil(2000.0 / parts)),
                                   static_cast<int64_t>(std::floor(2000.0 * 1.03 / parts)));
    EXPECT_EQ(part_capacity(2000, parts), capacity);
    for (int64_t s : part_sizes(part, parts)) {
      EXPECT_LE(s, capacity) << parts << " parts";
      EXPECT_GT(s, 0) << parts << " parts";
    }
    // A seeded random assignment of the same graph, for scale.
    std::mt19937 rng(1);
    std::vector<int32_t> random(part.size());
    for (auto& r : random) r = static_cast<int32_t>(rng() % static_cast<uint32_t>(parts));
    const double ldg = static_cast<double>(edge_cut(g, part.data()));
    const double rnd = static_cast<double>(edge_cut(g, random.data()));
    EXPECT_LT(ldg, 0.7 * rnd) << parts << " parts: LDG cut " << ldg << ", random " << rnd;
  }
}

TEST(Partition, BudgetJustAboveTheMetisInputUsesMetis) {
  const Planted p = planted_blocks(4, 50, 0.2, 10, 2);
  // (N + 1 offsets + symmetrised entries + N parts) x 4-byte idx_t, and METIS's work on top.
  EXPECT_EQ(metis_input_bytes(p.graph.view()), (201 + static_cast<uint64_t>(p.graph.indices.size()) + 200) * 4);
  const uint64_t need = metis_memory_bytes(p.graph.view());
  EXPECT_EQ(need, 16 * metis_input_bytes(p.graph.view()));
  std::string method;
  partition_graph(p.graph.view(), 4, need, 0, &method);
  EXPECT_EQ(method, "metis");
  partition_graph(p.graph.view(), 4, need - 1, 0, &method);
  EXPECT_EQ(method, "ldg");
}

TEST(Partition, DirectedUnsortedInputIsSymmetrised) {
  // A ring stored in one direction only, rows out of order, with self loops and duplicates:
  // METIS sees the same adjacency as for the clean undirected ring.
  const int64_t n = 40;
  std::vector<std::pair<int32_t, int32_t>> one_way, both;
  for (int32_t v = 0; v < n; ++v) {
    const int32_t w = static_cast<int32_t>((v + 1) % n);
    one_way.push_back({v, w});
    one_way.push_back({v, w});  // duplicate
    one_way.push_back({v, v});  // self loop
    one_way.push_back({static_cast<int32_t>((v + 7) % n), w});  // a chord, also one way
    both.push_back({v, w});
    both.push_back({w, v});
    both.push_back({static_cast<int32_t>((v + 7) % n), w});
    both.push_back({w, static_cast<int32_t>((v + 7) % n)});
  }
  std::reverse(one_way.begin(), one_way.end());
  const Graph directed = from_edges(n, one_way, /*sort_rows=*/false);
  const Graph undirected = from_edges(n, both);
  EXPECT_EQ(metis_input_bytes(directed.view()), metis_input_bytes(undirected.view()));
  std::string method;
  const auto part = partition_graph(directed.view(), 4, kPlenty, 0, &method);
  EXPECT_EQ(method, "metis");
  for (int64_t s : part_sizes(part, 4)) EXPECT_LE(s, 11);
}

TEST(Partition, OnePartAndEdgelessGraphs) {
  const Planted p = planted_blocks(2, 10, 0.5, 2, 1);
  std::string method;
  EXPECT_EQ(partition_graph(p.graph.view(), 1, kPlenty, 0, &method), std::vector<int32_t>(20, 0));
  EXPECT_EQ(method, "single");
  const Graph empty = from_edges(12, {});
  for (const uint64_t budget : {kPlenty, uint64_t{1}}) {
    const auto part = partition_graph(empty.view(), 3, budget, 0, &method);
    for (int64_t s : part_sizes(part, 3)) EXPECT_EQ(s, 4) << method;
  }
  // One node per part: METIS alone leaves most parts empty here; the repair moves nodes out of
  // every part above part_capacity() (1 here).
  for (const uint64_t budget : {kPlenty, uint64_t{1}}) {
    const auto part = partition_graph(p.graph.view(), 20, budget, 0, &method);
    EXPECT_EQ(std::set<int32_t>(part.begin(), part.end()).size(), 20u) << method;
  }
  // Nearly so: 7 parts of 20 nodes, at most 3 each.
  const auto part = partition_graph(p.graph.view(), 7, kPlenty, 0, nullptr);
  for (int64_t s : part_sizes(part, 7)) EXPECT_LE(s, 3);
}

TEST(Partition, BadPartCountsNameTheFlag) {
  const Planted p = planted_blocks(2, 5, 0.5, 1, 1);
  for (const int parts : {0, -3, 11}) {
    try {
      partition_graph(p.graph.view(), parts, kPlenty, 0, nullptr);
      ADD_FAILURE() << parts << " parts accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--partitions: ", 0), 0u) << e.what();
    }
  }
}

// ----- through the store ---------------------------------------------------------------------

TEST(PartitionStore, PreprocessWritesAVerifiedPartitionOfTheSbmClasses) {
  TempDir dir;
  PreprocessOptions o;
  o.generate = "sbm:nodes=4K,classes=4,avg-degree=12,feature-dim=4,homophily=0.9,seed=2";
  o.output = dir / "s.gale";
  o.partitions = 4;
  o.seed = 5;
  const PreprocessReport r = preprocess(o);
  EXPECT_EQ(r.partition_method, "metis");

  const Store s = Store::open(dir / "s.gale");
  ASSERT_TRUE(s.has_partition());
  EXPECT_EQ(s.num_partitions(), 4);
  EXPECT_EQ(s.partition_method(), "metis");
  const std::vector<int32_t> stored(s.partition(), s.partition() + s.num_nodes());
  // The same partitioner on the stored graph gives the stored parts.
  EXPECT_EQ(stored, partition_graph(s.csr(), 4, kPlenty, 5, nullptr));
  EXPECT_EQ(r.partition_cut, edge_cut(s.csr(), stored.data()));
  // Planted classes: the cut is near the planted one (10 % of edges cross classes, x 3/4), far below
  // random (3/4 of edges).
  EXPECT_LT(static_cast<double>(r.partition_cut), 0.15 * static_cast<double>(s.num_edges()));
  for (int64_t size : part_sizes(stored, 4)) EXPECT_LE(static_cast<double>(size), 1000 * 1.03 + 1);

  const std::string info = describe_store(s);
  EXPECT_NE(info.find("partitions 4 (metis), nodes per part min "), std::string::npos) << info;
  EXPECT_NE(info.find("edge cut " + std::to_string(r.partition_cut) + " ("), std::string::npos) << info;
  std::ifstream in(dir / "s.gale/manifest.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["num_partitions"], 4);
  EXPECT_EQ(j["partition_method"], "metis");
  EXPECT_TRUE(j["files"].contains("partition.npy"));
  s.verify();
}

TEST(PartitionStore, FlippedByteInPartitionIsReportedOnOpen) {
  TempDir dir;
  PreprocessOptions o;
  o.generate = "sbm:nodes=500,classes=2,avg-degree=6,seed=1";
  o.output = dir / "s.gale";
  o.partitions = 2;
  preprocess(o);
  {
    std::fstream f(dir / "s.gale/partition.npy", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 4 * 17);
    f.put('\x05');  // part 5 of 2
  }
  // Same size and header: the page sums tell, before anything indexes by the parts (a store
  // without them has its values range-checked instead: tests/storage/store_test.cpp).
  try {
    Store::open(dir / "s.gale");
    ADD_FAILURE() << "open accepted a part outside [0, 2)";
  } catch (const CorruptStoreError& e) {
    EXPECT_NE(std::string(e.what()).find("partition.npy: page checksum mismatch at byte offset 4096 (page 1)"),
              std::string::npos)
        << e.what();
  }
}

TEST(PartitionStore, StreamingUnderASmallBudgetAndNoKeyWithoutPartitions) {
  TempDir dir;
  PreprocessOptions o;
  o.generate = "sbm:nodes=3K,classes=3,avg-degree=10,seed=4";
  o.output = dir / "ldg.gale";
  o.partitions = 3;
  o.mem_budget = 64 << 10;  // the sort spills too; METIS (~16 x 140 KB) does not fit
  const PreprocessReport r = preprocess(o);
  EXPECT_EQ(r.partition_method, "ldg");
  const Store s = Store::open(dir / "ldg.gale");
  EXPECT_EQ(s.partition_method(), "ldg");
  for (int64_t size : part_sizes(std::vector<int32_t>(s.partition(), s.partition() + 3000), 3))
    EXPECT_LE(size, 1030);
  EXPECT_LT(static_cast<double>(r.partition_cut), 0.7 * random_cut(s.csr(), 3));
  s.verify();

  o.output = dir / "none.gale";
  o.partitions = 0;
  preprocess(o);
  const Store none = Store::open(dir / "none.gale");
  EXPECT_FALSE(none.has_partition());
  EXPECT_EQ(none.partition(), nullptr);
  EXPECT_EQ(testing::read_bytes(dir / "none.gale/manifest.json").find("partition_method"), std::string::npos);
}

TEST(PartitionStore, MorePartsThanNodesLeavesNoStore) {
  TempDir dir;
  PreprocessOptions o;
  o.generate = "sbm:nodes=50,classes=2,avg-degree=4,seed=1";
  o.output = dir / "s.gale";
  o.partitions = 51;
  try {
    preprocess(o);
    ADD_FAILURE() << "51 parts of 50 nodes accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "--partitions: 51 parts for a graph of 50 nodes; expected at most one part per node");
  }
  testing::expect_nothing_left(dir / "s.gale");
}

}  // namespace
}  // namespace gale::storage
