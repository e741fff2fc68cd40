// sampler/neighbor_sampler.hpp — CPU neighbour sampler: the reference for the GPU sampler and a
// real fallback for CPU training.
//
// Per hop, every frontier node draws min(fanout, in-degree) distinct in-neighbours uniformly
// without replacement (all of them when the degree is at most the fanout; fanout -1 takes all).
// Draws are a pure function of (key, hop, node id), so a batch samples the same whatever the
// thread count or the order batches are processed in.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/views.hpp"
#include "sampler/block.hpp"

namespace gale::sampler {

// Throws InputError unless `fanouts` is non-empty and every entry is positive or -1 (all
// neighbours). The CPU and GPU samplers take the same fanouts.
void validate_fanouts(const std::vector<int>& fanouts);

class NeighborSampler {
 public:
  // fanouts[0] is for the seeds' direct in-neighbours (the last layer), as PyG's num_neighbors.
  NeighborSampler(kernels::CsrView graph, std::vector<int> fanouts);

  int num_layers() const { return static_cast<int>(fanouts_.size()); }
  const std::vector<int>& fanouts() const { return fanouts_; }

  // Samples the blocks for `seeds` (distinct global ids). `key` identifies the batch.
  SampledBatch sample(const int64_t* seeds, int64_t num_seeds, uint64_t key) const;

 private:
  kernels::CsrView graph_;
  std::vector<int> fanouts_;
};

}  // namespace gale::sampler
