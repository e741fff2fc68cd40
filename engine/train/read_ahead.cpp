#include "engine/train/read_ahead.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include <tbb/parallel_for.h>

#include "kernels/error.hpp"

namespace gale::engine::train_parts {

namespace {

// Batches sampled at once, in parallel (the GPU sampler takes concurrent calls on streams of its
// own; the CPU sampler is const).
constexpr int64_t kSampleChunk = 4;

}  // namespace

ReadAhead::ReadAhead(storage::DiskFeatures& disk, uint64_t bytes, int64_t first, int64_t end, SampleInputs sample)
    : disk_(disk),
      limit_rows_(std::max<int64_t>(
          1, static_cast<int64_t>(bytes / 2 / (sizeof(int64_t) + static_cast<uint64_t>(disk.feature_dim()) * sizeof(float))))),
      first_(first),
      end_(end),
      sample_(std::move(sample)),
      thread_([this] { run(); }) {}

ReadAhead::~ReadAhead() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

bool ReadAhead::stopped() {
  const std::lock_guard<std::mutex> lock(mutex_);
  return stop_;
}

bool ReadAhead::wait_for_room() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return stop_ || windows_.size() < 2; });
  return !stop_;
}

void ReadAhead::run() {
  try {
    // Each batch's distinct misses, sampled a chunk at a time ahead of the window being grown.
    std::deque<std::vector<int64_t>> sampled;
    int64_t next_sample = first_;
    std::vector<uint64_t> seen(static_cast<size_t>(disk_.num_nodes() / 64 + 1), 0);
    std::shared_ptr<const storage::WindowRows> previous;  // the newest window read
    for (int64_t b = first_; b < end_;) {
      const int64_t window_first = b;
      std::vector<int64_t> ids;
      while (b < end_) {
        if (sampled.empty()) {
          if (stopped()) return;
          const int64_t n = std::min(kSampleChunk, end_ - next_sample);
          std::vector<std::vector<int64_t>> chunk(static_cast<size_t>(n));
          tbb::parallel_for(int64_t{0}, n, [&](int64_t i) {
            const std::vector<int64_t> inputs = sample_(next_sample + i);
            disk_.collect_misses(inputs.data(), static_cast<int64_t>(inputs.size()), &chunk[static_cast<size_t>(i)]);
          });
          for (auto& misses : chunk) sampled.push_back(std::move(misses));
          next_sample += n;
        }
        // The batch joins the window unless its new rows would overfill it (a window has at
        // least one batch, however many rows that is).
        const std::vector<int64_t>& misses = sampled.front();
        int64_t fresh = 0;
        for (int64_t id : misses) fresh += (seen[static_cast<size_t>(id) >> 6] >> (id & 63) & 1) == 0;
        if (b > window_first && static_cast<int64_t>(ids.size()) + fresh > limit_rows_) break;
        for (int64_t id : misses) {
          uint64_t& word = seen[static_cast<size_t>(id) >> 6];
          if ((word >> (id & 63) & 1) == 0) {
            word |= uint64_t{1} << (id & 63);
            ids.push_back(id);
          }
        }
        sampled.pop_front();
        ++b;
      }
      for (int64_t id : ids) seen[static_cast<size_t>(id) >> 6] = 0;
      std::sort(ids.begin(), ids.end());

      if (!wait_for_room()) return;
      std::shared_ptr<const storage::WindowRows> rows;
      try {
        rows = disk_.read_window(std::move(ids), previous.get());
      } catch (const ResourceError&) {
        rows = nullptr;  // the budget refused it: its batches read their own misses
      }
      if (rows) previous = rows;
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        windows_.push_back(Window{window_first, b, std::move(rows), b - window_first});
      }
      changed_.notify_all();
    }
  } catch (...) {
    const std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
    changed_.notify_all();
  }
}

std::shared_ptr<const storage::WindowRows> ReadAhead::window_of(int64_t b) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  std::shared_ptr<const storage::WindowRows> rows;
  changed_.wait(lock, [&] {
    if (error_) return true;
    for (const Window& w : windows_) {
      if (w.first <= b && b < w.end) {
        rows = w.rows;
        return true;
      }
    }
    return false;
  });
  if (error_) std::rethrow_exception(error_);
  disk_.add_wait(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  return rows;
}

void ReadAhead::done(int64_t b) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = std::find_if(windows_.begin(), windows_.end(), [&](const Window& w) { return w.first <= b && b < w.end; });
    if (it == windows_.end() || --it->pending > 0) return;
    windows_.erase(it);
  }
  changed_.notify_all();
}

}  // namespace gale::engine::train_parts
