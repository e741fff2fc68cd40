// `gale bench io STORE [--seconds 3] [--queue-depth 64] [--io-engine auto|io_uring|pread] [--json] [--sweep]`:
// this disk's ceilings for the disk tier, measured with the reader training uses
// (storage/disk_reader.hpp: O_DIRECT, io_uring or the pread pool) on the store's features.npy:
// random 4 KiB reads, random 64 KiB reads, and a sequential pass in 1 MiB reads, then what a request
// costs beyond its pages, in pages of the faster bulk reads (storage::request_pages, which the disk
// tier's reads are coalesced by). A user sees the ceiling beside what training achieves (the
// metrics' disk_bytes_read / disk_read_s). Run it with the page cache dropped for a cold disk
// (O_DIRECT bypasses the cache either way, but the device's own cache may hold a file read just
// before).
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "kernels/cuda/budget.hpp"
#include "kernels/error.hpp"
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

}  // namespace

int run_bench_io(const std::vector<std::string>& args) {
  std::string store_path, engine = "auto";
  double seconds = 3;
  int depth = 64;
  bool json = false, sweep = false;
  po::options_description desc("usage: gale bench io STORE [options]\n\noptions");
  desc.add_options()("help,h", "show this help")("store", po::value(&store_path), "store directory")(
      "seconds", po::value(&seconds), "time per measurement (default 3)")(
      "queue-depth", po::value(&depth), "reads in flight (default 64)")(
      "io-engine", po::value(&engine), "auto | io_uring | pread")("json", po::bool_switch(&json), "one JSON line per row")(
      "sweep", po::bool_switch(&sweep), "also random reads of 8, 16, 32, 128 and 256 KiB");
  po::positional_options_description pos;
  pos.add("store", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, pos, &vm)) return 0;
  if (store_path.empty()) throw InputError("bench io: expected a STORE path");
  if (!(seconds > 0)) throw InputError("--seconds: expected a positive number of seconds");
  if (depth < 1 || depth > 4096) throw InputError("--queue-depth: expected 1 to 4096, found " + std::to_string(depth));
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
  return 0;
}

}  // namespace gale::apps
