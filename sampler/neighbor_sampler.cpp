#include "sampler/neighbor_sampler.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <unordered_map>

#include "kernels/error.hpp"
#include "kernels/random.hpp"

namespace gale::sampler {

using kernels::derive_key;

void validate_fanouts(const std::vector<int>& fanouts) {
  if (fanouts.empty()) throw InputError("--fanouts: expected at least one fanout");
  for (int f : fanouts) {
    if (f == 0 || f < -1)
      throw InputError("--fanouts: expected positive fanouts (or -1 for all), found " + std::to_string(f));
  }
}

NeighborSampler::NeighborSampler(kernels::CsrView graph, std::vector<int> fanouts, Sampling sampling,
                                 bool block_weights)
    : graph_(graph), fanouts_(std::move(fanouts)), sampling_(sampling), block_weights_(block_weights) {
  validate_fanouts(fanouts_);
  if (block_weights_ && graph_.weights == nullptr)
    throw InputError("blocks with edge weights need a graph with edge weights, and the graph has none");
  if (sampling_ == Sampling::kWeighted && graph_.weights == nullptr && graph_.nnz() > 0)
    throw InputError("weighted sampling needs edge weights, and the graph has none");
}

void weighted_offsets(uint64_t row_key, const float* weights, int64_t degree, int64_t k, std::vector<int64_t>* out) {
  double total = 0;
  for (int64_t j = 0; j < degree; ++j) {
    const float w = weights[j];
    if (!(w > 0.0f) || !std::isfinite(w))
      throw InputError("weighted sampling: edge weight " + std::to_string(w) + " at offset " + std::to_string(j) +
                       " of the row is not positive and finite");
    total += w;
  }
  auto priority = [&](int64_t j) {
    return kernels::random_exponential(row_key, static_cast<uint64_t>(j)) / static_cast<double>(weights[j]);
  };
  // (priority, entry): the k smallest in this lexicographic order, so ties go to the lower entry.
  // They are all among the entries whose priority is below any t that at least k are below: try
  // t = 2k / total (about 2k fall below it) and four times more while too few do, computing only
  // the priorities the uniforms do not rule out (the GPU sampler's candidate select, same result).
  std::vector<std::pair<double, int64_t>> keyed;
  double t = 2.0 * static_cast<double>(k) / total;
  for (int attempt = 0; attempt < 6 && t > 0 && std::isfinite(t) && static_cast<int64_t>(keyed.size()) < k;
       ++attempt, t *= 4.0) {
    keyed.clear();
    for (int64_t j = 0; j < degree; ++j) {
      if (kernels::random_exponential_at_least(row_key, static_cast<uint64_t>(j), t * static_cast<double>(weights[j])))
        continue;
      const double p = priority(j);
      if (p < t) keyed.emplace_back(p, j);
    }
  }
  if (static_cast<int64_t>(keyed.size()) < k) {  // every entry
    keyed.resize(static_cast<size_t>(degree));
    for (int64_t j = 0; j < degree; ++j) keyed[static_cast<size_t>(j)] = {priority(j), j};
  }
  std::nth_element(keyed.begin(), keyed.begin() + (k - 1), keyed.end());
  out->resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) (*out)[static_cast<size_t>(i)] = keyed[static_cast<size_t>(i)].second;
  std::sort(out->begin(), out->end());
}

namespace {

// Picks k distinct offsets in [0, degree) with Robert Floyd's algorithm: k draws, no rejection
// loops, and no O(degree) scratch, so hub rows cost the same as small ones. Offsets are returned
// sorted so a row's sources appear in graph order.
void sample_offsets(uint64_t key, int64_t degree, int k, std::vector<int64_t>* out) {
  out->clear();
  for (int64_t j = degree - k; j < degree; ++j) {
    const int64_t t = static_cast<int64_t>(kernels::random_below(key, static_cast<uint64_t>(j), static_cast<uint64_t>(j + 1)));
    if (std::find(out->begin(), out->end(), t) == out->end()) {
      out->push_back(t);
    } else {
      out->push_back(j);
    }
  }
  std::sort(out->begin(), out->end());
}

}  // namespace

SampledBatch NeighborSampler::sample(const int64_t* seeds, int64_t num_seeds, uint64_t key) const {
  SampledBatch batch;
  batch.blocks.resize(fanouts_.size());
  std::vector<int64_t> frontier(seeds, seeds + num_seeds);
  for (int64_t i = 0; i < num_seeds; ++i) {
    if (seeds[i] < 0 || seeds[i] >= graph_.rows)
      throw InputError("seed node " + std::to_string(seeds[i]) + " is out of range [0, " +
                       std::to_string(graph_.rows) + ")");
  }

  // Hop h fills the block of layer (L-1-h): the seeds' hop is the last layer.
  for (size_t hop = 0; hop < fanouts_.size(); ++hop) {
    const int fanout = fanouts_[hop];
    const uint64_t hop_key = derive_key(key, hop);
    const int64_t n = static_cast<int64_t>(frontier.size());

    // 1. How many neighbours each destination takes, then where its picks go.
    std::vector<int64_t> indptr(n + 1, 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t deg = graph_.degree(frontier[i]);
      indptr[i + 1] = indptr[i] + (fanout < 0 ? deg : std::min<int64_t>(deg, fanout));
    }
    // 2. Draw in parallel (each destination's picks depend only on its id).
    std::vector<int64_t> picked(indptr[n]);
    std::vector<float> picked_weights(block_weights_ ? indptr[n] : 0);
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 256), [&](const tbb::blocked_range<int64_t>& r) {
      std::vector<int64_t> offsets;
      for (int64_t i = r.begin(); i < r.end(); ++i) {
        const int64_t v = frontier[i];
        const int64_t begin = graph_.indptr[v];
        const int64_t deg = graph_.indptr[v + 1] - begin;
        const int64_t take = indptr[i + 1] - indptr[i];
        const bool whole = take == deg;  // the whole row, in order: no offsets to draw
        if (whole) {
          // taken in order below
        } else if (sampling_ == Sampling::kWeighted) {
          try {
            weighted_offsets(derive_key(hop_key, static_cast<uint64_t>(v)), graph_.weights + begin, deg, take, &offsets);
          } catch (const InputError& e) {
            throw InputError("node " + std::to_string(v) + ": " + e.what());
          }
        } else {
          sample_offsets(derive_key(hop_key, static_cast<uint64_t>(v)), deg, static_cast<int>(take), &offsets);
        }
        const auto entry = [&](int64_t j) { return begin + (whole ? j : offsets[j]); };
        int64_t* dst = picked.data() + indptr[i];
        for (int64_t j = 0; j < take; ++j) dst[j] = graph_.indices[entry(j)];
        if (block_weights_) {
          float* w = picked_weights.data() + indptr[i];
          for (int64_t j = 0; j < take; ++j) w[j] = graph_.weights[entry(j)];
        }
      }
    });
    // 3. Local ids: destinations keep their positions, new sources follow in first-seen order.
    Block& block = batch.blocks[fanouts_.size() - 1 - hop];
    block.indptr = std::move(indptr);
    block.weights = std::move(picked_weights);
    block.src_ids = frontier;
    std::unordered_map<int64_t, int32_t> local;
    local.reserve(static_cast<size_t>(n + picked.size()));
    for (int64_t i = 0; i < n; ++i) local.emplace(frontier[i], static_cast<int32_t>(i));
    block.indices.resize(picked.size());
    for (size_t e = 0; e < picked.size(); ++e) {
      auto [it, inserted] = local.emplace(picked[e], static_cast<int32_t>(block.src_ids.size()));
      if (inserted) block.src_ids.push_back(picked[e]);
      block.indices[e] = it->second;
    }
    frontier = block.src_ids;
  }
  return batch;
}

}  // namespace gale::sampler
