#include "scheduler/epoch_plan.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "kernels/error.hpp"
#include "kernels/random.hpp"

namespace gale::scheduler {

namespace {

// Fisher-Yates with the counter RNG: identical on every platform (std::shuffle is not).
void shuffle(std::vector<int64_t>* v, uint64_t key) {
  kernels::CounterRng rng(key);
  for (int64_t i = static_cast<int64_t>(v->size()) - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap((*v)[i], (*v)[j]);
  }
}

void check_batch_size(int64_t batch_size) {
  if (batch_size <= 0) throw InputError("--batch-size: expected a positive number, found " + std::to_string(batch_size));
}

}  // namespace

EpochPlan::EpochPlan(const std::vector<int64_t>& seeds, int64_t batch_size, uint64_t seed, int64_t epoch, int workers,
                     int rank)
    : order_(seeds), batch_size_(batch_size), workers_(workers), rank_(rank) {
  check_batch_size(batch_size);
  if (workers < 1 || rank < 0 || rank >= workers)
    throw InternalError("EpochPlan: rank " + std::to_string(rank) + " of " + std::to_string(workers) + " workers");
  shuffle(&order_, kernels::derive_key(seed ^ 0x5eed5eedULL, static_cast<uint64_t>(epoch)));
  const int64_t step = batch_size * workers;
  num_batches_ = (static_cast<int64_t>(order_.size()) + step - 1) / step;
}

EpochPlan::EpochPlan(const std::vector<std::vector<int64_t>>& pools, int64_t batch_size, uint64_t seed, int64_t epoch,
                     int rank)
    : batch_size_(batch_size), workers_(static_cast<int>(pools.size())), rank_(rank), pools_(true) {
  check_batch_size(batch_size);
  if (rank < 0 || rank >= workers_) throw InternalError("EpochPlan: rank " + std::to_string(rank) + " of the pools");
  order_ = pools[static_cast<size_t>(rank)];
  shuffle(&order_, kernels::derive_key(kernels::derive_key(seed ^ 0x5eed5eedULL, static_cast<uint64_t>(epoch)),
                                       0x9001ULL + static_cast<uint64_t>(rank)));
  for (const auto& p : pools) {
    pool_sizes_.push_back(static_cast<int64_t>(p.size()));
    num_batches_ = std::max(num_batches_, (static_cast<int64_t>(p.size()) + batch_size - 1) / batch_size);
  }
}

EpochPlan::EpochPlan(std::vector<int64_t> order, int64_t batch_size)
    : order_(std::move(order)), batch_size_(batch_size), workers_(1), rank_(0) {
  check_batch_size(batch_size);
  num_batches_ = (static_cast<int64_t>(order_.size()) + batch_size - 1) / batch_size;
}

EpochPlan EpochPlan::in_order(std::vector<int64_t> seeds, int64_t batch_size) {
  return EpochPlan(std::move(seeds), batch_size);
}

int64_t EpochPlan::begin(int64_t b, int r) const {
  const int64_t n = static_cast<int64_t>(order_.size());
  if (pools_) return std::min(n, (b + (r > rank_ ? 1 : 0)) * batch_size_);
  const int64_t step = batch_size_ * workers_;
  return b * step + step_length(b) * r / workers_;
}

int64_t EpochPlan::step_length(int64_t b) const {
  if (pools_) {
    int64_t total = 0;
    for (int64_t size : pool_sizes_) total += std::clamp<int64_t>(size - b * batch_size_, 0, batch_size_);
    return total;
  }
  const int64_t step = batch_size_ * workers_;
  return std::min<int64_t>(step, static_cast<int64_t>(order_.size()) - b * step);
}

std::vector<std::vector<int64_t>> balance_seed_pools(const std::vector<int64_t>& seeds, const int32_t* partition,
                                                     int workers) {
  if (workers < 1) throw InternalError("balance_seed_pools: at least one worker");
  std::vector<std::vector<int64_t>> pools(static_cast<size_t>(workers));
  for (int64_t v : seeds) pools[static_cast<size_t>(partition[v] % workers)].push_back(v);
  const int64_t n = static_cast<int64_t>(seeds.size());
  const int64_t low = n / workers, high = (n + workers - 1) / workers;
  // Surplus above `high` from the large pools, then what is still above `low` while some pool is
  // below `low`; handed to the small pools in rank order.
  std::vector<int64_t> moved;
  for (auto& p : pools) {
    while (static_cast<int64_t>(p.size()) > high) {
      moved.push_back(p.back());
      p.pop_back();
    }
  }
  auto deficit = [&] {
    int64_t d = 0;
    for (const auto& p : pools) d += std::max<int64_t>(0, low - static_cast<int64_t>(p.size()));
    return d;
  };
  for (auto& p : pools) {
    while (static_cast<int64_t>(moved.size()) < deficit() && static_cast<int64_t>(p.size()) > low) {
      moved.push_back(p.back());
      p.pop_back();
    }
  }
  std::reverse(moved.begin(), moved.end());
  for (auto& p : pools) {
    while (static_cast<int64_t>(p.size()) < low && !moved.empty()) {
      p.push_back(moved.back());
      moved.pop_back();
    }
  }
  for (auto& p : pools) {  // what is left tops pools up to `high`
    while (static_cast<int64_t>(p.size()) < high && !moved.empty()) {
      p.push_back(moved.back());
      moved.pop_back();
    }
  }
  return pools;
}

}  // namespace gale::scheduler
