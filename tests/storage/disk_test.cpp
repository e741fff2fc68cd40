// The disk tier's storage layer: DiskReader reads what is on disk with either engine, from many
// threads, zero-filling past the end; DiskFeatures serves exactly the rows the mmap path serves,
// whatever the cache, coalescing and thread count, counts its traffic, refuses a damaged page by its
// offset, and charges its memory to the budget.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

#include "kernels/cuda/budget.hpp"
#include "kernels/error.hpp"
#include "storage/disk_features.hpp"
#include "storage/disk_reader.hpp"
#include "storage/page_sums.hpp"
#include "storage/store.hpp"
#include "tests/storage/test_files.hpp"

namespace gale::storage {
namespace {

namespace fs = std::filesystem;
using kernels::cuda::MemoryBudget;
using testing::TempDir;

constexpr size_t kPage = 4096;

using testing::error_of;

// 4096-aligned bytes, freed on scope exit.
struct AlignedBytes {
  explicit AlignedBytes(size_t n) : size(n) {
    void* p = nullptr;
    EXPECT_EQ(posix_memalign(&p, kPage, n), 0);
    data = static_cast<char*>(p);
  }
  ~AlignedBytes() { std::free(data); }
  char* data;
  size_t size;
};

std::string known_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// A reader of `file` with `engine`, or nullptr when io_uring is refused here (the test skips).
std::unique_ptr<DiskReader> open_reader(const std::string& file, IoEngine engine, std::string* why) {
  try {
    return open_disk_reader(file, engine, 16);
  } catch (const ResourceError& e) {
    if (engine != IoEngine::kUring) throw;
    *why = e.what();
    return nullptr;
  }
}

#define OPEN_OR_SKIP(reader, file, engine)                                        \
  std::string skip_reason;                                                        \
  auto reader = open_reader(file, engine, &skip_reason);                          \
  if (!reader) GTEST_SKIP() << "io_uring refused on this machine: " << skip_reason

// ---------------------------------------------------------------------------------------------
// DiskReader, once per engine

class DiskReaderTest : public ::testing::TestWithParam<IoEngine> {};

// Random page-aligned extents (1-8 pages, some running past the end) of a file of known bytes,
// `count` per call, checked against the bytes (zeros past the end).
void read_and_check(DiskReader& reader, const std::string& bytes, int calls, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t pages = (bytes.size() + kPage - 1) / kPage;
  AlignedBytes arena(static_cast<size_t>(count) * 8 * kPage);
  for (int c = 0; c < calls; ++c) {
    std::memset(arena.data, 0xab, arena.size);
    std::vector<ReadRequest> requests;
    for (int i = 0; i < count; ++i) {
      const uint64_t page = rng() % (pages + 2);  // up to two pages wholly past the end
      const uint32_t length = static_cast<uint32_t>((1 + rng() % 8) * kPage);
      requests.push_back(ReadRequest{page * kPage, length, arena.data + static_cast<size_t>(i) * 8 * kPage});
    }
    reader.read(requests.data(), requests.size());
    for (const ReadRequest& r : requests) {
      std::string expected(r.length, '\0');
      if (r.offset < bytes.size()) {
        const size_t have = std::min<size_t>(r.length, bytes.size() - r.offset);
        std::memcpy(expected.data(), bytes.data() + r.offset, have);
      }
      ASSERT_EQ(std::memcmp(expected.data(), r.dest, r.length), 0)
          << "extent at byte " << r.offset << ", " << r.length << " bytes";
    }
  }
}

TEST_P(DiskReaderTest, ReadsRandomExtentsOfKnownBytes) {
  TempDir dir;
  const std::string bytes = known_bytes(300 * kPage + 1234, 7);  // the last page is short
  testing::write_text(dir / "data.bin", bytes);
  OPEN_OR_SKIP(reader, dir / "data.bin", GetParam());
  EXPECT_EQ(reader->file_size(), bytes.size());
  EXPECT_STREQ(reader->engine_name(), GetParam() == IoEngine::kUring ? "io_uring" : "pread");
  EXPECT_TRUE(reader->direct()) << "O_DIRECT refused on " << dir.path();  // ext4 here; tmpfs would say false
  read_and_check(*reader, bytes, 10, 200, 1);  // 200 requests per call: more than the queue depth of 16
}

// measure_reads: whole reads of the asked size, random or in order, counted; request_pages is a
// random 4 KiB read's time in pages of bulk reads, less the page itself, never below zero.
TEST_P(DiskReaderTest, MeasuresItsCeilings) {
  TempDir dir;
  const std::string bytes = known_bytes(64 * kPage, 9);
  testing::write_text(dir / "data.bin", bytes);
  OPEN_OR_SKIP(reader, dir / "data.bin", GetParam());
  AlignedBytes staging(8 * 4 * kPage);
  const ReadCeiling random = measure_reads(*reader, kPage, false, 8, 0.02, 1, staging.data);
  EXPECT_GE(random.reads, 8);
  EXPECT_EQ(random.reads % 8, 0);
  EXPECT_EQ(random.read_bytes, static_cast<uint64_t>(random.reads) * kPage);
  EXPECT_GT(random.reads_per_s(), 0.0);
  // In order, the pass stops at the end of the file (16 reads of 4 pages), or at the time.
  const ReadCeiling pass = measure_reads(*reader, 4 * kPage, true, 8, 10, 1, staging.data);
  EXPECT_EQ(pass.reads, 16);
  EXPECT_EQ(std::memcmp(staging.data, bytes.data() + 8 * 4 * kPage, 8 * 4 * kPage), 0) << "the second round's reads";
  ReadCeiling small, bulk;
  small.reads = 80000, small.seconds = 1;
  bulk.read_bytes = 1600000000, bulk.seconds = 1;
  EXPECT_NEAR(request_pages(small, bulk), 1.6e9 / 4096 / 80000 - 1, 1e-9);
  bulk.read_bytes = 100000000;
  EXPECT_EQ(request_pages(small, bulk), 0.0);
  EXPECT_EQ(request_pages(ReadCeiling{}, bulk), 0.0);
}

TEST_P(DiskReaderTest, ReadsPastTheEndAsZeros) {
  TempDir dir;
  const std::string bytes = known_bytes(2 * kPage + 100, 3);
  testing::write_text(dir / "data.bin", bytes);
  OPEN_OR_SKIP(reader, dir / "data.bin", GetParam());
  AlignedBytes buf(4 * kPage);
  std::memset(buf.data, 0xab, buf.size);
  const ReadRequest tail{2 * kPage, static_cast<uint32_t>(2 * kPage), buf.data};  // 100 bytes, then EOF
  const ReadRequest beyond{8 * kPage, static_cast<uint32_t>(kPage), buf.data + 2 * kPage};
  const ReadRequest requests[] = {tail, beyond};
  reader->read(requests, 2);
  EXPECT_EQ(std::memcmp(buf.data, bytes.data() + 2 * kPage, 100), 0);
  for (size_t i = 100; i < 3 * kPage; ++i) ASSERT_EQ(buf.data[i], 0) << "byte " << i << " of the destinations";
  EXPECT_EQ(static_cast<unsigned char>(buf.data[3 * kPage]), 0xab) << "wrote beyond the request";
}

TEST_P(DiskReaderTest, SeveralThreadsAtOnce) {
  TempDir dir;
  const std::string bytes = known_bytes(500 * kPage, 11);
  testing::write_text(dir / "data.bin", bytes);
  OPEN_OR_SKIP(reader, dir / "data.bin", GetParam());
  std::vector<std::thread> threads;
  std::vector<std::string> failures(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      try {
        read_and_check(*reader, bytes, 20, 50, 100 + t);
      } catch (const std::exception& e) {
        failures[t] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) EXPECT_EQ(f, "");
}

TEST_P(DiskReaderTest, RegisteredBuffersReadTheSame) {
  TempDir dir;
  const std::string bytes = known_bytes(64 * kPage + 17, 5);
  testing::write_text(dir / "data.bin", bytes);
  OPEN_OR_SKIP(reader, dir / "data.bin", GetParam());
  AlignedBytes staging(16 * kPage);
  reader->register_buffer(staging.data, staging.size);
  for (int round = 0; round < 20; ++round) {
    std::vector<ReadRequest> requests;
    for (uint32_t i = 0; i < 8; ++i) {
      const uint64_t page = (round * 3 + i * 7) % 66;
      requests.push_back(ReadRequest{page * kPage, static_cast<uint32_t>(2 * kPage), staging.data + i * 2 * kPage});
    }
    reader->read(requests.data(), requests.size());
    for (const ReadRequest& r : requests) {
      std::string expected(r.length, '\0');
      if (r.offset < bytes.size())
        std::memcpy(expected.data(), bytes.data() + r.offset, std::min<size_t>(r.length, bytes.size() - r.offset));
      ASSERT_EQ(std::memcmp(expected.data(), r.dest, r.length), 0) << "extent at byte " << r.offset;
    }
  }
  reader->unregister_buffers();
}

// Every completion is checked: a misaligned O_DIRECT read fails with EINVAL, named with its offset,
// and the reader (its ring, its pool) still serves the next call.
TEST_P(DiskReaderTest, AFailedReadIsNamedAndTheReaderGoesOn) {
  TempDir dir;
  const std::string bytes = known_bytes(64 * kPage, 13);
  testing::write_text(dir / "data.bin", bytes);
  OPEN_OR_SKIP(reader, dir / "data.bin", GetParam());
  if (!reader->direct()) GTEST_SKIP() << "no O_DIRECT on " << dir.path() << ": misaligned reads succeed";
  AlignedBytes buf(40 * kPage);
  std::vector<ReadRequest> requests;
  for (uint32_t i = 0; i < 32; ++i) requests.push_back(ReadRequest{i * kPage, static_cast<uint32_t>(kPage), buf.data + i * kPage});
  requests[5].dest = buf.data + 33 * kPage + 1;  // not 4096-aligned
  const std::string message = error_of([&] { reader->read(requests.data(), requests.size()); });
  EXPECT_NE(message.find(dir / "data.bin" + ": read failed at byte " + std::to_string(5 * kPage)), std::string::npos)
      << message;
  EXPECT_NE(message.find(std::strerror(EINVAL)), std::string::npos) << message;
  read_and_check(*reader, bytes, 3, 40, 2);
}

TEST_P(DiskReaderTest, MissingFileIsNamed) {
  TempDir dir;
  const std::string missing = dir / "nope.npy";
  std::string message;
  try {
    open_disk_reader(missing, GetParam());
  } catch (const InputError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find(missing), std::string::npos) << message;
  EXPECT_NE(message.find("No such file"), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskReaderTest, ::testing::Values(IoEngine::kPread, IoEngine::kUring),
                         [](const ::testing::TestParamInfo<IoEngine>& info) {
                           return info.param == IoEngine::kUring ? "io_uring" : "pread";
                         });

TEST(IoEngine, EnvironmentChoosesAndABadValueIsNamed) {
  const char* old = std::getenv("GALE_IO_ENGINE");
  const std::string saved = old ? old : "";
  setenv("GALE_IO_ENGINE", "pread", 1);
  EXPECT_EQ(io_engine_from_env(), IoEngine::kPread);
  TempDir dir;
  testing::write_text(dir / "data.bin", known_bytes(kPage, 1));
  EXPECT_STREQ(open_disk_reader(dir / "data.bin", IoEngine::kAuto)->engine_name(), "pread");
  setenv("GALE_IO_ENGINE", "io_uring", 1);
  EXPECT_EQ(io_engine_from_env(), IoEngine::kUring);
  setenv("GALE_IO_ENGINE", "aio", 1);
  const std::string message = error_of([] { io_engine_from_env(); });
  EXPECT_NE(message.find("GALE_IO_ENGINE=aio"), std::string::npos) << message;
  unsetenv("GALE_IO_ENGINE");
  EXPECT_EQ(io_engine_from_env(), IoEngine::kAuto);
  if (old) setenv("GALE_IO_ENGINE", saved.c_str(), 1);
}

// ---------------------------------------------------------------------------------------------
// DiskFeatures

// A store of n nodes on a ring graph with random features of dim x dtype.
void write_feature_store(const std::string& path, int64_t n, int64_t dim, DType dtype, uint32_t seed) {
  std::vector<int64_t> indptr(static_cast<size_t>(n + 1));
  std::iota(indptr.begin(), indptr.end(), 0);
  std::vector<int32_t> indices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = static_cast<int32_t>((i + 1) % n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> features(static_cast<size_t>(n * dim));
  for (auto& f : features) f = normal(rng);
  std::vector<uint16_t> narrow(features.size());
  if (dtype != DType::kF32) convert_from_f32(dtype, features.data(), narrow.data(), features.size());

  StoreWriter w(path, false);
  w.write_array("graph/indptr.npy", DType::kI64, {n + 1}, indptr.data());
  w.write_array("graph/indices.npy", DType::kI32, {n}, indices.data());
  w.write_array("features.npy", dtype, {n, dim},
                dtype == DType::kF32 ? static_cast<const void*>(features.data()) : narrow.data());
  Manifest& m = w.manifest();
  m.num_nodes = n;
  m.num_edges = n;
  m.feature_dim = dim;
  m.feature_dtype = dtype_name(dtype);
  w.commit();
}

// page_sum of every page of `file`, as the store's sidecar holds them.
std::vector<uint32_t> sums_of(const std::string& file) {
  const std::string bytes = testing::read_bytes(file);
  std::vector<uint32_t> sums;
  for (size_t at = 0; at < bytes.size(); at += kPage)
    sums.push_back(page_sum(bytes.data() + at, std::min(kPage, bytes.size() - at)));
  return sums;
}

// Random ids with repeats, unsorted.
std::vector<int64_t> random_ids(int64_t n, size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> ids(count);
  for (auto& id : ids) id = static_cast<int64_t>(rng() % static_cast<uint32_t>(n));
  if (count > 3) ids[count - 1] = ids[0], ids[count - 2] = ids[1];  // repeats for sure
  return ids;
}

// Hottest first: a fixed random order.
std::vector<int64_t> priority_of(int64_t n, uint32_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  return order;
}

void expect_same_rows(DiskFeatures& disk, const Store& store, const std::vector<int64_t>& ids, const std::string& what) {
  const size_t d = static_cast<size_t>(store.feature_dim());
  std::vector<float> got(ids.size() * d, -1.0f), want(ids.size() * d, -2.0f);
  disk.read_rows(ids.data(), static_cast<int64_t>(ids.size()), got.data());
  store.read_feature_rows(ids.data(), static_cast<int64_t>(ids.size()), want.data());
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(std::memcmp(got.data() + i * d, want.data() + i * d, d * sizeof(float)), 0)
        << what << ": row " << i << " (node " << ids[i] << ")";
  }
}

TEST(DiskFeatures, RowsEqualTheMappedStoreBitForBit) {
  TempDir dir;
  struct Case {
    DType dtype;
    int64_t dim;  // 100 x f32 = 400 B rows straddle pages; 64 x f16 = 128 B rows pack 32 to a page
  };
  const int64_t n = 3001;
  for (const Case c : {Case{DType::kF32, 100}, Case{DType::kF16, 64}, Case{DType::kBF16, 100}}) {
    const std::string path = dir / ("s-" + dtype_name(c.dtype) + ".gale");
    write_feature_store(path, n, c.dim, c.dtype, 42);
    const Store store = Store::open(path);
    const std::vector<uint32_t> sums = sums_of(path + "/features.npy");
    const uint64_t all = static_cast<uint64_t>(n * c.dim) * sizeof(float);
    for (const uint64_t cache_bytes : {uint64_t{0}, all / 3, all}) {
      for (const int gap : {0, 8}) {
        DiskFeatureOptions o;
        o.cache_bytes = cache_bytes;
        o.max_gap_pages = gap;
        o.page_sums = sums.data();
        DiskFeatures disk(store, priority_of(n, 9), o);
        const std::string what = dtype_name(c.dtype) + " dim " + std::to_string(c.dim) + " cache " +
                                 std::to_string(cache_bytes) + " gap " + std::to_string(gap);
        EXPECT_EQ(disk.cached_rows(), static_cast<int64_t>(cache_bytes / (c.dim * sizeof(float)))) << what;
        expect_same_rows(disk, store, random_ids(n, 1000, 1), what);
        expect_same_rows(disk, store, random_ids(n, 7, 2), what);
        expect_same_rows(disk, store, {n - 1, 0, n - 1}, what);  // the last row ends inside the last page
        expect_same_rows(disk, store, {}, what);
      }
    }
  }
}

TEST(DiskFeatures, BothEnginesServeTheSameRows) {
  TempDir dir;
  write_feature_store(dir / "s.gale", 2000, 100, DType::kF32, 5);
  const Store store = Store::open(dir / "s.gale");
  for (IoEngine engine : {IoEngine::kPread, IoEngine::kUring}) {
    DiskFeatureOptions o;
    o.engine = engine;
    o.cache_bytes = 500 * 100 * 4;
    std::unique_ptr<DiskFeatures> disk;
    try {
      disk = std::make_unique<DiskFeatures>(store, priority_of(2000, 1), o);
    } catch (const ResourceError& e) {
      ASSERT_EQ(engine, IoEngine::kUring) << e.what();
      GTEST_SKIP() << "io_uring refused on this machine: " << e.what();
    }
    expect_same_rows(*disk, store, random_ids(2000, 3000, 3), disk->reader().engine_name());
    EXPECT_NE(disk->describe().find(disk->reader().engine_name()), std::string::npos) << disk->describe();
  }
}

TEST(DiskFeatures, StatsAddUp) {
  TempDir dir;
  const int64_t n = 5000, dim = 100;
  write_feature_store(dir / "s.gale", n, dim, DType::kF32, 8);
  const Store store = Store::open(dir / "s.gale");
  DiskFeatureOptions o;
  o.cache_bytes = 1000 * dim * 4;
  o.max_gap_pages = 8;
  DiskFeatures disk(store, priority_of(n, 4), o);
  EXPECT_EQ(disk.take_stats().rows_requested, 0) << "the cache fill is not counted";

  const std::vector<int64_t> ids = random_ids(n, 2000, 6);
  std::vector<float> out(ids.size() * dim);
  disk.read_rows(ids.data(), static_cast<int64_t>(ids.size()), out.data());
  const DiskFeatureStats s = disk.take_stats();
  int64_t hits = 0;
  for (int64_t id : ids) hits += disk.is_cached(id);
  std::vector<int64_t> missed;
  for (int64_t id : ids)
    if (!disk.is_cached(id)) missed.push_back(id);
  std::sort(missed.begin(), missed.end());
  missed.erase(std::unique(missed.begin(), missed.end()), missed.end());

  EXPECT_EQ(s.rows_requested, 2000);
  EXPECT_EQ(s.cache_hits, hits);
  EXPECT_GT(s.cache_hits, 0);
  EXPECT_EQ(s.cache_hits + s.disk_rows, s.rows_requested);
  EXPECT_EQ(s.distinct_disk_rows, static_cast<int64_t>(missed.size()));
  EXPECT_EQ(s.useful_bytes, missed.size() * dim * 4);
  EXPECT_GE(s.disk_bytes, s.useful_bytes);
  EXPECT_EQ(s.disk_bytes % kPage, 0u);
  EXPECT_GT(s.read_calls, 0);
  EXPECT_LE(static_cast<uint64_t>(s.read_calls) * kPage, s.disk_bytes);
  EXPECT_GE(s.read_seconds, 0.0);

  const DiskFeatureStats again = disk.take_stats();
  EXPECT_EQ(again.rows_requested, 0);
  EXPECT_EQ(again.disk_bytes, 0u);

  // Coalescing: without gaps, every needed page is read exactly once.
  DiskFeatureOptions no_gap;
  no_gap.max_gap_pages = 0;
  DiskFeatures plain(store, {}, no_gap);
  plain.read_rows(ids.data(), static_cast<int64_t>(ids.size()), out.data());
  std::vector<uint64_t> pages;
  for (int64_t id : ids) {
    const uint64_t begin = 4096 + static_cast<uint64_t>(id) * dim * 4;
    for (uint64_t p = begin / kPage; p <= (begin + dim * 4 - 1) / kPage; ++p) pages.push_back(p);
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  EXPECT_EQ(plain.take_stats().disk_bytes, pages.size() * kPage);
  EXPECT_NE(plain.describe().find("host cache 0 of 5000 rows"), std::string::npos) << plain.describe();
}

// Requests: runs of needed pages merge across gaps of fewer pages than a request costs (a read of n
// pages costing n + request_pages), or of at most max_gap_pages when that is given. The rows are the
// store's either way.
TEST(DiskFeatures, RunsMergeAcrossGapsShorterThanARequestCosts) {
  TempDir dir;
  const int64_t n = 1000, dim = 128;  // 512-byte rows, 8 to a page; data page d holds rows 8d..8d+7
  write_feature_store(dir / "s.gale", n, dim, DType::kF32, 3);
  const Store store = Store::open(dir / "s.gale");
  // One row on each of the data pages: two 10-page runs 4 pages apart (0-9, 14-23), three single
  // pages 3 apart (40, 44, 48) and two 6 apart (60, 67).
  std::vector<int64_t> ids;
  std::vector<int> pages;
  for (int d = 0; d <= 9; ++d) pages.push_back(d);
  for (int d = 14; d <= 23; ++d) pages.push_back(d);
  for (int d : {40, 44, 48, 60, 67}) pages.push_back(d);
  for (int d : pages) ids.push_back(8 * d + d % 8);
  struct Case {
    const char* what;
    double request_pages;
    int gap;
    int expect_gap;
    int64_t requests;
    uint64_t pages;
  };
  for (const Case c : {Case{"cost 4", 4, -1, 3, 5, 10 + 10 + 9 + 1 + 1}, Case{"cost 3.5", 3.5, -1, 3, 5, 31},
                       Case{"cost 7", 7, -1, 6, 3, 24 + 9 + 8}, Case{"cost 0.5", 0.5, -1, 0, 7, 25},
                       Case{"gap 4", 0, 4, 4, 4, 24 + 9 + 1 + 1}, Case{"gap 0", 7, 0, 0, 7, 25}}) {
    DiskFeatureOptions o;
    o.request_pages = c.request_pages;
    o.max_gap_pages = c.gap;
    DiskFeatures disk(store, {}, o);
    EXPECT_EQ(disk.gap_pages(), c.expect_gap) << c.what;
    expect_same_rows(disk, store, ids, c.what);
    const DiskFeatureStats s = disk.take_stats();
    EXPECT_EQ(s.read_calls, c.requests) << c.what;
    EXPECT_EQ(s.disk_bytes, c.pages * kPage) << c.what;
    EXPECT_EQ(s.needed_bytes, 25 * kPage) << c.what;
  }
  DiskFeatureOptions o;
  EXPECT_EQ(DiskFeatures(store, {}, o).request_pages(), kDefaultRequestPages) << "a small file is not probed";
  EXPECT_NE(DiskFeatures(store, {}, o).describe().find("gaps of up to 3 (a request costing 4.0 pages)"), std::string::npos)
      << DiskFeatures(store, {}, o).describe();
  o.request_pages = kMeasureRequestPages;
  DiskFeatures measured(store, {}, o);
  EXPECT_GE(measured.request_pages(), 0.0);
  EXPECT_GE(measured.gap_pages(), 0);
  expect_same_rows(measured, store, ids, "measured");
  o.request_pages = -2;
  EXPECT_THROW(DiskFeatures(store, {}, o), InputError);
}

TEST(DiskFeatures, ConcurrentCallsAgreeWithSerialOnes) {
  TempDir dir;
  const int64_t n = 4000, dim = 100;
  write_feature_store(dir / "s.gale", n, dim, DType::kF16, 12);
  const Store store = Store::open(dir / "s.gale");
  const std::vector<uint32_t> sums = sums_of(dir / "s.gale/features.npy");
  DiskFeatureOptions o;
  o.cache_bytes = 800 * dim * 4;
  o.max_gap_pages = 8;
  o.page_sums = sums.data();
  DiskFeatures disk(store, priority_of(n, 2), o);
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::vector<float>> serial;
  for (int t = 0; t < 4; ++t) {
    ids.push_back(random_ids(n, 1500, 50 + t));
    serial.emplace_back(ids[t].size() * dim);
    disk.read_rows(ids[t].data(), static_cast<int64_t>(ids[t].size()), serial[t].data());
  }
  disk.take_stats();
  std::vector<std::vector<float>> parallel(4);
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      try {
        parallel[t].assign(ids[t].size() * dim, 0.0f);
        for (int round = 0; round < 5; ++round)
          disk.read_rows(ids[t].data(), static_cast<int64_t>(ids[t].size()), parallel[t].data());
      } catch (const std::exception& e) {
        failures[t] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(failures[t], "");
    EXPECT_TRUE(std::memcmp(parallel[t].data(), serial[t].data(), serial[t].size() * sizeof(float)) == 0)
        << "thread " << t;
  }
  const DiskFeatureStats s = disk.take_stats();
  EXPECT_EQ(s.rows_requested, 4 * 5 * 1500);
  EXPECT_EQ(s.cache_hits + s.disk_rows, s.rows_requested);
}

// XORs the byte at `offset` of `file` with `mask`.
void flip_bits(const std::string& file, uint64_t offset, char mask) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST(DiskFeatures, FlippedByteIsReportedWithItsPage) {
  TempDir dir;
  const int64_t n = 3000, dim = 100;
  write_feature_store(dir / "s.gale", n, dim, DType::kF32, 21);
  const std::string file = dir / "s.gale/features.npy";
  const std::vector<uint32_t> sums = sums_of(file);  // the store as written
  const Store store = Store::open(dir / "s.gale");

  const int64_t bad_row = 1234;
  const uint64_t bad_byte = 4096 + static_cast<uint64_t>(bad_row) * dim * 4 + 17;
  const uint64_t bad_page = bad_byte / kPage;
  flip_bits(file, bad_byte, 0x10);

  DiskFeatureOptions o;
  o.page_sums = sums.data();
  DiskFeatures disk(store, {}, o);
  std::vector<float> out(dim);
  const int64_t good = 10;
  EXPECT_NO_THROW(disk.read_rows(&good, 1, out.data()));
  std::string message;
  try {
    disk.read_rows(&bad_row, 1, out.data());
  } catch (const CorruptStoreError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("features.npy: page checksum mismatch at byte offset " + std::to_string(bad_page * kPage) +
                         " (page " + std::to_string(bad_page) + ")"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("gale info --verify"), std::string::npos) << message;

  // The cache fill checks its pages too.
  DiskFeatureOptions cached = o;
  cached.cache_bytes = 100 * dim * 4;
  EXPECT_THROW(DiskFeatures(store, {5, bad_row, 7}, cached), CorruptStoreError);
  // By default the store's own sums (pages/features.npy) are used.
  if (store.has_page_sums()) {
    DiskFeatures by_store(store, {}, DiskFeatureOptions{});
    EXPECT_NO_THROW(by_store.read_rows(&good, 1, out.data()));
    const std::string m = error_of([&] { by_store.read_rows(&bad_row, 1, out.data()); });
    EXPECT_NE(m.find("at byte offset " + std::to_string(bad_page * kPage)), std::string::npos) << m;
  }
  // Unchecked, the damage passes unseen.
  DiskFeatureOptions unchecked;
  unchecked.check_page_sums = false;
  DiskFeatures blind(store, {}, unchecked);
  EXPECT_NO_THROW(blind.read_rows(&bad_row, 1, out.data()));
}

// A read larger than the staging buffer goes in rounds, each half of the buffer read while the
// other's pages are checked: every row still arrives bit for bit, every page is checked, and a bad
// page in a late round stops the read naming its offset, with the budget given back.
TEST(DiskFeatures, ReadsOfManyRoundsServeTheSameRowsAndCheckEveryPage) {
  TempDir dir;
  const int64_t n = 100000, dim = 128;  // 51 MB of features: rounds of 16 MiB halves (or 10.7 MiB thirds)
  ASSERT_GT(static_cast<uint64_t>(n * dim * 4), 3 * DiskFeatures::max_staging_bytes() / 2);
  write_feature_store(dir / "s.gale", n, dim, DType::kF32, 33);
  const std::string file = dir / "s.gale/features.npy";
  const std::vector<uint32_t> sums = sums_of(file);
  const Store store = Store::open(dir / "s.gale");
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  std::vector<int64_t> scattered = random_ids(n, 60000, 4);
  // Rounds one after another, and overlapped (the next round's reads out while one is in flight).
  const auto options = [&](MemoryBudget* budget, bool overlap) {
    DiskFeatureOptions o;
    o.page_sums = sums.data();
    o.budget = budget;
    o.overlap_rounds = overlap;
    return o;
  };
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "rounds overlapped" : "rounds one at a time");
    MemoryBudget budget(uint64_t{1} << 30, "--host-mem-budget");
    const DiskFeatureOptions o = options(&budget, overlap);
    DiskFeatures disk(store, {}, o);
    expect_same_rows(disk, store, all, "every row, in order");
    expect_same_rows(disk, store, scattered, "random rows");
    EXPECT_LE(budget.peak() - budget.in_use(), DiskFeatures::max_staging_bytes()) << "staging stays within its bound";
    const DiskFeatureStats st = disk.take_stats();
    EXPECT_GE(st.disk_bytes, static_cast<uint64_t>(n * dim * 4)) << "every page of the file was read";
    EXPECT_GT(st.read_seconds, 0.0);
    // And a full cache, filled in rounds of its own.
    DiskFeatureOptions cached = o;
    cached.cache_bytes = static_cast<uint64_t>(n * dim * 4);
    DiskFeatures filled(store, priority_of(n, 3), cached);
    EXPECT_EQ(filled.cached_rows(), n);
    expect_same_rows(filled, store, scattered, "cached rows");
  }
  const int64_t bad_row = n - 1000;  // in the last round
  const uint64_t bad_byte = 4096 + static_cast<uint64_t>(bad_row) * dim * 4 + 5;
  flip_bits(file, bad_byte, 0x01);
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "rounds overlapped" : "rounds one at a time");
    MemoryBudget budget(uint64_t{1} << 30, "--host-mem-budget");
    DiskFeatures disk(store, {}, options(&budget, overlap));
    const uint64_t before = budget.in_use();
    std::vector<float> out(all.size() * static_cast<size_t>(dim));
    const std::string message = error_of([&] { disk.read_rows(all.data(), n, out.data()); });
    EXPECT_NE(message.find("page checksum mismatch at byte offset " + std::to_string(bad_byte / kPage * kPage)),
              std::string::npos)
        << message;
    EXPECT_EQ(budget.in_use(), before) << "the staging buffer was given back";
  }
}

TEST(DiskFeatures, BudgetTooSmallForTheCacheIsRefused) {
  TempDir dir;
  const int64_t n = 2000, dim = 100;
  write_feature_store(dir / "s.gale", n, dim, DType::kF32, 2);
  const Store store = Store::open(dir / "s.gale");
  MemoryBudget small(200 * 1024, "--host-mem-budget");
  DiskFeatureOptions o;
  o.cache_bytes = 1000 * dim * 4;  // 400 kB of rows
  o.budget = &small;
  std::string message;
  try {
    DiskFeatures disk(store, priority_of(n, 1), o);
  } catch (const ResourceError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("--host-mem-budget"), std::string::npos) << message;
  EXPECT_EQ(small.in_use(), 0u);

  // A budget that fits: cache, slot table and staging are charged, and returned at the end.
  MemoryBudget ample(64 << 20, "--host-mem-budget");
  o.budget = &ample;
  {
    DiskFeatures disk(store, priority_of(n, 1), o);
    EXPECT_EQ(ample.in_use(), 1000u * dim * 4 + n * 4u);
    const std::vector<int64_t> ids = random_ids(n, 500, 3);
    std::vector<float> out(ids.size() * dim);
    disk.read_rows(ids.data(), static_cast<int64_t>(ids.size()), out.data());
    EXPECT_GT(ample.peak(), ample.in_use()) << "staging was not charged";
    EXPECT_EQ(ample.in_use(), 1000u * dim * 4 + n * 4u);
  }
  EXPECT_EQ(ample.in_use(), 0u);
}

TEST(DiskFeatures, BadIdsAreInputErrors) {
  TempDir dir;
  write_feature_store(dir / "s.gale", 100, 8, DType::kF32, 2);
  const Store store = Store::open(dir / "s.gale");
  DiskFeatureOptions o;
  o.cache_bytes = 10 * 8 * 4;
  EXPECT_THROW(DiskFeatures(store, {3, 100}, o), InputError);
  DiskFeatures disk(store, {}, o);
  const int64_t bad = -1;
  std::vector<float> out(8);
  EXPECT_THROW(disk.read_rows(&bad, 1, out.data()), InputError);
}

// The distinct uncached ids of `ids`, ascending: what a read-ahead window of them holds.
std::vector<int64_t> window_ids(const DiskFeatures& disk, const std::vector<int64_t>& ids) {
  std::vector<int64_t> misses;
  disk.collect_misses(ids.data(), static_cast<int64_t>(ids.size()), &misses);
  std::sort(misses.begin(), misses.end());
  misses.erase(std::unique(misses.begin(), misses.end()), misses.end());
  return misses;
}

// Slots 0, 1, ... for `ids`.
std::vector<int32_t> first_slots(const std::vector<int64_t>& ids) {
  std::vector<int32_t> slots(ids.size());
  std::iota(slots.begin(), slots.end(), 0);
  return slots;
}

// A caller's own staging (the read-ahead's, for all its windows): charged while it lives, registered
// with the reader, and read into instead of a buffer of each call's own; the same rows, both with
// rounds one at a time and overlapped; the reader reads on after it is gone.
TEST(DiskFeatures, ReadStagingIsChargedAndServesWindowReadsOfManyRounds) {
  TempDir dir;
  const int64_t n = 40000, dim = 128;  // 20 MB of features: two or more rounds in 32 MiB of staging
  write_feature_store(dir / "s.gale", n, dim, DType::kF32, 41);
  const Store store = Store::open(dir / "s.gale");
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  const size_t d = static_cast<size_t>(dim);
  std::vector<float> want(all.size() * d);
  store.read_feature_rows(all.data(), n, want.data());
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "rounds overlapped" : "rounds one at a time");
    MemoryBudget budget(uint64_t{1} << 30, "--host-mem-budget");
    DiskFeatureOptions o;
    o.budget = &budget;
    o.overlap_rounds = overlap;
    DiskFeatures disk(store, {}, o);
    const uint64_t before = budget.in_use();
    {
      ReadStaging staging(disk);
      EXPECT_EQ(staging.bytes(), DiskFeatures::max_staging_bytes());
      EXPECT_EQ(budget.in_use(), before + staging.bytes()) << "charged while it lives";
      auto pool = std::make_shared<RowPool>(&budget, n, dim);
      const uint64_t peak = budget.peak();
      std::vector<int32_t> slots(all.size());
      std::iota(slots.begin(), slots.end(), 0);
      const auto window = disk.read_window(pool, all, slots, {}, {}, &staging);
      EXPECT_EQ(budget.peak(), peak) << "no staging of the call's own";
      if (std::string(disk.reader().engine_name()) == "io_uring")  // registered, or refused (RLIMIT_MEMLOCK)
        EXPECT_TRUE(disk.reader().fixed_reads() > 0 || disk.reader().refused_registrations() > 0)
            << disk.reader().fixed_reads() << " fixed reads, " << disk.reader().refused_registrations() << " refused";
      const DiskFeatureStats s = disk.take_stats();
      EXPECT_GE(s.disk_bytes, static_cast<uint64_t>(n * dim * 4));
      std::vector<float> got(all.size() * d);
      disk.read_rows(all.data(), n, got.data(), window.get());
      EXPECT_EQ(got, want) << "every row served from the window, the store's bits";
    }
    EXPECT_EQ(budget.in_use(), before) << "given back";
    std::vector<float> again(all.size() * d);
    disk.read_rows(all.data(), n, again.data());
    EXPECT_EQ(again, want) << "read on, the staging unregistered";
  }
}

TEST(DiskFeatures, ReadAheadWindowsServeTheSameRowsWithoutReadingAgain) {
  TempDir dir;
  const int64_t n = 6000, dim = 100;
  write_feature_store(dir / "s.gale", n, dim, DType::kF32, 21);
  const Store store = Store::open(dir / "s.gale");
  MemoryBudget budget(64 << 20, "--host-mem-budget");
  DiskFeatureOptions o;
  o.cache_bytes = 1500 * dim * 4;
  o.budget = &budget;
  DiskFeatures disk(store, priority_of(n, 9), o);
  const uint64_t fixed = budget.in_use();
  disk.take_stats();
  auto pool = std::make_shared<RowPool>(&budget, n, dim);
  EXPECT_EQ(budget.in_use(), fixed + pool->bytes()) << "the pool is charged while alive";

  // Two batches of a window, and a third batch in the next window.
  const std::vector<int64_t> a = random_ids(n, 700, 31), b = random_ids(n, 700, 32), c = random_ids(n, 900, 33);
  std::vector<int64_t> both = a;
  both.insert(both.end(), b.begin(), b.end());
  const std::vector<int64_t> first_ids = window_ids(disk, both);
  for (int64_t id : first_ids) EXPECT_FALSE(disk.is_cached(id));
  const auto first = disk.read_window(pool, first_ids, first_slots(first_ids));
  EXPECT_EQ(first->rows(), static_cast<int64_t>(first_ids.size()));
  for (size_t k = 0; k < first_ids.size(); ++k) EXPECT_EQ(pool->holds(static_cast<int64_t>(k)), first_ids[k]);
  DiskFeatureStats s = disk.take_stats();
  EXPECT_EQ(s.windows, 1);
  EXPECT_EQ(s.read_ahead_rows, first->rows());
  EXPECT_EQ(s.distinct_disk_rows, first->rows());
  EXPECT_GE(s.disk_bytes, s.needed_bytes);
  EXPECT_GE(s.needed_bytes, s.useful_bytes);

  // Served from the cache and the window, the same bits as the store's, nothing read.
  const size_t d = static_cast<size_t>(dim);
  for (const auto* ids : {&a, &b}) {
    std::vector<float> got(ids->size() * d), want(ids->size() * d);
    disk.read_rows(ids->data(), static_cast<int64_t>(ids->size()), got.data(), first.get());
    store.read_feature_rows(ids->data(), static_cast<int64_t>(ids->size()), want.data());
    EXPECT_EQ(got, want);
  }
  s = disk.take_stats();
  EXPECT_EQ(s.disk_bytes, 0u);
  EXPECT_EQ(s.disk_rows, 0);
  EXPECT_EQ(s.cache_hits + s.read_ahead_hits, s.rows_requested);
  EXPECT_GT(s.read_ahead_hits, 0);

  // The next window keeps the slots of the rows the pool holds (not read again) and reads the rest
  // into free slots.
  const std::vector<int64_t> next_ids = window_ids(disk, c);
  std::vector<int32_t> next_slots;
  int32_t free_slot = static_cast<int32_t>(first_ids.size());
  int64_t shared = 0;
  for (int64_t id : next_ids) {
    const auto it = std::lower_bound(first_ids.begin(), first_ids.end(), id);
    const bool held = it != first_ids.end() && *it == id;
    shared += held;
    next_slots.push_back(held ? static_cast<int32_t>(it - first_ids.begin()) : free_slot++);
  }
  ASSERT_GT(shared, 0);
  const auto next = disk.read_window(pool, next_ids, next_slots);
  s = disk.take_stats();
  EXPECT_EQ(s.distinct_disk_rows, next->rows() - shared);
  EXPECT_EQ(s.read_ahead_rows, next->rows());
  std::vector<float> got(c.size() * d), want(c.size() * d);
  disk.read_rows(c.data(), static_cast<int64_t>(c.size()), got.data(), next.get());
  store.read_feature_rows(c.data(), static_cast<int64_t>(c.size()), want.data());
  EXPECT_EQ(got, want);

  // A slot given another row is read again: the first window's slots, once it is gone, hold the
  // rows of c in reverse order.
  std::vector<int32_t> reused(next_ids.size());
  for (size_t k = 0; k < reused.size(); ++k) reused[k] = static_cast<int32_t>(reused.size() - 1 - k);
  const auto again = disk.read_window(pool, next_ids, reused);
  s = disk.take_stats();
  EXPECT_GT(s.distinct_disk_rows, 0);
  disk.read_rows(c.data(), static_cast<int64_t>(c.size()), got.data(), again.get());
  EXPECT_EQ(got, want);

  // A row no window holds is still read from disk.
  std::vector<float> one(d);
  int64_t outside = 0;
  while (disk.is_cached(outside) || again->find(outside) != nullptr) ++outside;
  disk.take_stats();
  disk.read_rows(&outside, 1, one.data(), again.get());
  EXPECT_EQ(disk.take_stats().disk_rows, 1);
}

// Extra rows read with a window go into their slots of the pool, on the window's pages, without
// being the window's; a later window whose rows they are reads nothing.
TEST(DiskFeatures, ExtraRowsRideAlongWithAWindowsRead) {
  TempDir dir;
  const int64_t n = 1000, dim = 128;  // 8 rows to a page
  write_feature_store(dir / "s.gale", n, dim, DType::kF32, 4);
  const Store store = Store::open(dir / "s.gale");
  DiskFeatureOptions o;
  o.max_gap_pages = 0;
  DiskFeatures disk(store, {}, o);
  const auto pool = std::make_shared<RowPool>(nullptr, 16, dim);
  EXPECT_EQ(disk.pages_of(0), std::make_pair(uint64_t{1}, uint64_t{1})) << "the header is the first page";
  EXPECT_EQ(disk.pages_of(9), std::make_pair(uint64_t{2}, uint64_t{2}));
  // The window's rows 1 and 17 (pages 1 and 3); rows 2, 3 and 18 ride along.
  const auto first = disk.read_window(pool, {1, 17}, {0, 1}, {2, 3, 18}, {5, 6, 7});
  DiskFeatureStats s = disk.take_stats();
  EXPECT_EQ(s.needed_bytes, 2 * kPage);
  EXPECT_EQ(s.disk_bytes, 2 * kPage);
  EXPECT_EQ(s.distinct_disk_rows, 5);
  EXPECT_EQ(first->rows(), 2);
  EXPECT_EQ(first->find(2), nullptr) << "a rider is not the window's";
  for (const auto& [id, slot] : std::vector<std::pair<int64_t, int32_t>>{{1, 0}, {17, 1}, {2, 5}, {3, 6}, {18, 7}})
    EXPECT_EQ(pool->holds(slot), id);
  const auto later = disk.read_window(pool, {2, 3, 18}, {5, 6, 7});
  s = disk.take_stats();
  EXPECT_EQ(s.read_calls, 0) << "the riders' rows are in the pool";
  std::vector<float> got(3 * dim), want(3 * dim);
  const std::vector<int64_t> ids = {18, 2, 3};
  disk.read_rows(ids.data(), 3, got.data(), later.get());
  store.read_feature_rows(ids.data(), 3, want.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(disk.take_stats().read_calls, 0);
  EXPECT_THROW(disk.read_window(pool, {1, 17}, {0, 1}, {17}, {2}), InputError) << "both the window's and a rider";
  EXPECT_THROW(disk.read_window(pool, {1, 17}, {0, 1}, {4}, {1}), InputError) << "a rider in the window's slot";
  EXPECT_THROW(disk.read_window(pool, {1, 17}, {0, 1}, {4, 3}, {2, 3}), InputError) << "riders not ascending";
  EXPECT_THROW(disk.read_window(pool, {1, 17}, {0, 1}, {4}, {}), InputError) << "a slot for each rider";
}

TEST(DiskFeatures, ReadAheadWindowsAreCheckedAndChargedAndRefused) {
  TempDir dir;
  const int64_t n = 3000, dim = 64;
  write_feature_store(dir / "s.gale", n, dim, DType::kF32, 22);
  const Store store = Store::open(dir / "s.gale");
  DiskFeatureOptions o;
  MemoryBudget small(64 * 1024, "--host-mem-budget");
  o.budget = &small;
  DiskFeatures disk(store, {}, o);
  // 1000 rows of 256 bytes do not fit 64 KiB: refused, nothing left charged.
  EXPECT_THROW(RowPool(&small, 1000, dim), ResourceError);
  EXPECT_EQ(small.in_use(), 0u);
  auto pool = std::make_shared<RowPool>(nullptr, 16, dim);
  EXPECT_THROW(disk.read_window(pool, {5, 5}, {0, 1}), InputError) << "repeats";
  EXPECT_THROW(disk.read_window(pool, {7, 3}, {0, 1}), InputError) << "not ascending";
  EXPECT_THROW(disk.read_window(pool, {3, n}, {0, 1}), InputError) << "not a node";
  EXPECT_THROW(disk.read_window(pool, {3, 4}, {1, 1}), InputError) << "one slot for two rows";
  EXPECT_THROW(disk.read_window(pool, {3, 4}, {0, 16}), InputError) << "not a slot";
  EXPECT_THROW(disk.read_window(pool, {3, 4}, {0}), InputError) << "a slot for each row";

  // A flipped byte in a page a window reads is named with its offset, and the slots it was read
  // into hold nothing.
  const std::string file = dir / "s.gale/features.npy";
  const std::vector<uint32_t> sums = sums_of(file);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 40 * 256 + 17);
    f.put('\x5a');
  }
  DiskFeatureOptions checked;
  checked.page_sums = sums.data();
  DiskFeatures flipped(store, {}, checked);
  try {
    flipped.read_window(pool, {1, 2, 40, 2000}, {0, 1, 2, 3});
    FAIL() << "a flipped byte was read";
  } catch (const CorruptStoreError& e) {
    EXPECT_NE(std::string(e.what()).find("byte offset " + std::to_string(4096 + 40 * 256 / 4096 * 4096)),
              std::string::npos)
        << e.what();
  }
  for (int64_t slot = 0; slot < 4; ++slot) EXPECT_EQ(pool->holds(slot), -1) << "slot " << slot;
}

}  // namespace
}  // namespace gale::storage
