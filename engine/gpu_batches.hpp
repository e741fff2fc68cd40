// engine/gpu_batches.hpp — mini-batches sampled on the GPU (FastGL's fused-map sampler,
// sampler/fused_map_sampler.hpp) and turned into the operands a model trains on, without the
// blocks ever visiting the host.
//
//   GpuBatches batches(store, device, fanouts, topology_gpu_bytes);
//   // prepare stage, any thread, several at once:
//   GpuBatch b = batches.sample(seeds, n, key, /*input_nodes_on_host=*/window > 1);
//   // train stage, the compute thread:
//   GpuBatch::Operands ops = batches.operands(b, /*edge_map=*/false);
//
// The topology lives on the GPU when it fits `topology_gpu_bytes` (what the budget leaves for it),
// else in pinned host memory that the sampler's kernels read over UVA. Each sample() runs on a
// sampling stream of its own, so sampling overlaps training on the compute stream; operands()
// makes the device's IO stream wait for the batch's sampling (an event, not the host) and builds
// everything else there: the CSR copies, the CSCs, the norms (the compute stream must wait for the
// IO stream before using them: BatchFeatures::load_async's event, recorded later on the same
// stream, does). The batch's sampler buffers are then freed on the IO stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/graph.hpp"
#include "engine/tensor.hpp"
#include "sampler/neighbor_sampler.hpp"
#include "storage/store.hpp"

namespace gale::engine {

class GpuBatch {
 public:
  GpuBatch();
  ~GpuBatch();
  GpuBatch(GpuBatch&&) noexcept;
  GpuBatch& operator=(GpuBatch&&) noexcept;

  int64_t num_seeds() const;
  int64_t num_input_nodes() const;
  // The input nodes' global ids on the host: filled only when sample() was asked to (the
  // match-reorder window needs the node sets), else empty.
  const std::vector<int64_t>& input_nodes_host() const;

  struct Operands {
    std::vector<GraphOperand> graphs;  // input layer first
    Tensor input_nodes;                // i64, num_input_nodes x 1: whose features the model reads
    Tensor seeds;                      // i64, num_seeds x 1: whose labels the loss reads
  };

  struct Impl;

 private:
  friend class GpuBatches;
  std::unique_ptr<Impl> impl_;
};

class GpuBatches {
 public:
  // What training gives the topology on `device` under a GPU budget (0: none, i.e. 90% of the
  // card): a quarter of it. Features take half (BatchFeatures), the rest is for the model.
  static uint64_t topology_room(const Device& device, uint64_t gpu_mem_budget);

  // Throws DeviceError on a build without CUDA, ResourceError when the topology does not fit in
  // pinned host memory either. Weighted `sampling` draws by the store's edge weights; with
  // `block_weights` every block carries its entries' weights (weighted aggregation, and the full
  // graph's weighted degrees go with the topology). Either needs the store's weights (InputError).
  GpuBatches(const storage::Store& store, const Device& device, std::vector<int> fanouts, uint64_t topology_gpu_bytes,
             sampler::Sampling sampling = sampler::Sampling::kUniform, bool block_weights = false);
  ~GpuBatches();
  GpuBatches(const GpuBatches&) = delete;
  GpuBatches& operator=(const GpuBatches&) = delete;

  // "topology on the GPU (258 MiB)" / "topology in pinned host memory (4.2 GiB), read over UVA".
  std::string describe() const;
  bool topology_on_gpu() const;

  // Samples the blocks of `seeds` (n distinct host ids, copied before the call returns) keyed by
  // `key` as NeighborSampler::sample is. Thread-safe: concurrent calls use different streams.
  // Returns once the sizes are known; the GPU may still be writing the last hop.
  GpuBatch sample(const int64_t* seeds, int64_t n, uint64_t key, bool input_nodes_on_host) const;

  // The input nodes sample() would give these seeds and key (the same set, in another order past
  // the seeds) whose rows `cache_slot` lacks (device memory, per node id: its GPU cache row or -1;
  // null: every input node), on the host, with no blocks built (FusedMapSampler::
  // sample_input_nodes): what the read-ahead's sampling thread needs of a batch. Thread-safe.
  std::vector<int64_t> sample_input_nodes(const int64_t* seeds, int64_t n, uint64_t key,
                                          const int32_t* cache_slot) const;

  // The batch's operands, built on the IO stream (see the header comment). Consumes the batch's
  // device buffers; call once per batch, from the thread that trains.
  GpuBatch::Operands operands(GpuBatch& batch, bool edge_map) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gale::engine
