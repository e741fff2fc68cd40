// gale preprocess: every importer gives the same store for the same graph, external sorting
// gives the same store as in-memory sorting, generators are learnable and reproducible, and every
// bad input is an InputError naming the file and line that leaves nothing behind.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <sstream>

#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "storage/preprocess.hpp"
#include "storage/store.hpp"
#include "tests/storage/test_files.hpp"

namespace gale::storage {
namespace {

using testing::TempDir;

// A random directed graph with features, labels and a split, written in every input format.
struct Dataset {
  int64_t n = 60;
  int64_t d = 5;
  std::vector<std::pair<int64_t, int64_t>> edges;
  std::vector<float> features;
  std::vector<int32_t> labels;
  std::vector<int64_t> train, valid, test;

  Dataset() {
    kernels::CounterRng rng(17);
    for (int i = 0; i < 300; ++i)
      edges.emplace_back(static_cast<int64_t>(rng.below(n)), static_cast<int64_t>(rng.below(n)));
    edges.emplace_back(n - 1, 0);  // make sure the largest id appears
    for (int64_t i = 0; i < n * d; ++i) features.push_back(std::round((rng.uniform() * 8 - 4) * 64) / 64);  // exact in text
    for (int64_t v = 0; v < n; ++v) labels.push_back(static_cast<int32_t>(rng.below(3)));
    for (int64_t v = 0; v < n; ++v) (v % 5 == 0 ? train : v % 5 == 1 ? valid : test).push_back(v);
  }
  std::string edge_text(const std::string& sep) const {
    std::ostringstream o;
    for (auto [s, t] : edges) o << s << sep << t << "\n";
    return o.str();
  }
  std::string rows_text(const std::vector<int64_t>& ids) const {
    std::ostringstream o;
    for (auto v : ids) o << v << "\n";
    return o.str();
  }
  void write_npy_side(const TempDir& dir) const {
    testing::write_npy(dir / "x.npy", DType::kF32, {n, d}, features);
    testing::write_npy(dir / "y.npy", DType::kI32, {n}, labels);
    testing::write_npy(dir / "train.npy", DType::kI64, {static_cast<int64_t>(train.size())}, train);
    testing::write_text(dir / "valid.txt", rows_text(valid));
    testing::write_text(dir / "test.txt", rows_text(test));
  }
  PreprocessOptions with_side(const TempDir& dir, const std::string& out) const {
    PreprocessOptions o;
    o.output = dir / out;
    o.features_npy = dir / "x.npy";
    o.labels_npy = dir / "y.npy";
    o.train_ids = dir / "train.npy";
    o.valid_ids = dir / "valid.txt";
    o.test_ids = dir / "test.txt";
    return o;
  }
  void write_ogb(const std::string& root) const {
    testing::write_gz(root + "/raw/edge.csv.gz", edge_text(","));
    testing::write_gz(root + "/raw/num-node-list.csv.gz", std::to_string(n) + "\n");
    std::ostringstream f, l;
    f.precision(9);  // round-trips every float
    for (int64_t v = 0; v < n; ++v) {
      for (int64_t k = 0; k < d; ++k) f << (k ? "," : "") << features[v * d + k];
      f << "\n";
      l << labels[v] << "\n";
    }
    testing::write_gz(root + "/raw/node-feat.csv.gz", f.str());
    testing::write_gz(root + "/raw/node-label.csv.gz", l.str());
    testing::write_gz(root + "/split/random/train.csv.gz", rows_text(train));
    testing::write_gz(root + "/split/random/valid.csv.gz", rows_text(valid));
    testing::write_gz(root + "/split/random/test.csv.gz", rows_text(test));
  }
};

TEST(Preprocess, EveryFormatGivesTheSameStoreByteForByte) {
  TempDir dir;
  const Dataset ds;
  ds.write_npy_side(dir);

  // Edge list (TSV with a comment, CRLF line ends).
  testing::write_text(dir / "edges.tsv", "# src\tdst\r\n" + ds.edge_text("\t"));
  PreprocessOptions a = ds.with_side(dir, "a.gale");
  a.inputs = {dir / "edges.tsv"};
  preprocess(a);

  // OGB folder.
  ds.write_ogb(dir / "ogb");
  PreprocessOptions b;
  b.inputs = {dir / "ogb"};
  b.output = dir / "b.gale";
  preprocess(b);

  // Matrix Market (1-based, pattern, general), gzip-compressed.
  std::ostringstream mtx;
  mtx << "%%MatrixMarket matrix coordinate pattern general\n% a comment\n" << ds.n << " " << ds.n << " " << ds.edges.size() << "\n";
  for (auto [s, t] : ds.edges) mtx << s + 1 << " " << t + 1 << "\n";
  testing::write_gz(dir / "g.mtx.gz", mtx.str());
  PreprocessOptions c = ds.with_side(dir, "c.gale");
  c.inputs = {dir / "g.mtx.gz"};
  preprocess(c);

  // NumPy edge_index (2, E), int64.
  std::vector<int64_t> ei;
  for (auto [s, t] : ds.edges) ei.push_back(s);
  for (auto [s, t] : ds.edges) ei.push_back(t);
  testing::write_npy(dir / "ei.npy", DType::kI64, {2, static_cast<int64_t>(ds.edges.size())}, ei);
  PreprocessOptions e = ds.with_side(dir, "e.gale");
  e.edges_npy = dir / "ei.npy";
  preprocess(e);

  testing::expect_identical_stores(dir / "a.gale", dir / "b.gale");
  testing::expect_identical_stores(dir / "a.gale", dir / "c.gale");
  testing::expect_identical_stores(dir / "a.gale", dir / "e.gale");

  // And the store holds the graph: every distinct non-loop edge, in its destination's row.
  const Store s = Store::open(dir / "a.gale");
  std::set<std::pair<int64_t, int64_t>> want;
  for (auto [src, dst] : ds.edges)
    if (src != dst) want.insert({dst, src});
  std::set<std::pair<int64_t, int64_t>> got;
  for (int64_t v = 0; v < s.num_nodes(); ++v)
    for (int64_t k = s.indptr()[v]; k < s.indptr()[v + 1]; ++k) got.insert({v, s.indices32()[k]});
  EXPECT_EQ(got, want);
  EXPECT_EQ(s.num_edges(), static_cast<int64_t>(want.size()));
  EXPECT_EQ(s.num_classes(), 3);
  EXPECT_EQ(s.split("train"), ds.train);
}

TEST(Preprocess, ExternalSortGivesTheSameStoreAsInMemory) {
  TempDir dir;
  const Dataset ds;
  ds.write_npy_side(dir);
  testing::write_text(dir / "edges.csv", ds.edge_text(","));
  PreprocessOptions mem = ds.with_side(dir, "mem.gale");
  mem.inputs = {dir / "edges.csv"};
  mem.undirected = true;
  const PreprocessReport r1 = preprocess(mem);
  PreprocessOptions ext = mem;
  ext.output = dir / "ext.gale";
  ext.mem_budget = 1024;  // ~42 edges per run
  const PreprocessReport r2 = preprocess(ext);
  EXPECT_EQ(r1.sorted_runs, 0);
  EXPECT_GT(r2.sorted_runs, 5);
  testing::expect_identical_stores(dir / "mem.gale", dir / "ext.gale");
  testing::expect_nothing_left(dir / "none.gale");  // no sorted runs left behind
}

TEST(Preprocess, WeightsUndirectedDedupAndSelfLoops) {
  TempDir dir;
  testing::write_text(dir / "w.txt", "% weighted\n0 1 0.5\n1 2 2.0\n0 1 0.25\n2 2 9\n3 0 1\n");
  PreprocessOptions o;
  o.inputs = {dir / "w.txt"};
  o.output = dir / "w.gale";
  o.undirected = true;
  preprocess(o);
  const Store s = Store::open(dir / "w.gale");
  EXPECT_TRUE(s.manifest().weighted);
  EXPECT_EQ(s.num_nodes(), 4);
  // Edges (both ways, de-duplicated, no self loop): 0-1, 1-2, 3-0 -> 6 entries.
  EXPECT_EQ(s.num_edges(), 6);
  // Row 1 holds sources 0 (smallest duplicate weight, 0.25) and 2.
  EXPECT_EQ(s.indptr()[2] - s.indptr()[1], 2);
  EXPECT_EQ(s.indices32()[s.indptr()[1]], 0);
  EXPECT_FLOAT_EQ(s.weights()[s.indptr()[1]], 0.25f);

  PreprocessOptions keep = o;
  keep.output = dir / "k.gale";
  keep.undirected = false;
  keep.dedup = false;
  keep.self_loops = SelfLoops::kKeep;
  preprocess(keep);
  EXPECT_EQ(Store::open(dir / "k.gale").num_edges(), 5);
}

TEST(Preprocess, RelabelByDegreeIsAConsistentPermutation) {
  TempDir dir;
  const Dataset ds;
  ds.write_npy_side(dir);
  testing::write_text(dir / "edges.csv", ds.edge_text(","));
  PreprocessOptions plain = ds.with_side(dir, "plain.gale");
  plain.inputs = {dir / "edges.csv"};
  preprocess(plain);
  PreprocessOptions rel = plain;
  rel.output = dir / "rel.gale";
  rel.relabel = Relabel::kDegree;
  preprocess(rel);
  const Store p = Store::open(dir / "plain.gale"), r = Store::open(dir / "rel.gale");
  ASSERT_NE(r.relabel(), nullptr);
  const int64_t* orig = r.relabel();
  std::set<int64_t> seen(orig, orig + r.num_nodes());
  EXPECT_EQ(static_cast<int64_t>(seen.size()), r.num_nodes());
  for (int64_t s = 0; s + 1 < r.num_nodes(); ++s) EXPECT_GE(r.csr().degree(s), r.csr().degree(s + 1));
  // Edges, features, labels and splits all map back to the original ids.
  std::set<std::pair<int64_t, int64_t>> pe, re;
  for (int64_t v = 0; v < p.num_nodes(); ++v)
    for (int64_t k = p.indptr()[v]; k < p.indptr()[v + 1]; ++k) pe.insert({v, p.indices32()[k]});
  for (int64_t v = 0; v < r.num_nodes(); ++v)
    for (int64_t k = r.indptr()[v]; k < r.indptr()[v + 1]; ++k) re.insert({orig[v], orig[r.indices32()[k]]});
  EXPECT_EQ(pe, re);
  for (int64_t s = 0; s < r.num_nodes(); ++s) {
    EXPECT_EQ(r.labels()[s], p.labels()[orig[s]]);
    float a[5], b[5];
    r.read_features(s, s + 1, a);
    p.read_features(orig[s], orig[s] + 1, b);
    for (int k = 0; k < 5; ++k) EXPECT_EQ(a[k], b[k]);
  }
  std::set<int64_t> train;
  for (int64_t s : r.split("train")) train.insert(orig[s]);
  const auto ptrain = p.split("train");
  EXPECT_EQ(train, std::set<int64_t>(ptrain.begin(), ptrain.end()));
}

TEST(Preprocess, CoraFolderMatchesItsReadme) {
  TempDir dir;
  PreprocessOptions o;
  o.inputs = {std::string(GALE_SOURCE_DIR) + "/tests/data/cora"};
  o.output = dir / "cora.gale";
  o.normalize_features_row = true;
  o.feature_dtype = DType::kBF16;
  preprocess(o);
  const Store s = Store::open(dir / "cora.gale");
  EXPECT_EQ(s.num_nodes(), 2708);
  EXPECT_EQ(s.num_edges(), 10556);
  EXPECT_EQ(s.feature_dim(), 1433);
  EXPECT_EQ(s.num_classes(), 7);
  EXPECT_EQ(s.split("train").size(), 140u);
  EXPECT_EQ(s.split("valid").size(), 500u);
  EXPECT_EQ(s.split("test").size(), 1000u);
  std::vector<float> row(1433);
  s.read_features(0, 1, row.data());
  double sum = 0;
  for (float v : row) sum += v;
  EXPECT_NEAR(sum, 1.0, 1e-2);  // row-normalised (bf16)
}

TEST(Preprocess, RandomSplitWhenTheInputHasNone) {
  TempDir dir;
  const Dataset ds;
  testing::write_npy(dir / "y.npy", DType::kI32, {ds.n}, ds.labels);
  testing::write_text(dir / "e.csv", ds.edge_text(","));
  PreprocessOptions o;
  o.inputs = {dir / "e.csv"};
  o.labels_npy = dir / "y.npy";
  o.output = dir / "s.gale";
  o.train_fraction = 0.5;
  o.valid_fraction = 0.25;
  preprocess(o);
  const Store s = Store::open(dir / "s.gale");
  EXPECT_EQ(s.split("train").size(), 30u);
  EXPECT_EQ(s.split("valid").size(), 15u);
  EXPECT_EQ(s.split("test").size(), 15u);
}

TEST(Generators, SbmIsHomophilousAndReproducible) {
  TempDir dir;
  PreprocessOptions o;
  o.generate = "sbm:nodes=5K,classes=5,avg-degree=10,feature-dim=8,homophily=0.8,seed=3";
  o.output = dir / "a.gale";
  preprocess(o);
  o.output = dir / "b.gale";
  preprocess(o);
  testing::expect_identical_stores(dir / "a.gale", dir / "a.gale");
  testing::expect_identical_stores(dir / "a.gale", dir / "b.gale");
  const Store s = Store::open(dir / "a.gale");
  EXPECT_EQ(s.num_nodes(), 5000);
  EXPECT_NEAR(static_cast<double>(s.num_edges()) / 5000, 10.0, 0.5);
  int64_t same = 0;
  for (int64_t v = 0; v < 5000; ++v)
    for (int64_t k = s.indptr()[v]; k < s.indptr()[v + 1]; ++k) same += s.labels()[v] == s.labels()[s.indices32()[k]];
  // homophily 0.8 plus 1/5 of the random 0.2
  EXPECT_NEAR(static_cast<double>(same) / static_cast<double>(s.num_edges()), 0.84, 0.02);
  EXPECT_EQ(s.split("train").size(), 500u);
}

TEST(Generators, RmatHasGraph500Size) {
  TempDir dir;
  PreprocessOptions o;
  o.generate = "rmat:scale=12,edge-factor=8,seed=1,features=4,classes=3";
  o.output = dir / "r.gale";
  const PreprocessReport r = preprocess(o);
  EXPECT_EQ(r.num_nodes, 4096);
  // Both directions of the 32768 drawn edges; a self loop is kept once (and removed later).
  EXPECT_LE(r.input_edges, 2 * 4096 * 8);
  EXPECT_GT(r.input_edges, 2 * 4096 * 8 - 1000);
  const Store s = Store::open(dir / "r.gale");
  EXPECT_GT(s.num_edges(), 4096 * 8);   // symmetric, de-duplicated
  EXPECT_EQ(s.feature_dim(), 4);
  int64_t max_deg = 0;
  for (int64_t v = 0; v < 4096; ++v) max_deg = std::max(max_deg, s.csr().degree(v));
  EXPECT_GT(max_deg, 200);  // the R-MAT skew
}

// ---- bad inputs: one InputError naming the file and line, and no store ----

struct BadCase {
  const char* name;
  const char* file;
  std::string content;
  const char* expect;   // substring of the message
};

TEST(BadInput, EdgeListsNameFileAndLine) {
  const BadCase cases[] = {
      {"non-numeric", "e.csv", "0,1\n1,2\nx3,4\n", "e.csv:3: expected two integer node ids, found 'x3'"},
      {"negative", "e.csv", "0,1\n-4,2\n", "e.csv:2: negative node id -4"},
      {"columns", "e.csv", "0,1\n1,2,3,4\n", "e.csv:2: expected 2 columns"},
      {"first-line-columns", "e.csv", "0\n", "e.csv:1: expected 'src dst'"},
      {"weight", "e.tsv", "0\t1\t0.5\n1\t2\tabc\n", "e.tsv:2: expected a numeric weight, found 'abc'"},
      {"empty", "e.csv", "", "e.csv: no edges found"},
      {"only-comments", "e.csv", "# nothing\n% here\n", "e.csv: no edges found"},
  };
  for (const auto& c : cases) {
    TempDir dir;
    testing::write_text(dir / c.file, c.content);
    PreprocessOptions o;
    o.inputs = {dir / c.file};
    o.output = dir / "bad.gale";
    try {
      preprocess(o);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << c.name << ": " << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line";
    }
    testing::expect_nothing_left(dir / "bad.gale");
  }
}

TEST(BadInput, IdsOutOfRangeOfTheNodeCount) {
  TempDir dir;
  testing::write_text(dir / "e.csv", "0,1\n1,7\n");
  PreprocessOptions o;
  o.inputs = {dir / "e.csv"};
  o.output = dir / "bad.gale";
  o.num_nodes = 5;
  try {
    preprocess(o);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("e.csv:2: node id 7 out of range"), std::string::npos) << e.what();
  }
  testing::expect_nothing_left(dir / "bad.gale");
}

TEST(BadInput, TruncatedGzip) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += std::to_string(i) + "," + std::to_string(i + 1) + "\n";
  testing::write_gz(dir / "e.csv.gz", text);
  const std::string bytes = testing::read_bytes(dir / "e.csv.gz");
  testing::write_text(dir / "cut.csv.gz", bytes.substr(0, bytes.size() / 2));
  PreprocessOptions o;
  o.inputs = {dir / "cut.csv.gz"};
  o.output = dir / "bad.gale";
  try {
    preprocess(o);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.csv.gz: truncated"), std::string::npos) << e.what();
  }
  testing::expect_nothing_left(dir / "bad.gale");
}

TEST(BadInput, LabelAndFeatureCountsMustMatchTheGraph) {
  TempDir dir;
  const Dataset ds;
  testing::write_text(dir / "e.csv", ds.edge_text(","));
  std::vector<int32_t> short_labels(ds.labels.begin(), ds.labels.end() - 1);
  testing::write_npy(dir / "y.npy", DType::kI32, {ds.n - 1}, short_labels);
  testing::write_npy(dir / "x.npy", DType::kF32, {ds.n, ds.d}, ds.features);
  PreprocessOptions o;
  o.inputs = {dir / "e.csv"};
  o.features_npy = dir / "x.npy";
  o.labels_npy = dir / "y.npy";
  o.output = dir / "bad.gale";
  try {
    preprocess(o);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("y.npy: 59 labels for 60 nodes"), std::string::npos) << e.what();
  }
  testing::expect_nothing_left(dir / "bad.gale");
}

TEST(BadInput, OgbFeatureRowsOfDifferentLengths) {
  TempDir dir;
  Dataset ds;
  ds.write_ogb(dir / "ogb");
  testing::write_gz(dir / "ogb/raw/node-feat.csv.gz", "1,2,3\n4,5,6\n7,8\n");
  PreprocessOptions o;
  o.inputs = {dir / "ogb"};
  o.output = dir / "bad.gale";
  try {
    preprocess(o);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("node-feat.csv.gz:3: expected 3 values, found 2"), std::string::npos) << e.what();
  }
  testing::expect_nothing_left(dir / "bad.gale");
}

TEST(BadInput, MatrixMarketBannerAndEntryCount) {
  TempDir dir;
  testing::write_text(dir / "a.mtx", "not a banner\n3 3 1\n1 2\n");
  testing::write_text(dir / "b.mtx", "%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n");
  testing::write_text(dir / "c.mtx", "%%MatrixMarket matrix coordinate pattern general\n3 3 1\n1 4\n");
  const std::pair<const char*, const char*> cases[] = {
      {"a.mtx", "a.mtx:1: expected a '%%MatrixMarket"}, {"b.mtx", "promises 2 entries, found 1"}, {"c.mtx", "c.mtx:3: entry (1, 4) outside"}};
  for (const auto& [file, expect] : cases) {
    PreprocessOptions o;
    o.inputs = {dir / file};
    o.output = dir / "bad.gale";
    try {
      preprocess(o);
      ADD_FAILURE() << file;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
    testing::expect_nothing_left(dir / "bad.gale");
  }
}

TEST(BadInput, GeneratorKeys) {
  TempDir dir;
  for (const char* spec : {"sbm:nodes=10,classes=2,colour=3", "rmat:edge-factor=3", "ba:nodes=3", "sbm:nodes=x,classes=2"}) {
    PreprocessOptions o;
    o.generate = spec;
    o.output = dir / "bad.gale";
    EXPECT_THROW(preprocess(o), InputError) << spec;
    testing::expect_nothing_left(dir / "bad.gale");
  }
}

}  // namespace
}  // namespace gale::storage
