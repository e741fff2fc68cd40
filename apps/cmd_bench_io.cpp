// `gale bench io STORE [--seconds 3] [--queue-depth 64] [--io-engine auto|io_uring|pread] [--json] [--sweep]
// [--rows FRACTION]`:
// this disk's ceilings for the disk tier, measured with the reader training uses
// (storage/disk_reader.hpp: O_DIRECT, io_uring or the pread pool) on the store's features.npy:
// random 4 KiB reads, random 64 KiB reads, and a sequential pass in 1 MiB reads, then what a request
// costs beyond its pages, in pages of the faster bulk reads (storage::request_pages, which the disk
// tier's reads are coalesced by). A user sees the ceiling beside what training achieves (the
// metrics' disk_bytes_read / disk_read_s). Run it with the page cache dropped for a cold disk
// (O_DIRECT bypasses the cache either way, but the device's own cache may hold a file read just
// before). `--rows F` also times the disk tier's own read (storage::DiskFeatures::read_window, as
// the read-ahead reads a window) of a random fraction F of the rows: sorted, merged across gaps by
// that request cost, every page checked; its rate beside the ceilings above says what the disk
// tier's reads lose to their planning and rounds, without training.
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "kernels/cuda/budget.hpp"
#include "kernels/error.hpp"
#include "storage/disk_features.hpp"
#include "storage/disk_reader.hpp"
#include "storage/store.hpp"

namespace gale::apps {

namespace po = boost::program_options;

namespace {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

struct Ceiling {
  std::string name;
  storage::ReadCeiling read;
};

Ceiling measure(storage::DiskReader& reader, const std::string& name, uint32_t size, bool sequential, int depth,
                double seconds, uint64_t seed) {
  const size_t bytes = static_cast<size_t>(size) * static_cast<size_t>(depth);
  std::unique_ptr<void, AlignedFree> buffer(std::aligned_alloc(storage::kDirectAlignment, bytes));
  if (!buffer) throw ResourceError("bench io: cannot allocate " + std::to_string(bytes) + " bytes of staging");
  return {name, storage::measure_reads(reader, size, sequential, depth, seconds, seed, buffer.get())};
}

// The disk tier's read of a random `fraction` of the rows (each row drawn with that probability),
// in one window read into a pool of its own, planned with `request_pages`; its rounds overlapped
// or not (storage::DiskFeatureOptions::overlap_rounds).
void time_disk_tier_read(const storage::Store& store, storage::IoEngine engine, int depth, double request_pages,
                         double fraction, bool overlap, bool json) {
  storage::DiskFeatureOptions options;
  options.engine = engine;
  options.queue_depth = depth;
  options.request_pages = request_pages;
  options.overlap_rounds = overlap;
  storage::DiskFeatures disk(store, {}, options);
  std::mt19937_64 rng(overlap ? 8 : 7);  // other rows for each: neither finds the device's cache warm
  std::bernoulli_distribution pick(fraction);
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < store.num_nodes(); ++id)
    if (pick(rng)) ids.push_back(id);
  if (ids.empty()) ids.push_back(0);
  const int64_t n = static_cast<int64_t>(ids.size());
  const auto pool = std::make_shared<storage::RowPool>(nullptr, n, store.feature_dim());
  std::vector<int32_t> slots(ids.size());
  std::iota(slots.begin(), slots.end(), 0);
  const auto t0 = std::chrono::steady_clock::now();
  disk.read_window(pool, std::move(ids), std::move(slots));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const storage::DiskFeatureStats s = disk.take_stats();
  const double gb_per_s = seconds > 0 ? static_cast<double>(s.disk_bytes) / seconds / 1e9 : 0;
  if (json)
    std::printf("{\"bench\":\"io\",\"read\":\"disk tier\",\"overlap_rounds\":%s,\"rows\":%lld,\"requests\":%lld,\"bytes_read\":%llu,"
                "\"needed_bytes\":%llu,\"seconds\":%.3f,\"read_seconds\":%.3f,\"gb_per_s\":%.3f}\n",
                overlap ? "true" : "false", static_cast<long long>(n), static_cast<long long>(s.read_calls),
                static_cast<unsigned long long>(s.disk_bytes), static_cast<unsigned long long>(s.needed_bytes), seconds,
                s.read_seconds, gb_per_s);
  else
    std::printf("  disk tier, %.3g%% of the rows, rounds %s: %lld rows, %lld requests, %.2f GB read (%.2f GB of "
                "needed pages) in %.2f s: %.1f MB/s\n",
                100 * fraction, overlap ? "overlapped" : "one at a time", static_cast<long long>(n), static_cast<long long>(s.read_calls),
                static_cast<double>(s.disk_bytes) / 1e9, static_cast<double>(s.needed_bytes) / 1e9, seconds,
                gb_per_s * 1e3);
}

}  // namespace

int run_bench_io(const std::vector<std::string>& args) {
  std::string store_path, engine = "auto";
  double seconds = 3, row_fraction = 0;
  int depth = 64;
  bool json = false, sweep = false;
  po::options_description desc("usage: gale bench io STORE [options]\n\noptions");
  desc.add_options()("help,h", "show this help")("store", po::value(&store_path), "store directory")(
      "seconds", po::value(&seconds), "time per measurement (default 3)")(
      "queue-depth", po::value(&depth), "reads in flight (default 64)")(
      "io-engine", po::value(&engine), "auto | io_uring | pread")("json", po::bool_switch(&json), "one JSON line per row")(
      "sweep", po::bool_switch(&sweep), "also random reads of 8, 16, 32, 128 and 256 KiB")(
      "rows", po::value(&row_fraction),
      "also the disk tier's own read of this fraction of the rows, drawn at random (e.g. 0.05): sorted, "
      "merged by the request cost, pages checked");
  po::variables_map vm;
  if (!parse_store_command_line(args, desc, &vm)) return 0;
  if (store_path.empty()) throw InputError("bench io: expected a STORE path");
  if (!(seconds > 0)) throw InputError("--seconds: expected a positive number of seconds");
  if (depth < 1 || depth > 4096) throw InputError("--queue-depth: expected 1 to 4096, found " + std::to_string(depth));
  if (vm.count("rows") && !(row_fraction > 0 && row_fraction <= 1))
    throw InputError("--rows: expected a fraction of the rows in (0, 1], found " + std::to_string(row_fraction));
  const storage::IoEngine e = parse_io_engine(engine);
  const storage::Store store = storage::Store::open(store_path);
  if (!store.has_features()) throw InputError(store_path + ": the store has no features.npy to read");
  const auto reader = storage::open_disk_reader(store.path() / "features.npy", e, depth);
  std::vector<Ceiling> rows;
  rows.push_back(measure(*reader, "random 4 KiB", 4096, false, depth, seconds, 1));
  rows.push_back(measure(*reader, "random 64 KiB", 65536, false, depth, seconds, 2));
  rows.push_back(measure(*reader, "sequential 1 MiB", 1 << 20, true, std::min(depth, 16), seconds, 3));
  if (sweep)  // the sizes between: where reads stop being bound by requests
    for (const uint32_t kib : {8u, 16u, 32u, 128u, 256u})
      rows.push_back(measure(*reader, "random " + std::to_string(kib) + " KiB", kib << 10, false, depth, seconds, 3 + kib));
  if (!json)
    std::printf("features.npy %s, %s%s, queue depth %d\n", kernels::cuda::format_bytes(reader->file_size()).c_str(),
                reader->engine_name(), reader->direct() ? " (O_DIRECT)" : " (buffered: O_DIRECT refused)", depth);
  for (const Ceiling& c : rows) {
    const double mbps = c.read.bytes_per_s() / 1e6, iops = c.read.reads_per_s();
    if (json)
      std::printf("{\"bench\":\"io\",\"read\":\"%s\",\"engine\":\"%s\",\"direct\":%s,\"queue_depth\":%d,\"reads_per_s\":%.0f,"
                  "\"mb_per_s\":%.1f,\"seconds\":%.3f}\n",
                  c.name.c_str(), reader->engine_name(), reader->direct() ? "true" : "false", depth, iops, mbps,
                  c.read.seconds);
    else
      std::printf("  %-18s %10.0f reads/s %9.1f MB/s\n", c.name.c_str(), iops, mbps);
  }
  // What the disk tier plans its window reads with (storage::request_pages; it measures its own
  // at start, with shorter runs of the same reads).
  const double pages = storage::request_pages(rows[0].read, rows[1].read.bytes_per_s() > rows[2].read.bytes_per_s()
                                                                ? rows[1].read : rows[2].read);
  if (json)
    std::printf("{\"bench\":\"io\",\"request_pages\":%.2f}\n", pages);
  else
    std::printf("  a request costs %.1f pages read in bulk beyond its own: the disk tier reads through gaps of fewer pages\n",
                pages);
  if (row_fraction > 0)
    for (const bool overlap : {false, true}) time_disk_tier_read(store, e, depth, pages, row_fraction, overlap, json);
  return 0;
}

}  // namespace gale::apps
