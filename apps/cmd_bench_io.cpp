// `gale bench io STORE [--seconds 3] [--queue-depth 64] [--io-engine auto|io_uring|pread] [--json]`:
// this disk's ceilings for the disk tier, measured with the reader training uses
// (storage/disk_reader.hpp: O_DIRECT, io_uring or the pread pool) on the store's features.npy:
// random 4 KiB reads, random 64 KiB reads, and a sequential pass in 1 MiB reads. A user sees the
// ceiling beside what training achieves (the metrics' disk_bytes_read / disk_read_s). Run it with
// the page cache dropped for a cold disk (O_DIRECT bypasses the cache either way, but the device's
// own cache may hold a file read just before).
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
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
  uint64_t read_bytes = 0;
  int64_t reads = 0;
  double seconds = 0;
};

// Reads of `size` bytes at random aligned offsets (or one after the other with `sequential`), `depth`
// at a time, for about `seconds`.
Ceiling measure(storage::DiskReader& reader, const std::string& name, uint32_t size, bool sequential, int depth,
                double seconds, uint64_t seed) {
  // A file smaller than the read size is read whole (in pages) each time.
  size = static_cast<uint32_t>(std::min<uint64_t>(size, reader.file_size() / 4096 * 4096));
  if (size == 0) throw InputError(reader.path().string() + ": smaller than one 4096-byte page");
  const uint64_t slots = reader.file_size() / size;
  std::unique_ptr<void, AlignedFree> buffer(std::aligned_alloc(4096, static_cast<size_t>(size) * depth));
  if (!buffer) throw ResourceError("bench io: cannot allocate " + std::to_string(size * depth) + " bytes of staging");
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint64_t> pick(0, slots - 1);
  std::vector<storage::ReadRequest> batch(static_cast<size_t>(depth));
  Ceiling c;
  c.name = name;
  uint64_t next = 0;
  const auto t0 = std::chrono::steady_clock::now();
  do {
    for (int i = 0; i < depth; ++i) {
      const uint64_t slot = sequential ? next++ % slots : pick(rng);
      batch[static_cast<size_t>(i)] = {slot * size, size, static_cast<char*>(buffer.get()) + static_cast<size_t>(i) * size};
    }
    reader.read(batch.data(), batch.size());
    c.reads += depth;
    c.read_bytes += static_cast<uint64_t>(size) * static_cast<uint64_t>(depth);
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (c.seconds < seconds && !(sequential && next >= slots));
  return c;
}

}  // namespace

int run_bench_io(const std::vector<std::string>& args) {
  std::string store_path, engine = "auto";
  double seconds = 3;
  int depth = 64;
  bool json = false;
  po::options_description desc("usage: gale bench io STORE [options]\n\noptions");
  desc.add_options()("help,h", "show this help")("store", po::value(&store_path), "store directory")(
      "seconds", po::value(&seconds), "time per measurement (default 3)")(
      "queue-depth", po::value(&depth), "reads in flight (default 64)")(
      "io-engine", po::value(&engine), "auto | io_uring | pread")("json", po::bool_switch(&json), "one JSON line per row");
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
  if (!json)
    std::printf("features.npy %s, %s%s, queue depth %d\n", kernels::cuda::format_bytes(reader->file_size()).c_str(),
                reader->engine_name(), reader->direct() ? " (O_DIRECT)" : " (buffered: O_DIRECT refused)", depth);
  for (const Ceiling& c : rows) {
    const double mbps = static_cast<double>(c.read_bytes) / c.seconds / 1e6, iops = static_cast<double>(c.reads) / c.seconds;
    if (json)
      std::printf("{\"bench\":\"io\",\"read\":\"%s\",\"engine\":\"%s\",\"direct\":%s,\"queue_depth\":%d,\"reads_per_s\":%.0f,"
                  "\"mb_per_s\":%.1f,\"seconds\":%.3f}\n",
                  c.name.c_str(), reader->engine_name(), reader->direct() ? "true" : "false", depth, iops, mbps, c.seconds);
    else
      std::printf("  %-18s %10.0f reads/s %9.1f MB/s\n", c.name.c_str(), iops, mbps);
  }
  return 0;
}

}  // namespace gale::apps
