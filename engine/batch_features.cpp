#include "engine/batch_features.hpp"

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

BatchFeatures::BatchFeatures(const storage::Store& store, const Device& device, uint64_t gpu_bytes, bool match)
    : impl_(std::make_unique<Impl>(store, device)) {
  if (!store.has_features()) throw InputError(store.path().string() + ": the store has no features.npy");
  impl_->stats.row_bytes = store.feature_dim() * static_cast<int64_t>(sizeof(float));
  if (device.is_cpu()) return;
#if GALE_WITH_CUDA
  impl_->match = match;
  DeviceContext& ctx = DeviceContext::get(device.ordinal);
  if (match) {
    impl_->row_of = Tensor::empty(store.num_nodes(), 1, DType::kI32, device);
    kernels::cuda::fill(impl_->row_of.data<int32_t>(), static_cast<size_t>(store.num_nodes()), int32_t{-1}, ctx.stream());
  }
  impl_->tiers = std::make_unique<storage::FeatureTiers>(store, ctx.pool(), ctx.stream(), gpu_bytes);
#else
  (void)gpu_bytes;
  (void)match;
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

Tensor BatchFeatures::load(const std::vector<int64_t>& nodes) {
  Impl& s = *impl_;
  const int64_t n = static_cast<int64_t>(nodes.size());
  if (s.device.is_cpu()) {
    const int64_t d = s.store.feature_dim();
    ++s.stats.batches;
    s.stats.rows += n;
    Tensor out = Tensor::empty(n, d);
    for (int64_t i = 0; i < n; ++i) s.store.read_features(nodes[i], nodes[i] + 1, out.f32() + i * d);
    s.stats.host += n;
    return out;
  }
  return load(Tensor::from_host(nodes.data(), n, 1, DType::kI64, s.device));
}

Tensor BatchFeatures::load(const Tensor& nodes) {
  Impl& s = *impl_;
  if (nodes.device() != s.device) throw InternalError("BatchFeatures::load: the ids live on another device");
  if (s.device.is_cpu()) return load(std::vector<int64_t>(nodes.data<int64_t>(), nodes.data<int64_t>() + nodes.rows()));
#if GALE_WITH_CUDA
  const int64_t n = nodes.rows();
  ++s.stats.batches;
  s.stats.rows += n;
  DeviceContext& ctx = DeviceContext::get(s.device.ordinal);
  Tensor out = Tensor::empty(n, s.store.feature_dim(), DType::kF32, s.device);
  const bool reuse = s.match && s.prev_features.defined();
  Tensor prev_rows;
  if (reuse) {
    prev_rows = Tensor::empty(n, 1, DType::kI32, s.device);
    kernels::match_rows_cuda(s.row_of.data<int32_t>(), nodes.data<int64_t>(), n, prev_rows.data<int32_t>(), ctx.stream());
  }
  s.tiers->gather(nodes.data<int64_t>(), n, reuse ? prev_rows.data<int32_t>() : nullptr,
                  reuse ? s.prev_features.view() : kernels::ConstMatrixView{}, out.view(), ctx.stream());
  if (s.match) {
    kernels::match_advance_cuda(s.row_of.data<int32_t>(), s.prev_nodes.defined() ? s.prev_nodes.data<int64_t>() : nullptr,
                                s.prev_nodes.rows(), nodes.data<int64_t>(), n, ctx.stream());
    s.prev_nodes = nodes;
    s.prev_features = out;  // read-only from here: layers never write their input
  }
  return out;
#else
  throw DeviceError("this build has no CUDA backend");
#endif
}

FeatureLoadStats BatchFeatures::take_stats() {
  FeatureLoadStats out = impl_->stats;
#if GALE_WITH_CUDA
  if (impl_->tiers) {
    const storage::FeatureTierStats t = impl_->tiers->take_stats(DeviceContext::get(impl_->device.ordinal).stream());
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
