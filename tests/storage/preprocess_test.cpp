// gale preprocess: every importer gives the same store for the same graph, external sorting
// gives the same store as in-memory sorting, generators are learnable and reproducible, and every
// bad input is an InputError naming the file and line that leaves nothing behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "storage/generators.hpp"
#include "storage/partition.hpp"
#include "storage/preprocess.hpp"
#include "storage/store.hpp"
#include "tests/storage/test_files.hpp"

namespace gale::storage {
namespace {

namespace fs = std::filesystem;
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
    const std::string edges = edge_text(",");
    testing::write_gz(root + "/raw/edge.csv.gz", edges);
    testing::write_gz(root + "/raw/num-node-list.csv.gz", std::to_string(n) + "\n");
    testing::write_gz(root + "/raw/num-edge-list.csv.gz",
                      std::to_string(std::count(edges.begin(), edges.end(), '\n')) + "\n");
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
  EXPECT_EQ(preprocess(o).input_edges, 5);  // as read: before reverses, de-duplication, self loops
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

// Runs `o`, expecting an InputError whose one line contains `expect`, and no store afterwards.
void expect_input_error(const PreprocessOptions& o, const std::string& expect) {
  try {
    preprocess(o);
    ADD_FAILURE() << "accepted; expected: " << expect;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << "got: " << e.what() << "\nwanted: " << expect;
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
  }
  testing::expect_nothing_left(o.output);
}

// r is p with its nodes renumbered (r.relabel() maps r's ids to p's): a permutation, and the
// edges, features, labels and splits all map back to p's.
void expect_relabelled_copy(const Store& p, const Store& r) {
  ASSERT_NE(r.relabel(), nullptr);
  ASSERT_EQ(p.num_nodes(), r.num_nodes());
  const int64_t* orig = r.relabel();
  std::set<int64_t> seen(orig, orig + r.num_nodes());
  EXPECT_EQ(static_cast<int64_t>(seen.size()), r.num_nodes());
  std::set<std::pair<int64_t, int64_t>> pe, re;
  for (int64_t v = 0; v < p.num_nodes(); ++v)
    for (int64_t k = p.indptr()[v]; k < p.indptr()[v + 1]; ++k) pe.insert({v, p.indices32()[k]});
  for (int64_t v = 0; v < r.num_nodes(); ++v)
    for (int64_t k = r.indptr()[v]; k < r.indptr()[v + 1]; ++k) re.insert({orig[v], orig[r.indices32()[k]]});
  EXPECT_EQ(pe, re);
  const int64_t d = p.feature_dim();
  std::vector<float> a(static_cast<size_t>(d)), b(static_cast<size_t>(d));
  for (int64_t s = 0; s < r.num_nodes(); ++s) {
    EXPECT_EQ(r.labels()[s], p.labels()[orig[s]]);
    r.read_features(s, s + 1, a.data());
    p.read_features(orig[s], orig[s] + 1, b.data());
    EXPECT_EQ(a, b) << s;
  }
  std::set<int64_t> train;
  for (int64_t s : r.split("train")) train.insert(orig[s]);
  const auto ptrain = p.split("train");
  EXPECT_EQ(train, std::set<int64_t>(ptrain.begin(), ptrain.end()));
}

// Writes `plain` to plain.output and the same input relabelled `how` to dir/rel.gale; the report
// is the relabelled one's.
PreprocessReport write_plain_and_relabelled(PreprocessOptions plain, Relabel how, const fs::path& dir) {
  preprocess(plain);
  plain.output = dir / "rel.gale";
  plain.relabel = how;
  return preprocess(plain);
}

TEST(Preprocess, RelabelByDegreeIsAConsistentPermutation) {
  TempDir dir;
  const Dataset ds;
  ds.write_npy_side(dir);
  testing::write_text(dir / "edges.csv", ds.edge_text(","));
  PreprocessOptions plain = ds.with_side(dir, "plain.gale");
  plain.inputs = {dir / "edges.csv"};
  write_plain_and_relabelled(plain, Relabel::kDegree, dir.path());
  const Store p = Store::open(dir / "plain.gale"), r = Store::open(dir / "rel.gale");
  expect_relabelled_copy(p, r);
  for (int64_t s = 0; s + 1 < r.num_nodes(); ++s) EXPECT_GE(r.csr().degree(s), r.csr().degree(s + 1));
}

// --relabel hot: the random split is drawn before the relabelling (the same split as without
// it), and the stored order is the training nodes, the validation nodes, then the rest, each by
// decreasing in-degree.
TEST(Preprocess, RelabelHotPutsTheTrainingThenValidationNodesFirst) {
  TempDir dir;
  PreprocessOptions plain;
  plain.generate = "rmat:scale=11,edge-factor=8,classes=5,feature-dim=4,seed=3";
  plain.output = dir / "plain.gale";
  write_plain_and_relabelled(plain, Relabel::kHot, dir.path());
  const Store p = Store::open(dir / "plain.gale"), r = Store::open(dir / "rel.gale");
  expect_relabelled_copy(p, r);
  EXPECT_EQ(r.manifest().relabel_order, "hot");
  EXPECT_EQ(p.manifest().relabel_order, "");
  const auto train = r.split("train"), valid = r.split("valid");
  ASSERT_GT(train.size(), 0u);
  ASSERT_GT(valid.size(), 0u);
  const auto n_train = static_cast<int64_t>(train.size()), n_valid = static_cast<int64_t>(valid.size());
  // Stored ids 0 .. T-1 are the training split, T .. T+V-1 the validation split.
  for (int64_t k = 0; k < n_train; ++k) ASSERT_EQ(train[static_cast<size_t>(k)], k);
  for (int64_t k = 0; k < n_valid; ++k) ASSERT_EQ(valid[static_cast<size_t>(k)], n_train + k);
  const int64_t bounds[] = {0, n_train, n_train + n_valid, r.num_nodes()};
  for (int g = 0; g < 3; ++g)
    for (int64_t s = bounds[g]; s + 1 < bounds[g + 1]; ++s) EXPECT_GE(r.csr().degree(s), r.csr().degree(s + 1)) << s;
}

// --relabel partition: the same partition as without it (it is computed on the graph as read),
// each part's nodes consecutive ids in their input order, and the rest a consistent permutation.
TEST(Preprocess, RelabelByPartitionNumbersThePartsInTurn) {
  TempDir dir;
  PreprocessOptions plain;
  plain.generate = "sbm:nodes=2K,classes=20,avg-degree=10,feature-dim=6,homophily=0.9,seed=4";
  plain.partitions = 20;
  plain.output = dir / "plain.gale";
  const PreprocessReport report = write_plain_and_relabelled(plain, Relabel::kPartition, dir.path());
  const Store p = Store::open(dir / "plain.gale"), r = Store::open(dir / "rel.gale");
  expect_relabelled_copy(p, r);
  ASSERT_NE(r.partition(), nullptr);
  const int64_t* orig = r.relabel();
  for (int64_t s = 0; s < r.num_nodes(); ++s) {
    EXPECT_EQ(r.partition()[s], p.partition()[orig[s]]) << s;
    if (s > 0) {
      ASSERT_LE(r.partition()[s - 1], r.partition()[s]) << s;
      if (r.partition()[s - 1] == r.partition()[s]) EXPECT_LT(orig[s - 1], orig[s]) << s;
    }
  }
  EXPECT_EQ(report.partition_cut, edge_cut(p.csr(), p.partition()));
  PreprocessOptions rel = plain;
  rel.relabel = Relabel::kPartition;
  rel.partitions = 0;
  rel.output = dir / "none.gale";
  expect_input_error(rel, "--relabel partition: needs --partitions P");
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

TEST(Preprocess, CrlfCommentsBlankLinesAndGzipReadTheSame) {
  TempDir dir;
  const Dataset ds;
  testing::write_text(dir / "plain.csv", ds.edge_text(","));
  std::string messy = "# header comment\r\n% another\r\n\r\n";
  for (auto [s, t] : ds.edges) messy += "  " + std::to_string(s) + " \t " + std::to_string(t) + "\r\n";
  testing::write_gz(dir / "messy.txt.gz", messy);
  PreprocessOptions a;
  a.inputs = {dir / "plain.csv"};
  a.output = dir / "a.gale";
  PreprocessOptions b = a;
  b.inputs = {dir / "messy.txt.gz"};
  b.output = dir / "b.gale";
  EXPECT_EQ(preprocess(a).input_edges, static_cast<int64_t>(ds.edges.size()));
  EXPECT_EQ(preprocess(b).input_edges, static_cast<int64_t>(ds.edges.size()));
  testing::expect_identical_stores(dir / "a.gale", dir / "b.gale");
}

TEST(Preprocess, SeveralEdgeFilesAreOneGraph) {
  TempDir dir;
  const Dataset ds;
  testing::write_text(dir / "all.csv", ds.edge_text(","));
  const std::string text = ds.edge_text(",");
  const size_t half = text.find('\n', text.size() / 2) + 1;
  testing::write_text(dir / "one.csv", text.substr(0, half));
  testing::write_gz(dir / "two.csv.gz", text.substr(half));
  PreprocessOptions a;
  a.inputs = {dir / "all.csv"};
  a.output = dir / "a.gale";
  PreprocessOptions b = a;
  b.inputs = {dir / "one.csv", dir / "two.csv.gz"};
  b.output = dir / "b.gale";
  preprocess(a);
  preprocess(b);
  testing::expect_identical_stores(dir / "a.gale", dir / "b.gale");
}

TEST(Preprocess, NpyShapesAndFeatureDtypesAgree) {
  TempDir dir;
  const Dataset ds;  // features are multiples of 1/64 in [-4, 4]: exact in f16 and f64
  std::vector<int32_t> rows;
  for (auto [s, t] : ds.edges) rows.insert(rows.end(), {static_cast<int32_t>(s), static_cast<int32_t>(t)});
  std::vector<int64_t> cols;
  for (auto [s, t] : ds.edges) cols.push_back(s);
  for (auto [s, t] : ds.edges) cols.push_back(t);
  const auto e = static_cast<int64_t>(ds.edges.size());
  testing::write_npy(dir / "rows.npy", DType::kI32, {e, 2}, rows);
  testing::write_npy(dir / "cols.npy", DType::kI64, {2, e}, cols);
  testing::write_npy(dir / "x32.npy", DType::kF32, {ds.n, ds.d}, ds.features);
  testing::write_npy(dir / "x64.npy", DType::kF64, {ds.n, ds.d}, std::vector<double>(ds.features.begin(), ds.features.end()));
  std::vector<uint16_t> half(ds.features.size());
  convert_from_f32(DType::kF16, ds.features.data(), half.data(), half.size());
  testing::write_npy(dir / "x16.npy", DType::kF16, {ds.n, ds.d}, half);
  std::vector<int64_t> y64(ds.labels.begin(), ds.labels.end());
  testing::write_npy(dir / "y64.npy", DType::kI64, {ds.n}, y64);
  const char* variants[][3] = {{"rows.npy", "x32.npy", "a.gale"}, {"cols.npy", "x64.npy", "b.gale"}, {"rows.npy", "x16.npy", "c.gale"}};
  for (const auto& v : variants) {
    PreprocessOptions o;
    o.edges_npy = dir / v[0];
    o.features_npy = dir / v[1];
    o.labels_npy = dir / "y64.npy";
    o.output = dir / v[2];
    preprocess(o);
  }
  testing::expect_identical_stores(dir / "a.gale", dir / "b.gale");
  testing::expect_identical_stores(dir / "a.gale", dir / "c.gale");
}

// A 2 x 2 edge array is read as PyG's edge_index (2, E): sources in row 0, destinations in row 1.
TEST(Preprocess, TwoByTwoEdgeArrayIsPygEdgeIndex) {
  TempDir dir;
  testing::write_npy(dir / "ei.npy", DType::kI64, {2, 2}, std::vector<int64_t>{0, 2, 1, 3});
  PreprocessOptions o;
  o.edges_npy = dir / "ei.npy";
  o.output = dir / "s.gale";
  preprocess(o);
  const Store s = Store::open(dir / "s.gale");
  ASSERT_EQ(s.num_nodes(), 4);
  ASSERT_EQ(s.num_edges(), 2);
  EXPECT_EQ(std::vector<int64_t>(s.indptr(), s.indptr() + 5), (std::vector<int64_t>{0, 0, 1, 1, 2}));  // 0 -> 1, 2 -> 3
  EXPECT_EQ(std::vector<int32_t>(s.indices32(), s.indices32() + 2), (std::vector<int32_t>{0, 2}));
}

// numpy pads headers to 64 bytes, but any length is valid .npy: the data may start at an odd byte.
// The reader must take such arrays (edges i4, features f16) as they are, not load them misaligned.
TEST(Preprocess, NpyWhoseDataStartsAtAnOddByteReadsTheSame) {
  TempDir dir;
  auto odd_npy = [&](const std::string& name, const char* descr, const std::string& shape, const void* bytes, size_t n) {
    std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    dict += std::string(119 - 1 - dict.size(), ' ') + "\n";  // 10 + 119 = 129: odd
    std::string file = std::string("\x93NUMPY\x01\x00", 8) + std::string(1, static_cast<char>(119)) + std::string(1, '\0') + dict;
    file.append(static_cast<const char*>(bytes), n);
    testing::write_text(dir / name, file);
  };
  const std::vector<int32_t> edges{0, 1, 1, 2, 2, 3, 3, 0};
  odd_npy("e.npy", "<i4", "(4, 2)", edges.data(), edges.size() * 4);
  const std::vector<uint16_t> half{0x3C00, 0xC000, 0x3800, 0x0000, 0x4200, 0x3C00, 0xBC00, 0x4000};  // 1,-2,.5,0,3,1,-1,2
  odd_npy("x.npy", "<f2", "(4, 2)", half.data(), half.size() * 2);
  PreprocessOptions o;
  o.edges_npy = dir / "e.npy";
  o.features_npy = dir / "x.npy";
  o.output = dir / "s.gale";
  preprocess(o);
  const Store s = Store::open(dir / "s.gale");
  ASSERT_EQ(s.num_nodes(), 4);
  EXPECT_EQ(std::vector<int32_t>(s.indices32(), s.indices32() + s.num_edges()), (std::vector<int32_t>{3, 0, 1, 2}));
  std::vector<float> x(8);
  s.read_features(0, 4, x.data());
  EXPECT_EQ(x, (std::vector<float>{1, -2, 0.5f, 0, 3, 1, -1, 2}));
}

TEST(Preprocess, MatrixMarketSymmetricAddsBothDirections) {
  TempDir dir;
  testing::write_text(dir / "s.mtx",
                      "%%MatrixMarket matrix coordinate real symmetric\n%\n4 4 3\n2 1 0.5\n3 3 7\n4 2 -1.5\n");
  testing::write_text(dir / "s.txt", "1 0 0.5\n0 1 0.5\n2 2 7\n3 1 -1.5\n1 3 -1.5\n");
  testing::write_text(dir / "i.mtx", "%%MatrixMarket matrix coordinate integer general\n4 4 2\n1 2 3\n4 1 5\n");
  testing::write_text(dir / "i.txt", "0 1 3\n3 0 5\n");
  for (const char* name : {"s", "i"}) {
    PreprocessOptions m;
    m.inputs = {dir / (std::string(name) + ".mtx")};
    m.output = dir / (std::string(name) + "m.gale");
    m.self_loops = SelfLoops::kKeep;
    PreprocessOptions t = m;
    t.inputs = {dir / (std::string(name) + ".txt")};
    t.output = dir / (std::string(name) + "t.gale");
    t.num_nodes = 4;
    EXPECT_EQ(preprocess(m).input_edges, name[0] == 's' ? 3 : 2);  // entries, not mirrored ones
    preprocess(t);
    testing::expect_identical_stores(m.output, t.output);
  }
  const Store s = Store::open(dir / "sm.gale");
  EXPECT_TRUE(s.manifest().weighted);
  EXPECT_EQ(s.num_edges(), 5);
  EXPECT_EQ(Store::open(dir / "st.gale").num_edges(), 5);
  // Known by its banner whatever its name, gzipped too: an edge list would skip the banner as a
  // comment and read the size line as an edge.
  testing::write_text(dir / "S.MTX", testing::read_bytes(dir / "s.mtx"));
  testing::write_gz(dir / "s_mtx.gz", testing::read_bytes(dir / "s.mtx"));
  for (const char* other : {"S.MTX", "s_mtx.gz"}) {
    PreprocessOptions o;
    o.inputs = {dir / other};
    o.output = dir / (std::string(other) + ".gale");
    o.self_loops = SelfLoops::kKeep;
    EXPECT_EQ(preprocess(o).format, "Matrix Market") << other;
    testing::expect_identical_stores(o.output, dir / "sm.gale");
  }
}

TEST(Preprocess, FeatureDtypesAndRowNormalisation) {
  TempDir dir;
  testing::write_text(dir / "e.csv", "0,1\n1,2\n");
  testing::write_npy(dir / "x.npy", DType::kF32, {3, 2}, std::vector<float>{1, 3, 0.25f, 0.25f, 0, 0});
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    PreprocessOptions o;
    o.inputs = {dir / "e.csv"};
    o.features_npy = dir / "x.npy";
    o.normalize_features_row = true;
    o.feature_dtype = t;
    o.output = dir / (dtype_name(t) + ".gale");
    preprocess(o);
    const Store s = Store::open(o.output);
    EXPECT_EQ(s.manifest().feature_dtype, dtype_name(t));
    std::vector<float> x(6);
    s.read_features(0, 3, x.data());
    // x / x.sum(1).clamp(min=1): rows summing below 1 (or to 0) are left as they are.
    EXPECT_EQ(x, (std::vector<float>{0.25f, 0.75f, 0.25f, 0.25f, 0, 0})) << dtype_name(t);
  }
}

TEST(Preprocess, OgbSplitIsPickedByName) {
  TempDir dir;
  const Dataset ds;
  ds.write_ogb(dir / "ogb");
  testing::write_gz(dir / "ogb/split/other/train.csv.gz", "1\n");
  testing::write_gz(dir / "ogb/split/other/valid.csv.gz", "2\n");
  testing::write_gz(dir / "ogb/split/other/test.csv.gz", "3\n4\n");
  PreprocessOptions o;
  o.inputs = {dir / "ogb"};
  o.output = dir / "o.gale";
  try {
    preprocess(o);
    ADD_FAILURE() << "two splits without --split accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("other, random"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--split"), std::string::npos) << e.what();
  }
  testing::expect_nothing_left(dir / "o.gale");
  o.split_name = "other";
  preprocess(o);
  const Store s = Store::open(dir / "o.gale");
  EXPECT_EQ(s.split("test"), (std::vector<int64_t>{3, 4}));
}

TEST(Preprocess, RelabelTiesKeepTheOriginalOrder) {
  TempDir dir;
  // In-degrees: 0:1, 1:0, 2:3, 3:1, 4:0.
  testing::write_text(dir / "e.csv", "1,2\n3,2\n4,2\n2,0\n1,3\n");
  testing::write_npy(dir / "y.npy", DType::kI32, {5}, std::vector<int32_t>{0, 1, 2, 3, 4});
  PreprocessOptions o;
  o.inputs = {dir / "e.csv"};
  o.labels_npy = dir / "y.npy";
  o.relabel = Relabel::kDegree;
  o.output = dir / "r.gale";
  preprocess(o);
  const Store s = Store::open(dir / "r.gale");
  EXPECT_TRUE(s.manifest().relabelled);
  EXPECT_EQ(s.manifest().relabel_order, "degree");
  EXPECT_EQ(std::vector<int64_t>(s.relabel(), s.relabel() + 5), (std::vector<int64_t>{2, 0, 3, 1, 4}));
  EXPECT_EQ(std::vector<int32_t>(s.labels(), s.labels() + 5), (std::vector<int32_t>{2, 0, 3, 1, 4}));
  // Stored row 0 (original 2) holds original sources 1, 3, 4 -> stored 3, 2, 4, sorted.
  EXPECT_EQ(std::vector<int32_t>(s.indices32(), s.indices32() + 3), (std::vector<int32_t>{2, 3, 4}));
}

TEST(Preprocess, ExternalMergeDeduplicatesAcrossRuns) {
  TempDir dir;
  // The same few edges repeated so that every run holds copies of each.
  std::string text;
  for (int rep = 0; rep < 200; ++rep)
    for (int v = 0; v < 20; ++v) text += std::to_string((v * 7 + rep) % 20) + " " + std::to_string(v) + " " + std::to_string(rep % 3) + "\n";
  testing::write_text(dir / "e.txt", text);
  PreprocessOptions mem;
  mem.inputs = {dir / "e.txt"};
  mem.output = dir / "mem.gale";
  PreprocessOptions ext = mem;
  ext.output = dir / "ext.gale";
  ext.mem_budget = 1024;
  fs::create_directories(dir / "scratch");
  ext.temp_dir = dir / "scratch";
  preprocess(mem);
  const PreprocessReport r = preprocess(ext);
  EXPECT_GT(r.sorted_runs, 50);
  EXPECT_EQ(r.num_edges, Store::open(dir / "mem.gale").num_edges());
  testing::expect_identical_stores(dir / "mem.gale", dir / "ext.gale");
  EXPECT_TRUE(fs::is_empty(dir / "scratch"));  // runs removed
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

// order=class: the same kind of graph with each class a block of consecutive ids (what TC-GNN's
// windows and GAR's caches like), still homophilous; other orders are refused by name.
TEST(Generators, SbmInClassOrderNumbersClassesInBlocks) {
  TempDir dir;
  PreprocessOptions o;
  o.generate = "sbm:nodes=5K,classes=50,avg-degree=10,feature-dim=8,homophily=0.8,order=class,seed=3";
  o.output = dir / "a.gale";
  preprocess(o);
  const Store s = Store::open(dir / "a.gale");
  for (int64_t v = 0; v < 5000; ++v) ASSERT_EQ(s.labels()[v], v / 100) << v;
  int64_t same = 0;
  for (int64_t v = 0; v < 5000; ++v)
    for (int64_t k = s.indptr()[v]; k < s.indptr()[v + 1]; ++k) same += s.labels()[v] == s.labels()[s.indices32()[k]];
  EXPECT_NEAR(static_cast<double>(same) / static_cast<double>(s.num_edges()), 0.80, 0.02);
  o.generate = "sbm:nodes=5K,classes=50,order=degree";
  o.output = dir / "b.gale";
  expect_input_error(o, "'order' expects class or random");
}

// Accuracy of a nearest-class-mean classifier (means from the train split) on the test split:
// near the best any classifier can do on these features when classes are Gaussians with one
// shared covariance, as the generator draws them.
double nearest_mean_accuracy(const Store& s, const std::vector<float>& x, int64_t d) {
  const int64_t c = s.num_classes();
  std::vector<double> mean(static_cast<size_t>(c * d), 0.0);
  std::vector<int64_t> count(static_cast<size_t>(c), 0);
  for (int64_t v : s.split("train")) {
    const int32_t y = s.labels()[v];
    ++count[y];
    for (int64_t k = 0; k < d; ++k) mean[y * d + k] += x[v * d + k];
  }
  for (int64_t y = 0; y < c; ++y)
    for (int64_t k = 0; k < d; ++k) mean[y * d + k] /= static_cast<double>(std::max<int64_t>(1, count[y]));
  int64_t right = 0;
  const auto test = s.split("test");
  for (int64_t v : test) {
    int64_t best = 0;
    double best_dist = 1e300;
    for (int64_t y = 0; y < c; ++y) {
      double dist = 0;
      for (int64_t k = 0; k < d; ++k) dist += (x[v * d + k] - mean[y * d + k]) * (x[v * d + k] - mean[y * d + k]);
      if (dist < best_dist) best_dist = dist, best = y;
    }
    right += best == s.labels()[v];
  }
  return static_cast<double>(right) / static_cast<double>(test.size());
}

TEST(Generators, SbmFeaturesAloneAreWeakAndTheGraphHelps) {
  TempDir dir;
  PreprocessOptions o;
  o.generate = "sbm:nodes=20K,classes=8,avg-degree=12,feature-dim=64,seed=5";
  o.output = dir / "sbm.gale";
  preprocess(o);
  const Store s = Store::open(dir / "sbm.gale");
  const int64_t n = s.num_nodes(), d = s.feature_dim();
  std::vector<float> x(static_cast<size_t>(n * d));
  s.read_features(0, n, x.data());
  // Two rounds of mean aggregation over each node and its in-neighbours: what a 2-layer GCN's
  // propagation sees, without training.
  std::vector<float> h = x, next(x.size());
  for (int round = 0; round < 2; ++round) {
    for (int64_t v = 0; v < n; ++v) {
      const int64_t begin = s.indptr()[v], end = s.indptr()[v + 1];
      for (int64_t k = 0; k < d; ++k) {
        double sum = h[v * d + k];
        for (int64_t e = begin; e < end; ++e) sum += h[s.indices32()[e] * d + k];
        next[v * d + k] = static_cast<float>(sum / static_cast<double>(end - begin + 1));
      }
    }
    h.swap(next);
  }
  const double features_only = nearest_mean_accuracy(s, x, d);
  const double with_graph = nearest_mean_accuracy(s, h, d);
  std::printf("sbm nearest-mean accuracy: features %.3f, 2-hop mean %.3f (chance 0.125)\n", features_only, with_graph);
  EXPECT_GT(features_only, 0.15);  // a signal above chance (0.125)...
  EXPECT_LT(features_only, 0.40);  // ...but a weak one
  EXPECT_GT(with_graph, 0.80);     // the graph makes it learnable, not trivial
  EXPECT_LT(with_graph, 0.97);
  EXPECT_GT(with_graph - features_only, 0.4);
}

TEST(Generators, RmatIsReproducibleFromItsSeed) {
  TempDir dir;
  for (const char* name : {"a", "b", "c"}) {
    PreprocessOptions o;
    o.generate = std::string("rmat:scale=10,edge-factor=4,seed=") + (name[0] == 'c' ? "8" : "7");
    o.output = dir / (std::string(name) + ".gale");
    o.mem_budget = name[0] == 'b' ? 4096 : o.mem_budget;  // spilling changes nothing
    preprocess(o);
  }
  testing::expect_identical_stores(dir / "a.gale", dir / "b.gale");
  EXPECT_NE(testing::read_bytes(dir / "a.gale/graph/indices.npy"), testing::read_bytes(dir / "c.gale/graph/indices.npy"));
  const Store s = Store::open(dir / "a.gale");
  EXPECT_FALSE(s.has_features());
  EXPECT_FALSE(s.has_labels());
}

TEST(Generators, SpecsTakeSuffixesAndNameBadKeys) {
  EXPECT_EQ(parse_generator("sbm:nodes=2K,classes=4,avg-degree=8,feature-dim=16").nodes, 2000);
  EXPECT_EQ(parse_generator("sbm:nodes=1M,classes=4").nodes, 1000000);
  EXPECT_EQ(parse_generator("rmat:scale=20,edge-factor=16,a=0.6,b=0.15,c=0.15,seed=9").seed, 9u);
  try {
    parse_generator("sbm:nodes=10,classes=2,colour=3");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("colour"), std::string::npos) << e.what();
  }
  try {
    parse_generator("rmat:scale=10,edge-factor=many");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("edge-factor"), std::string::npos) << e.what();
  }
}

TEST(Generators, RmatHasGraph500Size) {
  TempDir dir;
  PreprocessOptions o;
  o.generate = "rmat:scale=12,edge-factor=8,seed=1,features=4,classes=3";
  o.output = dir / "r.gale";
  const PreprocessReport r = preprocess(o);
  EXPECT_EQ(r.num_nodes, 4096);
  EXPECT_EQ(r.input_edges, 4096 * 8);  // 2^scale * edge-factor drawn, before symmetrising / de-duplication
  const Store s = Store::open(dir / "r.gale");
  EXPECT_GT(s.num_edges(), 4096 * 8);   // symmetric, de-duplicated
  EXPECT_EQ(s.feature_dim(), 4);
  int64_t max_deg = 0;
  for (int64_t v = 0; v < 4096; ++v) max_deg = std::max(max_deg, s.csr().degree(v));
  EXPECT_GT(max_deg, 200);  // the R-MAT skew
}

// weights=uniform: every edge weighted in [0.1, 1), the same both ways, the same topology as
// without; a bad value is named.
// --weights beside NumPy edges (PyG's edge_index and edge_weight): the same store as the weighted
// edge list; a weight count, dtype or value that does not fit is named, and so is --weights without
// NumPy edges.
TEST(Preprocess, NumpyEdgeWeightsGiveTheWeightedEdgeListsStore) {
  TempDir dir;
  testing::write_text(dir / "w.txt", "0 1 0.5\n1 2 2\n3 0 1.25\n2 3 0.125\n");
  PreprocessOptions text;
  text.inputs = {dir / "w.txt"};
  text.output = dir / "text.gale";
  text.undirected = true;
  preprocess(text);
  testing::write_npy(dir / "ei.npy", DType::kI64, {2, 4}, std::vector<int64_t>{0, 1, 3, 2, 1, 2, 0, 3});
  testing::write_npy(dir / "ew.npy", DType::kF64, {4}, std::vector<double>{0.5, 2, 1.25, 0.125});
  PreprocessOptions npy;
  npy.edges_npy = dir / "ei.npy";
  npy.weights_npy = dir / "ew.npy";
  npy.output = dir / "npy.gale";
  npy.undirected = true;
  preprocess(npy);
  const Store a = Store::open(dir / "text.gale"), b = Store::open(dir / "npy.gale");
  ASSERT_NE(b.weights(), nullptr);
  ASSERT_EQ(a.num_edges(), b.num_edges());
  EXPECT_EQ(std::vector<float>(a.weights(), a.weights() + a.num_edges()),
            std::vector<float>(b.weights(), b.weights() + b.num_edges()));
  EXPECT_EQ(std::vector<int32_t>(a.indices32(), a.indices32() + a.num_edges()),
            std::vector<int32_t>(b.indices32(), b.indices32() + b.num_edges()));

  PreprocessOptions o = npy;
  o.output = dir / "bad.gale";
  testing::write_npy(dir / "short.npy", DType::kF32, {3}, std::vector<float>{1, 1, 1});
  o.weights_npy = dir / "short.npy";
  expect_input_error(o, "short.npy: 3 weights for the 4 edges of");
  testing::write_npy(dir / "int.npy", DType::kI32, {4}, std::vector<int32_t>{1, 1, 1, 1});
  o.weights_npy = dir / "int.npy";
  expect_input_error(o, "int.npy: expected a 1-D float32, float64 or float16 array of edge weights");
  testing::write_npy(dir / "nan.npy", DType::kF32, {4}, std::vector<float>{1, 1, NAN, 1});
  o.weights_npy = dir / "nan.npy";
  expect_input_error(o, "nan.npy: weight 2 is not a finite number");
  PreprocessOptions list = text;
  list.output = dir / "bad.gale";
  list.weights_npy = dir / "ew.npy";
  expect_input_error(list, "--weights: weighs NumPy edges");
}

TEST(Generators, UniformWeightsAreSymmetricAndInRange) {
  TempDir dir;
  for (const char* w : {"none", "uniform"}) {
    PreprocessOptions o;
    o.generate = std::string("rmat:scale=9,edge-factor=4,seed=3,weights=") + w;
    o.output = dir / (std::string(w) + ".gale");
    preprocess(o);
  }
  const Store plain = Store::open(dir / "none.gale"), weighted = Store::open(dir / "uniform.gale");
  EXPECT_EQ(plain.weights(), nullptr);
  ASSERT_NE(weighted.weights(), nullptr);
  EXPECT_EQ(testing::read_bytes(dir / "none.gale/graph/indices.npy"),
            testing::read_bytes(dir / "uniform.gale/graph/indices.npy"));
  const kernels::CsrView g = weighted.csr();
  std::set<float> distinct;
  for (int64_t v = 0; v < g.rows; ++v) {
    for (int64_t e = g.indptr[v]; e < g.indptr[v + 1]; ++e) {
      const float w = g.weights[e];
      EXPECT_TRUE(w >= 0.1f && w < 1.0f) << w;
      distinct.insert(w);
      const int32_t u = g.indices[e];  // the reverse entry (u's row holds v) has the same weight
      const int32_t* at = std::lower_bound(g.indices + g.indptr[u], g.indices + g.indptr[u + 1], static_cast<int32_t>(v));
      ASSERT_TRUE(at != g.indices + g.indptr[u + 1] && *at == v);
      EXPECT_EQ(g.weights[at - g.indices], w) << v << " " << u;
    }
  }
  EXPECT_GT(distinct.size(), g.nnz() / 4);
  try {
    parse_generator("sbm:nodes=10,classes=2,weights=heavy");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'weights' expects none or uniform"), std::string::npos) << e.what();
  }
}

// ---- bad inputs: one InputError naming the file and line, and no store ----

struct BadCase {
  const char* name;
  const char* file;
  std::string content;
  std::string expect;   // substring of the message
};

TEST(BadInput, EdgeListsNameFileAndLine) {
  const BadCase cases[] = {
      {"non-numeric", "e.csv", "0,1\n1,2\nx3,4\n", "e.csv:3: expected two integer node ids, found 'x3'"},
      {"negative", "e.csv", "0,1\n-4,2\n", "e.csv:2: negative node id -4"},
      {"columns", "e.csv", "0,1\n1,2,3,4\n", "e.csv:2: expected 2 columns"},
      {"first-line-columns", "e.csv", "0\n", "e.csv:1: expected 'src dst'"},
      {"weight", "e.tsv", "0\t1\t0.5\n1\t2\tabc\n", "e.tsv:2: expected a finite float32 weight, found 'abc'"},
      {"non-finite weight", "e.tsv", "0\t1\t0.5\n1\t2\tnan\n", "e.tsv:2: expected a finite float32 weight, found 'nan'"},
      {"weight beyond float32", "e.tsv", "0\t1\t1e50\n", "e.tsv:1: expected a finite float32 weight, found '1e50'"},
      {"empty", "e.csv", "", "e.csv: no edges found"},
      {"only-comments", "e.csv", "# nothing\n% here\n", "e.csv: no edges found"},
      // Quoted tokens stay short and printable: a runaway token, a BOM.
      {"long token", "e.csv", "0,1\n" + std::string(5000, '7') + "x,2\n",
       "e.csv:2: expected two integer node ids, found '" + std::string(40, '7') + "...'"},
      {"byte-order mark", "e.csv", "\xef\xbb\xbf" "0,1\n", "e.csv:1: expected two integer node ids, found '\\xef\\xbb\\xbf0'"},
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

TEST(BadInput, WeightedAndUnweightedLinesDoNotMix) {
  TempDir dir;
  testing::write_text(dir / "e.csv", "0,1\n1,2,0.5\n");
  testing::write_text(dir / "w.csv", "0,1,2\n1,2\n");
  testing::write_text(dir / "u.csv", "0,1\n");
  PreprocessOptions o;
  o.output = dir / "bad.gale";
  o.inputs = {dir / "e.csv"};
  expect_input_error(o, "e.csv:2: expected 2 columns");
  o.inputs = {dir / "w.csv"};
  expect_input_error(o, "w.csv:2: expected 3 columns");
  testing::write_text(dir / "w2.csv", "\n# weights\n5 6 1.5\n");
  o.inputs = {dir / "u.csv", dir / "w2.csv"};  // across files too
  expect_input_error(o, "w2.csv:3: expected 2 columns");
}

TEST(BadInput, SplitIdsOutOfRangeNameFileAndLine) {
  TempDir dir;
  const Dataset ds;
  ds.write_npy_side(dir);
  testing::write_text(dir / "edges.csv", ds.edge_text(","));
  testing::write_text(dir / "valid.txt", "1\n\n6\n60\n");  // the valid ids are 1 mod 5
  PreprocessOptions o = ds.with_side(dir, "bad.gale");
  o.inputs = {dir / "edges.csv"};
  expect_input_error(o, "valid.txt:4: node id 60 out of range for 60 nodes");
  // Splits must not share a node: node 5 is a training node (0 mod 5).
  testing::write_text(dir / "valid.txt", "1\n5\n");
  expect_input_error(o, "valid.txt:2: node id 5 is in split 'valid' and in split 'train' (" + dir / "train.npy" +
                            "); expected disjoint splits");
  testing::write_npy(dir / "train.npy", DType::kI64, {2}, std::vector<int64_t>{0, 99});
  testing::write_text(dir / "valid.txt", "1\n");
  expect_input_error(o, "train.npy: index 1: node id 99 out of range");
  testing::write_text(dir / "valid.txt", "1\n-2\n");
  expect_input_error(o, "valid.txt:2: negative node id -2");
  testing::write_text(dir / "valid.txt", "3 4\n");
  expect_input_error(o, "valid.txt:1: expected one integer node id");
}

TEST(BadInput, OgbFolderProblemsNameTheFile) {
  TempDir dir;
  const Dataset ds;
  PreprocessOptions o;
  o.inputs = {dir / "ogb"};
  o.output = dir / "bad.gale";

  ds.write_ogb(dir / "ogb");
  fs::remove(dir / "ogb/split/random/test.csv.gz");
  expect_input_error(o, "missing test.csv.gz");

  ds.write_ogb(dir / "ogb");
  testing::write_gz(dir / "ogb/raw/node-label.csv.gz", "1\n2\n");
  expect_input_error(o, "node-label.csv.gz: 2 labels for 60 nodes");

  ds.write_ogb(dir / "ogb");
  testing::write_gz(dir / "ogb/raw/node-label.csv.gz", "1\n2\ncat\n");
  expect_input_error(o, "node-label.csv.gz:3: expected an integer class label, found 'cat'");

  ds.write_ogb(dir / "ogb");
  testing::write_gz(dir / "ogb/raw/edge.csv.gz", "0,1\n1,2,3\n");
  expect_input_error(o, "edge.csv.gz:2: expected 2 columns");

  ds.write_ogb(dir / "ogb");
  testing::write_gz(dir / "ogb/raw/edge.csv.gz", "0,1\n1,60\n");
  expect_input_error(o, "edge.csv.gz:2: node id 60 out of range");

  ds.write_ogb(dir / "ogb");
  testing::write_gz(dir / "ogb/raw/node-feat.csv.gz", "1,2\n3,x\n");
  expect_input_error(o, "node-feat.csv.gz:2: expected a number, found 'x'");

  ds.write_ogb(dir / "ogb");
  testing::write_gz(dir / "ogb/raw/node-feat.csv.gz", "1,2\nnan,1\n");
  expect_input_error(o, "node-feat.csv.gz:2: expected a finite float32 feature, found 'nan'");

  // A download cut at a line boundary: fewer edges than num-edge-list.csv.gz states.
  ds.write_ogb(dir / "ogb");
  testing::write_gz(dir / "ogb/raw/num-edge-list.csv.gz", "100000\n");
  expect_input_error(o, "edge.csv.gz: expected 100000 edges as " + dir / "ogb/raw/num-edge-list.csv.gz" + " says, found ");

  ds.write_ogb(dir / "ogb");
  o.split_name = "nope";
  expect_input_error(o, "--split nope");
  o.split_name.clear();

  fs::create_directories(dir / "empty");
  o.inputs = {dir / "empty"};
  expect_input_error(o, "empty: a directory, but not an OGB node-property folder");
}

TEST(BadInput, MatrixMarketSizeLineAndRanges) {
  TempDir dir;
  const std::pair<std::string, std::string> cases[] = {
      {"%%MatrixMarket matrix coordinate pattern general\n3 x 1\n1 2\n", "m.mtx:2: expected the size line"},
      {"%%MatrixMarket matrix coordinate pattern general\n%\n3 3\n1 2\n", "m.mtx:3: expected the size line"},
      {"%%MatrixMarket matrix array real general\n3 3\n", "m.mtx:1: only 'coordinate'"},
      {"%%MatrixMarket matrix coordinate real general\n3 3 1\n1 2\n", "m.mtx:3: expected 3 values per entry"},
      {"%%MatrixMarket matrix coordinate real general\n3 3 1\n1 2 z\n", "m.mtx:3: expected a finite float32 value, found 'z'"},
      {"%%MatrixMarket matrix coordinate real general\n3 3 1\n1 2 inf\n", "m.mtx:3: expected a finite float32 value, found 'inf'"},
      {"%%MatrixMarket matrix coordinate pattern general\n99999999999 99999999999 1\n1 2\n",
       "m.mtx:2: the size line gives 99999999999 nodes for 1 entries"},
      {"%%MatrixMarket matrix coordinate pattern general\n3 3 1\n0 2\n", "m.mtx:3: entry (0, 2) outside"},
      {"%%MatrixMarket matrix coordinate pattern general\n", "m.mtx: missing the size line"},
  };
  for (const auto& [text, expect] : cases) {
    testing::write_text(dir / "m.mtx", text);
    PreprocessOptions o;
    o.inputs = {dir / "m.mtx"};
    o.output = dir / "bad.gale";
    expect_input_error(o, expect);
  }
  // --num-nodes smaller than the matrix.
  testing::write_text(dir / "m.mtx", "%%MatrixMarket matrix coordinate pattern general\n9 9 2\n1 2\n8 1\n");
  PreprocessOptions o;
  o.inputs = {dir / "m.mtx"};
  o.output = dir / "bad.gale";
  o.num_nodes = 5;
  expect_input_error(o, "m.mtx:4: node id 7 out of range: --num-nodes gives 5 nodes");
}

TEST(BadInput, NpyArraysOfTheWrongKind) {
  TempDir dir;
  testing::write_text(dir / "e.csv", "0,1\n1,2\n");
  testing::write_npy(dir / "e3.npy", DType::kI64, {2, 3}, std::vector<int64_t>{0, 1, 2, 1, 2, 5});
  testing::write_npy(dir / "ef.npy", DType::kF32, {2, 2}, std::vector<float>{0, 1, 1, 2});
  testing::write_npy(dir / "x.npy", DType::kI32, {3, 2}, std::vector<int32_t>(6, 1));
  testing::write_npy(dir / "xr.npy", DType::kF32, {2, 2}, std::vector<float>(4, 1));
  testing::write_npy(dir / "y.npy", DType::kF32, {3}, std::vector<float>(3, 1));
  testing::write_text(dir / "junk.npy", "not numpy at all");
  PreprocessOptions base;
  base.output = dir / "bad.gale";
  PreprocessOptions o = base;
  o.edges_npy = dir / "e3.npy";
  o.num_nodes = 4;
  expect_input_error(o, "e3.npy: edge 2: node id 5 out of range");
  o = base;
  o.edges_npy = dir / "ef.npy";
  expect_input_error(o, "ef.npy: expected an int32 or int64 edge array");
  o = base;
  o.inputs = {dir / "e.csv"};
  o.features_npy = dir / "x.npy";
  expect_input_error(o, "x.npy: expected a 2-D float32");
  o.features_npy = dir / "xr.npy";
  expect_input_error(o, "e.csv:2: node id 2 out of range");  // the features say N = 2
  o.features_npy.clear();
  o.labels_npy = dir / "y.npy";
  expect_input_error(o, "y.npy: expected a 1-D int32 or int64 array of labels");
  o.labels_npy = dir / "junk.npy";
  expect_input_error(o, "junk.npy");
  // Labels that label nothing, or whose largest class is far beyond any node count.
  testing::write_npy(dir / "y_none.npy", DType::kI32, {3}, std::vector<int32_t>{-1, -1, -1});
  o.labels_npy = dir / "y_none.npy";
  expect_input_error(o, "y_none.npy: no node is labelled (every label is -1)");
  testing::write_npy(dir / "y_far.npy", DType::kI64, {3}, std::vector<int64_t>{0, 1000000000, 1});
  o.labels_npy = dir / "y_far.npy";
  expect_input_error(o, "y_far.npy: expected class ids 0 .. C-1 with C at most 65536, found 1000000000");
  // Features: a 1-D array names its shape; values that are not finite name the node and column.
  o.labels_npy.clear();
  testing::write_npy(dir / "x1.npy", DType::kF32, {3}, std::vector<float>(3, 1));
  o.features_npy = dir / "x1.npy";
  expect_input_error(o, "x1.npy: expected a 2-D float32, float64 or float16 array (nodes x features), found <f4 of shape (3)");
  testing::write_npy(dir / "xnan.npy", DType::kF32, {3, 2}, std::vector<float>{1, 2, 3, std::nanf(""), 5, 6});
  o.features_npy = dir / "xnan.npy";
  expect_input_error(o, "xnan.npy: expected finite features, found nan at node 1, column 1");
  testing::write_npy(dir / "xbig.npy", DType::kF32, {3, 2}, std::vector<float>{1, 2, 3, 4, 1e5f, 6});
  o.features_npy = dir / "xbig.npy";
  o.feature_dtype = DType::kF16;
  expect_input_error(o, "xbig.npy: expected finite features within float16's range (--feature-dtype), found 100000");
  o.feature_dtype = DType::kF32;
  // Headers numpy would not read, and bytes beyond the header's shape.
  testing::write_text(dir / "open_dict.npy",
                      std::string("\x93NUMPY\x01\x00\x76\x00", 10) + "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2)" +
                          std::string(118 - 57, ' ') + "\n" + std::string(24, '\0'));
  o.features_npy = dir / "open_dict.npy";
  expect_input_error(o, "open_dict.npy: expected the npy header to be a dict literal {...}");
  testing::write_npy(dir / "xok.npy", DType::kF32, {3, 2}, std::vector<float>(6, 1));
  testing::write_text(dir / "xlong.npy", testing::read_bytes(dir / "xok.npy") + std::string(16, 'z'));
  o.features_npy = dir / "xlong.npy";
  expect_input_error(o, "xlong.npy: expected 4120 bytes for its header's shape (3, 2), found 4136 (trailing data)");
}

TEST(BadInput, MissingOrConflictingInputs) {
  TempDir dir;
  testing::write_text(dir / "e.csv", "0,1\n");
  testing::write_npy(dir / "e.npy", DType::kI64, {1, 2}, std::vector<int64_t>{0, 1});
  PreprocessOptions o;
  o.output = dir / "bad.gale";
  expect_input_error(o, "expected INPUT files, --edges FILE.npy or --generate");
  o.inputs = {dir / "e.csv"};
  o.edges_npy = dir / "e.npy";
  expect_input_error(o, "--edges");
  o.edges_npy.clear();
  o.inputs = {dir / "nope.csv"};
  expect_input_error(o, "nope.csv: no such file or directory");
  o.inputs = {dir / "e.csv"};
  o.generate = "sbm:nodes=10,classes=2";
  expect_input_error(o, "--generate");
}

TEST(BadInput, CorruptGzipAndSparseIds) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += std::to_string(i) + "," + std::to_string(i + 1) + "\n";
  testing::write_gz(dir / "e.csv.gz", text);
  std::string bytes = testing::read_bytes(dir / "e.csv.gz");
  for (size_t i = bytes.size() / 3; i < bytes.size() / 3 + 64; ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0x5a);
  testing::write_text(dir / "bad.csv.gz", bytes);
  PreprocessOptions o;
  o.inputs = {dir / "bad.csv.gz"};
  o.output = dir / "bad.gale";
  expect_input_error(o, "bad.csv.gz: truncated or corrupt gzip stream");
  testing::write_text(dir / "sparse.csv", "0,1\n1,1000000000000\n");
  o.inputs = {dir / "sparse.csv"};
  expect_input_error(o, "largest node id 1000000000000");
}

TEST(BadInput, ErrorAfterSpillingLeavesNoRuns) {
  TempDir dir;
  const Dataset ds;
  testing::write_text(dir / "e.csv", ds.edge_text(",") + "1,oops\n");
  PreprocessOptions o;
  o.inputs = {dir / "e.csv"};
  o.output = dir / "bad.gale";
  o.mem_budget = 256;
  expect_input_error(o, "e.csv:" + std::to_string(ds.edges.size() + 1) + ": expected two integer node ids, found 'oops'");
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
