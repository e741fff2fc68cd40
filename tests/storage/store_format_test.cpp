// The store as DESIGN.md specifies it: aligned .npy arrays, a manifest with sizes and xxHash64,
// atomic creation, and checks that turn damage into CorruptStoreError naming the file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/error.hpp"
#include "storage/store.hpp"
#include "tests/storage/test_files.hpp"

namespace gale::storage {
namespace {

using testing::TempDir;

// A 4-node graph with features, labels and a split.
void write_small_store(const std::string& path, DType feature_dtype = DType::kF32) {
  StoreWriter w(path, false);
  const std::vector<int64_t> indptr{0, 1, 3, 3, 4};
  const std::vector<int32_t> indices{1, 0, 3, 2};
  w.write_array("graph/indptr.npy", DType::kI64, {5}, indptr.data());
  w.write_array("graph/indices.npy", DType::kI32, {4}, indices.data());
  std::vector<float> f{0.5f, -1.0f, 2.0f, 0.25f, 3.0f, 4.0f, -0.125f, 8.0f};
  std::vector<uint16_t> half(f.size());
  if (feature_dtype != DType::kF32) convert_from_f32(feature_dtype, f.data(), half.data(), f.size());
  w.write_array("features.npy", feature_dtype, {4, 2}, feature_dtype == DType::kF32 ? static_cast<const void*>(f.data()) : half.data());
  const std::vector<int32_t> labels{0, 1, -1, 1};
  w.write_array("labels.npy", DType::kI32, {4}, labels.data());
  const std::vector<int64_t> train{0, 3};
  w.write_array("splits/train.npy", DType::kI64, {2}, train.data());
  Manifest& m = w.manifest();
  m.num_nodes = 4;
  m.num_edges = 4;
  m.feature_dim = 2;
  m.feature_dtype = dtype_name(feature_dtype);
  m.num_classes = 2;
  m.splits["train"] = 2;
  w.commit();
}

TEST(Npy, DataStartsAt4096AndTheHeaderReadsBack) {
  TempDir dir;
  const std::vector<float> v{1, 2, 3, 4, 5, 6};
  testing::write_npy(dir / "a.npy", DType::kF32, {2, 3}, v);
  const NpyHeader h = read_npy_header(dir / "a.npy");
  EXPECT_EQ(h.data_offset, 4096u);
  EXPECT_EQ(h.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.dtype, DType::kF32);
  EXPECT_EQ(std::filesystem::file_size(dir / "a.npy"), 4096u + 24u);
}

TEST(Npy, NumpyOpensStoreArrays) {
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) GTEST_SKIP() << "no python3 with numpy";
  TempDir dir;
  write_small_store(dir / "s.gale");
  const std::string cmd = "/usr/bin/python3 -c \"import numpy as np; x = np.load('" + dir / "s.gale/features.npy" +
                          "', mmap_mode='r'); i = np.load('" + dir / "s.gale/graph/indices.npy" +
                          "'); assert x.shape == (4, 2) and x[1, 1] == 0.25 and list(i) == [1, 0, 3, 2]\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST(Store, RoundTripsEveryArray) {
  TempDir dir;
  write_small_store(dir / "s.gale");
  const Store s = Store::open(dir / "s.gale");
  EXPECT_EQ(s.num_nodes(), 4);
  EXPECT_EQ(s.num_edges(), 4);
  EXPECT_EQ(s.csr().degree(1), 2);
  EXPECT_EQ(s.indices32()[2], 3);
  float row[2];
  s.read_features(1, 2, row);
  EXPECT_EQ(row[0], 2.0f);
  EXPECT_EQ(row[1], 0.25f);
  EXPECT_EQ(s.labels()[2], -1);
  EXPECT_EQ(s.split("train"), (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(s.split("test").empty());
  EXPECT_NO_THROW(s.verify());
  EXPECT_NE(describe_store(s).find("labels     2 classes, 3 labelled nodes"), std::string::npos) << describe_store(s);
}

TEST(Store, HalfAndBfloatFeaturesReadBackAsFloat) {
  for (DType t : {DType::kF16, DType::kBF16}) {
    TempDir dir;
    write_small_store(dir / "s.gale", t);
    const Store s = Store::open(dir / "s.gale");
    EXPECT_EQ(s.feature_dtype(), t);
    float rows[8];
    s.read_features(0, 4, rows);
    EXPECT_EQ(rows[3], 0.25f);   // exact in both formats
    EXPECT_EQ(rows[7], 8.0f);
  }
}

TEST(Store, FlippedByteIsReportedByVerify) {
  TempDir dir;
  write_small_store(dir / "s.gale");
  {
    std::fstream f(dir / "s.gale/features.npy", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 5);
    f.put('\x55');
  }
  const Store s = Store::open(dir / "s.gale");  // sizes still match, features index nothing: open succeeds
  try {
    s.verify();
    FAIL() << "verify accepted a flipped byte";
  } catch (const CorruptStoreError& e) {
    EXPECT_NE(std::string(e.what()).find("features.npy"), std::string::npos) << e.what();
  }
}

TEST(Store, TruncatedArrayFailsToOpen) {
  TempDir dir;
  write_small_store(dir / "s.gale");
  std::filesystem::resize_file(dir / "s.gale/features.npy", 4100);
  try {
    Store::open(dir / "s.gale");
    FAIL();
  } catch (const CorruptStoreError& e) {
    EXPECT_NE(std::string(e.what()).find("features.npy"), std::string::npos) << e.what();
  }
}

TEST(Store, WrongVersionAndMissingManifestFailToOpen) {
  TempDir dir;
  write_small_store(dir / "s.gale");
  const std::string manifest = dir / "s.gale/manifest.json";
  nlohmann::json j = nlohmann::json::parse(testing::read_bytes(manifest));
  j["format_version"] = 3;
  testing::write_text(manifest, j.dump());
  EXPECT_THROW(Store::open(dir / "s.gale"), CorruptStoreError);
  std::filesystem::remove(manifest);
  EXPECT_THROW(Store::open(dir / "s.gale"), CorruptStoreError);
  EXPECT_THROW(Store::open(dir / "nothing.gale"), InputError);
}

TEST(Store, InconsistentIndptrFailsToOpen) {
  TempDir dir;
  write_small_store(dir / "s.gale");
  // Rewrite indptr with a wrong last entry (and a matching manifest entry, so only the CSR check
  // can catch it).
  StoreWriter w(dir / "t.gale", false);
  const std::vector<int64_t> indptr{0, 1, 3, 3, 5};
  const std::vector<int32_t> indices{1, 0, 3, 2};
  w.write_array("graph/indptr.npy", DType::kI64, {5}, indptr.data());
  w.write_array("graph/indices.npy", DType::kI32, {4}, indices.data());
  w.manifest().num_nodes = 4;
  w.manifest().num_edges = 4;
  w.commit();
  EXPECT_THROW(Store::open(dir / "t.gale"), CorruptStoreError);
}

TEST(Store, UncommittedWriterLeavesNothing) {
  TempDir dir;
  {
    StoreWriter w(dir / "s.gale", false);
    const std::vector<int64_t> indptr{0, 0};
    w.write_array("graph/indptr.npy", DType::kI64, {2}, indptr.data());
  }
  testing::expect_nothing_left(dir / "s.gale");
}

TEST(Store, ExistingStoreIsReplacedOnlyWithOverwrite) {
  TempDir dir;
  write_small_store(dir / "s.gale");
  EXPECT_THROW(StoreWriter(dir / "s.gale", false), InputError);
  {
    StoreWriter w(dir / "s.gale", true);
    const std::vector<int64_t> indptr{0, 0, 0};
    const std::vector<int32_t> none;
    w.write_array("graph/indptr.npy", DType::kI64, {3}, indptr.data());
    w.write_array("graph/indices.npy", DType::kI32, {0}, none.data());
    w.manifest().num_nodes = 2;
    w.commit();
  }
  EXPECT_EQ(Store::open(dir / "s.gale").num_nodes(), 2);
  testing::expect_nothing_left(dir / "other.gale");
}

// Each array's page sums ride beside it as pages/<file>, a u32 .npy that NumPy reads like the rest.
TEST(Store, PageSumsAreAlignedU32SidecarsNumpyCanRead) {
  TempDir dir;
  write_small_store(dir / "s.gale");
  const Store s = Store::open(dir / "s.gale");
  ASSERT_TRUE(s.has_page_sums());
  for (const char* rel : {"graph/indptr.npy", "graph/indices.npy", "features.npy", "labels.npy", "splits/train.npy"}) {
    const FileEntry& e = s.manifest().files.at(page_sums_path(rel));
    EXPECT_EQ(e.dtype, "u32") << rel;
    EXPECT_EQ(e.shape, std::vector<int64_t>{2}) << rel;   // the header page and the data page
    EXPECT_EQ(e.size, 4096u + 8u) << rel;
    const std::string bytes = testing::read_bytes(dir / "s.gale/" + rel);
    EXPECT_EQ(s.page_sums(rel)[0], page_sum(bytes.data(), 4096)) << rel;
    EXPECT_EQ(s.page_sums(rel)[1], page_sum(bytes.data() + 4096, bytes.size() - 4096)) << rel;
  }
  EXPECT_EQ(s.manifest().files.count("pages/pages/labels.npy"), 0u);
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) GTEST_SKIP() << "no python3 with numpy";
  const std::string cmd = "/usr/bin/python3 -c \"import numpy as np; p = np.load('" + dir / "s.gale/pages/labels.npy" +
                          "', mmap_mode='r'); assert p.dtype == np.uint32 and p.shape == (2,) and p.offset == 4096\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST(Store, EqualContentGivesByteIdenticalStores) {
  TempDir dir;
  write_small_store(dir / "a.gale");
  write_small_store(dir / "b.gale");
  testing::expect_identical_stores(dir / "a.gale", dir / "b.gale");
}

}  // namespace
}  // namespace gale::storage
