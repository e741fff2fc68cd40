// kernels/cuda/budget.hpp — a byte budget that allocations are charged against before they are made.
//
// MemoryPool charges every device allocation here first, so `--gpu-mem-budget 8G` is honoured
// exactly and "larger than GPU memory" can be tested on any GPU by setting the budget small.
// Charging happens before the allocation, so a refused request leaves the device untouched.
// Nothing in this file touches CUDA: the host tiers can charge a `--host-mem-budget` the same way.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>
#include <utility>

#include "kernels/error.hpp"

namespace gale::kernels::cuda {

// "1.5 GiB", "512 MiB", "12 B": one decimal, trailing ".0" dropped.
inline std::string format_bytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return std::to_string(bytes) + " B";
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", value);
  std::string s(text);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s + " " + kUnits[unit];
}

class MemoryBudget {
 public:
  static constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

  // flag and limit_text name the budget in messages as the user gave it ("--gpu-mem-budget",
  // "8G"); limit_text defaults to the formatted limit.
  explicit MemoryBudget(uint64_t limit = kUnlimited, std::string flag = "--gpu-mem-budget",
                        std::string limit_text = {})
      : limit_(limit),
        flag_(std::move(flag)),
        limit_text_(limit_text.empty() ? format_bytes(limit) : std::move(limit_text)) {}

  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Adds bytes to in_use, or throws ResourceError and changes nothing when that would pass the
  // limit. Safe to call from any thread: the check and the add are one compare-and-swap.
  void charge(uint64_t bytes) {
    const uint64_t limit = limit_.load(std::memory_order_relaxed);
    uint64_t used = in_use_.load(std::memory_order_relaxed);
    do {
      if (bytes > limit || used > limit - bytes) {
        throw ResourceError(flag_ + " " + limit_text() + " exceeded: allocating " +
                            format_bytes(bytes) + " with " + format_bytes(used) + " in use");
      }
    } while (!in_use_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    raise_peak(used + bytes);
  }

  // A new limit (and its text for messages; empty: the formatted limit) for what is charged from
  // now on; bytes in use stay charged and count against it, so in_use may start above the new
  // limit (every charge then fails until enough is released). A GPU's pool changes its budget so
  // when a run leases the device (engine/device_context.hpp); charges racing the change see the
  // old limit or the new one.
  void set_limit(uint64_t limit, std::string limit_text = {}) {
    std::lock_guard<std::mutex> lock(text_mutex_);
    limit_text_ = limit_text.empty() ? format_bytes(limit) : std::move(limit_text);
    limit_.store(limit, std::memory_order_relaxed);
  }

  // Returns bytes charged earlier.
  void release(uint64_t bytes) noexcept { in_use_.fetch_sub(bytes, std::memory_order_relaxed); }

  uint64_t limit() const noexcept { return limit_.load(std::memory_order_relaxed); }
  // The limit as the user gave it ("8G"), or how a default was derived, or formatted.
  std::string limit_text() const {
    std::lock_guard<std::mutex> lock(text_mutex_);
    return limit_text_;
  }
  uint64_t in_use() const noexcept { return in_use_.load(std::memory_order_relaxed); }
  uint64_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
  bool unlimited() const noexcept { return limit() == kUnlimited; }

  // Starts a new high-water mark from what is in use now (e.g. per epoch).
  void reset_peak() noexcept { peak_.store(in_use(), std::memory_order_relaxed); }

 private:
  void raise_peak(uint64_t value) noexcept {
    uint64_t peak = peak_.load(std::memory_order_relaxed);
    while (value > peak && !peak_.compare_exchange_weak(peak, value, std::memory_order_relaxed)) {
    }
  }

  std::atomic<uint64_t> limit_;
  const std::string flag_;
  mutable std::mutex text_mutex_;  // limit_text_ changes with set_limit; read only for messages
  std::string limit_text_;
  std::atomic<uint64_t> in_use_{0};
  std::atomic<uint64_t> peak_{0};
};

// Bytes charged to a budget (nullptr: none) for as long as this lives.
class BudgetCharge {
 public:
  BudgetCharge(MemoryBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {
    if (budget_) budget_->charge(bytes_);
  }
  ~BudgetCharge() {
    if (budget_) budget_->release(bytes_);
  }
  BudgetCharge(const BudgetCharge&) = delete;
  BudgetCharge& operator=(const BudgetCharge&) = delete;

 private:
  MemoryBudget* budget_;
  uint64_t bytes_;
};

}  // namespace gale::kernels::cuda
