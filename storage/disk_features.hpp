// storage/disk_features.hpp — node feature rows served from features.npy on disk, for features
// beyond the host budget (DESIGN.md, "Out of core").
//
// A static host cache holds the hottest rows as f32 (the caller ranks them: degree, pre-sampling
// frequency); every other row is read from features.npy through a DiskReader (io_uring or a pread
// pool, O_DIRECT). The misses of one call are mapped to the distinct 4 KiB pages holding them,
// sorted by offset and coalesced, so rows that share a page cost one read of it — not one read per
// row as in Ginex's gather. Every page read is checked against the store's page sums when given.
// The disk tier changes where rows come from, never their values: read_rows equals
// Store::read_feature_rows bit for bit.
//
// Read-ahead (engine/train/read_ahead.hpp): the rows a window of future batches will miss in the
// cache are known once those batches are sampled; read_window reads them all in one pass, sorted
// by offset and coalesced across gaps shorter than what a request costs (so a cold page that
// several batches of the window need is read once, and dense runs of needed pages become long
// sequential reads), into slots of a RowPool that the read-ahead's windows share: a window whose
// rows the pool still holds from an earlier window finds them there instead of reading them again.
// read_rows serves a batch's rows from its WindowRows.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/budget.hpp"
#include "kernels/dtype.hpp"
#include "storage/disk_reader.hpp"
#include "storage/store.hpp"

namespace gale::storage {

// What a request costs beyond its pages, in pages read in bulk, where it is not measured: the H200
// machines' NVMe, fitted to the read-ahead's window reads of R-MAT 25 (10.7 us a request, 2.5 us a
// page: docs/performance.md).
constexpr double kDefaultRequestPages = 4;
constexpr double kMeasureRequestPages = -1;

struct DiskFeatureOptions {
  // Bytes of f32 rows the host cache may hold (the slot table, 4 bytes per node, is charged on
  // top of it when the cache is not empty). 0: every row comes from disk.
  uint64_t cache_bytes = 0;
  // Two runs of needed pages are read in one request, the unneeded pages between them read through,
  // where that costs less than a request of its own: with many reads in flight a request costs
  // about its pages plus request_pages more (storage::request_pages), so runs merge across gaps of
  // fewer than request_pages pages. 0: measured at open when features.npy is at least 1 GiB (0.4 s
  // of random 4 KiB and 256 KiB reads, the median of five rounds), else kDefaultRequestPages;
  // kMeasureRequestPages: measured whatever the file's size.
  double request_pages = 0;
  // >= 0: merge across gaps of at most this many pages instead (for measuring; GALE_READ_GAP_PAGES
  // sets it in training).
  int max_gap_pages = -1;
  IoEngine engine = IoEngine::kAuto;
  int queue_depth = 64;
  // A call reads its extents in rounds through a staging buffer. true: the next round's reads go
  // out while the round before is still in flight (the staging in thirds: one round checked, two
  // read), so the disk's queue does not drain and refill at every round's end. false: each round
  // once the one before is read (in halves: one checked, one read). Off unless GALE_READ_OVERLAP=1
  // in training (not yet measured on the GPU machine's disk); `gale bench io --rows` times both.
  bool overlap_rounds = false;
  // Charged with the cache, the slot table and the staging buffers of every call; nullptr: none.
  kernels::cuda::MemoryBudget* budget = nullptr;
  // Every page read is checked against XXH32 sums of features.npy's 4 KiB pages
  // (storage/page_sums.hpp): these, when given (page_count(file size) entries, alive as long as
  // the DiskFeatures), else the store's own (Store::page_sums) when it has them. false: unchecked.
  bool check_page_sums = true;
  const uint32_t* page_sums = nullptr;
};

// The read-ahead's rows, in slots its windows share (engine/train/read_ahead.hpp): a row stays in
// its slot while the read-ahead keeps it, so a later window that needs it finds it there. Its rows
// and its record of what each slot holds are charged to the budget for its life. Which slot holds
// which row is the read-ahead's plan; the pool records what each slot really holds (read_window
// writes it), so a row whose read failed is read again by the next window that needs it.
class RowPool {
 public:
  // Throws ResourceError when the budget (nullable) refuses it.
  RowPool(kernels::cuda::MemoryBudget* budget, int64_t slots, int64_t dim);
  ~RowPool();
  RowPool(const RowPool&) = delete;
  RowPool& operator=(const RowPool&) = delete;

  int64_t slots() const { return slots_; }
  uint64_t bytes() const { return bytes_; }
  // What each slot charges: its f32 row of `dim` and the id it holds.
  static uint64_t bytes_per_slot(int64_t dim) { return static_cast<uint64_t>(dim) * sizeof(float) + sizeof(int64_t); }
  // The row slot s holds, or -1 (none yet, or its read failed).
  int64_t holds(int64_t slot) const { return holds_[static_cast<size_t>(slot)]; }

 private:
  friend class DiskFeatures;
  friend class WindowRows;
  kernels::cuda::MemoryBudget* budget_;
  uint64_t bytes_ = 0;
  int64_t slots_ = 0;
  int64_t dim_ = 0;
  std::unique_ptr<float[]> rows_;  // uninitialised: a slot's row is written by its read before any use
  std::vector<int64_t> holds_;
};

// The rows read ahead for a window of batches: their ids (ascending) and the pool slots holding
// them. Immutable once read, so any number of threads may read it; the read-ahead overwrites none
// of its slots while the window is alive. Its lists are the read-ahead's bookkeeping (charged
// there).
class WindowRows {
 public:
  WindowRows(std::shared_ptr<const RowPool> pool, std::vector<int64_t> ids, std::vector<int32_t> slots);

  // The row of `id`, or nullptr when the window does not hold it.
  const float* find(int64_t id) const;
  int64_t rows() const { return static_cast<int64_t>(ids_.size()); }

 private:
  std::shared_ptr<const RowPool> pool_;
  std::vector<int64_t> ids_;
  std::vector<int32_t> slots_;
};

// Counters since the last take_stats().
struct DiskFeatureStats {
  int64_t rows_requested = 0;
  int64_t cache_hits = 0;
  int64_t disk_rows = 0;           // requested rows served from disk (duplicates counted)
  int64_t distinct_disk_rows = 0;  // distinct rows read from disk, per call
  uint64_t disk_bytes = 0;         // bytes of the reads issued
  uint64_t useful_bytes = 0;       // distinct_disk_rows x row bytes (<= disk_bytes)
  int64_t read_calls = 0;          // read requests (extents) issued
  // Wall time of the reads, summed over calls: in each, the time some round of its reads was in
  // flight (with DiskFeatureOptions::overlap_rounds two may be at once, counted once).
  double read_seconds = 0;
  uint64_t needed_bytes = 0;       // 4 KiB pages holding the distinct rows read, x 4 KiB
  int64_t read_ahead_hits = 0;     // requested rows served from a read-ahead window
  int64_t read_ahead_rows = 0;     // rows of the windows read (from disk, or already in the pool)
  int64_t windows = 0;             // windows read
  double read_ahead_wait_s = 0;    // time callers waited for a window to be read (add_wait)
  double read_ahead_sample_s = 0;  // time the read-ahead sampled ahead (add_sampling)
  // Time the read-ahead's reading thread waited (add_reader_wait): for a window to be planned (the
  // sampling behind), and with one planned, for the windows alive to free its slots.
  double read_ahead_reader_idle_s = 0, read_ahead_reader_held_s = 0;
};

class ReadStaging;

class DiskFeatures {
 public:
  // Opens `store`'s features.npy (`store` must outlive this: its page sums are used in place) and fills the cache with the rows of `priority` (node ids,
  // hottest first; repeats ignored) until cache_bytes is used. Throws InputError when the store has
  // no features or an id is not a node, CorruptStoreError when features.npy disagrees with the
  // manifest or a page fails its sum, ResourceError when the budget refuses the cache.
  DiskFeatures(const Store& store, const std::vector<int64_t>& priority, const DiskFeatureOptions& options);
  ~DiskFeatures();
  DiskFeatures(const DiskFeatures&) = delete;
  DiskFeatures& operator=(const DiskFeatures&) = delete;

  // out row i = features of ids[i] as f32 (n x feature_dim, row-major). Callable from several
  // threads at once. Throws InputError for an id that is not a node, CorruptStoreError for a page
  // that fails its sum, ResourceError when the budget refuses the staging buffer.
  // `window` (nullable): rows it holds are copied from it, not read.
  void read_rows(const int64_t* ids, int64_t n, float* out, const WindowRows* window = nullptr);

  // Appends to `out` the ids of ids[0..n) that the cache does not hold (in their order, repeats
  // kept). Throws InputError for an id that is not a node.
  void collect_misses(const int64_t* ids, int64_t n, std::vector<int64_t>* out) const;

  // The window of `ids` (ascending, distinct) whose rows lie in `pool`'s slots `slots` (ids[k] in
  // slots[k]; distinct slots): rows their slot already holds stay, the rest are read into their
  // slots in one pass sorted by offset and coalesced (gap_pages). The caller guarantees that no
  // live window uses a slot it gives another row. Throws as read_rows does
  // (then the slots being read hold nothing); InputError for ids or slots out of order or range.
  // `extra_ids` / `extra_slots` (ascending, distinct, slots apart from the window's): rows read
  // into the pool with the window, which it does not serve (later windows' rows on the pages it
  // reads anyway), unless their slot holds them already.
  // `staging` (nullable): the caller's own staging, used instead of a buffer of the call's own.
  std::shared_ptr<const WindowRows> read_window(const std::shared_ptr<RowPool>& pool, std::vector<int64_t> ids,
                                                std::vector<int32_t> slots, const std::vector<int64_t>& extra_ids = {},
                                                const std::vector<int32_t>& extra_slots = {},
                                                ReadStaging* staging = nullptr);
  // The first and last 4 KiB page of features.npy that hold row `id`.
  std::pair<uint64_t, uint64_t> pages_of(int64_t id) const {
    const uint64_t begin = data_offset_ + static_cast<uint64_t>(id) * row_bytes_;
    return {begin / kDirectAlignment, (begin + row_bytes_ - 1) / kDirectAlignment};
  }

  // Time a caller waited for a window (reported by take_stats as read_ahead_wait_s).
  void add_wait(int64_t nanoseconds) { wait_nanoseconds_.fetch_add(nanoseconds, std::memory_order_relaxed); }
  // Time the read-ahead spent sampling batches and collecting their misses (read_ahead_sample_s).
  void add_sampling(int64_t nanoseconds) { sampling_nanoseconds_.fetch_add(nanoseconds, std::memory_order_relaxed); }
  // Time the read-ahead's reading thread waited with no window planned (idle) and with one planned
  // but held back (read_ahead_reader_idle_s, read_ahead_reader_held_s).
  void add_reader_wait(int64_t idle_nanoseconds, int64_t held_nanoseconds) {
    reader_idle_nanoseconds_.fetch_add(idle_nanoseconds, std::memory_order_relaxed);
    reader_held_nanoseconds_.fetch_add(held_nanoseconds, std::memory_order_relaxed);
  }

  // Returns the counters and starts them again from zero.
  DiskFeatureStats take_stats();

  // "host cache 1.2M of 33M rows (600 MiB), the rest read from features.npy with io_uring (O_DIRECT),
  // pages checked, runs of pages merged across gaps of up to 3 (a request costing 3.2 pages)"
  std::string describe() const;

  int64_t num_nodes() const { return num_nodes_; }
  int64_t feature_dim() const { return dim_; }
  int64_t cached_rows() const { return cached_rows_; }
  bool is_cached(int64_t id) const { return !slots_.empty() && slots_[static_cast<size_t>(id)] >= 0; }
  const DiskReader& reader() const { return *reader_; }
  // What a request costs in pages, as the reads are planned (DiskFeatureOptions::request_pages, or
  // what was measured at open).
  double request_pages() const { return request_pages_; }
  // The gap of unneeded pages the reads merge runs across (fewer pages than request_pages, or
  // max_gap_pages).
  int gap_pages() const { return gap_pages_; }
  // What the cache, staging buffers and windows are charged to (nullptr: none).
  kernels::cuda::MemoryBudget* budget() const { return options_.budget; }
  // The most one read_rows or read_window call stages at once (charged to the budget meanwhile):
  // 32 MiB, or GALE_READ_STAGING_MIB, for measuring.
  static uint64_t max_staging_bytes();

 private:
  // Bytes, requests and wall time of the reads one read_from_disk issued, and the bytes of the
  // distinct pages the rows lie on.
  struct ReadTotals {
    uint64_t bytes = 0;
    int64_t calls = 0;
    int64_t nanoseconds = 0;
    uint64_t needed_bytes = 0;
  };
  // Adds one read's totals to the counters.
  void count(const ReadTotals& totals, int64_t distinct_rows);

  // Reads the distinct rows sorted_ids (ascending, no repeats) from disk and hands each row's raw
  // bytes to sink(k, bytes) with k its index in sorted_ids (in parallel: each k once). Extents are
  // planned with gap_pages and max_read_bytes; a staging buffer of at most max_staging_bytes (or
  // two or three times the largest extent) is read into slot by slot, round by round: one slot's
  // pages are checked and its rows handed over, in parallel, while the disk reads the next round
  // into another (and, with DiskFeatureOptions::overlap_rounds, the round after that into a third).
  // `staging` (nullable): a caller's staging to read into where it is large enough.
  template <typename Sink>
  ReadTotals read_from_disk(const std::vector<int64_t>& sorted_ids, int gap_pages, uint64_t max_read_bytes,
                            uint64_t max_staging_bytes, const Sink& sink, ReadStaging* staging = nullptr);
  void fill_cache(const std::vector<int64_t>& priority, int64_t rows);
  friend class ReadStaging;  // registers its buffer with reader_
  // request_pages of reader_'s disk, measured (storage::measure_reads).
  double measure_request_pages();
  // ", runs of pages merged across gaps of up to 3 (a request costing 3.2 pages)": describe()'s tail.
  std::string coalescing_text() const;

  std::filesystem::path file_;
  int64_t num_nodes_ = 0;
  int64_t dim_ = 0;
  DType dtype_ = DType::kF32;
  uint64_t row_bytes_ = 0;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  DiskFeatureOptions options_;
  const uint32_t* page_sums_ = nullptr;  // nullptr: pages are not checked
  std::unique_ptr<DiskReader> reader_;
  double request_pages_ = kDefaultRequestPages;
  int gap_pages_ = 0;

  // The cache: f32 rows, and per node its row in cache_ or -1. Filled once; read-only afterwards,
  // so concurrent read_rows need no lock. What changes batch by batch lives in the read-ahead
  // windows instead.
  int64_t cached_rows_ = 0;
  std::unique_ptr<kernels::cuda::BudgetCharge> cache_charge_;
  std::unique_ptr<float[]> cache_;  // uninitialised until the fill reads every row of it
  std::vector<int32_t> slots_;

  std::atomic<int64_t> rows_requested_{0}, cache_hits_{0}, disk_rows_{0}, distinct_disk_rows_{0};
  std::atomic<uint64_t> disk_bytes_{0}, useful_bytes_{0};
  std::atomic<int64_t> read_calls_{0};
  std::atomic<int64_t> read_nanoseconds_{0};
  std::atomic<uint64_t> needed_bytes_{0};
  std::atomic<int64_t> read_ahead_hits_{0}, read_ahead_rows_{0}, windows_{0}, wait_nanoseconds_{0},
      sampling_nanoseconds_{0}, reader_idle_nanoseconds_{0}, reader_held_nanoseconds_{0};
};

// A staging buffer that a caller keeps for many reads (the read-ahead's reading thread, for all its
// windows; DiskFeatures::read_window): max_staging_bytes() of 4096-aligned memory, charged to the
// disk tier's budget and registered with its reader while it lives, so that io_uring reads into it
// use IORING_OP_READ_FIXED (its pages pinned once, not per read; where the kernel refuses the
// registration, or with the pread engine, plain reads). One call at a time may use it.
class ReadStaging {
 public:
  // Throws ResourceError when the budget (or the allocator) refuses it.
  explicit ReadStaging(DiskFeatures& disk);
  ~ReadStaging();
  ReadStaging(const ReadStaging&) = delete;
  ReadStaging& operator=(const ReadStaging&) = delete;

  char* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  DiskFeatures& disk_;
  uint64_t bytes_;
  kernels::cuda::BudgetCharge charge_;
  char* data_ = nullptr;
};

}  // namespace gale::storage
