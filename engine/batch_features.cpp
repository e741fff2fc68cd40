#include "engine/batch_features.hpp"

#include <utility>

#include "kernels/error.hpp"
#if GALE_WITH_CUDA
#include "engine/device_context.hpp"
#include "kernels/cuda/fill.hpp"
#include "kernels/feature_gather.hpp"
#include "storage/feature_tiers.hpp"
#endif

namespace gale::engine {

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
  Impl(const storage::Store& s, const Device& d) : store(s), device(d) {}
};

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
  // With every row on the GPU the match saves no transfer and costs a lookup per row (measured:
  // 0.097 against 0.060 ms per R-MAT 21 batch), so it applies only when some rows live on the host.
  impl_->match = match && impl_->tiers->placement() != storage::FeatureTiers::Placement::kDevice;
  if (impl_->match) {
    impl_->row_of = Tensor::empty_io(store.num_nodes(), 1, DType::kI32, device);
    kernels::cuda::fill(impl_->row_of.data<int32_t>(), static_cast<size_t>(store.num_nodes()), int32_t{-1}, ctx.io_stream());
  }
#else
  (void)gpu_bytes;
  (void)match;
  (void)share_host_with;
  (void)preferred;
  (void)host_budget;
  throw DeviceError("this build has no CUDA backend");
#endif
}

BatchFeatures::~BatchFeatures() = default;

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

Tensor BatchFeatures::load(const std::vector<int64_t>& nodes) {
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
  return load_async(ids).take();
#else
  throw DeviceError("this build has no CUDA backend");
#endif
}

PendingFeatures BatchFeatures::load_async(const Tensor& nodes) {
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
  s.tiers->gather(nodes.data<int64_t>(), n, reuse ? prev_rows.data<int32_t>() : nullptr,
                  reuse ? s.prev_features.view() : kernels::ConstMatrixView{}, x.view(), io);
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
