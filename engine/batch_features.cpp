#include "engine/batch_features.hpp"

#include <algorithm>
#include <mutex>
#include <utility>

#include "kernels/error.hpp"
#if GALE_WITH_CUDA
#include "engine/device_context.hpp"
#include "kernels/cuda/fill.hpp"
#include "kernels/cuda/pinned.hpp"
#include "kernels/feature_gather.hpp"
#include "storage/feature_tiers.hpp"
#endif

namespace gale::engine {

// Pinned buffers for one batch's staged rows and its rows' places among them.
struct StagedRows::Slot {
#if GALE_WITH_CUDA
  kernels::cuda::PinnedBuffer rows;   // capacity_rows x dim floats
  kernels::cuda::PinnedBuffer index;  // capacity_index int32
  std::unique_ptr<kernels::cuda::Event> read;  // recorded after the gather that reads them
  bool pending = false;                        // read is recorded and may not have completed
#endif
  int64_t capacity_rows = 0, capacity_index = 0;
};

StagedRows::StagedRows() = default;
StagedRows::~StagedRows() = default;
StagedRows::StagedRows(StagedRows&&) noexcept = default;
StagedRows& StagedRows::operator=(StagedRows&&) noexcept = default;

struct BatchFeatures::Impl {
  const storage::Store& store;
  Device device;
  bool match = false;
  FeatureLoadStats stats;
  // Match state on the GPU: the previous batch's node ids and features, and every node's row in
  // them (-1: not in them).
  Tensor prev_nodes, row_of, prev_features;
#if GALE_WITH_CUDA
  std::unique_ptr<storage::FeatureTiers> tiers;
#endif
  // Features on disk: the pinned buffers of staged batches, each free again once only this pool
  // holds it and the gather that read it is done.
  kernels::cuda::MemoryBudget* host_budget = nullptr;
  std::mutex pool_mutex;
  std::vector<std::shared_ptr<StagedRows::Slot>> pool;
  Impl(const storage::Store& s, const Device& d) : store(s), device(d) {}

  void set_match(bool on);
  std::shared_ptr<StagedRows::Slot> acquire(int64_t rows, int64_t index);
};

void BatchFeatures::Impl::set_match(bool on) {
#if GALE_WITH_CUDA
  // With every row on the GPU the match saves no transfer and costs a lookup per row (measured:
  // 0.097 against 0.060 ms per R-MAT 21 batch), so it applies only when some rows live on the host.
  match = on && tiers->placement() != storage::FeatureTiers::Placement::kDevice;
  if (match) {
    DeviceContext& ctx = DeviceContext::get(device.ordinal);
    row_of = Tensor::empty_io(store.num_nodes(), 1, DType::kI32, device);
    kernels::cuda::fill(row_of.data<int32_t>(), static_cast<size_t>(store.num_nodes()), int32_t{-1}, ctx.io_stream());
  }
#else
  (void)on;
#endif
}

std::shared_ptr<StagedRows::Slot> BatchFeatures::Impl::acquire(int64_t rows, int64_t index) {
  std::shared_ptr<StagedRows::Slot> slot;
  {
    const std::lock_guard<std::mutex> lock(pool_mutex);
    // A free slot large enough, else any free one (grown below), else a new one.
    for (const auto& s : pool) {
      if (s.use_count() != 1) continue;
      if (s->capacity_rows >= rows && s->capacity_index >= index) {
        slot = s;
        break;
      }
      if (!slot) slot = s;
    }
    if (!slot) pool.push_back(slot = std::make_shared<StagedRows::Slot>());
  }
#if GALE_WITH_CUDA
  if (slot->pending) {
    slot->read->synchronize();
    slot->pending = false;
  }
  const int64_t d = store.feature_dim();
  // Grown by a quarter beyond what this batch needs, so batches a little larger reuse it.
  if (slot->capacity_rows < rows) {
    const int64_t capacity = std::max<int64_t>(rows + rows / 4, 1024);
    slot->rows = kernels::cuda::PinnedBuffer();
    slot->rows = kernels::cuda::PinnedBuffer(static_cast<size_t>(capacity * d) * sizeof(float), host_budget,
                                             "--host-mem-budget (staged feature rows)");
    slot->capacity_rows = capacity;
  }
  if (slot->capacity_index < index) {
    const int64_t capacity = std::max<int64_t>(index + index / 4, 4096);
    slot->index = kernels::cuda::PinnedBuffer();
    slot->index = kernels::cuda::PinnedBuffer(static_cast<size_t>(capacity) * sizeof(int32_t), host_budget,
                                              "--host-mem-budget (staged feature rows)");
    slot->capacity_index = capacity;
  }
  if (!slot->read) slot->read = std::make_unique<kernels::cuda::Event>(device.ordinal);
#else
  (void)rows, (void)index;
#endif
  return slot;
}

BatchFeatures::BatchFeatures(const storage::Store& store, const Device& device, uint64_t gpu_bytes, bool match,
                             const BatchFeatures* share_host_with, const std::vector<uint8_t>* preferred,
                             kernels::cuda::MemoryBudget* host_budget)
    : impl_(std::make_unique<Impl>(store, device)) {
  if (!store.has_features()) throw InputError(store.path().string() + ": the store has no features.npy");
  impl_->stats.row_bytes = store.feature_dim() * static_cast<int64_t>(sizeof(float));
  if (device.is_cpu()) return;
#if GALE_WITH_CUDA
  DeviceContext& ctx = DeviceContext::get(device.ordinal);
  std::shared_ptr<kernels::cuda::PinnedBuffer> host;
  if (share_host_with && share_host_with->impl_->tiers) host = share_host_with->impl_->tiers->host_tier();
  impl_->tiers = std::make_unique<storage::FeatureTiers>(store, ctx.pool(), ctx.io_stream(), gpu_bytes, host_budget,
                                                         std::move(host), preferred);
  impl_->set_match(match);
#else
  (void)gpu_bytes;
  (void)match;
  (void)share_host_with;
  (void)preferred;
  (void)host_budget;
  throw DeviceError("this build has no CUDA backend");
#endif
}

BatchFeatures::BatchFeatures(const storage::Store& store, const Device& device, uint64_t gpu_bytes, bool match,
                             const storage::HostFeatures& source, kernels::cuda::MemoryBudget* host_budget,
                             const std::vector<uint32_t>* reads)
    : impl_(std::make_unique<Impl>(store, device)) {
  if (!store.has_features()) throw InputError(store.path().string() + ": the store has no features.npy");
  impl_->stats.row_bytes = store.feature_dim() * static_cast<int64_t>(sizeof(float));
  impl_->host_budget = host_budget;
  if (!device.is_cuda()) throw InternalError("BatchFeatures: staged rows are for a GPU");
#if GALE_WITH_CUDA
  DeviceContext& ctx = DeviceContext::get(device.ordinal);
  impl_->tiers = std::make_unique<storage::FeatureTiers>(store, ctx.pool(), ctx.io_stream(), gpu_bytes, source, reads);
  impl_->set_match(match);
#else
  (void)gpu_bytes, (void)match, (void)source, (void)reads;
  throw DeviceError("this build has no CUDA backend");
#endif
}

BatchFeatures::~BatchFeatures() {
#if GALE_WITH_CUDA
  // The last gathers may still read the staged buffers: wait for them before the pool frees them.
  for (const auto& slot : impl_->pool)
    if (slot->pending) slot->read->synchronize_unchecked();
#endif
}

bool BatchFeatures::staged() const {
#if GALE_WITH_CUDA
  if (impl_->tiers) return impl_->tiers->placement() == storage::FeatureTiers::Placement::kCacheAndStaged;
#endif
  return false;
}

bool BatchFeatures::on_gpu(int64_t id) const {
#if GALE_WITH_CUDA
  if (impl_->tiers) return impl_->tiers->on_gpu(id);
#endif
  (void)id;
  return false;
}

const int32_t* BatchFeatures::gpu_cache_slots() const {
#if GALE_WITH_CUDA
  if (staged()) return impl_->tiers->cache_slots();
#endif
  return nullptr;
}

StagedRows BatchFeatures::stage(const std::vector<int64_t>& nodes, const RowReader& read) {
  if (!staged()) throw InternalError("BatchFeatures::stage: the features are not staged");
  StagedRows out;
#if GALE_WITH_CUDA
  const int64_t n = static_cast<int64_t>(nodes.size());
  std::vector<int64_t> missing;
  std::vector<int32_t> index(nodes.size(), -1);
  for (int64_t i = 0; i < n; ++i) {
    if (impl_->tiers->on_gpu(nodes[static_cast<size_t>(i)])) continue;
    index[static_cast<size_t>(i)] = static_cast<int32_t>(missing.size());
    missing.push_back(nodes[static_cast<size_t>(i)]);
  }
  out.slot_ = impl_->acquire(static_cast<int64_t>(missing.size()), n);
  out.rows_ = static_cast<int64_t>(missing.size());
  std::copy(index.begin(), index.end(), static_cast<int32_t*>(out.slot_->index.host()));
  if (!missing.empty()) read(missing.data(), out.rows_, static_cast<float*>(out.slot_->rows.host()));
#else
  (void)nodes, (void)read;
#endif
  return out;
}

bool BatchFeatures::resident() const {
#if GALE_WITH_CUDA
  if (impl_->tiers) return impl_->tiers->placement() == storage::FeatureTiers::Placement::kDevice;
#endif
  return true;
}

std::string BatchFeatures::describe() const {
#if GALE_WITH_CUDA
  if (impl_->tiers) return impl_->tiers->describe() + (impl_->match ? ", match on" : ", match off");
#endif
  return "read from the store on the CPU";
}

PendingFeatures& PendingFeatures::operator=(PendingFeatures&& other) noexcept {
  if (this != &other) {
    discard();
    features_ = std::move(other.features_);
    ready_ = std::move(other.ready_);
  }
  return *this;
}

PendingFeatures::~PendingFeatures() { discard(); }

void PendingFeatures::discard() noexcept {
  if (!ready_) return;
  try {
    (void)take();
  } catch (...) {  // the device is failing already: whoever reports that says why
  }
  features_ = Tensor();
}

Tensor PendingFeatures::take() {
#if GALE_WITH_CUDA
  if (ready_) {
    DeviceContext::get(features_.device().ordinal).stream().wait(*std::static_pointer_cast<kernels::cuda::Event>(ready_));
    ready_.reset();
  }
#endif
  return features_;
}

Tensor BatchFeatures::load(const std::vector<int64_t>& nodes, const StagedRows* staged) {
  Impl& s = *impl_;
  const int64_t n = static_cast<int64_t>(nodes.size());
  if (s.device.is_cpu()) {
    const int64_t d = s.store.feature_dim();
    ++s.stats.batches;
    s.stats.rows += n;
    Tensor out = Tensor::empty(n, d);
    s.store.read_feature_rows(nodes.data(), n, out.f32());
    s.stats.host += n;
    return out;
  }
#if GALE_WITH_CUDA
  Tensor ids = Tensor::empty_io(n, 1, DType::kI64, s.device);
  kernels::cuda::copy_to_device(ids.data<int64_t>(), nodes.data(), nodes.size(),
                                DeviceContext::get(s.device.ordinal).io_stream());
  return load_async(ids, staged).take();
#else
  throw DeviceError("this build has no CUDA backend");
#endif
}

PendingFeatures BatchFeatures::load_async(const Tensor& nodes, const StagedRows* staged) {
  Impl& s = *impl_;
  if (nodes.device() != s.device) throw InternalError("BatchFeatures::load_async: the ids live on another device");
  PendingFeatures out;
  if (s.device.is_cpu()) {
    out.features_ = load(std::vector<int64_t>(nodes.data<int64_t>(), nodes.data<int64_t>() + nodes.rows()));
    return out;
  }
#if GALE_WITH_CUDA
  const int64_t n = nodes.rows();
  ++s.stats.batches;
  s.stats.rows += n;
  kernels::cuda::Stream& io = DeviceContext::get(s.device.ordinal).io_stream();
  Tensor x = Tensor::empty_io(n, s.store.feature_dim(), DType::kF32, s.device);
  const bool reuse = s.match && s.prev_features.defined();
  Tensor prev_rows;
  if (reuse) {
    prev_rows = Tensor::empty_io(n, 1, DType::kI32, s.device);
    kernels::match_rows_cuda(s.row_of.data<int32_t>(), nodes.data<int64_t>(), n, prev_rows.data<int32_t>(), io);
  }
  const bool with_staged = s.tiers->placement() == storage::FeatureTiers::Placement::kCacheAndStaged;
  if (with_staged && (staged == nullptr || staged->empty()))
    throw InternalError("BatchFeatures::load_async: the batch's rows were not staged");
  s.tiers->gather(nodes.data<int64_t>(), n, reuse ? prev_rows.data<int32_t>() : nullptr,
                  reuse ? s.prev_features.view() : kernels::ConstMatrixView{}, x.view(), io,
                  with_staged ? static_cast<const float*>(staged->slot_->rows.device()) : nullptr,
                  with_staged ? staged->rows_ : 0,
                  with_staged ? static_cast<const int32_t*>(staged->slot_->index.device()) : nullptr);
  if (with_staged) {  // the buffers are reused once this gather has read them
    staged->slot_->read->record(io);
    staged->slot_->pending = true;
  }
  if (s.match) {
    kernels::match_advance_cuda(s.row_of.data<int32_t>(), s.prev_nodes.defined() ? s.prev_nodes.data<int64_t>() : nullptr,
                                s.prev_nodes.rows(), nodes.data<int64_t>(), n, io);
    s.prev_nodes = nodes;
    s.prev_features = x;  // read-only from here: layers never write their input
  }
  auto ready = std::make_shared<kernels::cuda::Event>(s.device.ordinal);
  ready->record(io);
  out.features_ = std::move(x);
  out.ready_ = std::move(ready);
  return out;
#else
  throw DeviceError("this build has no CUDA backend");
#endif
}

Tensor BatchFeatures::load(const std::vector<int64_t>& nodes, const RowReader& read) {
  if (!staged()) return load(nodes);
#if GALE_WITH_CUDA
  Impl& s = *impl_;
  const int64_t n = static_cast<int64_t>(nodes.size()), d = s.store.feature_dim();
  ++s.stats.batches;
  s.stats.rows += n;
  kernels::cuda::Stream& io = DeviceContext::get(s.device.ordinal).io_stream();
  Tensor ids = Tensor::empty_io(n, 1, DType::kI64, s.device);
  kernels::cuda::copy_to_device(ids.data<int64_t>(), nodes.data(), nodes.size(), io);
  Tensor x = Tensor::empty_io(n, d, DType::kF32, s.device);
  for (int64_t first = 0; first < n; first += kStageRows) {
    const int64_t len = std::min(kStageRows, n - first);
    const StagedRows part = stage(std::vector<int64_t>(nodes.begin() + first, nodes.begin() + first + len), read);
    s.tiers->gather(ids.data<int64_t>() + first, len, nullptr, kernels::ConstMatrixView{},
                    kernels::MatrixView{x.f32() + first * d, len, d, d}, io,
                    static_cast<const float*>(part.slot_->rows.device()), part.rows_,
                    static_cast<const int32_t*>(part.slot_->index.device()));
    part.slot_->read->record(io);
    part.slot_->pending = true;
  }
  PendingFeatures out;
  auto ready = std::make_shared<kernels::cuda::Event>(s.device.ordinal);
  ready->record(io);
  out.features_ = std::move(x);
  out.ready_ = std::move(ready);
  return out.take();
#else
  (void)read;
  throw DeviceError("this build has no CUDA backend");
#endif
}

FeatureLoadStats BatchFeatures::take_stats() {
  FeatureLoadStats out = impl_->stats;
#if GALE_WITH_CUDA
  if (impl_->tiers) {
    const storage::FeatureTierStats t = impl_->tiers->take_stats(DeviceContext::get(impl_->device.ordinal).io_stream());
    out.previous = t.rows[kernels::kTierPrevious];
    out.device = t.rows[kernels::kTierDevice];
    out.cache = t.rows[kernels::kTierCache];
    out.host = t.rows[kernels::kTierHost];
  }
#endif
  impl_->stats = FeatureLoadStats();
  impl_->stats.row_bytes = out.row_bytes;
  return out;
}

}  // namespace gale::engine
