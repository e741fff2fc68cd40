// engine/batch_features.hpp — a mini-batch's input features on the training device. On the CPU
// they are read from the store; on a GPU they are gathered from the feature tiers
// (storage/feature_tiers.hpp), and rows the previous batch already brought to the GPU are copied
// there instead of being fetched again (FastGL's match). Counts where every row came from.
//
// Features on disk (storage/host_features.hpp) behind a GPU cache: the host stages each batch's
// rows that the GPU cache lacks (stage(), from the host cache, a read-ahead window or disk) in
// pinned memory, which the gather reads over UVA like a host tier. The pinned buffers are reused
// batch after batch once the gather that read them is done, and charged to --host-mem-budget.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.hpp"
#include "kernels/cuda/budget.hpp"
#include "storage/host_features.hpp"
#include "storage/store.hpp"

namespace gale::engine {

struct FeatureLoadStats {
  int64_t batches = 0;
  int64_t rows = 0;           // rows delivered
  int64_t previous = 0;       // reused from the previous batch on the GPU (match)
  int64_t device = 0;         // read from GPU-resident features
  int64_t cache = 0;          // read from the GPU cache of hot nodes
  int64_t host = 0;           // read from pinned host memory over UVA (or, on the CPU, the store)
  int64_t row_bytes = 0;
  // Bytes that crossed from the host to the GPU.
  int64_t host_to_gpu_bytes() const { return host * row_bytes; }
};

// Features being gathered on the device's IO stream (device_context.hpp) while the compute stream
// trains: take() makes the compute stream wait for the gather (an event, not the host) and hands
// the tensor over.
// A gather that is dropped untaken (a batch left over when training stops early) first makes
// the compute stream wait for it, so its memory is not handed out again while the IO stream still
// writes it.
class PendingFeatures {
 public:
  PendingFeatures() = default;
  PendingFeatures(PendingFeatures&&) noexcept = default;
  PendingFeatures& operator=(PendingFeatures&& other) noexcept;
  PendingFeatures(const PendingFeatures&) = delete;
  PendingFeatures& operator=(const PendingFeatures&) = delete;
  ~PendingFeatures();
  Tensor take();

 private:
  friend class BatchFeatures;
  void discard() noexcept;
  Tensor features_;
  std::shared_ptr<void> ready_;  // the CUDA event recorded after the gather
};

// A batch's rows its GPU does not cache, staged in pinned host memory (BatchFeatures::stage).
class StagedRows {
 public:
  StagedRows();
  ~StagedRows();
  StagedRows(StagedRows&&) noexcept;
  StagedRows& operator=(StagedRows&&) noexcept;
  int64_t rows() const { return rows_; }
  bool empty() const { return slot_ == nullptr; }

  struct Slot;

 private:
  friend class BatchFeatures;
  std::shared_ptr<Slot> slot_;  // held by the pool too: free again once only the pool holds it
  int64_t rows_ = 0;
};

class BatchFeatures {
 public:
  // `gpu_bytes`: what the features may occupy on the GPU (all rows when they fit, else a cache of
  // the hottest); ignored on the CPU. `match`: reuse the previous batch's rows on the GPU (only
  // when some rows live in host memory: with all of them on the GPU it would only cost time).
  // Data-parallel workers: `share_host_with` (another GPU's BatchFeatures) lends its pinned host
  // tier instead of a copy per GPU; `preferred` (a flag per node, e.g. the worker's own parts) goes
  // first into the GPU cache.
  // `host_budget` (--host-mem-budget) is charged with the pinned host copy when one is made.
  BatchFeatures(const storage::Store& store, const Device& device, uint64_t gpu_bytes, bool match,
                const BatchFeatures* share_host_with = nullptr, const std::vector<uint8_t>* preferred = nullptr,
                kernels::cuda::MemoryBudget* host_budget = nullptr);
  // Features on disk: a GPU cache of the hottest rows gpu_bytes holds (filled through `source`;
  // ranked by `reads` when given, storage::hottest_nodes), every other row staged per batch. The
  // pinned buffers are charged to host_budget.
  BatchFeatures(const storage::Store& store, const Device& device, uint64_t gpu_bytes, bool match,
                const storage::HostFeatures& source, kernels::cuda::MemoryBudget* host_budget,
                const std::vector<uint32_t>* reads = nullptr);
  ~BatchFeatures();
  BatchFeatures(const BatchFeatures&) = delete;
  BatchFeatures& operator=(const BatchFeatures&) = delete;

  // The features of `nodes` (distinct global ids), one row each, on the device, ready for the
  // compute stream.
  Tensor load(const std::vector<int64_t>& nodes, const StagedRows* staged = nullptr);
  // The same for ids already on the device (i64, n x 1, ready on the IO stream), as the GPU
  // sampler leaves them, gathered on the IO stream: the match is found on the GPU too
  // (kernels/feature_gather.hpp's match map), with no host pass. Batches are matched in the order
  // of these calls.
  PendingFeatures load_async(const Tensor& nodes, const StagedRows* staged = nullptr);

  // Features on disk: whether batches need stage(), and whether the GPU caches `id`.
  bool staged() const;
  bool on_gpu(int64_t id) const;
  // Staged features: on_gpu's answer for every node as the GPU holds it (device memory, per node:
  // its GPU cache row or -1), null when the cache is empty; null too when not staged.
  const int32_t* gpu_cache_slots() const;
  // Reads with read(ids, count, out) the rows of `nodes` (a batch's input nodes, in the order
  // load_async will get them) that the GPU does not cache, into pinned memory; pass the result
  // to load / load_async. Callable from several threads at once.
  using RowReader = std::function<void(const int64_t* ids, int64_t count, float* out)>;
  StagedRows stage(const std::vector<int64_t>& nodes, const RowReader& read);
  // load(nodes) for any number of nodes (layer-wise inference's chunks): staged, when the
  // features are, at most kStageRows rows at a time, each part read through `read`; no match.
  Tensor load(const std::vector<int64_t>& nodes, const RowReader& read);
  static constexpr int64_t kStageRows = int64_t{1} << 16;
  // Host memory a GPU's staged buffers are given room for (a few batches in flight, each with the
  // rows its GPU cache lacks).
  static constexpr uint64_t kStagedReserve = uint64_t{256} << 20;
  // Whether every row is on the GPU (or the device is the CPU, where the store is the source).
  bool resident() const;
  std::string describe() const;
  // Counts since the last call (waits for the IO stream), and the reset.
  FeatureLoadStats take_stats();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gale::engine
