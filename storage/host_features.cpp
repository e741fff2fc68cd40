#include "storage/host_features.hpp"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "kernels/error.hpp"

namespace gale::storage {

uint64_t topology_bytes(const Store& store) {
  uint64_t bytes = 0;
  for (const char* rel : {"graph/indptr.npy", "graph/indices.npy", "graph/weights.npy"}) {
    const auto it = store.manifest().files.find(rel);
    if (it != store.manifest().files.end()) bytes += it->second.size;
  }
  return bytes;
}

uint64_t in_memory_feature_need(const Store& store) {
  return topology_bytes(store) + HostFeatures::kStagingReserve + store.manifest().files.at("features.npy").size;
}

std::string row_order_advice(const Store& store) {
  const Manifest& m = store.manifest();
  const char* order = !m.relabelled ? "node-id" : m.relabel_order == "degree" ? "in-degree" : nullptr;
  if (order == nullptr) return "";  // hot, partition (chosen for the full-graph kernels), or not recorded
  return std::string("rows in ") + order + " order: a store written with --relabel hot keeps the rows every epoch "
         "reads (the training nodes, then the hubs) together, so the disk tier reads fewer pages";
}

HostFeatures::HostFeatures(const Store& store, const Options& options) : store_(store), budget_(options.budget) {
  if (!store.has_features()) throw InputError(store.path().string() + ": the store has no features.npy");
  const uint64_t feature_bytes = store.manifest().files.at("features.npy").size;
  if (budget_ != nullptr) {
    // The topology is read whole (sampling, aggregation) unless the GPUs hold it, and batches need
    // staging: both come first.
    const uint64_t topology = options.topology_on_host ? topology_bytes(store) : 0;
    const uint64_t fixed = topology + kStagingReserve;
    if (fixed > budget_->limit())
      throw ResourceError("--host-mem-budget " + budget_->limit_text() + ": below this run's minimum of " +
                          kernels::cuda::format_bytes(fixed) + " (" +
                          (topology > 0 ? "the graph's " + kernels::cuda::format_bytes(topology) + " and " : std::string()) +
                          kernels::cuda::format_bytes(kStagingReserve) + " of IO staging) for " + store.path().string());
    budget_->charge(fixed);
    charged_ = fixed;
  }
  const bool fits = budget_ == nullptr || feature_bytes + options.keep_free <= budget_->limit() - budget_->in_use();
  if (fits && !options.force_disk) {
    if (budget_ != nullptr) {
      budget_->charge(feature_bytes);
      charged_ += feature_bytes;
    }
    placement_ = Placement::kMemory;
    // Loaded whole (through the mapping, in parallel), so checked whole, now.
    store.check_feature_pages(0, store.num_nodes());
    return;
  }
  placement_ = Placement::kDisk;
  const std::vector<uint32_t>* reads = options.reads ? options.reads() : nullptr;
  ranked_by_reads_ = reads != nullptr;
  DiskFeatureOptions d;
  d.engine = options.engine;
  // For measuring: GALE_READ_GAP_PAGES=G merges runs across gaps of at most G pages instead of by
  // cost, GALE_READ_REQUEST_PAGES=P plans by cost with P instead of the measured request cost,
  // GALE_READ_OVERLAP=1 overlaps a call's rounds of reads (DiskFeatureOptions::overlap_rounds).
  if (const char* gap = std::getenv("GALE_READ_GAP_PAGES"); gap != nullptr && std::atoi(gap) >= 0)
    d.max_gap_pages = std::atoi(gap);
  if (const char* pages = std::getenv("GALE_READ_REQUEST_PAGES"); pages != nullptr && std::atof(pages) > 0)
    d.request_pages = std::atof(pages);
  if (const char* overlap = std::getenv("GALE_READ_OVERLAP"); overlap != nullptr) d.overlap_rounds = std::atoi(overlap) == 1;
  d.budget = budget_;
  read_ahead_bytes_ = options.read_ahead_bytes != kAutoReadAhead ? options.read_ahead_bytes
                     : budget_ == nullptr                            ? uint64_t{256} << 20
                                                                     : (budget_->limit() - budget_->in_use()) / 3;
  if (budget_ != nullptr) {
    // What is left after the staging reserve and the read-ahead, less the slot table (4 bytes per
    // node) that a non-empty cache adds.
    uint64_t left = budget_->limit() - budget_->in_use();
    left = left > read_ahead_bytes_ + options.keep_free ? left - read_ahead_bytes_ - options.keep_free : 0;
    const uint64_t slots = static_cast<uint64_t>(store.num_nodes()) * sizeof(int32_t);
    d.cache_bytes = left > slots ? left - slots : 0;
    // The cache's rows are f32; never more than every row.
    d.cache_bytes = std::min<uint64_t>(
        d.cache_bytes, static_cast<uint64_t>(store.num_nodes()) * static_cast<uint64_t>(store.feature_dim()) * sizeof(float));
  }
  // The reserve was for the staging the disk tier charges per call: hand it back to it.
  if (budget_ != nullptr) {
    budget_->release(kStagingReserve);
    charged_ -= kStagingReserve;
  }
  // The cache's rows, hottest first (as the GPU cache's order) after those the GPUs hold, only as
  // many as it holds.
  const int64_t cache_rows = static_cast<int64_t>(d.cache_bytes / (static_cast<uint64_t>(store.feature_dim()) * sizeof(float)));
  const int64_t skip = std::clamp<int64_t>(options.skip_hottest, 0, store.num_nodes());
  std::vector<int64_t> priority = hottest_nodes(store, std::min(store.num_nodes(), skip + cache_rows), nullptr, reads);
  priority.erase(priority.begin(), priority.begin() + std::min<int64_t>(skip, static_cast<int64_t>(priority.size())));
  disk_ = std::make_unique<DiskFeatures>(store, priority, d);
}

HostFeatures::~HostFeatures() {
  disk_.reset();
  if (budget_ != nullptr) budget_->release(charged_);
}

void HostFeatures::read_rows(const int64_t* ids, int64_t n, float* out, const WindowRows* window) const {
  if (disk_) disk_->read_rows(ids, n, out, window);
  else store_.read_feature_rows(ids, n, out);
}

DiskFeatureStats HostFeatures::take_stats() { return disk_ ? disk_->take_stats() : DiskFeatureStats(); }

std::string HostFeatures::describe() const {
  if (disk_) return disk_->describe() + (ranked_by_reads_ ? "; caches ranked by one pre-sampled epoch" : "");
  const uint64_t bytes = store_.manifest().files.at("features.npy").size;
  return "features in host memory (" + kernels::cuda::format_bytes(bytes) +
         (budget_ != nullptr ? " of a " + kernels::cuda::format_bytes(budget_->limit()) + " --host-mem-budget)" : ")");
}

}  // namespace gale::storage
