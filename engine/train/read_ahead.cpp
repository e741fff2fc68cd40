#include "engine/train/read_ahead.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iterator>
#include <string>
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

// Carrying (the header): the windows planned ahead of the one handed to the reading thread, whose
// misses rank the rows it carries. bench/readahead_sim.py: 8 reads 0.72x the rows of windows
// without carrying (R-MAT 20, windows shorter than an epoch), 4 0.85x, 1 1.09x.
constexpr size_t kCarryHorizon = 8;

// Ids kept per row a full window may hold (ReadAhead::shape): the windows planned ahead (half a
// window each while carrying; one whole window before), the window handed over, and hand_over's
// lists (the candidates, the rest after each planned window, the kept rows, the merged ids).
constexpr uint64_t kIdsPerWindowRow = (kCarryHorizon + 1) / 2 + 1 + 4;

int64_t nanoseconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool read_ahead_carries() {
  static const bool carry = [] {
    const char* env = std::getenv("GALE_READ_AHEAD_CARRY");
    return env == nullptr || std::string(env) != "0";
  }();
  return carry;
}

ReadAhead::Shape ReadAhead::shape(uint64_t bytes, int64_t num_nodes, int64_t dim) {
  Shape s;
  const uint64_t seen = (static_cast<uint64_t>(num_nodes) / 64 + 1) * sizeof(uint64_t);
  const uint64_t per_row =
      2 * (sizeof(int64_t) + static_cast<uint64_t>(dim) * sizeof(float)) + kIdsPerWindowRow * sizeof(int64_t);
  s.window_rows = std::max<int64_t>(1, static_cast<int64_t>(bytes > seen ? (bytes - seen) / per_row : 0));
  s.bookkeeping_bytes = seen + static_cast<uint64_t>(s.window_rows) * kIdsPerWindowRow * sizeof(int64_t);
  return s;
}

int64_t window_growth(bool gpu_sampled) {
  static const int64_t forced = [] {
    const char* env = std::getenv("GALE_READ_AHEAD_GROWTH");
    return env != nullptr && std::atoll(env) >= 2 ? static_cast<int64_t>(std::atoll(env)) : int64_t{0};
  }();
  return forced > 0 ? forced : gpu_sampled ? 16 : 2;
}

ReadAhead::ReadAhead(storage::DiskFeatures& disk, uint64_t bytes, int64_t growth, Segment first, NextSegment next,
                     bool carry)
    : disk_(disk),
      shape_(shape(bytes, disk.num_nodes(), disk.feature_dim())),
      limit_rows_(shape_.window_rows),
      growth_(std::max<int64_t>(2, growth)),
      carry_(carry),
      bookkeeping_(disk.budget(), shape_.bookkeeping_bytes),
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

void ReadAhead::sample_windows(Segment segment, const NextSegment& next) {
  try {
    // Each batch's distinct misses, sampled a chunk at a time ahead of the window being grown.
    std::deque<std::vector<int64_t>> sampled;
    int64_t next_sample = segment.first;
    int64_t position = 0;  // of the segment's batch b: position + b - segment.first
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      placed_.push_back(Placed{segment.epoch, segment.first, segment.end, 0});
    }
    changed_.notify_all();
    std::vector<uint64_t> seen(static_cast<size_t>(disk_.num_nodes() / 64 + 1), 0);
    int64_t limit = std::max<int64_t>(1, limit_rows_ / kFirstWindowShare);
    // Windows carry once a full window turns out shorter than an epoch: where one holds an epoch's
    // misses, it carries them into the next epoch whole, and halving its own rows would lose that.
    bool carrying = false;
    // Windows planned, not yet handed over (their own misses); `before`: the rows of the last one
    // handed over, which the reading thread will hold while it reads the next.
    std::deque<Planned> ahead;
    std::vector<int64_t> before;
    bool handed_any = false;
    // Hands the oldest planned window over with its carry: the rows of `before` it does not need
    // itself that the windows planned after it need, the soonest needed first, up to its limit.
    // Waits until the reading thread has taken the one before. false: stopped.
    const auto hand_over = [&] {
      Planned w = std::move(ahead.front());
      ahead.pop_front();
      std::vector<int64_t> candidates, keep;
      std::set_difference(before.begin(), before.end(), w.ids.begin(), w.ids.end(), std::back_inserter(candidates));
      const size_t room = static_cast<size_t>(std::max<int64_t>(0, w.limit - static_cast<int64_t>(w.ids.size())));
      for (size_t j = 0; j < ahead.size() && keep.size() < room && !candidates.empty(); ++j) {
        std::vector<int64_t> needed, rest;
        std::set_intersection(candidates.begin(), candidates.end(), ahead[j].ids.begin(), ahead[j].ids.end(),
                              std::back_inserter(needed));
        if (needed.size() > room - keep.size()) needed.resize(room - keep.size());
        std::set_difference(candidates.begin(), candidates.end(), needed.begin(), needed.end(), std::back_inserter(rest));
        candidates = std::move(rest);
        keep.insert(keep.end(), needed.begin(), needed.end());
      }
      if (!keep.empty()) {
        std::sort(keep.begin(), keep.end());
        std::vector<int64_t> ids;
        ids.reserve(w.ids.size() + keep.size());
        std::merge(w.ids.begin(), w.ids.end(), keep.begin(), keep.end(), std::back_inserter(ids));
        w.ids = std::move(ids);
      }
      before = w.ids;
      handed_any = true;
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || error_ || planned_.empty(); });
      if (stop_ || error_) return false;
      planned_.push_back(std::move(w));
      lock.unlock();
      changed_.notify_all();
      return true;
    };
    // Whether the reading thread has taken every window handed over (it will want the next soon).
    const auto reader_waits = [&] {
      const std::lock_guard<std::mutex> lock(mutex_);
      return planned_.empty();
    };
    int64_t b = segment.first;
    bool more = true;
    while (more) {
      Planned window;
      window.limit = limit;
      window.first = position + b - segment.first;
      bool filled = false;  // it ended at its limit (not at the run's end)
      while (more) {
        if (b == segment.end) {  // on into the next epoch
          std::optional<Segment> after = next(segment.epoch);
          if (!after) {
            more = false;
            break;
          }
          position += segment.end - segment.first;
          segment = std::move(*after);
          b = next_sample = segment.first;
          sampled.clear();
          {
            const std::lock_guard<std::mutex> lock(mutex_);
            placed_.push_back(Placed{segment.epoch, segment.first, segment.end, position});
          }
          changed_.notify_all();
          continue;
        }
        if (sampled.empty()) {
          {
            const std::lock_guard<std::mutex> lock(mutex_);
            if (stop_ || error_) return;
          }
          const auto t0 = std::chrono::steady_clock::now();
          const int64_t n = std::min(sample_chunk(), segment.end - next_sample);
          std::vector<std::vector<int64_t>> chunk(static_cast<size_t>(n));
          tbb::parallel_for(int64_t{0}, n, [&](int64_t i) {
            const std::vector<int64_t> inputs = segment.sample(next_sample + i);
            disk_.collect_misses(inputs.data(), static_cast<int64_t>(inputs.size()), &chunk[static_cast<size_t>(i)]);
          });
          for (auto& misses : chunk) sampled.push_back(std::move(misses));
          next_sample += n;
          disk_.add_sampling(nanoseconds_since(t0));
        }
        // The batch joins the window unless its new rows would overfill it (a window has at
        // least one batch, however many rows that is).
        const std::vector<int64_t>& misses = sampled.front();
        int64_t fresh = 0;
        for (int64_t id : misses) fresh += (seen[static_cast<size_t>(id) >> 6] >> (id & 63) & 1) == 0;
        const int64_t own = carrying ? std::max<int64_t>(1, limit / 2) : limit;  // the rest of a window carries
        if (position + b - segment.first > window.first && static_cast<int64_t>(window.ids.size()) + fresh > own) {
          filled = true;
          break;
        }
        for (int64_t id : misses) {
          uint64_t& word = seen[static_cast<size_t>(id) >> 6];
          if ((word >> (id & 63) & 1) == 0) {
            word |= uint64_t{1} << (id & 63);
            window.ids.push_back(id);
          }
        }
        sampled.pop_front();
        ++b;
      }
      window.end = position + b - segment.first;
      if (window.end == window.first) break;
      for (int64_t id : window.ids) seen[static_cast<size_t>(id) >> 6] = 0;
      std::sort(window.ids.begin(), window.ids.end());
      if (filled && !carrying && window.limit == limit_rows_ && window.end - window.first < segment.end - segment.first)
        carrying = carry_;
      limit = std::min(limit_rows_, limit * growth_);
      ahead.push_back(std::move(window));
      // The first window (it has nothing to carry) goes at once, and so does the oldest when the
      // reading thread has nothing queued: planning further ahead never makes it wait. Otherwise
      // up to kCarryHorizon windows are planned past the one handed over next.
      while (!ahead.empty() && (!carrying || !handed_any || ahead.size() > kCarryHorizon || (ahead.size() > 1 && reader_waits())))
        if (!hand_over()) return;
    }
    while (!ahead.empty())
      if (!hand_over()) return;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      sampled_all_ = true;
    }
    changed_.notify_all();
  } catch (...) {
    fail(std::current_exception());
  }
}

void ReadAhead::read_windows() {
  try {
    std::shared_ptr<const storage::WindowRows> previous;  // the newest window read
    for (;;) {
      Planned window;
      {
        // The next window sampled, once at most one window is alive.
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || error_ || (windows_.size() < 2 && (!planned_.empty() || sampled_all_)); });
        if (stop_ || error_ || planned_.empty()) return;
        window = std::move(planned_.front());
        planned_.pop_front();
      }
      changed_.notify_all();
      std::shared_ptr<const storage::WindowRows> rows;
      try {
        rows = disk_.read_window(std::move(window.ids), previous.get());
      } catch (const ResourceError&) {
        rows = nullptr;  // the budget refused it: its batches read their own misses
      }
      if (rows) previous = rows;
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        windows_.push_back(Window{window.first, window.end, std::move(rows), window.end - window.first});
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
    if (--it->pending > 0) return;
    windows_.erase(it);
  }
  changed_.notify_all();
}

}  // namespace gale::engine::train_parts
