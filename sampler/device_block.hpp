// sampler/device_block.hpp — a sampled layer whose arrays live in device memory (the GPU
// sampler's output), with the same conventions as Block (block.hpp): destination-major CSR over
// int32 local ids, int64 global ids of the sources with the destinations first, in order.
//
// CUDA builds only (GALE_WITH_CUDA): the arrays are DeviceBuffers from a MemoryPool, freed on the
// stream they were sampled on. Sizes are known on the host; a buffer may be longer than the size
// it holds (the sampler allocates some before it knows the exact count), so read the sizes, not
// buffer.size().
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/views.hpp"
#include "sampler/block.hpp"

namespace gale::sampler {

struct DeviceBlock {
  int64_t num_dst = 0;
  int64_t num_src = 0;
  int64_t num_edges = 0;
  kernels::cuda::DeviceBuffer<int64_t> indptr;   // num_dst + 1 used, indptr[0] = 0
  kernels::cuda::DeviceBuffer<int32_t> indices;  // num_edges used, local source ids < num_src
  kernels::cuda::DeviceBuffer<int64_t> src_ids;  // num_src used; the first num_dst are the dsts
  kernels::cuda::DeviceBuffer<float> weights;    // num_edges used, or none (a sampler's option)

  // Device pointers; a kernel reads them, the host must not.
  kernels::CsrView csr() const {
    return {num_dst, num_src, indptr.data(), indices.data(), weights.size() > 0 ? weights.data() : nullptr};
  }
};

// Input layer first, as SampledBatch: blocks[0]'s sources are the nodes whose features are read,
// blocks.back()'s destinations are the seeds in the order given.
struct DeviceSampledBatch {
  std::vector<DeviceBlock> blocks;

  const int64_t* input_nodes() const { return blocks.front().src_ids.data(); }  // device pointer
  int64_t num_input_nodes() const { return blocks.front().num_src; }
  int64_t num_seeds() const { return blocks.back().num_dst; }
};

// A batch's input nodes alone (FusedMapSampler::sample_input_nodes): ids[0..count) on the device.
struct DeviceInputNodes {
  kernels::cuda::DeviceBuffer<int64_t> ids;
  int64_t count = 0;
};

// Copies a block / a batch to host memory and waits for `stream` (tests, CPU fallbacks, debugging).
Block to_host_and_wait(const DeviceBlock& block, cudaStream_t stream);
SampledBatch to_host_and_wait(const DeviceSampledBatch& batch, cudaStream_t stream);

}  // namespace gale::sampler
