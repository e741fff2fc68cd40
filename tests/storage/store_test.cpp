// The store core beyond the happy path: npy headers of every version, the writer's byte
// accounting, a manifest that is deterministic and self-consistent, replacement that never
// leaves a half store, and open() naming the file and what it expected whenever a store is damaged.
#include <gtest/gtest.h>

#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "kernels/error.hpp"
#include "storage/store.hpp"
#include "tests/storage/test_files.hpp"

namespace gale::storage {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Writes an .npy file by hand, as another tool would: `major` 1 has a 2-byte header length, 2
// and 3 a 4-byte one; the dict is padded so the data starts at a multiple of 64.
void write_raw_npy(const std::string& path, int major, std::string dict, const std::string& data) {
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const size_t len = dict.size();
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>((len >> 8) & 0xff);
  if (major != 1) {
    out += static_cast<char>((len >> 16) & 0xff);
    out += static_cast<char>((len >> 24) & 0xff);
  }
  testing::write_text(path, out + dict + data);
}

using testing::error_of;

// A 4-node store: 0 <- 1, 1 <- {0, 3}, 2 <- {}, 3 <- 2; two classes, one unlabelled node.
struct SmallStore {
  std::vector<int64_t> indptr{0, 1, 3, 3, 4};
  std::vector<int32_t> indices{1, 0, 3, 2};
  std::vector<float> weights{0.5f, 1.0f, 2.0f, 4.0f};
  std::vector<float> features{0.5f, -1.0f, 2.0f, 0.25f, 3.0f, 4.0f, -0.125f, 8.0f};
  std::vector<int32_t> labels{0, 1, -1, 1};
  std::vector<int64_t> train{0, 3}, valid{1};
  std::vector<int32_t> partition{0, 0, 1, 1};
  std::vector<int64_t> relabel{3, 2, 1, 0};

  void write(const std::string& path, bool overwrite = false, DType feature_dtype = DType::kF32) const {
    StoreWriter w(path, overwrite);
    fill(&w, feature_dtype);
    w.commit();
  }
  void fill(StoreWriter* w, DType feature_dtype = DType::kF32) const {
    w->write_array("graph/indptr.npy", DType::kI64, {5}, indptr.data());
    w->write_array("graph/indices.npy", DType::kI32, {4}, indices.data());
    w->write_array("graph/weights.npy", DType::kF32, {4}, weights.data());
    std::vector<uint16_t> narrow(features.size());
    if (feature_dtype != DType::kF32) convert_from_f32(feature_dtype, features.data(), narrow.data(), features.size());
    w->write_array("features.npy", feature_dtype, {4, 2},
                   feature_dtype == DType::kF32 ? static_cast<const void*>(features.data()) : narrow.data());
    w->write_array("labels.npy", DType::kI32, {4}, labels.data());
    w->write_array("splits/train.npy", DType::kI64, {2}, train.data());
    w->write_array("splits/valid.npy", DType::kI64, {1}, valid.data());
    w->write_array("partition.npy", DType::kI32, {4}, partition.data());
    w->write_array("relabel.npy", DType::kI64, {4}, relabel.data());
    Manifest& m = w->manifest();
    m.num_nodes = 4;
    m.num_edges = 4;
    m.weighted = true;
    m.feature_dim = 2;
    m.feature_dtype = dtype_name(feature_dtype);
    m.num_classes = 2;
    m.splits = {{"train", 2}, {"valid", 1}};
    m.num_partitions = 2;
    m.relabelled = true;
  }
};

// Rewrites manifest.json of `store` through `edit`, keeping it valid JSON.
template <typename Fn>
void edit_manifest(const std::string& store, Fn&& edit) {
  const std::string file = store + "/manifest.json";
  nlohmann::json j = nlohmann::json::parse(testing::read_bytes(file));
  edit(j);
  testing::write_text(file, j.dump(2) + "\n");
}

// Makes `store` what a store written before page sums looks like: no pages/, no manifest key,
// format version 1.
void strip_page_sums(const std::string& store) {
  fs::remove_all(store + "/pages");
  edit_manifest(store, [](nlohmann::json& j) {
    j.erase("page_size");
    j["format_version"] = 1;
    for (auto it = j["files"].begin(); it != j["files"].end();) {
      if (it.key().rfind("pages/", 0) == 0) it = j["files"].erase(it);
      else ++it;
    }
  });
}

// XORs byte `offset` of `file` with `mask`.
void flip_byte(const std::string& file, int64_t offset, char mask = '\x01') {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  const char c = static_cast<char>(f.get());
  f.seekp(offset);
  f.put(static_cast<char>(c ^ mask));
}

// ---------------------------------------------------------------------------------------------
// Npy

TEST(Npy, DataStartsAt4096AndNumpyCanReadIt) {
  TempDir dir;
  const std::vector<uint16_t> bf16{0x3f80, 0x4000, 0xbf80};
  testing::write_npy(dir / "b.npy", DType::kBF16, {3}, bf16);
  const std::string bytes = testing::read_bytes(dir / "b.npy");
  ASSERT_EQ(bytes.size(), 4096u + 6u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));   // v1.0
  EXPECT_EQ(bytes[4095], '\n');
  EXPECT_EQ(bytes[4094], ' ');
  const NpyHeader h = read_npy_header(dir / "b.npy");
  EXPECT_EQ(h.descr, "<u2");   // NumPy has no bf16: the raw bits travel as u2
  EXPECT_EQ(h.dtype, DType::kBF16);
  EXPECT_EQ(h.data_offset, kNpyDataAlignment);
  EXPECT_EQ(h.count(), 3);

  // The python3 first on PATH may be a virtual environment without numpy; the system one often has it.
  std::string python;
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    if (std::system((std::string(candidate) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0) {
      python = candidate;
      break;
    }
  }
  if (python.empty()) GTEST_SKIP() << "no python3 with numpy";
  const std::string cmd = python + " -c \"import numpy as np; a = np.load('" + dir / "b.npy" +
                          "', mmap_mode='r'); assert a.dtype == np.uint16 and a.offset == 4096 and "
                          "list(a) == [0x3f80, 0x4000, 0xbf80], a\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST(Npy, ReadsVersion1To3HeadersWrittenByOtherTools) {
  TempDir dir;
  const std::string data(24, '\0');
  for (int major : {1, 2, 3}) {
    const std::string path = dir / ("v" + std::to_string(major) + ".npy");
    write_raw_npy(path, major, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", data);
    const NpyHeader h = read_npy_header(path);
    EXPECT_EQ(h.dtype, DType::kI64) << major;
    EXPECT_EQ(h.shape, std::vector<int64_t>{3}) << major;
    EXPECT_EQ(h.data_offset % 64, 0u) << major;
    EXPECT_EQ(h.data_offset + data.size(), fs::file_size(path)) << major;
  }
  write_raw_npy(dir / "scalar.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", std::string(8, '\0'));
  EXPECT_EQ(read_npy_header(dir / "scalar.npy").count(), 1);
  write_raw_npy(dir / "u1.npy", 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 0), }", "");
  EXPECT_EQ(read_npy_header(dir / "u1.npy").count(), 0);
}

TEST(Npy, UnsupportedArraysAreRejectedInOneLineNamingTheFile) {
  TempDir dir;
  const struct {
    const char* name;
    const char* dict;
    const char* expect;
  } cases[] = {
      {"big.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", "found dtype '>f4'"},
      {"bool.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", "found dtype '|b1'"},
      {"short.npy", "{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }", "found dtype '<i2'"},
      {"fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", "Fortran-ordered"},
      {"negative.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", "expected a shape"},
      {"huge.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4000000000, 4000000000), }", "too large"},
      {"noshape.npy", "{'descr': '<f4', 'fortran_order': False, }", "no 'shape' entry"},
  };
  for (const auto& c : cases) {
    write_raw_npy(dir / c.name, 1, c.dict, std::string(16, '\0'));
    const std::string msg = error_of([&] { read_npy_header(dir / c.name); });
    EXPECT_EQ(msg.rfind(dir / c.name + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_THROW(read_npy_header(dir / c.name), InputError);
  }
  testing::write_text(dir / "text.npy", "a,b\n1,2\n");
  EXPECT_NE(error_of([&] { read_npy_header(dir / "text.npy"); }).find("not a NumPy .npy file"), std::string::npos);
  EXPECT_NE(error_of([&] { read_npy_header(dir / "absent.npy"); }).find("absent.npy: cannot open"), std::string::npos);
}

TEST(Npy, OneLargeWriteAndManySmallWritesGiveTheSameFile) {
  TempDir dir;
  // 3 M floats = 12 MiB: more than the writer's buffer, so the large write bypasses it.
  std::vector<float> v(3 << 20);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 1000) * 0.5f;
  NpyWriter one(dir / "one.npy", DType::kF32, {static_cast<int64_t>(v.size())});
  one.write(v.data(), v.size() * 4);
  one.finish();
  NpyWriter many(dir / "many.npy", DType::kF32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); i += 777) many.write(v.data() + i, std::min<size_t>(777, v.size() - i) * 4);
  many.finish();
  EXPECT_EQ(one.file_size(), 4096u + v.size() * 4);
  EXPECT_EQ(fs::file_size(dir / "one.npy"), one.file_size());
  EXPECT_EQ(one.xxh64(), many.xxh64());
  EXPECT_TRUE(testing::read_bytes(dir / "one.npy") == testing::read_bytes(dir / "many.npy"));
}

TEST(Npy, WriterChecksTheByteCountAgainstTheShape) {
  TempDir dir;
  const std::vector<int32_t> v{1, 2, 3};
  NpyWriter short_writer(dir / "short.npy", DType::kI32, {3});
  short_writer.write(v.data(), 8);
  EXPECT_THROW(short_writer.finish(), InternalError);
  NpyWriter long_writer(dir / "long.npy", DType::kI32, {2});
  EXPECT_THROW(long_writer.write(v.data(), 12), InternalError);
  const std::string msg = error_of([&] { NpyWriter(dir / "no/such/dir/a.npy", DType::kI32, {1}); });
  EXPECT_NE(msg.find("no/such/dir/a.npy: cannot create: No such file or directory"), std::string::npos) << msg;
}

TEST(Npy, FullDiskIsAResourceError) {
  // /dev/full fails every write with ENOSPC: what a full disk looks like to the writer.
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "/dev/full is not writable here";
  const std::vector<float> v(16, 1.0f);
  NpyWriter w("/dev/full", DType::kF32, {16});
  w.write(v.data(), v.size() * 4);
  const std::string msg = error_of([&] { w.finish(); });
  EXPECT_EQ(msg, "/dev/full: write failed: No space left on device");
  NpyWriter again("/dev/full", DType::kF32, {16});
  again.write(v.data(), v.size() * 4);
  EXPECT_THROW(again.finish(), ResourceError);
}

// ---------------------------------------------------------------------------------------------
// Manifest

TEST(Manifest, EqualContentGivesByteIdenticalManifests) {
  TempDir dir;
  const SmallStore s;
  s.write(dir / "a.gale");
  s.write(dir / "b.gale");
  const std::string a = testing::read_bytes(dir / "a.gale/manifest.json");
  EXPECT_EQ(a, testing::read_bytes(dir / "b.gale/manifest.json"));
  // No paths or temporary names leak in; keys are sorted; two-space indent and a final newline.
  EXPECT_EQ(a.find("tmp"), std::string::npos) << a;
  EXPECT_EQ(a.find(dir.path().string()), std::string::npos) << a;
  EXPECT_LT(a.find("\"feature_dim\""), a.find("\"files\""));
  EXPECT_LT(a.find("\"files\""), a.find("\"format_version\""));
  EXPECT_EQ(a.substr(0, 4), "{\n  ");
  EXPECT_EQ(a.back(), '\n');
  testing::expect_identical_stores(dir / "a.gale", dir / "b.gale");
}

TEST(Manifest, RoundTripsThroughJson) {
  TempDir dir;
  SmallStore().write(dir / "s.gale", false, DType::kBF16);
  const std::string text = testing::read_bytes(dir / "s.gale/manifest.json");
  const Manifest m = manifest_from_json(text, "m.json");
  EXPECT_EQ(manifest_to_json(m), text);
  EXPECT_EQ(m.feature_dtype, "bf16");
  EXPECT_EQ(m.files.at("features.npy").dtype, "bf16");   // stored as '<u2', named for what it is
  EXPECT_EQ(m.files.at("features.npy").shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(m.files.at("features.npy").size, 4096u + 16u);
  EXPECT_EQ(m.files.at("features.npy").xxh64.size(), 16u);
  EXPECT_EQ(m.splits.at("valid"), 1);
}

TEST(Manifest, BadManifestsNameTheFileAndTheKey) {
  EXPECT_NE(error_of([] { manifest_from_json("{", "S/manifest.json"); }).find("S/manifest.json: not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of([] { manifest_from_json("{\"format_version\": 1}", "S/manifest.json"); })
                .find("S/manifest.json: missing key 'num_nodes'"),
            std::string::npos);
  EXPECT_EQ(error_of([] { manifest_from_json("{\"format_version\": 7}", "S/manifest.json"); }),
            "S/manifest.json: format version 7, this Gale reads versions 1 to 2");
  EXPECT_THROW(manifest_from_json("[1, 2]", "S/manifest.json"), CorruptStoreError);
}

// ---------------------------------------------------------------------------------------------
// Store

TEST(Store, RoundTripsEveryArray) {
  TempDir dir;
  const SmallStore in;
  in.write(dir / "s.gale");
  const Store s = Store::open(dir / "s.gale");
  EXPECT_EQ(s.num_nodes(), 4);
  EXPECT_EQ(s.num_edges(), 4);
  const kernels::CsrView g = s.csr();
  EXPECT_EQ(g.rows, 4);
  EXPECT_EQ(g.nnz(), 4);
  EXPECT_EQ(std::vector<int64_t>(g.indptr, g.indptr + 5), in.indptr);
  EXPECT_EQ(std::vector<int32_t>(g.indices, g.indices + 4), in.indices);
  EXPECT_EQ(std::vector<float>(g.weights, g.weights + 4), in.weights);
  EXPECT_EQ(s.feature_dtype(), DType::kF32);
  std::vector<float> x(8);
  s.read_features(0, 4, x.data());
  EXPECT_EQ(x, in.features);
  EXPECT_EQ(std::vector<int32_t>(s.labels(), s.labels() + 4), in.labels);
  EXPECT_EQ(s.num_classes(), 2);
  EXPECT_EQ(s.split("train"), in.train);
  EXPECT_EQ(s.split("valid"), in.valid);
  EXPECT_FALSE(s.has_split("test"));
  EXPECT_TRUE(s.split("test").empty());
  EXPECT_EQ(std::vector<int32_t>(s.partition(), s.partition() + 4), in.partition);
  EXPECT_EQ(std::vector<int64_t>(s.relabel(), s.relabel() + 4), in.relabel);
  EXPECT_NO_THROW(s.verify());
}

TEST(Store, HalfAndBfloatFeaturesReadBackAsFloat) {
  for (DType t : {DType::kF16, DType::kBF16}) {
    TempDir dir;
    const SmallStore in;
    in.write(dir / "s.gale", false, t);
    const Store s = Store::open(dir / "s.gale");
    EXPECT_EQ(s.feature_dtype(), t);
    std::vector<float> rows(4);
    s.read_features(2, 4, rows.data());   // every value is exact in both formats
    EXPECT_EQ(rows, std::vector<float>(in.features.begin() + 4, in.features.end())) << dtype_name(t);
  }
}

TEST(Store, StoreAndMappedArrayMoveButDoNotCopy) {
  static_assert(!std::is_copy_constructible_v<MappedArray> && std::is_nothrow_move_constructible_v<MappedArray>);
  static_assert(!std::is_copy_constructible_v<Store> && std::is_move_constructible_v<Store>);
  TempDir dir;
  SmallStore().write(dir / "s.gale");
  Store a = Store::open(dir / "s.gale");
  const int64_t* indptr = a.indptr();
  Store b = std::move(a);
  EXPECT_EQ(b.indptr(), indptr);   // the mapping moved, it was not remapped
  EXPECT_EQ(b.indptr()[4], 4);
}

TEST(Store, FlippedByteIsReportedByVerify) {
  TempDir dir;
  SmallStore().write(dir / "s.gale");
  const std::string manifest_hash = Store::open(dir / "s.gale").manifest().files.at("features.npy").xxh64;
  {
    std::fstream f(dir / "s.gale/features.npy", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 9);
    f.put('\x7f');
  }
  const Store s = Store::open(dir / "s.gale");   // same size, same header: only the hash can tell
  const std::string msg = error_of([&] { s.verify(); });
  EXPECT_EQ(msg.rfind(dir / "s.gale/features.npy: xxHash64 mismatch (manifest " + manifest_hash + ", file ", 0), 0u)
      << msg;
  EXPECT_NE(msg.find("the store is corrupt"), std::string::npos) << msg;
  EXPECT_THROW(s.verify(), CorruptStoreError);
}

TEST(Store, TruncatedArrayFailsToOpen) {
  TempDir dir;
  SmallStore().write(dir / "s.gale");
  fs::resize_file(dir / "s.gale/labels.npy", 4096 + 8);
  EXPECT_EQ(error_of([&] { Store::open(dir / "s.gale"); }),
            dir / "s.gale/labels.npy" + ": expected 4112 bytes, found 4104 (truncated or replaced)");
  EXPECT_THROW(Store::open(dir / "s.gale"), CorruptStoreError);
}

TEST(Store, WrongVersionFailsToOpen) {
  TempDir dir;
  SmallStore().write(dir / "s.gale");
  edit_manifest(dir / "s.gale", [](nlohmann::json& j) { j["format_version"] = 7; });
  EXPECT_EQ(error_of([&] { Store::open(dir / "s.gale"); }),
            dir / "s.gale/manifest.json" + ": format version 7, this Gale reads versions 1 to 2");
  EXPECT_THROW(Store::open(dir / "s.gale"), CorruptStoreError);
}

TEST(Store, OpenNamesTheFileThatIsWrong) {
  TempDir dir;
  const std::string store = dir / "s.gale";
  auto fresh = [&] {
    fs::remove_all(store);
    SmallStore().write(store);
  };
  auto expect_open_error = [&](const std::string& starts, const std::string& contains) {
    const std::string msg = error_of([&] { Store::open(store); });
    EXPECT_EQ(msg.rfind(starts, 0), 0u) << msg;
    EXPECT_NE(msg.find(contains), std::string::npos) << msg;
    EXPECT_THROW(Store::open(store), CorruptStoreError);
  };

  EXPECT_THROW(Store::open(dir / "absent.gale"), InputError);

  fresh();
  testing::write_text(store + "/manifest.json", "{\"format_version\": 1,");
  expect_open_error(store + "/manifest.json: ", "not valid JSON");

  fresh();
  fs::remove(store + "/manifest.json");
  expect_open_error(store + "/manifest.json: ", "missing");

  fresh();
  fs::remove(store + "/splits/valid.npy");
  expect_open_error(store + "/splits/valid.npy: ", "missing (listed in the manifest)");

  // Same size, different dtype: the header check catches it.
  fresh();
  testing::write_npy(store + "/labels.npy", DType::kF32, {4}, std::vector<float>(4, 1.0f));
  expect_open_error(store + "/labels.npy: ", "expected i32 (4) as the manifest says, found <f4 (4)");

  fresh();
  edit_manifest(store, [](nlohmann::json& j) { j.erase("num_edges"); });
  expect_open_error(store + "/manifest.json: ", "missing key 'num_edges'");

  fresh();
  edit_manifest(store, [](nlohmann::json& j) { j["files"].erase("graph/indices.npy"); });
  expect_open_error(store + "/manifest.json: ", "required file graph/indices.npy");

  fresh();
  edit_manifest(store, [](nlohmann::json& j) { j["files"]["../outside.npy"] = j["files"]["labels.npy"]; });
  expect_open_error(store + "/manifest.json: ", "expected file paths inside the store, found '../outside.npy'");
}

TEST(Store, ManifestAndArraysMustAgree) {
  TempDir dir;
  const std::string store = dir / "s.gale";
  const struct {
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  } cases[] = {
      {[](nlohmann::json& j) { j["num_nodes"] = 5; }, "graph/indptr.npy: expected shape (6), found (5)"},
      {[](nlohmann::json& j) { j["num_edges"] = 3; }, "graph/indices.npy: expected shape (3), found (4)"},
      {[](nlohmann::json& j) { j["weighted"] = false; }, "expected graph/weights.npy to be absent"},
      {[](nlohmann::json& j) { j["feature_dim"] = 3; }, "features.npy: expected shape (4, 3), found (4, 2)"},
      {[](nlohmann::json& j) { j["feature_dtype"] = "f16"; }, "features.npy: expected dtype f16, found f32"},
      {[](nlohmann::json& j) { j["num_partitions"] = 0; }, "expected partition.npy to be absent"},
      {[](nlohmann::json& j) { j["relabelled"] = false; }, "expected relabel.npy to be absent"},
      {[](nlohmann::json& j) { j["splits"]["valid"] = 2; }, "splits/valid.npy: expected 2 node ids"},
      {[](nlohmann::json& j) { j["splits"]["test"] = 1; }, "expected splits/test.npy for split 'test'"},
      {[](nlohmann::json& j) { j["splits"].erase("train"); }, "splits/train.npy: expected a matching entry"},
      {[](nlohmann::json& j) { j["num_nodes"] = -1; }, "expected a non-negative num_nodes, found -1"},
      {[](nlohmann::json& j) { j["files"]["labels.npy"]["xxh64"] = "XYZ"; }, "expected an xxh64 of 16 lowercase hex"},
  };
  for (const auto& c : cases) {
    fs::remove_all(store);
    SmallStore().write(store);
    edit_manifest(store, c.edit);
    const std::string msg = error_of([&] { Store::open(store); });
    EXPECT_EQ(msg.rfind(store + "/", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_THROW(Store::open(store), CorruptStoreError);
  }
}

TEST(Store, IndptrMustStartAtZeroAndEndAtTheEdgeCount) {
  TempDir dir;
  StoreWriter w(dir / "s.gale", false);
  const std::vector<int64_t> indptr{1, 1, 2};
  const std::vector<int32_t> indices{0, 1};
  w.write_array("graph/indptr.npy", DType::kI64, {3}, indptr.data());
  w.write_array("graph/indices.npy", DType::kI32, {2}, indices.data());
  w.manifest().num_nodes = 2;
  w.manifest().num_edges = 2;
  w.commit();
  EXPECT_EQ(error_of([&] { Store::open(dir / "s.gale"); }),
            dir / "s.gale/graph/indptr.npy" + ": expected indptr[0] = 0 and indptr[N] = 2, found 1 and 2");
}

TEST(Store, Int64IndicesOpenButHaveNoInt32View) {
  TempDir dir;
  StoreWriter w(dir / "s.gale", false);
  const std::vector<int64_t> indptr{0, 1, 2}, indices{1, 0};
  w.write_array("graph/indptr.npy", DType::kI64, {3}, indptr.data());
  w.write_array("graph/indices.npy", DType::kI64, {2}, indices.data());
  w.manifest().num_nodes = 2;
  w.manifest().num_edges = 2;
  w.commit();
  const Store s = Store::open(dir / "s.gale");
  EXPECT_THROW(s.indices32(), InputError);
  EXPECT_THROW(s.csr(), InputError);
  EXPECT_FALSE(s.has_features());
  EXPECT_FALSE(s.has_labels());
  EXPECT_EQ(s.weights(), nullptr);
  EXPECT_NE(describe_store(s).find("out-degree not computed (int64 indices)"), std::string::npos) << describe_store(s);
}

TEST(Store, UncommittedWriterLeavesNothing) {
  TempDir dir;
  {
    StoreWriter w(dir / "s.gale", false);
    SmallStore().fill(&w);
    NpyWriter& open_array = w.begin_array("extra/half.npy", DType::kF32, {100});
    const std::vector<float> some(10);
    open_array.write(some.data(), 40);
    EXPECT_TRUE(fs::is_directory(w.temp_dir()));
    EXPECT_EQ(w.temp_dir().parent_path(), dir.path());
    EXPECT_EQ(w.temp_dir().filename().string().rfind(".s.gale.tmp-", 0), 0u);
    EXPECT_NE(w.temp_dir().filename().string().find("-" + std::to_string(::getpid()) + "-"), std::string::npos);
  }   // destroyed mid-array, as when an importer throws
  testing::expect_nothing_left(dir / "s.gale");
}

TEST(Store, ExistingStoreIsNotReplacedWithoutOverwrite) {
  TempDir dir;
  SmallStore().write(dir / "s.gale");
  const std::string before = testing::read_bytes(dir / "s.gale/manifest.json");
  EXPECT_EQ(error_of([&] { StoreWriter(dir / "s.gale", false); }),
            dir / "s.gale" + ": already exists (pass --force to replace it)");
  EXPECT_THROW(StoreWriter(dir / "s.gale", false), InputError);

  // A store that appears while another is being written is not clobbered either.
  {
    StoreWriter w(dir / "t.gale", false);
    SmallStore().fill(&w);
    fs::create_directory(dir / "t.gale");
    EXPECT_THROW(w.commit(), InputError);
  }
  EXPECT_TRUE(fs::is_empty(dir / "t.gale"));
  EXPECT_EQ(testing::read_bytes(dir / "s.gale/manifest.json"), before);
  fs::remove(dir / "t.gale");
  testing::expect_nothing_left(dir / "t.gale");
}

TEST(Store, OverwriteReplacesTheWholeStore) {
  TempDir dir;
  SmallStore().write(dir / "s.gale");
  {
    StoreWriter w(dir / "s.gale", true);
    const std::vector<int64_t> indptr{0, 0, 0};
    const std::vector<int32_t> none;
    w.write_array("graph/indptr.npy", DType::kI64, {3}, indptr.data());
    w.write_array("graph/indices.npy", DType::kI32, {0}, none.data());
    w.manifest().num_nodes = 2;
    w.commit();
  }
  const Store s = Store::open(dir / "s.gale");
  EXPECT_EQ(s.num_nodes(), 2);
  EXPECT_FALSE(fs::exists(dir / "s.gale/features.npy"));   // nothing of the old store survives
  EXPECT_FALSE(fs::exists(dir / "s.gale/splits"));
  EXPECT_NO_THROW(s.verify());
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  EXPECT_THROW(StoreWriter(dir / "missing-parent/x.gale", false), InputError);
}

// --force replaces a store or an empty directory; a directory of anything else (a typo in -o, a
// folder of the store itself) is refused and left as it was.
TEST(Store, OverwriteRefusesADirectoryThatIsNotAStore) {
  TempDir dir;
  testing::write_text(dir / "precious/data.txt", "keep me");
  const std::string msg = error_of([&] { StoreWriter(dir / "precious", true); });
  EXPECT_EQ(msg, dir / "precious" + ": exists and is not a store (no manifest.json); --force replaces only a store, "
                                    "so remove it or choose another path");
  EXPECT_THROW(StoreWriter(dir / "precious", true), InputError);
  EXPECT_EQ(testing::read_bytes(dir / "precious/data.txt"), "keep me");
  SmallStore().write(dir / "s.gale");
  EXPECT_THROW(StoreWriter(dir / "s.gale/graph", true), InputError);
  EXPECT_NO_THROW(Store::open(dir / "s.gale"));
  fs::create_directories(dir / "empty");
  SmallStore().write(dir / "empty", true);
  EXPECT_NO_THROW(Store::open(dir / "empty"));
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(Store, DescribeReportsDegreesClassesSplitsAndFiles) {
  TempDir dir;
  SmallStore().write(dir / "s.gale", false, DType::kBF16);
  const std::string d = describe_store(Store::open(dir / "s.gale"));
  for (const char* line : {"(format version 2)", "nodes      4\n", "edges      4 (weighted)\n",
                           // in-degrees 1 2 0 1; out-degrees (counted over indices) 1 1 1 1
                           "in-degree  min 0  mean 1.00  median 1  p99 2  max 2  (1 nodes with none)",
                           "out-degree min 1  mean 1.00  median 1  p99 1  max 1  (0 nodes with none)",
                           "features   2 x bf16", "labels     2 classes, 3 labelled nodes",
                           "classes    smallest 1 nodes (class 0), largest 2 nodes (class 1)",
                           "splits     train 2 valid 1", "partitions 2", "relabelled yes", "files      9, ",
                           "features.npy", "splits/valid.npy"}) {
    EXPECT_NE(d.find(line), std::string::npos) << "missing '" << line << "' in\n" << d;
  }
}

// A store damaged in place (same size, same header: only the hash could tell) must not open when a
// value that indexes something is out of range: train and predict would otherwise read or write out
// of bounds. Each case overwrites one value of SmallStore.
TEST(Store, OpenRefusesValuesOutsideTheirRange) {
  struct Case {
    const char* file;
    int64_t entry;
    int64_t value;
    int width;  // bytes of an entry
    const char* expect;
  };
  const Case cases[] = {
      {"graph/indptr.npy", 2, 0, 8,
       "graph/indptr.npy: expected non-decreasing offsets, found 1 decreasing (the first: indptr[1] = 1 > indptr[2] = 0"},
      {"graph/indices.npy", 1, 9, 4, "graph/indices.npy: expected node ids in [0, 4), found 1 outside (the first, entry 1, is 9"},
      {"graph/indices.npy", 3, -1, 4, "graph/indices.npy: expected node ids in [0, 4), found 1 outside (the first, entry 3, is -1"},
      {"labels.npy", 2, 2, 4, "labels.npy: expected classes (-1 = unlabelled) in [-1, 2), found 1 outside (the first, entry 2, is 2"},
      {"labels.npy", 0, -5, 4, "labels.npy: expected classes (-1 = unlabelled) in [-1, 2), found 1 outside (the first, entry 0, is -5"},
      {"splits/train.npy", 1, 4, 8, "splits/train.npy: expected node ids in [0, 4), found 1 outside (the first, entry 1, is 4"},
      {"partition.npy", 3, 2, 4, "partition.npy: expected parts in [0, 2), found 1 outside (the first, entry 3, is 2"},
      {"relabel.npy", 0, 4, 8, "relabel.npy: expected original node ids in [0, 4), found 1 outside (the first, entry 0, is 4"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.file) + " entry " + std::to_string(c.entry) + " = " + std::to_string(c.value));
    TempDir dir;
    SmallStore().write(dir / "s.gale");
    strip_page_sums(dir / "s.gale");   // with page sums the damaged page is reported first (PageSums tests)
    ASSERT_NO_THROW(Store::open(dir / "s.gale"));
    {
      std::fstream f(dir / ("s.gale/" + std::string(c.file)), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(4096 + c.entry * c.width);
      const int64_t v = c.value;  // little-endian: the low c.width bytes
      f.write(reinterpret_cast<const char*>(&v), c.width);
    }
    const std::string msg = error_of([&] { Store::open(dir / "s.gale"); });
    EXPECT_EQ(msg.rfind(dir / ("s.gale/" + std::string(c.expect)), 0), 0u) << msg;
    EXPECT_NE(msg.find("run gale info --verify)"), std::string::npos) << msg;
    EXPECT_THROW(Store::open(dir / "s.gale"), CorruptStoreError);
  }
}

// ---------------------------------------------------------------------------------------------
// Page sums

// The sums of every page of `file`, computed here from its bytes.
std::vector<uint32_t> sums_of(const std::string& file) {
  const std::string bytes = testing::read_bytes(file);
  std::vector<uint32_t> sums;
  for (size_t at = 0; at < bytes.size(); at += kPageSumPage)
    sums.push_back(page_sum(bytes.data() + at, std::min(kPageSumPage, bytes.size() - at)));
  return sums;
}

// The u32 entries of a sidecar, read by hand past its 4096-byte header.
std::vector<uint32_t> sidecar_entries(const std::string& file) {
  const std::string bytes = testing::read_bytes(file);
  std::vector<uint32_t> v((bytes.size() - 4096) / 4);
  std::memcpy(v.data(), bytes.data() + 4096, v.size() * 4);
  return v;
}

TEST(PageSums, SumIsXxh32OfThePageAndPathsLiveUnderPages) {
  EXPECT_EQ(page_sum("", 0), 0x02CC5D05u);   // XXH32 of nothing, seed 0 (the xxHash test vector)
  const std::string page(kPageSumPage, 'a');
  EXPECT_NE(page_sum(page.data(), page.size()), page_sum(page.data(), page.size() - 1));
  EXPECT_EQ(page_sums_path("graph/indices.npy"), "pages/graph/indices.npy");
  EXPECT_EQ(page_count(0), 0u);
  EXPECT_EQ(page_count(4096), 1u);
  EXPECT_EQ(page_count(4097), 2u);
}

TEST(PageSums, EveryWrittenArrayHasASidecarOfItsPageSums) {
  TempDir dir;
  {
    StoreWriter w(dir / "s.gale", false);
    SmallStore().fill(&w);
    // 5000 floats (20000 data bytes, 6 pages with a short last one), streamed in pieces that
    // straddle page boundaries.
    std::vector<float> big(5000);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.25f;
    NpyWriter& a = w.begin_array("extra/big.npy", DType::kF32, {5000});
    for (size_t i = 0; i < big.size(); i += 333) a.write(big.data() + i, std::min<size_t>(333, big.size() - i) * 4);
    w.end_array("extra/big.npy");
    // 6 MB: its sums reach the sidecar in several batches while it streams.
    std::vector<int32_t> large(1500000);
    for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<int32_t>(i * 2654435761u);
    NpyWriter& l = w.begin_array("extra/large.npy", DType::kI32, {1500000});
    for (size_t i = 0; i < large.size(); i += 100003) l.write(large.data() + i, std::min<size_t>(100003, large.size() - i) * 4);
    w.end_array("extra/large.npy");
    w.commit();
  }
  const Store s = Store::open(dir / "s.gale");
  EXPECT_TRUE(s.has_page_sums());
  EXPECT_EQ(s.manifest().page_size, 4096u);
  EXPECT_NE(testing::read_bytes(dir / "s.gale/manifest.json").find("\"page_size\": 4096"), std::string::npos);
  int arrays = 0;
  for (const auto& [rel, e] : s.manifest().files) {
    if (rel.rfind("pages/", 0) == 0) {
      EXPECT_FALSE(fs::exists(dir / ("s.gale/pages/" + rel))) << "a sidecar got a sidecar: " << rel;
      continue;
    }
    ++arrays;
    SCOPED_TRACE(rel);
    const std::vector<uint32_t> want = sums_of(dir / ("s.gale/" + rel));
    ASSERT_EQ(want.size(), page_count(e.size));
    const FileEntry& sidecar = s.manifest().files.at("pages/" + rel);
    EXPECT_EQ(sidecar.dtype, "u32");
    EXPECT_EQ(sidecar.shape, std::vector<int64_t>{static_cast<int64_t>(want.size())});
    EXPECT_EQ(sidecar_entries(dir / ("s.gale/pages/" + rel)), want);
    ASSERT_NE(s.page_sums(rel), nullptr);
    EXPECT_EQ(std::vector<uint32_t>(s.page_sums(rel), s.page_sums(rel) + want.size()), want);
    // Aligned like every store array: numpy.load(mmap_mode="r") reads it as uint32.
    const NpyHeader h = read_npy_header(dir / ("s.gale/pages/" + rel), true);
    EXPECT_EQ(h.descr, "<u4");
    EXPECT_EQ(h.data_offset, 4096u);
  }
  EXPECT_EQ(arrays, 11);
  EXPECT_EQ(sums_of(dir / "s.gale/extra/big.npy").size(), 6u);
  EXPECT_EQ(sums_of(dir / "s.gale/extra/large.npy").size(), 1u + 1465u);   // header + 6,000,000 bytes
  EXPECT_EQ(s.verify(), 9u * 2u + 6u + 1466u);   // nine 2-page arrays, the 6-page one, the large one
  // A user's u4 array is still refused where arrays are imported.
  EXPECT_THROW(read_npy_header(dir / "s.gale/pages/labels.npy"), InputError);
}

TEST(PageSums, FlippedByteInTheTopologyFailsOpenNamingTheFileAndOffset) {
  TempDir dir;
  SmallStore().write(dir / "s.gale");
  strip_page_sums(dir / "s.gale");
  // Entry 1 of indices: 0 -> 1, still a node id, so without page sums the store opens as if whole.
  flip_byte(dir / "s.gale/graph/indices.npy", 4096 + 4);
  EXPECT_NO_THROW(Store::open(dir / "s.gale"));

  fs::remove_all(dir / "s.gale");
  SmallStore().write(dir / "s.gale");
  flip_byte(dir / "s.gale/graph/indices.npy", 4096 + 4);
  EXPECT_EQ(error_of([&] { Store::open(dir / "s.gale"); }),
            dir / "s.gale/graph/indices.npy" +
                ": page checksum mismatch at byte offset 4096 (page 1): the store is corrupt; run gale info --verify");
  EXPECT_THROW(Store::open(dir / "s.gale"), CorruptStoreError);

  // Every file open() reads whole is checked, weights and relabel (indexing nothing, or in range) too.
  for (const char* file : {"graph/indptr.npy", "graph/weights.npy", "labels.npy", "splits/valid.npy", "partition.npy",
                           "relabel.npy"}) {
    fs::remove_all(dir / "s.gale");
    SmallStore().write(dir / "s.gale");
    flip_byte(dir / ("s.gale/" + std::string(file)), 4096 + 1, '\x40');
    const std::string msg = error_of([&] { Store::open(dir / "s.gale"); });
    EXPECT_EQ(msg.rfind(dir / ("s.gale/" + std::string(file)) + ": page checksum mismatch at byte offset 4096 (page 1)", 0),
              0u)
        << msg;
  }
}

// 4 nodes with 2048 f32 features each: row r spans pages 1 + 2r and 2 + 2r of features.npy.
void write_wide_store(const std::string& path) {
  StoreWriter w(path, false);
  const SmallStore small;
  w.write_array("graph/indptr.npy", DType::kI64, {5}, small.indptr.data());
  w.write_array("graph/indices.npy", DType::kI32, {4}, small.indices.data());
  std::vector<float> x(4 * 2048);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97);
  w.write_array("features.npy", DType::kF32, {4, 2048}, x.data());
  w.manifest().num_nodes = 4;
  w.manifest().num_edges = 4;
  w.manifest().feature_dim = 2048;
  w.manifest().feature_dtype = "f32";
  w.commit();
}

TEST(PageSums, FlippedFeatureByteIsLeftToCheckFeaturePagesAndVerify) {
  TempDir dir;
  const std::string store = dir / "s.gale";
  write_wide_store(store);
  const int64_t offset = 4096 + 2 * 8192 + 4096 + 12;   // row 2, its second page (page 6)
  flip_byte(store + "/features.npy", offset);
  const Store s = Store::open(store);   // features are read by rows: open does not read them
  std::vector<float> row(2048);
  EXPECT_NO_THROW(s.read_features(2, 3, row.data()));   // the hot path does not check
  EXPECT_NO_THROW(s.check_feature_pages(0, 2));
  EXPECT_NO_THROW(s.check_feature_pages(3, 4));
  EXPECT_NO_THROW(s.check_feature_pages(2, 2));
  const std::string want = store + "/features.npy: page checksum mismatch at byte offset 24576 (page 6): the store is "
                                   "corrupt; run gale info --verify";
  EXPECT_EQ(error_of([&] { s.check_feature_pages(2, 3); }), want);
  EXPECT_EQ(error_of([&] { s.check_feature_pages(0, 4); }), want);
  EXPECT_THROW(s.check_feature_pages(1, 3), CorruptStoreError);
  // verify names the file by its hash first ...
  EXPECT_NE(error_of([&] { s.verify(); }).find("features.npy: xxHash64 mismatch"), std::string::npos);
  // ... and by the page when only the page sums can tell (the hash rewritten to match the damage).
  const std::string digest = [&] {
    char buf[17];
    const std::string bytes = testing::read_bytes(store + "/features.npy");
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(XXH64(bytes.data(), bytes.size(), 0)));
    return std::string(buf);
  }();
  edit_manifest(store, [&](nlohmann::json& j) { j["files"]["features.npy"]["xxh64"] = digest; });
  EXPECT_EQ(error_of([&] { Store::open(store).verify(); }), want);
}

TEST(PageSums, StoreWithoutThemOpensAndAddingThemGivesTheFreshStore) {
  TempDir dir;
  SmallStore().write(dir / "fresh.gale");
  SmallStore().write(dir / "old.gale");
  strip_page_sums(dir / "old.gale");
  EXPECT_EQ(testing::read_bytes(dir / "old.gale/manifest.json").find("page_size"), std::string::npos);
  {
    const Store old = Store::open(dir / "old.gale");
    EXPECT_FALSE(old.has_page_sums());
    EXPECT_EQ(old.page_sums("graph/indices.npy"), nullptr);
    EXPECT_EQ(old.verify(), 0u);
    EXPECT_NO_THROW(old.check_feature_pages(0, 4));
    EXPECT_NE(describe_store(old).find("page sums  none"), std::string::npos);
  }
  EXPECT_EQ(add_page_sums(dir / "old.gale"), 9u);
  testing::expect_identical_stores(dir / "fresh.gale", dir / "old.gale");   // sidecars and manifest, byte for byte
  EXPECT_EQ(add_page_sums(dir / "old.gale"), 0u);   // already there: nothing written
  const Store s = Store::open(dir / "old.gale");
  EXPECT_TRUE(s.has_page_sums());
  EXPECT_EQ(s.verify(), 18u);
}

TEST(PageSums, AddingThemRefusesADamagedFile) {
  TempDir dir;
  SmallStore().write(dir / "s.gale");
  strip_page_sums(dir / "s.gale");
  flip_byte(dir / "s.gale/features.npy", 4096 + 3);
  const std::string before = testing::read_bytes(dir / "s.gale/manifest.json");
  const std::string msg = error_of([&] { add_page_sums(dir / "s.gale"); });
  EXPECT_EQ(msg.rfind(dir / "s.gale/features.npy: xxHash64 mismatch", 0), 0u) << msg;
  EXPECT_THROW(add_page_sums(dir / "s.gale"), CorruptStoreError);
  EXPECT_EQ(testing::read_bytes(dir / "s.gale/manifest.json"), before);
  EXPECT_FALSE(Store::open(dir / "s.gale").has_page_sums());
}

TEST(PageSums, ManifestMustNameEverySidecarWithOneSumPerPage) {
  TempDir dir;
  const std::string store = dir / "s.gale";
  const struct {
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  } cases[] = {
      {[](nlohmann::json& j) { j["page_size"] = 8192; }, "manifest.json: expected page_size 4096 (or no key), found 8192"},
      {[](nlohmann::json& j) { j["page_size"] = 0; }, "manifest.json: expected page_size 4096 (or no key), found 0"},
      {[](nlohmann::json& j) { j["page_size"] = "4096"; }, "manifest.json: key 'page_size' has the wrong type"},
      {[](nlohmann::json& j) { j["files"].erase("pages/labels.npy"); },
       "manifest.json: expected pages/labels.npy (the page sums of labels.npy) to be listed because page_size is set"},
      {[](nlohmann::json& j) { j["files"]["pages/labels.npy"]["shape"] = {3}; },
       "pages/labels.npy: expected u32 (2) (one sum per 4096-byte page of labels.npy), found u32 (3)"},
      {[](nlohmann::json& j) { j["files"]["pages/labels.npy"]["dtype"] = "i32"; },
       "pages/labels.npy: expected u32 (2) (one sum per 4096-byte page of labels.npy), found i32 (2)"},
      {[](nlohmann::json& j) { j["files"]["pages/other.npy"] = j["files"]["pages/labels.npy"]; },
       "manifest.json: expected pages/other.npy to be the page sums of a listed file, found no other.npy"},
  };
  for (const auto& c : cases) {
    fs::remove_all(store);
    SmallStore().write(store);
    edit_manifest(store, c.edit);
    const std::string msg = error_of([&] { Store::open(store); });
    EXPECT_EQ(msg.rfind(store + "/", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_THROW(Store::open(store), CorruptStoreError);
  }
  // A sidecar replaced by an array of another dtype is caught by its header.
  fs::remove_all(store);
  SmallStore().write(store);
  testing::write_npy(store + "/pages/labels.npy", DType::kI32, {2}, std::vector<int32_t>{0, 0});
  const std::string msg = error_of([&] { Store::open(store); });
  EXPECT_NE(msg.find("pages/labels.npy: expected u32 (2) as the manifest says, found <i4 (2)"), std::string::npos) << msg;
}

}  // namespace
}  // namespace gale::storage
