// scheduler/epoch_plan.hpp — which seeds each mini-batch of an epoch trains on.
//
// The training ids are shuffled with a key derived from (seed, epoch), so epoch e's batches are
// the same whether the run started at epoch 0 or resumed from a checkpoint at e.
//
// Data-parallel workers, two ways:
//   - sliced (no partitions): the shuffled ids are cut into steps of batch_size x workers, and
//     worker `rank` trains on the rank-th of `workers` near-equal slices of each step (sizes differ
//     by at most one), so every worker takes the same number of steps, and step b's slices together
//     are exactly the seeds of batch b of a single worker with batch_size x workers. Given the
//     graph's row offsets, each step's seeds are dealt to the slices by in-degree, largest first,
//     in snake order (0, 1, .., W-1, W-1, .., 0, 0, ..): a seed's sampled subtree grows with its
//     in-degree and a step waits for its slowest worker, so slices of like degrees finish
//     together. Simulated on R-MAT 20 (15,10,5, 1024 a worker), the largest slice's sampled nodes
//     over the mean fell from 1.011 to 1.002 on 2 workers and from 1.025 to 1.005 on 4. A slice
//     keeps its seeds' shuffled order; the step's seeds, and so what it sums, do not change;
//   - partition-aware (a store with partition.npy): each worker owns a pool of seeds drawn from its
//     own parts (balance_seed_pools), shuffled per epoch and worker, so its batches share
//     neighbours; every worker takes as many steps as the largest pool needs, a worker that has run
//     out taking empty ones.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace gale::scheduler {

class EpochPlan {
 public:
  // One worker, or the sliced split for worker `rank` of `workers`; `indptr` (the graph's row
  // offsets by destination, nullable): the slices balanced by in-degree.
  EpochPlan(const std::vector<int64_t>& seeds, int64_t batch_size, uint64_t seed, int64_t epoch, int workers = 1,
            int rank = 0, const int64_t* indptr = nullptr);
  // Partition-aware: worker `rank` trains on pools[rank].
  EpochPlan(const std::vector<std::vector<int64_t>>& pools, int64_t batch_size, uint64_t seed, int64_t epoch, int rank);
  // One worker, the seeds unshuffled: batch b is seeds[b * batch_size, (b + 1) * batch_size)
  // (inference over every node in id order).
  static EpochPlan in_order(std::vector<int64_t> seeds, int64_t batch_size);
  // One worker, the seeds dealt round the batches: with B batches, batch b is seeds[b],
  // seeds[b + B], seeds[b + 2B], ... (inference over every node, gale predict --fanouts). Each batch
  // spans the whole list, so a store numbered by in-degree (preprocess --relabel) puts no run of
  // hubs, whose neighbourhoods are the largest, into one batch (R-MAT 25 in 8 GB: predict over
  // batches of consecutive ids passed a 10 GiB GPU budget that training's batches stay within),
  // while W consecutive batches still take runs of W consecutive seeds, which lie together on disk.
  static EpochPlan strided(const std::vector<int64_t>& seeds, int64_t batch_size);

  // The same sliced plan for another worker (one plan built per epoch serves every worker of a
  // process: building it deals every step's seeds). Copies of a plan share its order, which is
  // not changed once built, so handing a plan to each worker copies no seeds.
  EpochPlan for_rank(int rank) const;

  int64_t num_batches() const { return num_batches_; }
  // This worker's seeds of step b (batch_length may be 0).
  const int64_t* batch(int64_t b) const { return order_->data() + begin(b, rank_); }
  int64_t batch_length(int64_t b) const { return begin(b, rank_ + 1) - begin(b, rank_); }
  // All workers' seeds of step b together (what the loss of the step averages over).
  int64_t step_length(int64_t b) const;
  const std::vector<int64_t>& order() const { return *order_; }

 private:
  // Offset in order_ of slice r of step b (sliced), or of this worker's batch b (pools; r is
  // rank_ or rank_ + 1 for its end).
  int64_t begin(int64_t b, int r) const;
  EpochPlan(std::vector<int64_t> order, int64_t batch_size);  // in_order's
  // Deals each step's seeds to the slices by in-degree (the header).
  void balance_steps(const int64_t* indptr);

  std::shared_ptr<std::vector<int64_t>> order_;  // filled by the constructors only; copies share it
  int64_t batch_size_;
  int workers_, rank_;
  bool pools_ = false;
  std::vector<int64_t> pool_sizes_;  // partition-aware: every worker's pool size
  int64_t num_batches_ = 0;
  bool strided_ = false;  // strided(): batches of sizes n / B rounded up, then down (begin)
};

// Partition-aware pools: part p goes to worker p % workers; then seeds move from pools above
// ceil(n / workers) to pools below floor(n / workers) (the last seeds of a large pool first), so
// the sizes differ by at most one and a worker keeps its own parts' seeds wherever it can. Each
// seed lands in exactly one pool; pools keep the seeds' given order.
std::vector<std::vector<int64_t>> balance_seed_pools(const std::vector<int64_t>& seeds, const int32_t* partition,
                                                     int workers);

}  // namespace gale::scheduler
