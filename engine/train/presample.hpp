// engine/train/presample.hpp — GNNLab's pre-sampling for the disk tier's caches: how often one
// epoch's batches read each node's features, so the GPU cache and the host cache behind it hold
// the rows training will read most (storage::hottest_nodes ranks by these counts, then in-degree)
// rather than the rows of highest in-degree alone (DESIGN.md, "Out of core"; --cache-rank sampled).
//
// The batches are drawn as an epoch's are (the training seeds shuffled into batches of the run's
// size) but with a key of their own, so the ranking predicts an epoch's reads without being one of
// them. Pre-sampling costs one epoch's sampling once, before the caches are filled.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace gale::engine::train_parts {

// A batch's distinct input nodes for `n` seeds, sampled with `key` (sample_input_nodes). Called from
// several threads at once.
using SampleInputs = std::function<std::vector<int64_t>(const int64_t* seeds, int64_t n, uint64_t key)>;

// Per node of `num_nodes`, how many of the batches its row is an input of: the batches of
// `batch_size` seeds that one epoch shuffled with `seed` draws from `train_ids`, each sampled with
// a key derived from `seed`. Throws InternalError for an input that is not a node.
std::vector<uint32_t> presample_reads(int64_t num_nodes, const std::vector<int64_t>& train_ids, int64_t batch_size,
                                      uint64_t seed, const SampleInputs& sample);

}  // namespace gale::engine::train_parts
