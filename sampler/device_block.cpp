#include "sampler/device_block.hpp"

namespace gale::sampler {

namespace {

void enqueue_copy(const DeviceBlock& d, Block* h, cudaStream_t stream) {
  h->indptr.resize(static_cast<size_t>(d.num_dst + 1));
  h->indices.resize(static_cast<size_t>(d.num_edges));
  h->src_ids.resize(static_cast<size_t>(d.num_src));
  kernels::cuda::copy_to_host(h->indptr.data(), d.indptr.data(), h->indptr.size(), stream);
  kernels::cuda::copy_to_host(h->indices.data(), d.indices.data(), h->indices.size(), stream);
  kernels::cuda::copy_to_host(h->src_ids.data(), d.src_ids.data(), h->src_ids.size(), stream);
  if (d.weights.size() > 0) {
    h->weights.resize(static_cast<size_t>(d.num_edges));
    kernels::cuda::copy_to_host(h->weights.data(), d.weights.data(), h->weights.size(), stream);
  }
}

}  // namespace

Block to_host_and_wait(const DeviceBlock& block, cudaStream_t stream) {
  Block host;
  enqueue_copy(block, &host, stream);
  GALE_CHECK_CUDA(cudaStreamSynchronize(stream));
  return host;
}

SampledBatch to_host_and_wait(const DeviceSampledBatch& batch, cudaStream_t stream) {
  SampledBatch host;
  host.blocks.resize(batch.blocks.size());
  for (size_t l = 0; l < batch.blocks.size(); ++l) enqueue_copy(batch.blocks[l], &host.blocks[l], stream);
  GALE_CHECK_CUDA(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace gale::sampler
