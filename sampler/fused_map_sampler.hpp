// sampler/fused_map_sampler.hpp — the GPU neighbour sampler after FastGL (ASPLOS'24), Sec. 4.3
// and Algorithm 2 (Fused-Map): sampling and the global -> local id map run on the GPU, and the
// map's hash table is built and the local ids handed out in one kernel, with no synchronisation
// between threads beyond the atomics themselves.
//
// Draws the same neighbours as the CPU NeighborSampler (neighbor_sampler.hpp): per hop h and
// destination v, min(fanout, degree) distinct in-neighbours by Robert Floyd's algorithm keyed on
// derive_key(derive_key(key, h), v) with the same counters, in graph order (sorted offsets); all
// neighbours when the degree is at most the fanout or the fanout is -1. So for every destination
// the GPU and CPU lists of sampled global ids are equal, element for element.
//
// Per hop (frontier = the previous hop's sources; the seeds first):
//   1. count:   take(v) per frontier node, an exclusive scan (CUB) gives the block's indptr;
//   2. sync:    the host learns the number of sampled entries (and the frontier's exact size);
//   3. table:   an open-addressing table (int64 keys, linear probing) of a power-of-two size at
//               least twice the frontier plus the entries (load factor <= 0.5), from the pool,
//               cleared on the stream; the frontier is inserted with local ids 0..n-1, so the
//               destinations come first and in order;
//   4. sample + fused map: one warp per destination draws its neighbours and inserts each with
//               atomicCAS; the thread whose CAS claimed an empty slot takes the next local id
//               from an atomicAdd counter and records the global id at that position;
//   5. rewrite: a second kernel replaces every sampled global id by its local id.
//
// Local ids are dense ([0, num_src)) and the destinations hold 0..num_dst-1 in order, but the
// numbering of the other sources depends on which thread wins each CAS, so it varies from run to
// run; the (destination, source) pairs, the per-destination source order in global ids and the
// set of sources do not. Aggregations do not depend on the numbering.
//
// Sampling::kWeighted draws by the edge weights as NeighborSampler's weighted mode does, entry for
// entry (the same exponential-race priorities, computed bit-identically on the device): one warp
// per destination keeps the entries whose priority falls below a threshold that about twice the
// fanout fall below (from the row's total weight), and selects among them, computing the priority
// only of the entries whose uniform does not already rule them out (as NeighborSampler does); a
// row whose candidates do not fit (or a fanout above 64) radix-selects over the
// row instead (9 passes over its weights). Either way a weighted draw reads the whole row, where a
// uniform one reads only its picks, so weighted hub rows cost more.
//
// Host synchronisations: one per hop (step 2) plus one at the end to learn the input layer's
// number of sources; nothing else blocks. Every byte (the result, the table, scratch) comes from
// the MemoryPool given, on the stream given, so the GPU budget governs it.
//
// CUDA builds only (GALE_WITH_CUDA).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/runtime.hpp"
#include "kernels/views.hpp"
#include "sampler/device_block.hpp"
#include "sampler/neighbor_sampler.hpp"

namespace gale::sampler {

class FusedMapSampler {
 public:
  // graph: the topology, rows == cols (node ids index both). Its indptr and indices must be
  // readable by kernels on the pool's device: device memory, or mapped pinned host memory
  // (cudaHostAlloc with cudaHostAllocMapped, or cudaHostRegister with cudaHostRegisterMapped) read
  // over UVA, which keeps a topology larger than the GPU on the host at PCIe speed. The caller
  // chooses, owns the memory and keeps it alive. graph.weights is read (same rules) only in the
  // weighted mode, which needs it.
  // fanouts: as NeighborSampler (fanouts[0] for the seeds' hop; positive, or -1 for all).
  // pool: every allocation of sample() comes from it; it must outlive the sampler's results.
  // block_weights: every block carries its entries' edge weights (DeviceBlock::weights), which
  // needs graph.weights (read under the same rules).
  FusedMapSampler(kernels::CsrView graph, std::vector<int> fanouts, kernels::cuda::MemoryPool& pool,
                  Sampling sampling = Sampling::kUniform, bool block_weights = false);

  int num_layers() const { return static_cast<int>(fanouts_.size()); }
  const std::vector<int>& fanouts() const { return fanouts_; }
  Sampling sampling() const { return sampling_; }

  // Samples the blocks for `seeds_device` (num_seeds distinct global ids in device memory) on
  // `stream`, keyed by `key` like NeighborSampler::sample. The result's buffers are freed on
  // `stream`. Throws InputError for a seed out of range or repeated, a weight that is not positive
  // and finite in a row sampled by weight, or a batch whose hop would need 2^31 or more local ids;
  // ResourceError when the pool's budget is exceeded. May be called
  // from several threads at once (each call has its own scratch) on different streams.
  DeviceSampledBatch sample(const int64_t* seeds_device, int64_t num_seeds, uint64_t key, cudaStream_t stream) const;
  // Only the input layer's sources of sample()'s batch (the same set; the order past the seeds
  // varies as sample()'s does), for a reader that needs to know which rows a batch will read but
  // not its blocks: the picks go into the map alone, and no entry is rewritten to its local id
  // (step 5 skipped; no block weights). The same errors as sample().
  DeviceInputNodes sample_input_nodes(const int64_t* seeds_device, int64_t num_seeds, uint64_t key,
                                      cudaStream_t stream) const;

 private:
  DeviceSampledBatch run(const int64_t* seeds_device, int64_t num_seeds, uint64_t key, cudaStream_t stream,
                         bool inputs_only) const;

  kernels::CsrView graph_;
  std::vector<int> fanouts_;
  kernels::cuda::MemoryPool* pool_;
  Sampling sampling_;
  bool block_weights_;
};

}  // namespace gale::sampler
