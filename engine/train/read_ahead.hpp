// engine/train/read_ahead.hpp — the disk tier's look-ahead over one worker's epoch (DESIGN.md,
// "Out of core"; Ginex's superbatch, with a sorted pass in place of per-row reads).
//
// A thread of its own samples the batches ahead of training, with the keys training will use (so
// it finds exactly the node sets the pipeline will), collects the rows they miss in the host
// cache, and reads each window's distinct misses in one pass sorted by offset and coalesced
// (storage::DiskFeatures::read_window), while the batches before it train. A cold page that
// several batches of a window need is read once; rows the window before still holds are copied
// from it. A window grows batch by batch until its distinct misses fill half of the read-ahead
// memory: two windows are alive at once, the one batches read from and the next, being read.
//
// Sampling twice costs GPU (or CPU) time that keeping the sampled batches would not; keeping W
// sampled batches would cost their blocks' memory instead, which is what a run beyond memory has
// least of. The windows change where rows come from, never which: batches see the same bits.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "storage/disk_features.hpp"

namespace gale::engine::train_parts {

class ReadAhead {
 public:
  // Batch b's input node ids (an empty batch: none), sampled as the pipeline will sample it.
  // Called from the read-ahead thread, for several batches at once.
  using SampleInputs = std::function<std::vector<int64_t>(int64_t b)>;

  // Starts reading ahead over batches [first, end) of the plan; `bytes`: what the two live
  // windows may hold together.
  ReadAhead(storage::DiskFeatures& disk, uint64_t bytes, int64_t first, int64_t end, SampleInputs sample);
  // Stops the thread (after the read under way) and frees the windows.
  ~ReadAhead();
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // The window holding batch b's misses, once read (waits for it; the wait is counted in the
  // disk tier's read_ahead_wait_s). nullptr when the budget refused that window: b reads its own
  // misses. Rethrows the thread's error.
  std::shared_ptr<const storage::WindowRows> window_of(int64_t b);
  // Batch b has its rows: a window all of whose batches do is freed.
  void done(int64_t b);

 private:
  struct Window {
    int64_t first = 0, end = 0;  // batches [first, end)
    std::shared_ptr<const storage::WindowRows> rows;
    int64_t pending = 0;  // batches not yet done
  };

  void run();
  bool stopped();
  // Waits until at most one window is alive; false when stopped.
  bool wait_for_room();

  storage::DiskFeatures& disk_;
  const int64_t limit_rows_;  // distinct rows per window
  const int64_t first_, end_;
  const SampleInputs sample_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Window> windows_;  // alive, oldest first
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace gale::engine::train_parts
