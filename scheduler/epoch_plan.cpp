#include "scheduler/epoch_plan.hpp"

#include <algorithm>
#include <string>

#include "kernels/error.hpp"
#include "kernels/random.hpp"

namespace gale::scheduler {

EpochPlan::EpochPlan(const std::vector<int64_t>& seeds, int64_t batch_size, uint64_t seed, int64_t epoch, int workers,
                     int rank)
    : order_(seeds), step_(batch_size * workers), workers_(workers), rank_(rank) {
  if (batch_size <= 0) throw InputError("--batch-size: expected a positive number, found " + std::to_string(batch_size));
  if (workers < 1 || rank < 0 || rank >= workers)
    throw InternalError("EpochPlan: rank " + std::to_string(rank) + " of " + std::to_string(workers) + " workers");
  // Fisher-Yates with the counter RNG: identical on every platform (std::shuffle is not).
  kernels::CounterRng rng(kernels::derive_key(seed ^ 0x5eed5eedULL, static_cast<uint64_t>(epoch)));
  for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(order_[i], order_[j]);
  }
}

int64_t EpochPlan::step_length(int64_t b) const {
  return std::min<int64_t>(step_, static_cast<int64_t>(order_.size()) - b * step_);
}

}  // namespace gale::scheduler
