// storage/host_features.hpp — where the host reads node features from, decided by what the
// --host-mem-budget leaves for them: the store's features.npy in memory (its mapping, read whole
// and checked page by page once at the start, and charged to the budget), or the disk tier
// (storage/disk_features.hpp: a host cache of the hottest rows inside the budget, every other row
// read from features.npy with io_uring, each page checked). Either way read_rows hands out the
// same bits: the placement changes where rows come from, never which.
//
// The budget also pays for the graph's topology (the sampler and the aggregations read it whole)
// and for a reserve of IO staging; a budget that cannot hold those is refused with a
// ResourceError naming --host-mem-budget (exit 4), never the OOM killer's kill.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/budget.hpp"
#include "storage/disk_features.hpp"
#include "storage/store.hpp"

namespace gale::storage {

class HostFeatures {
 public:
  enum class Placement { kMemory, kDisk };

  struct Options {
    // The features' part of the host budget (after the topology and the staging reserve); the
    // disk tier is used when features.npy's rows exceed it.
    kernels::cuda::MemoryBudget* budget = nullptr;  // nullptr: unlimited, features in memory
    IoEngine engine = IoEngine::kAuto;
    bool force_disk = false;  // the disk tier even when the rows fit (tests, measurements)
    // On disk: what the read-ahead windows may hold (engine/train/read_ahead.hpp), kept out of the
    // cache. kAutoReadAhead: a third of the features' share (256 MiB without a budget); 0: none
    // (every batch reads its own misses).
    uint64_t read_ahead_bytes = kAutoReadAhead;
    // On disk behind GPU caches (storage/feature_tiers.hpp, kCacheAndStaged): the hottest rows the
    // GPUs hold, which the host cache then skips, and the bytes it leaves free for the pinned
    // buffers the batches' staged rows take.
    int64_t skip_hottest = 0;
    uint64_t keep_free = 0;
    // False when the GPUs hold the topology (their samplers read it there): the host keeps no copy,
    // so none is charged, and its share goes to the cache and the read-ahead windows.
    bool topology_on_host = true;
    // On disk: how often pre-sampled batches read each node (one count per node; hottest_nodes),
    // asked for once the features go to disk and before the cache is sized (the caller charges the
    // counts to the budget meanwhile); the cache (and the GPUs' skipped rows) is then ranked by
    // them before in-degree. Empty, or returning nullptr: by in-degree.
    std::function<const std::vector<uint32_t>*()> reads;
  };
  static constexpr uint64_t kAutoReadAhead = ~uint64_t{0};

  // IO staging every run keeps back from the budget for its batches (rows read per call are
  // staged in at most 32 MiB at a time, several calls at once).
  static constexpr uint64_t kStagingReserve = uint64_t{128} << 20;

  // Charges the topology (unless the GPUs hold it) and the staging reserve to the budget (ResourceError naming the flag
  // when they do not fit), then the features' bytes when they fit beside them (memory: checked
  // page by page now, in parallel, CorruptStoreError on a mismatch), else opens the disk tier
  // with a cache of what is left, hottest nodes (in-degree) first.
  HostFeatures(const Store& store, const Options& options);
  ~HostFeatures();
  HostFeatures(const HostFeatures&) = delete;
  HostFeatures& operator=(const HostFeatures&) = delete;

  Placement placement() const { return placement_; }
  bool on_disk() const { return placement_ == Placement::kDisk; }
  // out row i = the features of ids[i] as f32 (n x dim); callable from several threads at once.
  void read_rows(const int64_t* ids, int64_t n, float* out, const WindowRows* window = nullptr) const;
  // The disk tier (nullptr in memory), for read-ahead.
  DiskFeatures* disk() const { return disk_.get(); }
  // On disk: the bytes the read-ahead windows may hold (0: no read-ahead, or in memory).
  uint64_t read_ahead_bytes() const { return read_ahead_bytes_; }
  // Disk-tier counters since the last call (zeros in memory), and the reset.
  DiskFeatureStats take_stats();
  // "features in host memory (4.1 GiB of a 30 GiB budget)" / the disk tier's description.
  std::string describe() const;

 private:
  const Store& store_;
  Placement placement_ = Placement::kMemory;
  kernels::cuda::MemoryBudget* budget_ = nullptr;
  uint64_t charged_ = 0;  // returned to the budget when destroyed
  uint64_t read_ahead_bytes_ = 0;
  bool ranked_by_reads_ = false;  // the cache ranked by Options::reads
  std::unique_ptr<DiskFeatures> disk_;
};

// Bytes of the graph's topology files (indptr, indices, weights) as the store holds them.
uint64_t topology_bytes(const Store& store);
// Host bytes a training run needs to keep the store's features in memory: the topology, the IO
// staging reserve and features.npy. Beyond the host budget the features go to the disk tier.
uint64_t in_memory_feature_need(const Store& store);
// The `placement` advice for a store whose features would go to disk: rows in node-id or in-degree
// order scatter an epoch's seeds and misses over more pages than the training nodes first
// (`--relabel hot`; R-MAT 25 in 8 GB: 3.5 GB read in the first epoch against 10.8-12.1 GB in
// in-degree order; docs/performance.md). Empty for a store in hot or partition order, or relabelled
// before the order was recorded.
std::string row_order_advice(const Store& store);

}  // namespace gale::storage
