// engine/comm_group.hpp — internal to engine/comm*.cpp: what the workers of one process share, a
// generation barrier that abort() breaks, and the exchange of 64-bit values with every worker of
// the run (this process's through shared memory, other processes' through engine/processes.hpp).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "engine/processes.hpp"
#include "kernels/error.hpp"

namespace gale::engine {

class WorkerGroup {
 public:
  // `workers` worker threads of this process; with several processes every one has as many.
  WorkerGroup(int workers, Processes* procs)
      : workers_(workers), procs_(procs && procs->distributed() ? procs : nullptr), values_(static_cast<size_t>(workers)) {}
  int size() const { return workers_; }  // this process's workers
  // Every process's workers, and a local worker's rank among them (process-major).
  int world_size() const { return workers_ * (procs_ ? procs_->size() : 1); }
  int world_rank(int local) const { return (procs_ ? procs_->rank() : 0) * workers_ + local; }
  Processes* processes() const { return procs_; }

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

  // Every worker's values (each the same count) in world-rank order, concatenated. Local worker 0
  // exchanges this process's share with the other processes (so it must run on the thread that
  // makes the run's MPI calls).
  std::vector<uint64_t> all_gather(int local, const std::vector<uint64_t>& values) {
    values_[static_cast<size_t>(local)] = values;
    barrier();
    if (local == 0) {
      std::vector<uint64_t> mine;
      for (const auto& v : values_) {
        if (v.size() != values.size()) throw InternalError("all_gather: workers' counts differ");
        mine.insert(mine.end(), v.begin(), v.end());
      }
      if (procs_) {
        const std::vector<uint8_t> bytes = procs_->all_gather(mine.data(), mine.size() * sizeof(uint64_t), "a metrics exchange");
        gathered_.resize(bytes.size() / sizeof(uint64_t));
        std::memcpy(gathered_.data(), bytes.data(), bytes.size());
      } else {
        gathered_ = std::move(mine);
      }
    }
    barrier();
    std::vector<uint64_t> out = gathered_;
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
  Processes* const procs_;  // null in a single process
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::string aborted_;  // non-empty once a worker gave up
  std::vector<std::vector<uint64_t>> values_;
  std::vector<uint64_t> gathered_;
};

}  // namespace gale::engine
