#include "engine/batch_features.hpp"

#include "kernels/error.hpp"
#if GALE_WITH_CUDA
#include "engine/device_context.hpp"
#include "storage/feature_tiers.hpp"
#endif

namespace gale::engine {

struct BatchFeatures::Impl {
  const storage::Store& store;
  Device device;
  bool match = false;
  FeatureLoadStats stats;
  // Match state: the previous batch's node ids and each node's row in it (-1: not in it).
  std::vector<int64_t> prev_nodes;
  std::vector<int32_t> prev_row;
  Tensor prev_features;
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
  if (match) impl_->prev_row.assign(static_cast<size_t>(store.num_nodes()), -1);
  DeviceContext& ctx = DeviceContext::get(device.ordinal);
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
  const int64_t d = s.store.feature_dim();
  ++s.stats.batches;
  s.stats.rows += n;
  if (s.device.is_cpu()) {
    Tensor out = Tensor::empty(n, d);
    for (int64_t i = 0; i < n; ++i) s.store.read_features(nodes[i], nodes[i] + 1, out.f32() + i * d);
    s.stats.host += n;
    return out;
  }
#if GALE_WITH_CUDA
  DeviceContext& ctx = DeviceContext::get(s.device.ordinal);
  std::vector<int32_t> rows;
  if (s.match) {
    rows.resize(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) rows[i] = s.prev_row[static_cast<size_t>(nodes[i])];
  }
  const Tensor ids = Tensor::from_host(nodes.data(), n, 1, DType::kI64, s.device);
  const Tensor prev_rows = s.match ? Tensor::from_host(rows.data(), n, 1, DType::kI32, s.device) : Tensor();
  Tensor out = Tensor::empty(n, d, DType::kF32, s.device);
  const kernels::ConstMatrixView prev = s.prev_features.defined() ? s.prev_features.view() : kernels::ConstMatrixView{};
  s.tiers->gather(ids.data<int64_t>(), n, s.match && s.prev_features.defined() ? prev_rows.data<int32_t>() : nullptr, prev,
                  out.view(), ctx.stream());
  if (s.match) {
    for (int64_t v : s.prev_nodes) s.prev_row[static_cast<size_t>(v)] = -1;
    for (int64_t i = 0; i < n; ++i) s.prev_row[static_cast<size_t>(nodes[i])] = static_cast<int32_t>(i);
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
