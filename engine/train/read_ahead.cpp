#include "engine/train/read_ahead.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>

#include <tbb/parallel_for.h>

#include "kernels/error.hpp"

namespace gale::engine::train_parts {

namespace {

// Batches sampled at once, in parallel (the GPU sampler takes concurrent calls on streams of its
// own; the CPU sampler is const). GALE_READ_AHEAD_CHUNK overrides it, for measuring.
int64_t sample_chunk() {
  static const int64_t chunk = [] {
    const char* env = std::getenv("GALE_READ_AHEAD_CHUNK");
    return env != nullptr && std::atoll(env) > 0 ? static_cast<int64_t>(std::atoll(env)) : int64_t{8};
  }();
  return chunk;
}
// The first window's share of the full window's rows (each next one window_growth times the last).
constexpr int64_t kFirstWindowShare = 16;
// The first window's batches at most; each next may have window_growth times the last's, up to
// kMaxWindowBatches. A window's batches are all sampled before its read starts, and training waits
// for the first. Where the host cache holds nearly every row a batch needs, a window bounded by rows
// alone grew over the whole run: R-MAT 23 (`--relabel hot`, one H200) with every row cached sampled
// all three epochs' batches, 2.4 s, before the first batch trained (docs/performance.md, thirteenth
// session). 128 and 2,048 leave R-MAT 25's first epoch in 8 GB as it was (its windows of 88 and
// 1,400 batches end on rows first); windows of 32 batches growing 1.25 times read 1.9x the bytes
// there, and the epoch took 13.7 s against 9.0 (rows alone, growth 16, on another H200 that day).
constexpr int64_t kFirstWindowBatches = 128;
constexpr int64_t kMaxWindowBatches = 2048;
// How close (in batches) training may come to the end of the windows handed over before the
// window being sampled is cut and handed over (read_ahead_cuts_when_caught_up): two chunks of
// sampling at the default chunk (sample_chunk), so its read can start before training reaches it.
constexpr int64_t kCatchUpMargin = 16;
// `limit` grown by `growth` (at least by one).
int64_t grown(int64_t limit, double growth) {
  return std::max(limit + 1, static_cast<int64_t>(std::ceil(static_cast<double>(limit) * growth)));
}
// A full window's own rows: a quarter of the pool's slots (the header). bench/readahead_sim.py
// --pool on R-MAT 20 (4 GB-like memory): a quarter read 0.50x the rows of windows that keep
// nothing, a half 0.61x, three quarters 0.71x.
constexpr int64_t kDefaultWindowShare = 4;
int64_t window_share() {  // GALE_READ_AHEAD_SHARE (>= 2) overrides it, for measuring
  static const int64_t share = [] {
    const char* env = std::getenv("GALE_READ_AHEAD_SHARE");
    return env != nullptr && std::atoll(env) >= 2 ? static_cast<int64_t>(std::atoll(env)) : kDefaultWindowShare;
  }();
  return share;
}
}  // namespace

int read_ahead_parts() {
  static const int parts = [] {
    const char* env = std::getenv("GALE_READ_AHEAD_PARTS");
    return env != nullptr && std::atoi(env) >= 1 ? std::atoi(env) : 1;
  }();
  return parts;
}

namespace {

// The windows planned ahead of the one handed to the reading thread, whose misses rank what the
// pool keeps (bench/readahead_sim.py --pool-horizon: 8 read 0.56x, 4 0.65x, the whole future 0.50x).
constexpr size_t kHorizon = 8;

// Bookkeeping per pool slot (ReadAhead::shape): the plan's row and slot (16; twice while a
// window's new rows are merged in), free-slot entry (4), last use (8) and fresh row (8), what
// choosing the rows to drop holds (the candidates' index 8, id 8, first later use 8, and key with
// index 16: 40), the spans of pages a window's read covers, which rows ride along on, and their
// copy as chained riders grow them (16 bytes a span, at most one per fresh row or rider, so up to
// half the slots each: 16 a slot for both), and a later window's rows' two flags while they are
// chained (2 bytes a row of a window, a quarter of the slots: under 1 a slot).
constexpr uint64_t kPlanBytesPerSlot = 2 * 16 + 4 + 8 + 8 + 40 + 16 + 1;
// The windows whose ids and slots (12 bytes a row) are held at once: those planned ahead, the one
// being grown, the one handed over, its copy as the live window, the two read and alive; and the
// rows riding along with the window handed over and with the one being read (at most a window's).
constexpr uint64_t kWindowLists = kHorizon + 7;
// With parts, five lists more: the first use of each row of the windows planned ahead and being
// grown (4 bytes a row, the kHorizon + 1 of them: three lists), the whole window's ids and slots
// beside its parts' (one), and what splitting a window holds for a moment (9 bytes a row: one).
uint64_t window_lists(int parts) { return kWindowLists + (parts > 1 ? 5 : 0); }
constexpr uint64_t kWindowBytesPerRow = sizeof(int64_t) + sizeof(int32_t);

// The sampling thread's plan of the pool: which row each slot holds once the windows handed over
// so far are read, and the last window that needed it.
class PoolPlan {
 public:
  PoolPlan(int64_t slots, bool keep) : keep_(keep), last_needed_(static_cast<size_t>(slots), -1) {
    free_.resize(static_cast<size_t>(slots));
    for (size_t i = 0; i < free_.size(); ++i) free_[i] = static_cast<int32_t>(free_.size() - 1 - i);  // 0 first
  }

  // Slots for window `index`'s rows `w` (ascending), read while the window `live` (ascending ids)
  // trains: rows the pool holds keep their slots; the rest take free slots, then those of rows
  // neither window needs (the header's order; all of them without keep). Empty, and nothing
  // changed, when w and live do not fit the pool together. `later`: the ids of the windows planned
  // after w, in order.
  std::vector<int32_t> place(const std::vector<int64_t>& w, const std::vector<int64_t>& live,
                             const std::vector<const std::vector<int64_t>*>& later, int64_t index) {
    fresh_.clear();
    std::vector<int32_t> slots(w.size(), -1);
    size_t fresh = 0;
    for (size_t k = 0, h = 0; k < w.size(); ++k) {
      while (h < held_.size() && held_[h].first < w[k]) ++h;
      if (h < held_.size() && held_[h].first == w[k]) slots[k] = held_[h].second;
      else ++fresh;
    }
    // Rows neither window needs may give up their slots; looked for only where the free slots do
    // not suffice, or nothing is kept.
    const bool short_of_room = fresh > free_.size();
    std::vector<size_t> spare = short_of_room || !keep_ ? spare_rows(w, live) : std::vector<size_t>();
    if (fresh > free_.size() + spare.size()) return {};
    const size_t drop = !keep_ ? spare.size() : short_of_room ? fresh - free_.size() : 0;
    if (drop < spare.size()) spare = choose_drops(spare, drop, later, /*unneeded_only=*/false);
    release(spare);
    std::vector<std::pair<int64_t, int32_t>> added;
    for (size_t k = 0; k < w.size(); ++k) {
      if (slots[k] < 0) {
        slots[k] = free_.back();
        free_.pop_back();
        added.emplace_back(w[k], slots[k]);
      }
      last_needed_[static_cast<size_t>(slots[k])] = index;
    }
    for (const auto& [id, slot] : added) fresh_.push_back(id);
    hold(added);
    return slots;
  }

  // Rows of the windows planned after the one placed last (`later`, soonest first) that the pool
  // does not hold and that lie on the pages its read covers (its fresh rows' pages and the gaps
  // read through between them), or near enough to them that reading them now likely costs less
  // than a request of their own would later: across gaps of up to one page fewer than the disk
  // tier's gap (chain_gap) from those pages, or from another rider's, so the spans grow by chains
  // of rows. They ride along with that read into free slots, at most `cap`, the soonest windows'
  // first, so that a later window finds them in the pool instead of reading their pages again, in
  // requests of their own. Ascending.
  // Where the free slots do not suffice, rows that neither w, live nor a later window needs give
  // theirs up, least recently needed first (Belady's choice: their next use is further off).
  // `chain` false: only rows wholly on the pages read for the fresh rows ride (the eighth
  // session's rule, for measuring).
  std::vector<std::pair<int64_t, int32_t>> ride_along(const std::vector<int64_t>& w, const std::vector<int64_t>& live,
                                                      const std::vector<const std::vector<int64_t>*>& later,
                                                      const storage::DiskFeatures& disk, size_t cap, int64_t index,
                                                      bool chain) {
    if (fresh_.empty() || cap == 0) return {};
    // The spans of pages read for the fresh rows, runs merged across the disk tier's gap as
    // read_window will merge them (ascending, disjoint, inclusive): the unneeded pages inside are
    // read through anyway.
    Spans spans;
    const uint64_t gap = static_cast<uint64_t>(disk.gap_pages());
    for (int64_t id : fresh_) {
      const auto [p, q] = disk.pages_of(id);
      if (!spans.empty() && p <= spans.back().second + 1 + gap) spans.back().second = std::max(spans.back().second, q);
      else spans.emplace_back(p, q);
    }
    std::vector<int64_t> riders;
    for (const std::vector<int64_t>* ids : later) {
      if (riders.size() >= cap) break;
      if (chain) join_chained(*ids, disk, cap, &spans, &riders);
      else join_within(*ids, disk, spans, cap, &riders);
    }
    std::sort(riders.begin(), riders.end());
    riders.erase(std::unique(riders.begin(), riders.end()), riders.end());
    if (riders.size() > free_.size()) {
      release(choose_drops(spare_rows(w, live), riders.size() - free_.size(), later, /*unneeded_only=*/true));
      riders.resize(std::min(riders.size(), free_.size()));  // the soonest windows' riders may go too: rare
    }
    std::vector<std::pair<int64_t, int32_t>> placed;
    placed.reserve(riders.size());
    for (int64_t id : riders) {
      placed.emplace_back(id, free_.back());
      free_.pop_back();
      last_needed_[static_cast<size_t>(placed.back().second)] = index;
    }
    hold(placed);
    return placed;
  }

  // The rows the last place() gave new slots (they will be read), ascending.
  const std::vector<int64_t>& fresh() const { return fresh_; }

 private:
  using Spans = std::vector<std::pair<uint64_t, uint64_t>>;  // pages, inclusive, ascending, disjoint

  // Whether the pool holds `id`; `h` walks held_ along ascending ids.
  bool held(int64_t id, size_t* h) const {
    while (*h < held_.size() && held_[*h].first < id) ++*h;
    return *h < held_.size() && held_[*h].first == id;
  }

  // Appends to `riders` the rows of `ids` (ascending) that are not held and lie wholly inside a
  // span, up to `cap` riders in all.
  void join_within(const std::vector<int64_t>& ids, const storage::DiskFeatures& disk, const Spans& spans, size_t cap,
                   std::vector<int64_t>* riders) const {
    for (size_t i = 0, g = 0, h = 0; i < ids.size() && riders->size() < cap; ++i) {
      const auto [p, q] = disk.pages_of(ids[i]);
      while (g < spans.size() && spans[g].second < p) ++g;
      if (g == spans.size()) break;
      if (p < spans[g].first || q > spans[g].second) continue;
      if (!held(ids[i], &h)) riders->push_back(ids[i]);
    }
  }

  // The gap of unneeded pages a rider may chain across: one page fewer than the disk tier's, whose
  // gap weighs a page read through against a request of its own; a rider's request would come
  // later and might have merged into its own window's run. On the CPU machine's R-MAT 20 (gap 3)
  // chains across 2 cost the least in the disk's affine model, against 0, 1 and 3 (4 GB-like),
  // and 1 a little less than 2 (8 GB-like); docs/performance.md. GALE_READ_AHEAD_CHAIN_GAP
  // overrides it, for measuring.
  static uint64_t chain_gap(const storage::DiskFeatures& disk) {
    static const int64_t forced = [] {
      const char* env = std::getenv("GALE_READ_AHEAD_CHAIN_GAP");
      return env != nullptr && std::atoll(env) >= 0 ? static_cast<int64_t>(std::atoll(env)) : int64_t{-1};
    }();
    return static_cast<uint64_t>(forced >= 0 ? forced : std::max(0, disk.gap_pages() - 1));
  }

  // Appends to `riders` the rows of `ids` (ascending) that are not held and whose pages lie within
  // chain_gap of a span or of a row joined before them, in a pass up the pages and one down, up to
  // `cap` riders in all; the spans grow by the rows joined (merged across that gap).
  void join_chained(const std::vector<int64_t>& ids, const storage::DiskFeatures& disk, size_t cap, Spans* spans,
                    std::vector<int64_t>* riders) const {
    if (spans->empty()) return;
    const uint64_t gap = chain_gap(disk);
    std::vector<char> joined(ids.size(), 0), is_held(ids.size(), 0);
    for (size_t i = 0, h = 0; i < ids.size(); ++i) is_held[i] = held(ids[i], &h);
    size_t count = riders->size();
    {  // up the pages: `reach` is the last page read at or before the row's
      uint64_t reach = 0;
      bool any = false;
      for (size_t i = 0, g = 0; i < ids.size() && count < cap; ++i) {
        const auto [p, q] = disk.pages_of(ids[i]);
        for (; g < spans->size() && (*spans)[g].first <= q; ++g) {
          reach = any ? std::max(reach, (*spans)[g].second) : (*spans)[g].second;
          any = true;
        }
        if (!any || p > reach + 1 + gap || is_held[i]) continue;
        joined[i] = 1;
        ++count;
        reach = std::max(reach, q);
      }
    }
    {  // down the pages: `reach` is the first page read at or after the row's
      uint64_t reach = 0;
      bool any = false;
      size_t g = spans->size();
      for (size_t i = ids.size(); i-- > 0 && count < cap;) {
        const auto [p, q] = disk.pages_of(ids[i]);
        for (; g > 0 && (*spans)[g - 1].second >= p; --g) {
          reach = any ? std::min(reach, (*spans)[g - 1].first) : (*spans)[g - 1].first;
          any = true;
        }
        if (joined[i]) {
          reach = any ? std::min(reach, p) : p;
          any = true;
          continue;
        }
        if (!any || q + 1 + gap < reach || is_held[i]) continue;
        joined[i] = 1;
        ++count;
        reach = p;
      }
    }
    Spans grown;
    grown.reserve(spans->size() + count - riders->size());
    const auto add = [&](uint64_t p, uint64_t q) {
      if (!grown.empty() && p <= grown.back().second + 1 + gap) grown.back().second = std::max(grown.back().second, q);
      else grown.emplace_back(p, q);
    };
    size_t g = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!joined[i]) continue;
      const auto [p, q] = disk.pages_of(ids[i]);
      for (; g < spans->size() && (*spans)[g].first <= p; ++g) add((*spans)[g].first, (*spans)[g].second);
      add(p, q);
      riders->push_back(ids[i]);
    }
    for (; g < spans->size(); ++g) add((*spans)[g].first, (*spans)[g].second);
    *spans = std::move(grown);
  }

  // The rows held that neither w nor live needs (indices into held_, ascending rows).
  std::vector<size_t> spare_rows(const std::vector<int64_t>& w, const std::vector<int64_t>& live) const {
    std::vector<size_t> spare;
    for (size_t h = 0, a = 0, b = 0; h < held_.size(); ++h) {
      const int64_t id = held_[h].first;
      while (a < w.size() && w[a] < id) ++a;
      while (b < live.size() && live[b] < id) ++b;
      if ((a < w.size() && w[a] == id) || (b < live.size() && live[b] == id)) continue;
      spare.push_back(h);
    }
    return spare;
  }

  // Frees the slots of held_[h] for each h of `rows` (ascending).
  void release(const std::vector<size_t>& rows) {
    for (size_t h : rows) {
      free_.push_back(held_[h].second);
      held_[h].first = -1;
    }
    held_.erase(std::remove_if(held_.begin(), held_.end(), [](const auto& e) { return e.first < 0; }), held_.end());
  }

  // The `drop` of `spare` to drop: rows no later window needs, least recently needed first, then
  // (unless unneeded_only: then fewer) those the later windows need latest. Ascending, as spare.
  std::vector<size_t> choose_drops(const std::vector<size_t>& spare, size_t drop,
                                   const std::vector<const std::vector<int64_t>*>& later, bool unneeded_only) const {
    drop = std::min(drop, spare.size());
    if (drop == 0) return {};
    constexpr int64_t kNever = INT64_MAX;
    std::vector<int64_t> rows(spare.size()), next(spare.size(), kNever);  // next: the first later window needing it
    for (size_t i = 0; i < spare.size(); ++i) rows[i] = held_[spare[i]].first;
    for (size_t j = later.size(); j-- > 0;) {  // the latest first: the soonest writes last
      const std::vector<int64_t>& ids = *later[j];
      for (size_t i = 0, x = 0; i < rows.size() && x < ids.size(); ++i) {
        while (x < ids.size() && ids[x] < rows[i]) ++x;
        if (x < ids.size() && ids[x] == rows[i]) next[i] = static_cast<int64_t>(j);
      }
    }
    // Dropped first: not needed ahead (then the oldest last use), then the latest next use; one
    // key each, computed once.
    constexpr int64_t kNeeded = int64_t{1} << 62;
    std::vector<std::pair<int64_t, size_t>> keyed(spare.size());
    for (size_t i = 0; i < spare.size(); ++i)
      keyed[i] = {next[i] == kNever ? last_needed_[static_cast<size_t>(held_[spare[i]].second)] : kNeeded - next[i], i};
    if (unneeded_only) {
      keyed.erase(std::remove_if(keyed.begin(), keyed.end(), [&](const auto& k) { return next[k.second] != kNever; }),
                  keyed.end());
      drop = std::min(drop, keyed.size());
      if (drop == 0) return {};
    }
    std::nth_element(keyed.begin(), keyed.begin() + static_cast<std::ptrdiff_t>(drop - 1), keyed.end());
    std::vector<size_t> chosen;
    chosen.reserve(drop);
    for (size_t i = 0; i < drop; ++i) chosen.push_back(spare[keyed[i].second]);
    std::sort(chosen.begin(), chosen.end());
    return chosen;
  }

  // Adds (row, slot) pairs, ascending rows, to held_.
  void hold(const std::vector<std::pair<int64_t, int32_t>>& added) {
    std::vector<std::pair<int64_t, int32_t>> merged;
    merged.reserve(held_.size() + added.size());
    std::merge(held_.begin(), held_.end(), added.begin(), added.end(), std::back_inserter(merged));
    held_ = std::move(merged);
  }

  const bool keep_;
  std::vector<std::pair<int64_t, int32_t>> held_;  // (row, slot), ascending rows
  std::vector<int64_t> fresh_;                     // the rows the last place() gave new slots, ascending
  std::vector<int32_t> free_;
  std::vector<int64_t> last_needed_;  // per slot
};

// `bytes`, or less where the budget has less room now (other charges may have taken part of what
// the host tier set aside), keeping room for a window's read to stage: a smaller pool, not a run
// that stops.
uint64_t usable_bytes(const storage::DiskFeatures& disk, uint64_t bytes) {
  const kernels::cuda::MemoryBudget* budget = disk.budget();
  if (budget == nullptr || budget->unlimited()) return bytes;
  const uint64_t room = budget->limit() > budget->in_use() ? budget->limit() - budget->in_use() : 0;
  const uint64_t staging = storage::DiskFeatures::max_staging_bytes();
  return std::min(bytes, room > staging ? room - staging : 0);
}

// The reading thread's own staging (usable_bytes left room for it), or null where the budget has
// none now: each read then stages on its own, as read_rows does.
std::unique_ptr<storage::ReadStaging> own_staging(storage::DiskFeatures& disk) {
  try {
    return std::make_unique<storage::ReadStaging>(disk);
  } catch (const ResourceError&) {
    return nullptr;
  }
}

int64_t nanoseconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

// Whether the environment variable `name` leaves a measuring switch on (it is, unless set to 0).
bool unless_zero(const char* name) {
  const char* env = std::getenv(name);
  return env == nullptr || std::string(env) != "0";
}

}  // namespace

int64_t read_ahead_lead(bool gpu_sampled, bool later_epochs, int64_t epoch_batches) {
  static const int64_t forced = [] {  // -1: not set
    const char* env = std::getenv("GALE_READ_AHEAD_LEAD");
    return env != nullptr && std::atoll(env) >= 0 ? static_cast<int64_t>(std::atoll(env)) : int64_t{-1};
  }();
  if (forced >= 0) return forced;
  return gpu_sampled && later_epochs ? std::max<int64_t>(1, epoch_batches / 2) : 0;
}

bool read_ahead_keeps() {
  static const bool keep = unless_zero("GALE_READ_AHEAD_KEEP");
  return keep;
}

bool read_ahead_rides_along() {
  static const bool ride = unless_zero("GALE_READ_AHEAD_RIDE");
  return ride;
}

bool read_ahead_chains_riders() {
  static const bool chain = unless_zero("GALE_READ_AHEAD_CHAIN");
  return chain;
}

bool read_ahead_cuts_when_caught_up() {
  static const bool cut = unless_zero("GALE_READ_AHEAD_CATCH_UP");
  return cut;
}

ReadAhead::Shape ReadAhead::shape(uint64_t bytes, int64_t num_nodes, int64_t dim, int parts) {
  Shape s;
  const uint64_t seen = (static_cast<uint64_t>(num_nodes) / 64 + 1) * sizeof(uint64_t);
  const uint64_t row = storage::RowPool::bytes_per_slot(dim);
  const uint64_t per_slot = row + kPlanBytesPerSlot + window_lists(parts) * kWindowBytesPerRow / static_cast<uint64_t>(window_share());
  s.slots = std::clamp<int64_t>(static_cast<int64_t>(bytes > seen ? (bytes - seen) / per_slot : 0), window_share(),
                                INT32_MAX);
  s.window_rows = s.slots / window_share();
  s.pool_bytes = static_cast<uint64_t>(s.slots) * row;
  s.bookkeeping_bytes = seen + static_cast<uint64_t>(s.slots) * kPlanBytesPerSlot +
                        window_lists(parts) * static_cast<uint64_t>(s.window_rows) * kWindowBytesPerRow;
  return s;
}

double window_growth(bool gpu_sampled) {
  static const double forced = [] {
    const char* env = std::getenv("GALE_READ_AHEAD_GROWTH");
    return env != nullptr && std::atof(env) >= kMinWindowGrowth ? std::atof(env) : 0.0;
  }();
  return forced > 0 ? forced : gpu_sampled ? 16.0 : 2.0;
}

ReadAhead::ReadAhead(storage::DiskFeatures& disk, uint64_t bytes, double growth, Segment first, NextSegment next,
                     bool keep, bool ride_along, bool chain, int parts, int64_t lead, bool catch_up)
    : disk_(disk),
      shape_(shape(usable_bytes(disk, bytes), disk.num_nodes(), disk.feature_dim(), std::max(1, parts))),
      growth_(std::max(kMinWindowGrowth, growth)),
      keep_(keep),
      ride_along_(ride_along),
      chain_(chain),
      parts_(std::max(1, parts)),
      lead_(std::max<int64_t>(0, lead)),
      catch_up_(catch_up),
      bookkeeping_(disk.budget(), shape_.bookkeeping_bytes),
      pool_(std::make_shared<storage::RowPool>(disk.budget(), shape_.slots, disk.feature_dim())),
      staging_(own_staging(disk)),
      sampling_([this, first = std::move(first), next = std::move(next)]() mutable { sample_windows(std::move(first), next); }),
      reading_([this] { read_windows(); }) {}

ReadAhead::~ReadAhead() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  sampling_.join();
  reading_.join();
}

void ReadAhead::fail(std::exception_ptr e) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::move(e);
  }
  changed_.notify_all();
}

// The windows the sampling thread has planned and not yet handed over, and the pool's plan for them:
// each goes over to the reading thread with its rows' slots.
class ReadAhead::Handover {
 public:
  explicit Handover(ReadAhead& ra)
      : ra_(ra), plan_(ra.shape_.slots, ra.keep_), full_(std::max<int64_t>(1, ra.shape_.window_rows)) {}

  bool empty() const { return ahead_.empty(); }
  // A window's largest row count.
  int64_t full() const { return full_; }
  void plan(Planned window) { ahead_.push_back(std::move(window)); }

  // Hands the oldest planned window over with its slots in the pool. Waits until the reading
  // thread has taken the one before. false: stopped.
  bool hand_over() {
    Planned w = std::move(ahead_.front());
    ahead_.pop_front();
    std::vector<const std::vector<int64_t>*> later;
    for (const Planned& p : ahead_) later.push_back(&p.ids);
    w.slots = plan_.place(w.ids, live_, later, handed_);
    if (w.slots.empty() && !live_.empty()) {  // too large beside the live window: read once it is done
      w.slots = plan_.place(w.ids, {}, later, handed_);
      w.alone = !w.slots.empty();
    }
    if (!w.slots.empty() && ra_.keep_ && ra_.ride_along_) {
      for (const auto& [id, slot] :
           plan_.ride_along(w.ids, live_, later, ra_.disk_, static_cast<size_t>(full_), handed_, ra_.chain_)) {
        w.extra_ids.push_back(id);
        w.extra_slots.push_back(slot);
      }
    }
    w.plan = handed_++;
    handed_end_ = w.end;
    if (w.slots.empty()) live_.clear();  // larger than the pool: its batches read their own rows
    else live_ = w.ids;
    std::vector<Planned> pieces;
    if (ra_.parts_ > 1 && !w.slots.empty() && w.end - w.first > 1) pieces = ra_.split_into_parts(std::move(w), plan_.fresh());
    else pieces.push_back(std::move(w));
    std::unique_lock<std::mutex> lock(ra_.mutex_);
    ra_.changed_.wait(lock, [&] { return ra_.stop_ || ra_.error_ || ra_.planned_.empty(); });
    if (ra_.stop_ || ra_.error_) return false;
    for (Planned& piece : pieces) ra_.planned_.push_back(std::move(piece));
    lock.unlock();
    ra_.changed_.notify_all();
    return true;
  }

  // Whether training is about to run out of batches read (within kCatchUpMargin of the last window
  // handed over) while the reading thread has nothing to read: the next window should go now,
  // however few batches it has, or training waits for its sampling (catch_up_).
  bool caught_up() const {
    if (!ra_.catch_up_ || handed_ == 0) return false;
    const std::lock_guard<std::mutex> lock(ra_.mutex_);
    return ra_.planned_.empty() && !ra_.reader_busy_ && handed_end_ - ra_.prepared_ <= kCatchUpMargin;
  }

  // The first window goes at once, and so does the oldest when the reading thread has nothing
  // queued (planning further ahead never makes it wait), or when training has caught up with the
  // windows handed over. Otherwise up to kHorizon windows are planned past the one handed over
  // next. false: stopped.
  bool hand_over_due() {
    while (!ahead_.empty() && (handed_ == 0 || ahead_.size() > kHorizon || (ahead_.size() > 1 && reader_waits()) || caught_up()))
      if (!hand_over()) return false;
    return true;
  }

  bool hand_over_all() {
    while (!ahead_.empty())
      if (!hand_over()) return false;
    return true;
  }

 private:
  // Whether the reading thread has taken every window handed over (it will want the next soon).
  bool reader_waits() const {
    const std::lock_guard<std::mutex> lock(ra_.mutex_);
    return ra_.planned_.empty();
  }

  ReadAhead& ra_;
  PoolPlan plan_;
  const int64_t full_;
  std::deque<Planned> ahead_;
  std::vector<int64_t> live_;  // the rows of the last window handed over, which the batches read from
                               // while the reading thread reads the next
  int64_t handed_ = 0;
  int64_t handed_end_ = 0;  // the position past the last window handed over
};

// The batches in sequence, segment after segment, each as its distinct misses, sampled a chunk at
// a time ahead of the window being grown.
class ReadAhead::Batches {
 public:
  Batches(ReadAhead& ra, Segment first, const NextSegment& next)
      : ra_(ra), segment_(std::move(first)), next_(next), b_(segment_.first), next_sample_(segment_.first) {
    place_segment();
  }

  // Grows a window from the batches in turn: a batch joins it unless its new rows would overfill it
  // (`rows` rows, `max_batches` batches; a window has at least one batch, however many rows that is) or
  // training has caught up with the windows handed over. `seen` marks the window's rows and is
  // cleared again. false: stopped.
  bool grow_window(Handover& out, int64_t rows, int64_t max_batches, std::vector<uint64_t>& seen, Planned* window, bool* more) {
    window->first = at();
    for (;;) {
      const std::vector<int64_t>* misses = nullptr;
      const Next next = front(out, &misses);
      if (next == Next::kStopped) return false;
      if (next == Next::kEnd) {
        *more = false;
        break;
      }
      int64_t fresh = 0;
      for (int64_t id : *misses) fresh += (seen[static_cast<size_t>(id) >> 6] >> (id & 63) & 1) == 0;
      const int64_t pos = at();
      if (pos > window->first && (static_cast<int64_t>(window->ids.size()) + fresh > rows || pos - window->first >= max_batches ||
                                 (out.empty() && out.caught_up())))
        break;
      for (int64_t id : *misses) {
        uint64_t& word = seen[static_cast<size_t>(id) >> 6];
        if ((word >> (id & 63) & 1) == 0) {
          word |= uint64_t{1} << (id & 63);
          window->ids.push_back(id);
          if (ra_.parts_ > 1) window->first_use.push_back(static_cast<int32_t>(pos - window->first));
        }
      }
      pop();
    }
    window->end = at();
    for (int64_t id : window->ids) seen[static_cast<size_t>(id) >> 6] = 0;
    // Ascending ids (with parts, each keeping its first use).
    if (ra_.parts_ > 1) {
      std::vector<std::pair<int64_t, int32_t>> by_id(window->ids.size());
      for (size_t i = 0; i < by_id.size(); ++i) by_id[i] = {window->ids[i], window->first_use[i]};
      std::sort(by_id.begin(), by_id.end());
      for (size_t i = 0; i < by_id.size(); ++i) std::tie(window->ids[i], window->first_use[i]) = by_id[i];
    } else {
      std::sort(window->ids.begin(), window->ids.end());
    }
    return true;
  }

 private:
  enum class Next { kBatch, kEnd, kStopped };

  // The current batch's position in the sequence.
  int64_t at() const { return position_ + b_ - segment_.first; }

  // The current batch's misses (sampling the next chunk when none is left, and the next segment
  // at a segment's end), or why there is none.
  Next front(Handover& out, const std::vector<int64_t>** misses) {
    while (b_ == segment_.end) {  // on into the next epoch
      std::optional<Segment> after = next_(segment_.epoch);
      if (!after) return Next::kEnd;
      position_ += segment_.end - segment_.first;
      segment_ = std::move(*after);
      b_ = next_sample_ = segment_.first;
      sampled_.clear();
      place_segment();
    }
    if (sampled_.empty() && !sample(out)) return Next::kStopped;
    *misses = &sampled_.front();
    return Next::kBatch;
  }

  void pop() {
    sampled_.pop_front();
    ++b_;
  }

  void place_segment() {
    {
      const std::lock_guard<std::mutex> lock(ra_.mutex_);
      ra_.placed_.push_back(Placed{segment_.epoch, segment_.first, segment_.end, position_});
    }
    ra_.changed_.notify_all();
  }

  // Samples the next chunk of the segment's batches. With a lead: while windows are planned ahead
  // and the reading thread has one queued, sample no further than the lead past the batches
  // prepared; once the reading thread wants the next window, hand it over and go on. false: stopped.
  bool sample(Handover& out) {
    {
      std::unique_lock<std::mutex> lock(ra_.mutex_);
      if (ra_.stop_ || ra_.error_) return false;
      if (ra_.lead_ > 0 && !out.empty()) {
        const int64_t to = position_ + next_sample_ - segment_.first;
        ra_.changed_.wait(lock, [&] { return ra_.stop_ || ra_.error_ || ra_.planned_.empty() || to - ra_.prepared_ < ra_.lead_; });
        if (ra_.stop_ || ra_.error_) return false;
        const bool wants = ra_.planned_.empty();
        lock.unlock();
        if (wants && !out.hand_over()) return false;
      }
    }
    if (!out.empty() && out.caught_up() && !out.hand_over()) return false;  // a planned window goes at once
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t n = std::min(sample_chunk(), segment_.end - next_sample_);
    std::vector<std::vector<int64_t>> chunk(static_cast<size_t>(n));
    tbb::parallel_for(int64_t{0}, n, [&](int64_t i) {
      const std::vector<int64_t> inputs = segment_.sample(next_sample_ + i);
      ra_.disk_.collect_misses(inputs.data(), static_cast<int64_t>(inputs.size()), &chunk[static_cast<size_t>(i)]);
    });
    for (auto& misses : chunk) sampled_.push_back(std::move(misses));
    next_sample_ += n;
    ra_.disk_.add_sampling(nanoseconds_since(t0));
    return true;
  }

  ReadAhead& ra_;
  Segment segment_;
  const NextSegment& next_;
  int64_t position_ = 0;  // of the segment's batch b: position_ + b - segment_.first
  int64_t b_;
  int64_t next_sample_;
  std::deque<std::vector<int64_t>> sampled_;
};

void ReadAhead::sample_windows(Segment segment, const NextSegment& next) {
  try {
    Handover out(*this);
    Batches batches(*this, std::move(segment), next);
    std::vector<uint64_t> seen(static_cast<size_t>(disk_.num_nodes() / 64 + 1), 0);
    // Windows start small, so that the first read starts soon, and grow to the shape's.
    int64_t rows = std::max<int64_t>(1, out.full() / kFirstWindowShare);
    int64_t max_batches = kFirstWindowBatches;
    for (bool more = true; more;) {
      Planned window;
      if (!batches.grow_window(out, rows, max_batches, seen, &window, &more)) return;
      if (window.end == window.first) break;
      rows = std::min(out.full(), grown(rows, growth_));
      max_batches = std::min(kMaxWindowBatches, grown(max_batches, growth_));
      out.plan(std::move(window));
      if (!out.hand_over_due()) return;
    }
    if (!out.hand_over_all()) return;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      sampled_all_ = true;
    }
    changed_.notify_all();
  } catch (...) {
    fail(std::current_exception());
  }
}

std::vector<ReadAhead::Planned> ReadAhead::split_into_parts(Planned w, const std::vector<int64_t>& fresh) const {
  const int64_t batches = w.end - w.first;
  const int64_t k = std::min<int64_t>(parts_, batches);
  // Visits the window's rows and its riders in ascending id (so ascending pages) order.
  const auto each_row = [&](const auto& visit) {  // visit(rider, index, id)
    for (size_t i = 0, x = 0; i < w.ids.size() || x < w.extra_ids.size();) {
      if (i == w.ids.size() || (x < w.extra_ids.size() && w.extra_ids[x] < w.ids[i])) {
        visit(true, x, w.extra_ids[x]);
        ++x;
      } else {
        visit(false, i, w.ids[i]);
        ++i;
      }
    }
  };
  // Each row's part (-1: none yet), whether a window row will be read (the pool does not hold it),
  // and the part whose batches first need it (riders: the last).
  std::vector<int32_t> part_of(w.ids.size(), -1), rider_part(w.extra_ids.size(), -1);
  std::vector<char> read(w.ids.size(), 0);
  for (size_t i = 0, f = 0; i < w.ids.size(); ++i) {
    while (f < fresh.size() && fresh[f] < w.ids[i]) ++f;
    read[i] = f < fresh.size() && fresh[f] == w.ids[i];
  }
  const auto due = [&](bool rider, size_t i) {
    return rider ? k - 1 : static_cast<int64_t>(w.first_use[i]) * k / batches;
  };
  // Part p reads the rows its batches need first, and the rows of later parts that a read of
  // those would merge (within the disk tier's gap of their runs), so no page is read twice.
  const uint64_t gap = static_cast<uint64_t>(disk_.gap_pages());
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (int64_t p = 0; p < k; ++p) {
    spans.clear();
    each_row([&](bool rider, size_t i, int64_t id) {
      int32_t& part = rider ? rider_part[i] : part_of[i];
      if (part >= 0 || due(rider, i) != p) return;
      part = static_cast<int32_t>(p);
      if (!rider && !read[i]) return;
      const auto [a, z] = disk_.pages_of(id);
      if (!spans.empty() && a <= spans.back().second + 1 + gap) spans.back().second = std::max(spans.back().second, z);
      else spans.emplace_back(a, z);
    });
    size_t g = 0;
    each_row([&](bool rider, size_t i, int64_t id) {
      int32_t& part = rider ? rider_part[i] : part_of[i];
      if (part >= 0 || (!rider && !read[i])) return;
      const auto [a, z] = disk_.pages_of(id);
      while (g < spans.size() && spans[g].second + 1 + gap < a) ++g;
      if (g < spans.size() && z + 1 + gap >= spans[g].first) part = static_cast<int32_t>(p);
    });
  }
  std::vector<Planned> out(static_cast<size_t>(k));
  for (int64_t p = 0; p < k; ++p) {
    Planned& part = out[static_cast<size_t>(p)];
    part.first = w.first + (p * batches + k - 1) / k;  // the batches whose first-use part is p
    part.end = w.first + ((p + 1) * batches + k - 1) / k;
    part.alone = w.alone;
    part.plan = w.plan;
  }
  each_row([&](bool rider, size_t i, int64_t id) {
    Planned& part = out[static_cast<size_t>(rider ? rider_part[i] : part_of[i])];
    (rider ? part.extra_ids : part.ids).push_back(id);
    (rider ? part.extra_slots : part.slots).push_back(rider ? w.extra_slots[i] : w.slots[i]);
  });
  // The whole window's rows, shared by the parts (its lists moved, not copied).
  const auto whole = std::make_shared<const storage::WindowRows>(pool_, std::move(w.ids), std::move(w.slots));
  for (Planned& part : out) part.whole = whole;
  return out;
}

void ReadAhead::read_windows() {
  try {
    int64_t failed_plan = -1;  // a window one of whose parts could not be read: its later parts are not read
    for (;;) {
      Planned window;
      {
        // The next window sampled, once no window is alive but the last one read (whose rows the
        // plan kept in place: the slots the next takes over belong to no live window then; windows
        // may finish out of order, as batches are prepared in parallel), or none at all for a window
        // planned alone; the parts of the window being read may be alive too.
        std::unique_lock<std::mutex> lock(mutex_);
        const auto ready = [&] {
          if (stop_ || error_) return true;
          if (planned_.empty()) return sampled_all_;
          const int64_t oldest = planned_.front().plan - (planned_.front().alone ? 0 : 1);
          return std::all_of(windows_.begin(), windows_.end(), [&](const Window& w) { return w.plan >= oldest; });
        };
        // The wait, split by what it waited for (read_ahead_reader_idle_s / _held_s).
        int64_t idle = 0, held = 0;
        while (!ready()) {
          const auto t0 = std::chrono::steady_clock::now();
          const bool planned = !planned_.empty();
          changed_.wait(lock);
          (planned ? held : idle) += nanoseconds_since(t0);
        }
        disk_.add_reader_wait(idle, held);
        if (stop_ || error_ || planned_.empty()) return;
        window = std::move(planned_.front());
        planned_.pop_front();
        reader_busy_ = true;
      }
      changed_.notify_all();
      std::shared_ptr<const storage::WindowRows> rows;
      if (window.whole != nullptr) {  // a part: its batches may need the rows of the parts before it
        if (window.plan != failed_plan) {
          try {
            if (!window.ids.empty() || !window.extra_ids.empty())
              disk_.read_window(pool_, std::move(window.ids), std::move(window.slots), window.extra_ids,
                                window.extra_slots, staging_.get());
            rows = window.whole;
          } catch (const ResourceError&) {
            rows = nullptr;  // the budget refused its staging: its batches read their own misses, and so
            failed_plan = window.plan;  // do those of the parts after it, which need this part's rows
          }
        }
      } else if (!window.slots.empty()) {
        try {
          rows = disk_.read_window(pool_, std::move(window.ids), std::move(window.slots), window.extra_ids,
                                   window.extra_slots, staging_.get());
        } catch (const ResourceError&) {
          rows = nullptr;  // the budget refused its staging: its batches read their own misses
        }
      }
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        windows_.push_back(Window{window.first, window.end, std::move(rows), window.end - window.first, window.plan});
        reader_busy_ = false;
      }
      changed_.notify_all();
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

int64_t ReadAhead::position(std::unique_lock<std::mutex>& lock, int64_t epoch, int64_t b) {
  const Placed* found = nullptr;
  changed_.wait(lock, [&] {
    if (error_) return true;
    for (const Placed& p : placed_) {
      if (p.epoch == epoch) {
        found = &p;
        return true;
      }
    }
    return sampled_all_;
  });
  if (error_) std::rethrow_exception(error_);
  if (found == nullptr || b < found->first || b >= found->end)
    throw InternalError("read-ahead: batch " + std::to_string(b) + " of epoch " + std::to_string(epoch + 1) +
                        " is not in the batches read ahead");
  return found->offset + b - found->first;
}

std::deque<ReadAhead::Window>::iterator ReadAhead::window_at(std::unique_lock<std::mutex>& lock, int64_t epoch, int64_t b) {
  const int64_t at = position(lock, epoch, b);
  std::deque<Window>::iterator found;
  changed_.wait(lock, [&] {
    if (error_) return true;
    found = std::find_if(windows_.begin(), windows_.end(), [&](const Window& w) { return w.first <= at && at < w.end; });
    return found != windows_.end();
  });
  if (error_) std::rethrow_exception(error_);
  return found;
}

std::shared_ptr<const storage::WindowRows> ReadAhead::window_of(int64_t epoch, int64_t b) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  std::shared_ptr<const storage::WindowRows> rows = window_at(lock, epoch, b)->rows;
  lock.unlock();
  disk_.add_wait(nanoseconds_since(t0));
  return rows;
}

void ReadAhead::done(int64_t epoch, int64_t b) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto it = window_at(lock, epoch, b);
    const bool last = --it->pending == 0;
    if (last) windows_.erase(it);
    prepared_ = std::max(prepared_, position(lock, epoch, b) + 1);  // read by the sampling (catch_up_, lead_)
    if (lead_ == 0 && !last) return;  // only a lead waits on it
  }
  changed_.notify_all();
}

}  // namespace gale::engine::train_parts
