#include "storage/disk_features.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <optional>

#include <tbb/parallel_for.h>
#include <tbb/task_group.h>

#include "kernels/error.hpp"
#include "storage/npy.hpp"
#include "storage/page_sums.hpp"

namespace gale::storage {

namespace fs = std::filesystem;
using kernels::cuda::format_bytes;
using kernels::cuda::MemoryBudget;

namespace {

constexpr uint64_t kPage = kDirectAlignment;
static_assert(kPage == kPageSumPage, "page sums are checked per read page");

// read_rows: a coalesced read stays within 1 MiB (large enough to reach a device's bandwidth,
// small enough that one gap does not drag in much), and one call stages at most 32 MiB at once.
constexpr uint64_t kMaxReadBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxStagingBytes = uint64_t{32} << 20;
// The cache fill reads the chosen rows once, sorted: long reads (4 MiB) that may skip up to 64 KiB
// of unneeded pages, 16 MiB staged at a time — sequential bandwidth, never the whole file at once.
constexpr int kFillGapPages = 16;
constexpr uint64_t kFillReadBytes = uint64_t{4} << 20;
constexpr uint64_t kFillStagingBytes = uint64_t{16} << 20;
// A features.npy this large has its request cost measured at open (smaller ones are read so little
// that 0.4 s of probing would outweigh what it saves; they use kDefaultRequestPages).
constexpr uint64_t kProbeFileBytes = uint64_t{1} << 30;

// `bytes` of 4096-aligned memory for O_DIRECT reads (std::free it), uninitialised.
char* allocate_staging(uint64_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, kPage, bytes) != 0)
    throw ResourceError("cannot allocate " + format_bytes(bytes) + " of disk staging buffers");
  return static_cast<char*>(p);
}

// Staging for one call, charged to the budget first.
class Staging {
 public:
  Staging(MemoryBudget* budget, uint64_t bytes) : charge_(budget, bytes), data_(allocate_staging(bytes)) {}
  ~Staging() { std::free(data_); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  char* data() const { return data_; }

 private:
  kernels::cuda::BudgetCharge charge_;  // first: released if the allocation throws
  char* data_ = nullptr;
};

// "1.2M", "33M", "12K", "950": counts as describe() prints them.
std::string count_text(int64_t n) {
  char text[32];
  if (n >= 1000000) {
    std::snprintf(text, sizeof(text), "%.1fM", static_cast<double>(n) / 1e6);
  } else if (n >= 10000) {
    std::snprintf(text, sizeof(text), "%.0fK", static_cast<double>(n) / 1e3);
  } else {
    return std::to_string(n);
  }
  std::string s(text);
  const size_t dot = s.find(".0");
  if (dot != std::string::npos && dot + 3 == s.size()) s.erase(dot, 2);
  return s;
}

struct Extent {
  uint64_t first_page = 0;
  uint64_t last_page = 0;  // inclusive
  uint64_t bytes() const { return (last_page - first_page + 1) * kPage; }
};

}  // namespace

DiskFeatures::DiskFeatures(const Store& store, const std::vector<int64_t>& priority,
                           const DiskFeatureOptions& options)
    : file_(store.path() / "features.npy"), options_(options) {
  if (!store.has_features()) throw InputError(store.path().string() + ": the store has no features");
  if (!(options.request_pages >= 0 || options.request_pages == kMeasureRequestPages))
    throw InputError("request_pages " + std::to_string(options.request_pages) +
                     ": expected >= 0 (0: measured for large files), or kMeasureRequestPages");
  num_nodes_ = store.num_nodes();
  dim_ = store.feature_dim();
  dtype_ = store.feature_dtype();
  row_bytes_ = static_cast<uint64_t>(dim_) * dtype_size(dtype_);
  file_size_ = store.manifest().files.at("features.npy").size;

  const NpyHeader header = read_npy_header(file_.string());
  if (header.data_offset % kPage != 0 || header.shape != std::vector<int64_t>{num_nodes_, dim_} ||
      header.data_offset + static_cast<uint64_t>(num_nodes_) * row_bytes_ > file_size_)
    throw CorruptStoreError(file_.string() + ": header (shape " + shape_text(header.shape) + ", data at byte " +
                            std::to_string(header.data_offset) + ") disagrees with the manifest");
  data_offset_ = header.data_offset;

  if (options.check_page_sums)
    page_sums_ = options.page_sums != nullptr ? options.page_sums : store.page_sums("features.npy");

  reader_ = open_disk_reader(file_, options.engine, options.queue_depth);
  if (reader_->file_size() != file_size_)
    throw CorruptStoreError(file_.string() + ": " + std::to_string(reader_->file_size()) +
                            " bytes on disk, the manifest says " + std::to_string(file_size_));
  const bool measure = options.max_gap_pages < 0 && (options.request_pages == kMeasureRequestPages ||
                                                     (options.request_pages == 0 && file_size_ >= kProbeFileBytes));
  request_pages_ = options.request_pages > 0 ? options.request_pages
                   : measure                 ? measure_request_pages()
                                             : kDefaultRequestPages;
  // A gap of g unneeded pages costs g pages' time read through and saves a request: worth it
  // while g < request_pages.
  gap_pages_ = options.max_gap_pages >= 0 ? options.max_gap_pages
                                          : std::max(0, static_cast<int>(std::ceil(request_pages_)) - 1);

  const uint64_t cache_row_bytes = static_cast<uint64_t>(dim_) * sizeof(float);
  const int64_t capacity = static_cast<int64_t>(std::min<uint64_t>(
      {options.cache_bytes / cache_row_bytes, static_cast<uint64_t>(num_nodes_), uint64_t{INT32_MAX}}));
  if (capacity > 0) fill_cache(priority, capacity);
}

DiskFeatures::~DiskFeatures() = default;

double DiskFeatures::measure_request_pages() {
  // Random 4 KiB reads and random 256 KiB reads (bulk: past any NVMe drive's request-bound
  // sizes), in one staging buffer charged to the budget: five rounds of 40 ms each, interleaved,
  // and the median of the rounds' costs. One round of 0.1 s each measured 2.4 to 6.5 pages on one
  // H200 machine whose `gale bench io` said 4.4: the disk's pace drifts (writeback, the page cache
  // just dropped), and a drift during one of two long probes skews their ratio.
  constexpr uint32_t kBulk = 256 << 10;
  constexpr int kRounds = 5;
  const int depth = std::max(1, options_.queue_depth);
  Staging staging(options_.budget, static_cast<uint64_t>(kBulk) * static_cast<uint64_t>(depth));
  std::vector<double> costs;
  for (int r = 0; r < kRounds; ++r) {
    const ReadCeiling small = measure_reads(*reader_, static_cast<uint32_t>(kPage), false, depth, 0.04,
                                            static_cast<uint64_t>(2 * r + 1), staging.data());
    const ReadCeiling bulk = measure_reads(*reader_, kBulk, false, depth, 0.04, static_cast<uint64_t>(2 * r + 2),
                                           staging.data());
    costs.push_back(storage::request_pages(small, bulk));
  }
  std::nth_element(costs.begin(), costs.begin() + kRounds / 2, costs.end());
  return costs[kRounds / 2];
}

uint64_t DiskFeatures::max_staging_bytes() {
  // GALE_READ_STAGING_MIB (at least 8) overrides it, for measuring: each of a read's rounds fills
  // half the staging, and the disk's queue drains at the end of a round.
  static const uint64_t bytes = [] {
    const char* env = std::getenv("GALE_READ_STAGING_MIB");
    return env != nullptr && std::atoll(env) >= 8 ? static_cast<uint64_t>(std::atoll(env)) << 20 : kMaxStagingBytes;
  }();
  return bytes;
}

template <typename Sink>
DiskFeatures::ReadTotals DiskFeatures::read_from_disk(const std::vector<int64_t>& sorted_ids, int gap_pages,
                                                      uint64_t max_read_bytes, uint64_t max_staging_bytes,
                                                      const Sink& sink, ReadStaging* external) {
  // Plan: the pages [p, q] of each row, in ascending order, merged into one extent while the gap
  // is <= gap_pages and the extent stays within max_read_bytes. A row never spans two extents; a
  // page shared by two rows is read twice only where the size limit falls between them.
  std::vector<Extent> extents;
  std::vector<uint32_t> extent_of(sorted_ids.size());
  ReadTotals totals;
  uint64_t last_needed = UINT64_MAX;  // the last page counted in needed_bytes
  for (size_t k = 0; k < sorted_ids.size(); ++k) {
    const auto [p, q] = pages_of(sorted_ids[k]);
    const uint64_t new_from = last_needed == UINT64_MAX ? p : std::max(p, last_needed + 1);
    if (q >= new_from) {
      totals.needed_bytes += (q - new_from + 1) * kPage;
      last_needed = q;
    }
    if (!extents.empty()) {
      Extent& e = extents.back();
      const uint64_t last = std::max(e.last_page, q);
      if (p <= e.last_page + 1 + static_cast<uint64_t>(gap_pages) &&
          (last - e.first_page + 1) * kPage <= max_read_bytes) {
        e.last_page = last;
        extent_of[k] = static_cast<uint32_t>(extents.size() - 1);
        continue;
      }
    }
    extents.push_back(Extent{p, q});
    extent_of[k] = static_cast<uint32_t>(extents.size() - 1);
  }
  if (extents.empty()) return totals;

  uint64_t total = 0, largest = 0;
  for (const Extent& e : extents) {
    total += e.bytes();
    largest = std::max(largest, e.bytes());
  }
  // Slots of the staging buffer, used in turn by rounds of as many extents as a slot holds: while
  // the pages of one round are checked and their rows handed to the sink (in parallel, on TBB's
  // threads), the disk reads the next round into another slot, so neither the disk nor the checks
  // wait for the other. With overlapping rounds (DiskFeatureOptions::overlap_rounds) the round after
  // that is read too.
  // An extent larger than a slot gets a slot of its own size; slots are whole pages (O_DIRECT
  // reads land on 4096-aligned destinations).
  const bool overlap = options_.overlap_rounds;
  const uint64_t slots = overlap ? 3 : 2;
  const uint64_t slot = std::max(largest, std::min(total, max_staging_bytes) / slots / kPage * kPage);
  struct Round {
    size_t first = 0, last = 0;          // its extents
    size_t row_begin = 0, row_end = 0;   // its rows (sorted_ids[row_begin, row_end))
    uint64_t bytes = 0;
  };
  std::vector<Round> rounds;
  std::vector<uint64_t> offset_in_staging(extents.size());
  for (size_t first = 0, row = 0; first < extents.size();) {
    Round round;
    round.first = first;
    size_t last = first;
    while (last < extents.size() && (last == first || round.bytes + extents[last].bytes() <= slot)) {
      offset_in_staging[last] = round.bytes;
      round.bytes += extents[last].bytes();
      ++last;
    }
    round.last = last;
    round.row_begin = row;
    while (row < sorted_ids.size() && extent_of[row] < last) ++row;
    round.row_end = row;
    rounds.push_back(round);
    first = last;
  }
  // The caller's staging where it holds the rounds' slots, else a buffer of this call's own.
  const uint64_t staging_bytes =
      rounds.size() == 1 ? rounds[0].bytes : std::min<uint64_t>(rounds.size(), slots) * slot;
  std::optional<Staging> own;
  char* const staging =
      external != nullptr && external->bytes() >= staging_bytes ? external->data()
                                                                : own.emplace(options_.budget, staging_bytes).data();
  const auto buffer_of = [&](size_t r) { return staging + (r % slots) * slot; };

  // Checks round r's pages and hands its rows to the sink.
  const auto process = [&](size_t r) {
    const Round& round = rounds[r];
    const char* buffer = buffer_of(r);
    if (page_sums_ != nullptr) {
      tbb::parallel_for(round.first, round.last, [&](size_t x) {
        for (uint64_t p = extents[x].first_page; p <= extents[x].last_page; ++p) {
          const uint64_t at = p * kPage;
          const char* bytes = buffer + offset_in_staging[x] + (p - extents[x].first_page) * kPage;
          if (page_sum(bytes, std::min(kPage, file_size_ - at)) != page_sums_[p])
            throw CorruptStoreError(file_.string() + ": page checksum mismatch at byte offset " + std::to_string(at) +
                                    " (page " + std::to_string(p) +
                                    "): the store is corrupt; run gale info --verify");
        }
      });
    }
    tbb::parallel_for(round.row_begin, round.row_end, [&](size_t k) {
      const Extent& e = extents[extent_of[k]];
      const uint64_t begin = data_offset_ + static_cast<uint64_t>(sorted_ids[k]) * row_bytes_;
      sink(k, buffer + offset_in_staging[extent_of[k]] + (begin - e.first_page * kPage));
    });
  };
  std::vector<ReadRequest> requests(extents.size());
  const auto prepare = [&](size_t r) {
    for (size_t x = rounds[r].first; x < rounds[r].last; ++x)
      requests[x] = ReadRequest{extents[x].first_page * kPage, static_cast<uint32_t>(extents[x].bytes()),
                                buffer_of(r) + offset_in_staging[x]};
  };
  const auto read_round = [this, &requests, &rounds](size_t r) {
    reader_->read(requests.data() + rounds[r].first, rounds[r].last - rounds[r].first);
  };
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> launched(rounds.size());
  // Overlapped rounds go out on threads of their own (the reader takes calls from several threads at
  // once, each on its own ring, or its workers); otherwise each round is read here.
  const bool ahead = overlap && rounds.size() > 1;
  const auto launch = [&](size_t r) {
    launched[r] = Clock::now();
    prepare(r);
    return std::async(std::launch::async, read_round, r);
  };
  tbb::task_group checking;  // the round being checked, at most one
  // Declared after the staging, so that on an error their destructors wait for the reads in
  // flight before the staging is freed.
  std::future<void> reading, next_reading;
  try {
    // The reads' time: while any round is in flight, from its submission to when it is seen done.
    Clock::time_point busy_until{};
    const auto count_read = [&](size_t r) {
      const Clock::time_point done = Clock::now(), from = std::max(launched[r], busy_until);
      if (done > from) totals.nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(done - from).count();
      busy_until = std::max(busy_until, done);
      totals.bytes += rounds[r].bytes;
      totals.calls += static_cast<int64_t>(rounds[r].last - rounds[r].first);
    };
    if (ahead) reading = launch(0);
    for (size_t r = 0; r < rounds.size(); ++r) {
      if (ahead) {
        // Round r + 1 goes out before round r is awaited: its slot was round r - 2's, checked already.
        if (r + 1 < rounds.size()) next_reading = launch(r + 1);
        reading.get();
        reading = std::move(next_reading);
      } else {
        // Its slot was round r - 2's, checked already; round r - 1 is being checked in the other.
        launched[r] = Clock::now();
        prepare(r);
        read_round(r);
      }
      count_read(r);
      checking.wait();  // the round before, in its own slot (rethrows its error)
      checking.run([&process, r] { process(r); });
    }
    checking.wait();
  } catch (...) {
    // The staging outlives the reads in flight and the round being checked; their errors, if any,
    // give way to this one.
    for (std::future<void>* f : {&reading, &next_reading}) {
      if (f->valid()) f->wait();
    }
    try {
      checking.wait();
    } catch (...) {
    }
    throw;
  }
  return totals;
}

void DiskFeatures::fill_cache(const std::vector<int64_t>& priority, int64_t capacity) {
  // The first `capacity` distinct ids of the priority order, then sorted so the fill reads the
  // file front to back; a row's slot is its rank in that order.
  // (`seen`, N bits, is the only memory used before the budget is charged.)
  std::vector<bool> seen(static_cast<size_t>(num_nodes_), false);
  std::vector<int64_t> chosen;
  chosen.reserve(static_cast<size_t>(std::min<int64_t>(capacity, static_cast<int64_t>(priority.size()))));
  for (int64_t id : priority) {
    if (static_cast<int64_t>(chosen.size()) == capacity) break;
    if (id < 0 || id >= num_nodes_)
      throw InputError("cache priority: node id " + std::to_string(id) + " is not in [0, " +
                       std::to_string(num_nodes_) + ")");
    if (seen[static_cast<size_t>(id)]) continue;
    seen[static_cast<size_t>(id)] = true;
    chosen.push_back(id);
  }
  seen = std::vector<bool>();
  if (chosen.empty()) return;
  std::sort(chosen.begin(), chosen.end());

  const uint64_t cache_bytes = chosen.size() * static_cast<uint64_t>(dim_) * sizeof(float);
  cache_charge_ = std::make_unique<kernels::cuda::BudgetCharge>(options_.budget,
                                          cache_bytes + static_cast<uint64_t>(num_nodes_) * sizeof(int32_t));
  std::vector<int32_t> slots(static_cast<size_t>(num_nodes_), -1);
  // Left uninitialised (new[] of floats): the fill writes every row, and zero-filling gigabytes
  // first costs a thread seconds of page faults.
  cache_.reset(new float[chosen.size() * static_cast<size_t>(dim_)]);
  for (size_t k = 0; k < chosen.size(); ++k) slots[static_cast<size_t>(chosen[k])] = static_cast<int32_t>(k);

  const size_t d = static_cast<size_t>(dim_);
  read_from_disk(chosen, kFillGapPages, kFillReadBytes, kFillStagingBytes, [&](size_t k, const char* bytes) {
    convert_to_f32(dtype_, bytes, cache_.get() + k * d, d);
  });
  slots_ = std::move(slots);
  cached_rows_ = static_cast<int64_t>(chosen.size());
}

void DiskFeatures::collect_misses(const int64_t* ids, int64_t n, std::vector<int64_t>* out) const {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= num_nodes_)
      throw InputError("feature row " + std::to_string(id) + " is not a node id in [0, " +
                       std::to_string(num_nodes_) + ")");
    if (slots_.empty() || slots_[static_cast<size_t>(id)] < 0) out->push_back(id);
  }
}

void DiskFeatures::read_rows(const int64_t* ids, int64_t n, float* out, const WindowRows* window) {
  const size_t d = static_cast<size_t>(dim_);
  // (id, output row) of every miss; hits are copied at once.
  std::vector<std::pair<int64_t, int64_t>> misses;
  int64_t window_hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= num_nodes_)
      throw InputError("feature row " + std::to_string(id) + " is not a node id in [0, " +
                       std::to_string(num_nodes_) + ")");
    const int32_t slot = slots_.empty() ? -1 : slots_[static_cast<size_t>(id)];
    const float* row = slot >= 0 ? cache_.get() + static_cast<size_t>(slot) * d
                                 : window != nullptr ? window->find(id) : nullptr;
    if (row != nullptr) {
      std::memcpy(out + static_cast<size_t>(i) * d, row, d * sizeof(float));
      window_hits += slot < 0;
    } else {
      misses.emplace_back(id, i);
    }
  }
  rows_requested_.fetch_add(n, std::memory_order_relaxed);
  cache_hits_.fetch_add(n - static_cast<int64_t>(misses.size()) - window_hits, std::memory_order_relaxed);
  read_ahead_hits_.fetch_add(window_hits, std::memory_order_relaxed);
  if (misses.empty()) return;

  // Sorted by id (offset in the file); a row asked for several times is read once.
  std::sort(misses.begin(), misses.end());
  std::vector<int64_t> distinct;
  std::vector<size_t> first_miss;  // index in misses of each distinct id's first occurrence
  for (size_t m = 0; m < misses.size(); ++m) {
    if (m == 0 || misses[m].first != misses[m - 1].first) {
      distinct.push_back(misses[m].first);
      first_miss.push_back(m);
    }
  }
  first_miss.push_back(misses.size());

  const ReadTotals totals = read_from_disk(distinct, gap_pages_, kMaxReadBytes, max_staging_bytes(),
                                           [&](size_t k, const char* bytes) {
    for (size_t m = first_miss[k]; m < first_miss[k + 1]; ++m)
      convert_to_f32(dtype_, bytes, out + static_cast<size_t>(misses[m].second) * d, d);
  });
  disk_rows_.fetch_add(static_cast<int64_t>(misses.size()), std::memory_order_relaxed);
  count(totals, static_cast<int64_t>(distinct.size()));
}

void DiskFeatures::count(const ReadTotals& totals, int64_t distinct_rows) {
  distinct_disk_rows_.fetch_add(distinct_rows, std::memory_order_relaxed);
  useful_bytes_.fetch_add(static_cast<uint64_t>(distinct_rows) * row_bytes_, std::memory_order_relaxed);
  disk_bytes_.fetch_add(totals.bytes, std::memory_order_relaxed);
  needed_bytes_.fetch_add(totals.needed_bytes, std::memory_order_relaxed);
  read_calls_.fetch_add(totals.calls, std::memory_order_relaxed);
  read_nanoseconds_.fetch_add(totals.nanoseconds, std::memory_order_relaxed);
}

std::shared_ptr<const WindowRows> DiskFeatures::read_window(const std::shared_ptr<RowPool>& pool,
                                                            std::vector<int64_t> ids, std::vector<int32_t> slots,
                                                            const std::vector<int64_t>& extra_ids,
                                                            const std::vector<int32_t>& extra_slots,
                                                            ReadStaging* staging) {
  if (pool == nullptr || pool->dim_ != dim_) throw InternalError("read_window: a pool of this store's rows expected");
  if (slots.size() != ids.size() || extra_slots.size() != extra_ids.size())
    throw InputError("read_window: " + std::to_string(ids.size()) + " ids but " + std::to_string(slots.size()) +
                     " slots, " + std::to_string(extra_ids.size()) + " extra ids but " +
                     std::to_string(extra_slots.size()) + " slots");
  std::vector<bool> taken(static_cast<size_t>(pool->slots_), false);
  const auto check = [&](const std::vector<int64_t>& rows, const std::vector<int32_t>& into, const char* what) {
    for (size_t k = 0; k < rows.size(); ++k) {
      if (rows[k] < 0 || rows[k] >= num_nodes_ || (k > 0 && rows[k] <= rows[k - 1]))
        throw InputError(std::string("read_window: ") + what + " must be distinct node ids in [0, " +
                         std::to_string(num_nodes_) + "), ascending; position " + std::to_string(k) + " holds " +
                         std::to_string(rows[k]));
      if (into[k] < 0 || into[k] >= pool->slots_ || taken[static_cast<size_t>(into[k])])
        throw InputError(std::string("read_window: the slots of ") + what + " must be distinct in [0, " +
                         std::to_string(pool->slots_) + "); position " + std::to_string(k) + " holds " +
                         std::to_string(into[k]));
      taken[static_cast<size_t>(into[k])] = true;
    }
  };
  check(ids, slots, "ids");
  check(extra_ids, extra_slots, "extra ids");
  // What a slot already holds stays; the rest is read into its slot (which holds nothing until the
  // read succeeds), the window's rows and the extra ones in one pass, by id.
  std::vector<int64_t> from_disk;
  std::vector<int32_t> into;
  int64_t previous = -1;
  for (size_t k = 0, x = 0; k < ids.size() || x < extra_ids.size();) {
    const bool extra = k == ids.size() || (x < extra_ids.size() && extra_ids[x] < ids[k]);
    const int64_t id = extra ? extra_ids[x] : ids[k];
    const int32_t slot = extra ? extra_slots[x++] : slots[k++];
    if (id == previous) throw InputError("read_window: row " + std::to_string(id) + " is both the window's and an extra one");
    previous = id;
    if (pool->holds_[static_cast<size_t>(slot)] == id) continue;
    pool->holds_[static_cast<size_t>(slot)] = -1;
    from_disk.push_back(id);
    into.push_back(slot);
  }
  const size_t d = static_cast<size_t>(dim_);
  const ReadTotals totals = read_from_disk(from_disk, gap_pages_, kMaxReadBytes, max_staging_bytes(),
                                           [&](size_t k, const char* bytes) {
    convert_to_f32(dtype_, bytes, pool->rows_.get() + static_cast<size_t>(into[k]) * d, d);
  }, staging);
  for (size_t k = 0; k < from_disk.size(); ++k) pool->holds_[static_cast<size_t>(into[k])] = from_disk[k];
  count(totals, static_cast<int64_t>(from_disk.size()));
  read_ahead_rows_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
  windows_.fetch_add(1, std::memory_order_relaxed);
  return std::make_shared<WindowRows>(pool, std::move(ids), std::move(slots));
}

RowPool::RowPool(MemoryBudget* budget, int64_t slots, int64_t dim)
    : budget_(budget), slots_(slots), dim_(dim) {
  if (slots < 1 || slots > INT32_MAX || dim < 1)
    throw InternalError("RowPool: expected 1 to 2^31 - 1 slots of dim >= 1, found " + std::to_string(slots) + " x " +
                        std::to_string(dim));
  bytes_ = static_cast<uint64_t>(slots) * bytes_per_slot(dim);
  if (budget_) budget_->charge(bytes_);
  try {
    // Uninitialised: a zero-filled pool (gigabytes in a run beyond memory) cost the first epoch
    // seconds of one thread's page faults before its first read; a slot's pages are touched by the
    // read that fills it instead, on the threads that convert the rows.
    rows_.reset(new float[static_cast<size_t>(slots) * static_cast<size_t>(dim)]);
    holds_.assign(static_cast<size_t>(slots), -1);
  } catch (...) {
    if (budget_) budget_->release(bytes_);
    throw;
  }
}

RowPool::~RowPool() {
  if (budget_) budget_->release(bytes_);
}

ReadStaging::ReadStaging(DiskFeatures& disk)
    : disk_(disk),
      bytes_(DiskFeatures::max_staging_bytes()),
      charge_(disk.budget(), bytes_),
      data_(allocate_staging(bytes_)) {
  disk_.reader_->register_buffer(data_, bytes_);
}

ReadStaging::~ReadStaging() {
  disk_.reader_->unregister_buffer(data_);
  std::free(data_);
}

WindowRows::WindowRows(std::shared_ptr<const RowPool> pool, std::vector<int64_t> ids, std::vector<int32_t> slots)
    : pool_(std::move(pool)), ids_(std::move(ids)), slots_(std::move(slots)) {}

const float* WindowRows::find(int64_t id) const {
  const auto it = std::lower_bound(ids_.begin(), ids_.end(), id);
  if (it == ids_.end() || *it != id) return nullptr;
  return pool_->rows_.get() + static_cast<size_t>(slots_[static_cast<size_t>(it - ids_.begin())]) *
                                   static_cast<size_t>(pool_->dim_);
}

DiskFeatureStats DiskFeatures::take_stats() {
  DiskFeatureStats s;
  s.rows_requested = rows_requested_.exchange(0, std::memory_order_relaxed);
  s.cache_hits = cache_hits_.exchange(0, std::memory_order_relaxed);
  s.disk_rows = disk_rows_.exchange(0, std::memory_order_relaxed);
  s.distinct_disk_rows = distinct_disk_rows_.exchange(0, std::memory_order_relaxed);
  s.disk_bytes = disk_bytes_.exchange(0, std::memory_order_relaxed);
  s.useful_bytes = useful_bytes_.exchange(0, std::memory_order_relaxed);
  s.read_calls = read_calls_.exchange(0, std::memory_order_relaxed);
  s.read_seconds = static_cast<double>(read_nanoseconds_.exchange(0, std::memory_order_relaxed)) * 1e-9;
  s.needed_bytes = needed_bytes_.exchange(0, std::memory_order_relaxed);
  s.read_ahead_hits = read_ahead_hits_.exchange(0, std::memory_order_relaxed);
  s.read_ahead_rows = read_ahead_rows_.exchange(0, std::memory_order_relaxed);
  s.windows = windows_.exchange(0, std::memory_order_relaxed);
  s.read_ahead_wait_s = static_cast<double>(wait_nanoseconds_.exchange(0, std::memory_order_relaxed)) * 1e-9;
  s.read_ahead_sample_s = static_cast<double>(sampling_nanoseconds_.exchange(0, std::memory_order_relaxed)) * 1e-9;
  s.read_ahead_reader_idle_s =
      static_cast<double>(reader_idle_nanoseconds_.exchange(0, std::memory_order_relaxed)) * 1e-9;
  s.read_ahead_reader_held_s =
      static_cast<double>(reader_held_nanoseconds_.exchange(0, std::memory_order_relaxed)) * 1e-9;
  return s;
}

std::string DiskFeatures::coalescing_text() const {
  std::string s = ", runs of pages merged across gaps of up to " + std::to_string(gap_pages_);
  if (options_.max_gap_pages >= 0) return s + " (fixed)";
  char text[64];
  std::snprintf(text, sizeof(text), " (a request costing %.1f pages)", request_pages_);
  return s + text;
}

std::string DiskFeatures::describe() const {
  const uint64_t cache_bytes = static_cast<uint64_t>(cached_rows_) * static_cast<uint64_t>(dim_) * sizeof(float);
  std::string s = "host cache " + count_text(cached_rows_) + " of " + count_text(num_nodes_) + " rows (" +
                  format_bytes(cache_bytes) + ")";
  if (cached_rows_ == num_nodes_)
    return s + ": every row, read once from " + file_.filename().string() + " with " + reader_->engine_name();
  return s + ", the rest read from " + file_.filename().string() + " with " + reader_->engine_name() +
         (reader_->direct() ? " (O_DIRECT)" : " (buffered: no O_DIRECT on this filesystem)") +
         (page_sums_ ? ", pages checked" : "") + coalescing_text();
}

}  // namespace gale::storage
