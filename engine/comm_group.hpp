// engine/comm_group.hpp — internal to engine/comm*.cpp: what the workers of one process share, a
// generation barrier that abort() breaks, and the exchange of one 64-bit value per worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/error.hpp"

namespace gale::engine {

class WorkerGroup {
 public:
  explicit WorkerGroup(int workers) : workers_(workers), values_(static_cast<size_t>(workers)) {}
  int size() const { return workers_; }

  // Returns once every worker has arrived; throws ResourceError with the abort reason instead when
  // the group is aborted before or while waiting.
  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!aborted_.empty()) throw ResourceError(aborted_);
    const uint64_t gen = generation_;
    if (++arrived_ == workers_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || !aborted_.empty(); });
    if (generation_ == gen) throw ResourceError(aborted_);
  }

  // Every worker's value in rank order.
  std::vector<uint64_t> all_gather(int rank, uint64_t value) {
    values_[static_cast<size_t>(rank)] = value;
    barrier();
    std::vector<uint64_t> out = values_;
    barrier();  // nobody overwrites a value before everyone has read them
    return out;
  }

  // The first reason wins; `on_first` runs once, under the lock, before the waiters wake.
  template <typename F>
  void abort(const std::string& reason, F&& on_first) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.empty()) return;
    aborted_ = reason;
    on_first();
    cv_.notify_all();
  }
  void throw_if_aborted() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_.empty()) throw ResourceError(aborted_);
  }

 private:
  const int workers_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::string aborted_;  // non-empty once a worker gave up
  std::vector<uint64_t> values_;
};

}  // namespace gale::engine
