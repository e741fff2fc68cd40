// sampler/block.hpp — one layer's sampled bipartite graph.
//
// Destination-major CSR over local ids: rows are the destinations, entries index `src_ids`. The
// destinations are the first num_dst sources (DGL's and PyG's convention), so a layer's self or
// root term for destination i reads source row i.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/views.hpp"

namespace gale::sampler {

struct Block {
  std::vector<int64_t> indptr;   // num_dst + 1
  std::vector<int32_t> indices;  // local source ids, < src_ids.size()
  std::vector<int64_t> src_ids;  // global id of every local source; the first num_dst are the dsts
  std::vector<float> weights;    // the entries' edge weights, or empty (a sampler's option)

  int64_t num_dst() const { return static_cast<int64_t>(indptr.size()) - 1; }
  int64_t num_src() const { return static_cast<int64_t>(src_ids.size()); }
  kernels::CsrView csr() const {
    return {num_dst(), num_src(), indptr.data(), indices.data(), weights.empty() ? nullptr : weights.data()};
  }
};

// The blocks of one mini-batch, input layer first: blocks[0].src_ids are the nodes whose
// features are read; blocks.back()'s destinations are the seeds, in the order given.
struct SampledBatch {
  std::vector<Block> blocks;
  const std::vector<int64_t>& input_nodes() const { return blocks.front().src_ids; }
  int64_t num_seeds() const { return blocks.back().num_dst(); }
};

}  // namespace gale::sampler
