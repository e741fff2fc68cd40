// scheduler/epoch_plan.hpp — which seeds each mini-batch of an epoch trains on.
//
// The training ids are shuffled with a key derived from (seed, epoch), so epoch e's batches are
// the same whether the run started at epoch 0 or resumed from a checkpoint at e.
//
// Data-parallel workers: the shuffled ids are cut into steps of batch_size x workers, and worker
// `rank` trains on the rank-th of `workers` near-equal slices of each step (sizes differ by at most
// one), so every worker takes the same number of steps, and step b's slices together are exactly
// the batch b of a single worker with batch_size x workers.
#pragma once

#include <cstdint>
#include <vector>

namespace gale::scheduler {

class EpochPlan {
 public:
  EpochPlan(const std::vector<int64_t>& seeds, int64_t batch_size, uint64_t seed, int64_t epoch, int workers = 1,
            int rank = 0);

  int64_t num_batches() const { return (static_cast<int64_t>(order_.size()) + step_ - 1) / step_; }
  // This worker's seeds of step b.
  const int64_t* batch(int64_t b) const { return order_.data() + b * step_ + slice_begin(b); }
  int64_t batch_length(int64_t b) const { return slice_begin(b, rank_ + 1) - slice_begin(b); }
  // All workers' seeds of step b together (what the loss of the step averages over).
  int64_t step_length(int64_t b) const;
  const std::vector<int64_t>& order() const { return order_; }

 private:
  int64_t slice_begin(int64_t b) const { return slice_begin(b, rank_); }
  int64_t slice_begin(int64_t b, int r) const { return step_length(b) * r / workers_; }

  std::vector<int64_t> order_;
  int64_t step_;  // batch_size x workers
  int workers_, rank_;
};

}  // namespace gale::scheduler
