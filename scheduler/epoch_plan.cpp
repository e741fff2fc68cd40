#include "scheduler/epoch_plan.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

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
                     int rank, const int64_t* indptr)
    : order_(std::make_shared<std::vector<int64_t>>(seeds)), batch_size_(batch_size), workers_(workers), rank_(rank) {
  check_batch_size(batch_size);
  if (workers < 1 || rank < 0 || rank >= workers)
    throw InternalError("EpochPlan: rank " + std::to_string(rank) + " of " + std::to_string(workers) + " workers");
  shuffle(order_.get(), kernels::derive_key(seed ^ 0x5eed5eedULL, static_cast<uint64_t>(epoch)));
  const int64_t step = batch_size * workers;
  num_batches_ = (static_cast<int64_t>(order_->size()) + step - 1) / step;
  if (workers > 1 && indptr != nullptr) balance_steps(indptr);
}

void EpochPlan::balance_steps(const int64_t* indptr) {
  // Steps are dealt independently (each rewrites only its own range of order_), so they run in
  // parallel: on R-MAT 23's 839K seeds one thread took 0.1-0.25 s a plan, outside every worker's
  // time and so outside their seeds per second, but inside the epoch.
  struct Scratch {
    std::vector<std::pair<int64_t, int64_t>> by_degree;  // (-in-degree, position in the step)
    std::vector<int64_t> step_seeds;
    std::vector<std::vector<int64_t>> slices;
    std::vector<int64_t> room;
  };
  tbb::enumerable_thread_specific<Scratch> scratch;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, num_batches_, 16), [&](const tbb::blocked_range<int64_t>& steps) {
    Scratch& s = scratch.local();
    s.slices.resize(static_cast<size_t>(workers_));
    s.room.resize(static_cast<size_t>(workers_));
    for (int64_t b = steps.begin(); b < steps.end(); ++b) {
      const int64_t first = begin(b, 0), len = step_length(b);
      s.step_seeds.assign(order_->begin() + first, order_->begin() + first + len);
      // Positions in the step, largest in-degree first (ties: shuffled order, as a stable sort).
      s.by_degree.resize(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) {
        const int64_t v = s.step_seeds[static_cast<size_t>(i)];
        s.by_degree[static_cast<size_t>(i)] = {indptr[v] - indptr[v + 1], i};
      }
      std::sort(s.by_degree.begin(), s.by_degree.end());
      for (int r = 0; r < workers_; ++r) {
        s.slices[static_cast<size_t>(r)].clear();
        s.room[static_cast<size_t>(r)] = begin(b, r + 1) - begin(b, r);
      }
      // Snake order over the slices with room left (a full slice is passed over).
      int r = 0, direction = 1;
      const auto advance = [&] {
        r += direction;
        if (r == workers_) r = workers_ - 1, direction = -1;
        if (r < 0) r = 0, direction = 1;
      };
      for (const auto& [negative_degree, i] : s.by_degree) {
        while (s.room[static_cast<size_t>(r)] == 0) advance();
        s.slices[static_cast<size_t>(r)].push_back(i);
        --s.room[static_cast<size_t>(r)];
        advance();
      }
      int64_t at = first;
      for (std::vector<int64_t>& slice : s.slices) {
        std::sort(slice.begin(), slice.end());  // the shuffled order within a slice
        for (int64_t i : slice) (*order_)[static_cast<size_t>(at++)] = s.step_seeds[static_cast<size_t>(i)];
      }
    }
  });
}

EpochPlan EpochPlan::for_rank(int rank) const {
  if (rank < 0 || rank >= workers_)
    throw InternalError("EpochPlan::for_rank: rank " + std::to_string(rank) + " of " + std::to_string(workers_) + " workers");
  if (pools_) throw InternalError("EpochPlan::for_rank: a partition-aware plan holds one worker's pool only");
  EpochPlan p = *this;
  p.rank_ = rank;
  return p;
}

EpochPlan::EpochPlan(const std::vector<std::vector<int64_t>>& pools, int64_t batch_size, uint64_t seed, int64_t epoch,
                     int rank)
    : batch_size_(batch_size), workers_(static_cast<int>(pools.size())), rank_(rank), pools_(true) {
  check_batch_size(batch_size);
  if (rank < 0 || rank >= workers_) throw InternalError("EpochPlan: rank " + std::to_string(rank) + " of the pools");
  order_ = std::make_shared<std::vector<int64_t>>(pools[static_cast<size_t>(rank)]);
  shuffle(order_.get(), kernels::derive_key(kernels::derive_key(seed ^ 0x5eed5eedULL, static_cast<uint64_t>(epoch)),
                                       0x9001ULL + static_cast<uint64_t>(rank)));
  for (const auto& p : pools) {
    pool_sizes_.push_back(static_cast<int64_t>(p.size()));
    num_batches_ = std::max(num_batches_, (static_cast<int64_t>(p.size()) + batch_size - 1) / batch_size);
  }
}

EpochPlan::EpochPlan(std::vector<int64_t> order, int64_t batch_size)
    : order_(std::make_shared<std::vector<int64_t>>(std::move(order))), batch_size_(batch_size), workers_(1), rank_(0) {
  check_batch_size(batch_size);
  num_batches_ = (static_cast<int64_t>(order_->size()) + batch_size - 1) / batch_size;
}

EpochPlan EpochPlan::in_order(std::vector<int64_t> seeds, int64_t batch_size) {
  return EpochPlan(std::move(seeds), batch_size);
}

EpochPlan EpochPlan::strided(const std::vector<int64_t>& seeds, int64_t batch_size) {
  check_batch_size(batch_size);
  const auto n = static_cast<int64_t>(seeds.size());
  const int64_t batches = (n + batch_size - 1) / batch_size;
  std::vector<int64_t> order;
  order.reserve(seeds.size());
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t i = b; i < n; i += batches) order.push_back(seeds[static_cast<size_t>(i)]);
  EpochPlan plan(std::move(order), batch_size);
  plan.strided_ = true;
  return plan;
}

int64_t EpochPlan::begin(int64_t b, int r) const {
  const int64_t n = static_cast<int64_t>(order_->size());
  if (strided_) {  // with n = q B + e (B batches), the first e batches hold q + 1 seeds, the others q
    const int64_t at = b + (r > rank_ ? 1 : 0), q = n / num_batches_, extra = n % num_batches_;
    return at * q + std::min(at, extra);
  }
  if (pools_) return std::min(n, (b + (r > rank_ ? 1 : 0)) * batch_size_);
  const int64_t step = batch_size_ * workers_;
  return b * step + step_length(b) * r / workers_;
}

int64_t EpochPlan::step_length(int64_t b) const {
  if (strided_) return begin(b, rank_ + 1) - begin(b, rank_);
  if (pools_) {
    int64_t total = 0;
    for (int64_t size : pool_sizes_) total += std::clamp<int64_t>(size - b * batch_size_, 0, batch_size_);
    return total;
  }
  const int64_t step = batch_size_ * workers_;
  return std::min<int64_t>(step, static_cast<int64_t>(order_->size()) - b * step);
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
