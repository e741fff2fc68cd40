// scheduler/epoch_plan.hpp — which seeds each mini-batch of an epoch trains on.
//
// The training ids are shuffled with a key derived from (seed, epoch), so epoch e's batches are
// the same whether the run started at epoch 0 or resumed from a checkpoint at e.
#pragma once

#include <cstdint>
#include <vector>

namespace gale::scheduler {

class EpochPlan {
 public:
  EpochPlan(const std::vector<int64_t>& seeds, int64_t batch_size, uint64_t seed, int64_t epoch);

  int64_t num_batches() const { return (static_cast<int64_t>(order_.size()) + batch_size_ - 1) / batch_size_; }
  const int64_t* batch(int64_t b) const { return order_.data() + b * batch_size_; }
  int64_t batch_length(int64_t b) const;
  const std::vector<int64_t>& order() const { return order_; }

 private:
  std::vector<int64_t> order_;
  int64_t batch_size_;
};

}  // namespace gale::scheduler
