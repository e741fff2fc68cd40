#include "storage/feature_tiers.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/error.hpp"

namespace gale::storage {

namespace {

// Reads rows [0, n) of the store's features (converted to f32) into `dst` on the device through a
// bounded pinned staging buffer.
void upload_rows(const Store& store, const std::vector<int64_t>& ids, float* dst, cudaStream_t stream) {
  const int64_t d = store.feature_dim();
  constexpr int64_t kChunkRows = 1 << 15;
  kernels::cuda::PinnedBuffer staging(static_cast<size_t>(std::min<int64_t>(kChunkRows, static_cast<int64_t>(ids.size())) * d) *
                                      sizeof(float));
  auto* host = static_cast<float*>(staging.host());
  for (size_t b = 0; b < ids.size(); b += kChunkRows) {
    const size_t e = std::min(ids.size(), b + kChunkRows);
    GALE_CHECK_CUDA(cudaStreamSynchronize(stream));  // the staging buffer is free again
    store.read_feature_rows(ids.data() + b, static_cast<int64_t>(e - b), host);
    kernels::cuda::copy_to_device(dst + b * d, host, (e - b) * d, stream);
  }
  GALE_CHECK_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace

FeatureTiers::FeatureTiers(const Store& store, kernels::cuda::MemoryPool& pool, cudaStream_t stream, uint64_t gpu_bytes,
                           kernels::cuda::MemoryBudget* host_budget,
                           std::shared_ptr<kernels::cuda::PinnedBuffer> shared_host,
                           const std::vector<uint8_t>* preferred)
    : num_nodes_(store.num_nodes()), dim_(store.feature_dim()) {
  if (!store.has_features()) throw InputError(store.path().string() + ": the store has no features.npy");
  const uint64_t row_bytes = static_cast<uint64_t>(dim_) * sizeof(float);
  store.check_feature_pages(0, num_nodes_);  // every row is read below (to the GPU, or to pinned memory)
  counters_ = kernels::cuda::DeviceBuffer<int64_t>(pool, kernels::kFeatureTiers, stream);
  GALE_CHECK_CUDA(cudaMemsetAsync(counters_.data(), 0, counters_.bytes(), stream));
  if (gpu_bytes >= row_bytes * static_cast<uint64_t>(num_nodes_)) {
    placement_ = Placement::kDevice;
    device_ = kernels::cuda::DeviceBuffer<float>(pool, static_cast<size_t>(num_nodes_ * dim_), stream);
    std::vector<int64_t> all(static_cast<size_t>(num_nodes_));
    std::iota(all.begin(), all.end(), 0);
    upload_rows(store, all, device_.data(), stream);
    cached_rows_ = num_nodes_;
    return;
  }
  placement_ = Placement::kCacheAndHost;
  if (shared_host && shared_host->bytes() == static_cast<size_t>(num_nodes_) * row_bytes) {
    host_ = std::move(shared_host);
  } else {
    host_ = std::make_shared<kernels::cuda::PinnedBuffer>(static_cast<size_t>(num_nodes_) * row_bytes, host_budget,
                                                          "--host-mem-budget (host feature tier)");
    store.read_features(0, num_nodes_, static_cast<float*>(host_->host()));
  }
  // The cache: the hottest nodes that fit once the slot table (4 bytes per node) is paid for.
  cached_rows_ = cache_rows_within(store, gpu_bytes);
  if (cached_rows_ == 0) return;
  const std::vector<int64_t> order = hottest_nodes(store, cached_rows_, preferred);  // preferred, then by degree
  std::vector<int32_t> slot(static_cast<size_t>(num_nodes_), -1);
  for (int64_t i = 0; i < cached_rows_; ++i) slot[static_cast<size_t>(order[i])] = static_cast<int32_t>(i);
  slot_ = kernels::cuda::to_device(pool, slot, stream);
  device_ = kernels::cuda::DeviceBuffer<float>(pool, static_cast<size_t>(cached_rows_ * dim_), stream);
  upload_rows(store, order, device_.data(), stream);
}

FeatureTiers::FeatureTiers(const Store& store, kernels::cuda::MemoryPool& pool, cudaStream_t stream, uint64_t gpu_bytes,
                           const HostFeatures& source, const std::vector<uint32_t>* reads)
    : num_nodes_(store.num_nodes()), dim_(store.feature_dim()), placement_(Placement::kCacheAndStaged) {
  if (!store.has_features()) throw InputError(store.path().string() + ": the store has no features.npy");
  counters_ = kernels::cuda::DeviceBuffer<int64_t>(pool, kernels::kFeatureTiers, stream);
  GALE_CHECK_CUDA(cudaMemsetAsync(counters_.data(), 0, counters_.bytes(), stream));
  on_gpu_.assign(static_cast<size_t>(num_nodes_ / 64 + 1), 0);
  cached_rows_ = cache_rows_within(store, gpu_bytes);
  if (cached_rows_ == 0) return;
  // The hottest rows, read in file order (long reads through the disk tier), a slot each in that
  // order.
  std::vector<int64_t> order = hottest_nodes(store, cached_rows_, nullptr, reads);
  std::sort(order.begin(), order.end());
  std::vector<int32_t> slot(static_cast<size_t>(num_nodes_), -1);
  for (int64_t i = 0; i < cached_rows_; ++i) {
    slot[static_cast<size_t>(order[i])] = static_cast<int32_t>(i);
    on_gpu_[static_cast<size_t>(order[i]) >> 6] |= uint64_t{1} << (order[i] & 63);
  }
  slot_ = kernels::cuda::to_device(pool, slot, stream);
  device_ = kernels::cuda::DeviceBuffer<float>(pool, static_cast<size_t>(cached_rows_ * dim_), stream);
  constexpr int64_t kChunkRows = 1 << 15;
  kernels::cuda::PinnedBuffer staging(static_cast<size_t>(std::min<int64_t>(kChunkRows, cached_rows_) * dim_) * sizeof(float));
  auto* host = static_cast<float*>(staging.host());
  for (int64_t b = 0; b < cached_rows_; b += kChunkRows) {
    const int64_t e = std::min(cached_rows_, b + kChunkRows);
    GALE_CHECK_CUDA(cudaStreamSynchronize(stream));  // the staging buffer is free again
    source.read_rows(order.data() + b, e - b, host);
    kernels::cuda::copy_to_device(device_.data() + b * dim_, host, static_cast<size_t>((e - b) * dim_), stream);
  }
  GALE_CHECK_CUDA(cudaStreamSynchronize(stream));
}

FeatureTiers::~FeatureTiers() = default;

std::string FeatureTiers::describe() const {
  const uint64_t row_bytes = static_cast<uint64_t>(dim_) * sizeof(float);
  if (placement_ == Placement::kDevice)
    return "all " + std::to_string(num_nodes_) + " rows on the GPU (" +
           kernels::cuda::format_bytes(row_bytes * static_cast<uint64_t>(num_nodes_)) + ")";
  if (placement_ == Placement::kCacheAndStaged)
    return "GPU cache of the " + std::to_string(cached_rows_) + " hottest of " + std::to_string(num_nodes_) + " rows (" +
           kernels::cuda::format_bytes(row_bytes * static_cast<uint64_t>(cached_rows_)) +
           "), each batch's other rows staged by the host";
  return "GPU cache of the " + std::to_string(cached_rows_) + " hottest of " + std::to_string(num_nodes_) + " rows (" +
         kernels::cuda::format_bytes(row_bytes * static_cast<uint64_t>(cached_rows_)) +
         "), every row in pinned host memory (" + kernels::cuda::format_bytes(host_->bytes()) + ")";
}

void FeatureTiers::gather(const int64_t* ids, int64_t n, const int32_t* prev_rows, kernels::ConstMatrixView prev,
                          kernels::MatrixView out, cudaStream_t stream, const float* staged, int64_t staged_rows,
                          const int32_t* host_rows) {
  GALE_ASSERT(out.cols == dim_ && out.rows >= n);
  kernels::TieredGatherArgs a;
  a.ids = ids;
  a.n = n;
  a.prev_rows = prev_rows;
  a.prev = prev;
  if (placement_ == Placement::kDevice) {
    a.device = {device_.data(), num_nodes_, dim_, dim_};
  } else {
    a.cache_slot = cached_rows_ > 0 ? slot_.data() : nullptr;
    a.cache = {device_.data(), cached_rows_, dim_, dim_};
    if (placement_ == Placement::kCacheAndStaged) {
      GALE_ASSERT(host_rows != nullptr);
      a.host = {staged, staged_rows, dim_, dim_};
      a.host_rows = host_rows;
    } else {
      a.host = {static_cast<const float*>(host_->device()), num_nodes_, dim_, dim_};
    }
  }
  a.out = out;
  a.counters = counters_.data();
  kernels::tiered_gather_cuda(a, stream);
}

FeatureTierStats FeatureTiers::take_stats(cudaStream_t stream) {
  FeatureTierStats s;
  s.row_bytes = dim_ * static_cast<int64_t>(sizeof(float));
  const std::vector<int64_t> counts = kernels::cuda::to_host_and_wait(counters_.view(), stream);
  for (int t = 0; t < kernels::kFeatureTiers; ++t) s.rows[static_cast<size_t>(t)] = counts[static_cast<size_t>(t)];
  GALE_CHECK_CUDA(cudaMemsetAsync(counters_.data(), 0, counters_.bytes(), stream));
  return s;
}

}  // namespace gale::storage
