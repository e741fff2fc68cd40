// storage/feature_tiers.hpp — where node features live for GPU training, decided by how many bytes
// the GPU budget leaves for them, and the gather that reads a batch's rows from the tiers
// (kernels/feature_gather.hpp): the previous batch on the GPU (FastGL's match), all features on
// the GPU when they fit, else a GPU cache of the hottest nodes plus every node in pinned host
// memory that the gather kernel reads over UVA; or, when the features fit the host budget no more
// than the GPU (the disk tier, storage/host_features.hpp), a GPU cache of the hottest nodes and,
// per batch, the rows it lacks staged by the host in pinned memory that the kernel reads the same
// way. Counters per tier say where each row came from.
// CUDA builds only.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/pinned.hpp"
#include "kernels/feature_gather.hpp"
#include "storage/host_features.hpp"
#include "storage/store.hpp"

namespace gale::storage {

struct FeatureTierStats {
  std::array<int64_t, kernels::kFeatureTiers> rows{};  // rows served per tier (kernels::FeatureTier)
  int64_t row_bytes = 0;                              // bytes of one feature row
  int64_t bytes(int tier) const { return rows[static_cast<size_t>(tier)] * row_bytes; }
};

class FeatureTiers {
 public:
  enum class Placement { kDevice, kCacheAndHost, kCacheAndStaged };

  // Places the store's features on `pool`'s device. With gpu_bytes >= every feature row, all of
  // them go to the GPU; otherwise every row goes to pinned host memory (charged to host_budget when
  // given) and the GPU keeps as many of the hottest nodes as gpu_bytes allows (hotness: in-degree,
  // the nodes a sampler reaches most). Reads the store once; copies on `stream`.
  //
  // Several GPUs of one process: `shared_host`, another FeatureTiers' host_tier(), is used instead
  // of a pinned copy of its own (the memory is portable and mapped, so every GPU reads it), and
  // `preferred` (a flag per node, e.g. the nodes of this worker's parts) puts those nodes ahead of
  // the rest in the cache, hottest first within each group.
  FeatureTiers(const Store& store, kernels::cuda::MemoryPool& pool, cudaStream_t stream, uint64_t gpu_bytes,
               kernels::cuda::MemoryBudget* host_budget = nullptr,
               std::shared_ptr<kernels::cuda::PinnedBuffer> shared_host = nullptr,
               const std::vector<uint8_t>* preferred = nullptr);
  // Features beyond the host budget: a GPU cache of the hottest rows gpu_bytes holds, filled
  // through `source` (pages checked as it reads them), and no host copy: each batch's other rows
  // are staged by the host (gather's `staged`). The cache's rows are the cache_rows_within(store,
  // gpu_bytes) first of hottest_nodes (ranked by `reads` when given), so a host cache behind it,
  // ranked alike, can start after them.
  FeatureTiers(const Store& store, kernels::cuda::MemoryPool& pool, cudaStream_t stream, uint64_t gpu_bytes,
               const HostFeatures& source, const std::vector<uint32_t>* reads = nullptr);
  ~FeatureTiers();
  FeatureTiers(const FeatureTiers&) = delete;
  FeatureTiers& operator=(const FeatureTiers&) = delete;

  Placement placement() const { return placement_; }
  // The pinned host tier (null when every row is on the GPU), for other GPUs' tiers to share.
  std::shared_ptr<kernels::cuda::PinnedBuffer> host_tier() const { return host_; }
  int64_t dim() const { return dim_; }
  int64_t cached_rows() const { return cached_rows_; }
  // Whether the GPU holds `id`'s row (every row when resident; the host's copy of the cache's
  // membership otherwise).
  bool on_gpu(int64_t id) const {
    return placement_ == Placement::kDevice || (on_gpu_[static_cast<size_t>(id) >> 6] >> (id & 63) & 1) != 0;
  }
  // The cache's row of each node on the device (-1: not cached), the gather's cache_slot; null
  // when the cache holds no row (or every row is resident: ask on_gpu).
  const int32_t* cache_slots() const { return cached_rows_ > 0 ? slot_.data() : nullptr; }
  std::string describe() const;  // "all 2.1M rows on the GPU (800 MiB)" / "cache 1.2M of 33M rows (...)"

  // out (n x dim, device) = features of ids[0..n) (device); prev_rows (device, nullable): each
  // id's row in prev (the previous batch's features, still on the GPU) or -1. Stream-ordered.
  // kCacheAndStaged: `staged` (mapped pinned memory, staged_rows x dim) holds the rows no GPU tier
  // has, row i of the batch at host_rows[i] (mapped pinned too).
  void gather(const int64_t* ids, int64_t n, const int32_t* prev_rows, kernels::ConstMatrixView prev,
              kernels::MatrixView out, cudaStream_t stream, const float* staged = nullptr, int64_t staged_rows = 0,
              const int32_t* host_rows = nullptr);

  // Rows served per tier since the last call (waits for `stream`), and the reset.
  FeatureTierStats take_stats(cudaStream_t stream);

 private:
  int64_t num_nodes_ = 0, dim_ = 0, cached_rows_ = 0;
  Placement placement_ = Placement::kDevice;
  kernels::cuda::DeviceBuffer<float> device_;      // all rows, or the cache
  kernels::cuda::DeviceBuffer<int32_t> slot_;      // per node: cache row or -1 (cache placement)
  std::shared_ptr<kernels::cuda::PinnedBuffer> host_;  // all rows (cache placement), maybe shared
  kernels::cuda::DeviceBuffer<int64_t> counters_;  // kFeatureTiers rows served
  std::vector<uint64_t> on_gpu_;                   // kCacheAndStaged: a bit per node, set when cached
};

}  // namespace gale::storage
