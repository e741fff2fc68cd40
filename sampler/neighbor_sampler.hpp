// sampler/neighbor_sampler.hpp — CPU neighbour sampler: the reference for the GPU sampler and a
// real fallback for CPU training.
//
// Per hop, every frontier node draws min(fanout, in-degree) distinct in-neighbours uniformly
// without replacement (all of them when the degree is at most the fanout; fanout -1 takes all).
// Draws are a pure function of (key, hop, node id), so a batch samples the same whatever the
// thread count or the order batches are processed in.
//
// Sampling::kWeighted draws with probabilities proportional to the edge weights (graph.weights),
// without replacement, by Efraimidis and Spirakis' exponential race (A-Res): entry j of row v gets
// the priority E_j / w_j, E_j = random_exponential(derive_key(derive_key(key, hop), v), j), and
// the fanout smallest priorities (ties to the lower entry) are taken. That is the law of drawing
// one neighbour at a time proportionally to the weights left. They are found among the entries
// whose priority falls below a threshold t that about twice the fanout do (t = 2 fanout / the
// row's total weight, raised while too few do), computing only the priorities that the entries'
// uniforms do not already put above t (kernels::random_exponential_at_least). The weights of a row sampled from
// must be positive and finite (InputError otherwise); rows at or below the fanout are taken whole
// as in the uniform mode, so their weights are not read.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/views.hpp"
#include "sampler/block.hpp"

namespace gale::sampler {

// Throws InputError unless `fanouts` is non-empty and every entry is positive or -1 (all
// neighbours). The CPU and GPU samplers take the same fanouts.
void validate_fanouts(const std::vector<int>& fanouts);

// How a row with more in-neighbours than the fanout is sampled.
enum class Sampling { kUniform, kWeighted };

// The offsets (in [0, degree), ascending) the weighted mode takes from a row of `degree` entries
// with weights `weights` (its own slice), k < degree, keyed by the row's key
// derive_key(derive_key(key, hop), node). The CPU reference of the GPU sampler's weighted draw.
// Throws InputError naming the entry when a weight is not positive and finite.
void weighted_offsets(uint64_t row_key, const float* weights, int64_t degree, int64_t k, std::vector<int64_t>* out);

class NeighborSampler {
 public:
  // fanouts[0] is for the seeds' direct in-neighbours (the last layer), as PyG's num_neighbors.
  // kWeighted needs graph.weights. With `block_weights` (which needs them too) every block carries
  // its sampled entries' weights (Block::weights), for weighted aggregation.
  NeighborSampler(kernels::CsrView graph, std::vector<int> fanouts, Sampling sampling = Sampling::kUniform,
                  bool block_weights = false);

  int num_layers() const { return static_cast<int>(fanouts_.size()); }
  const std::vector<int>& fanouts() const { return fanouts_; }
  Sampling sampling() const { return sampling_; }

  // Samples the blocks for `seeds` (distinct global ids). `key` identifies the batch.
  SampledBatch sample(const int64_t* seeds, int64_t num_seeds, uint64_t key) const;

 private:
  kernels::CsrView graph_;
  std::vector<int> fanouts_;
  Sampling sampling_;
  bool block_weights_;
};

}  // namespace gale::sampler
