#include "engine/roofline.hpp"

#include <algorithm>
#include <functional>
#include <string>

#include "engine/devices.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"

namespace gale::engine {

double spmm_dram_bytes(int64_t rows, int64_t nnz, int64_t width, int64_t value_bytes) {
  const double r = static_cast<double>(rows), e = static_cast<double>(nnz), w = static_cast<double>(width);
  return (r + 1) * 8 + e * (4 + static_cast<double>(value_bytes)) + r * w * 4;
}

double spmm_gathered_bytes(int64_t nnz, int64_t width) {
  return static_cast<double>(nnz) * static_cast<double>(width) * 4;
}

double spmm_min_bytes(int64_t rows, int64_t nnz, int64_t width, int64_t value_bytes) {
  return spmm_dram_bytes(rows, nnz, width, value_bytes) + spmm_gathered_bytes(nnz, width);
}

namespace {

bool same_gemm(const RooflineRates::Gemm& g, const ops::OpShape& s) {
  return g.m == s.m && g.n == s.n && g.k == s.k && g.trans_a == s.trans_a && g.trans_b == s.trans_b;
}

double gemm_flops(const ops::OpShape& s) {
  return 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
}

// Milliseconds to do `work` at `rate` (per second); nothing when the rate is unknown. Its inverse:
// the rate of `work` done in `ms`.
double ms_at(double work, double rate) { return rate > 0 ? work / rate * 1e3 : 0.0; }
double ms_rate(double work, double ms) { return ms > 0 ? work / ms * 1e3 : 0.0; }

}  // namespace

double RooflineRates::gemm_rate(const ops::OpShape& s) const {
  for (const Gemm& g : gemm)
    if (same_gemm(g, s)) return g.flops_per_s;
  return 0;
}

double RooflineRates::gather_rate(int64_t width) const {
  for (const auto& [w, rate] : gather)
    if (w == width) return rate;
  return 0;
}

RooflineBound roofline_bound(const std::vector<ops::OpProfile::Entry>& ops, const RooflineRates& rates, int epochs) {
  RooflineBound b;
  if (epochs <= 0) return b;
  for (const ops::OpProfile::Entry& e : ops) {
    const double calls = static_cast<double>(e.calls) / epochs;
    const ops::OpShape& s = e.shape;
    switch (e.kind) {
      case ops::OpKind::kGemm:
        b.gemm_ms += calls * ms_at(gemm_flops(s), rates.gemm_rate(s));
        break;
      case ops::OpKind::kAggregation:
        if (s.rows > 0 && s.width > 0 && rates.gather_rate(s.width) > 0)  // an unmeasured width counts nothing
          b.agg_ms += calls * std::max(ms_at(spmm_dram_bytes(s.rows, s.nnz, s.width, s.value_bytes), rates.hbm_bytes_per_s),
                                       ms_at(spmm_gathered_bytes(s.nnz, s.width), rates.gather_rate(s.width)));
        break;
      case ops::OpKind::kOther:
        b.other_ms += calls * ms_at(s.bytes, rates.hbm_bytes_per_s);
        break;
    }
  }
  return b;
}

double roofline_efficiency(const RooflineBound& bound, double epoch_ms) {
  return epoch_ms > 0 ? bound.ms() / epoch_ms : 0.0;
}

// ---- measuring the rates on a GPU ---------------------------------------------------------------

namespace {

constexpr int kWarmupCalls = 3;
constexpr int kTimedCalls = 7;  // the median of an odd count is one call's time
constexpr uint64_t kL2GatherKey = 0x12f2;  // the synthetic graph's sources

// The median device milliseconds of one call of `op` (of kind `kind`).
double median_call_ms(ops::OpKind kind, const std::function<void()>& op) {
  for (int i = 0; i < kWarmupCalls; ++i) op();
  std::vector<double> ms;
  for (int i = 0; i < kTimedCalls; ++i) {
    ops::OpProfile profile;
    op();
    ms.push_back(profile.ms(kind));
  }
  std::nth_element(ms.begin(), ms.begin() + kTimedCalls / 2, ms.end());
  return ms[kTimedCalls / 2];
}

Tensor zeros(int64_t rows, int64_t cols, DType dtype, const Device& device) {
  Tensor t = Tensor::empty(rows, cols, dtype, device);
  ops::zero(&t);
  return t;
}

// FLOP/s of ops::gemm for the shape on zeroed operands: op(a) m x k, op(b) k x n.
double gemm_flops_per_s(const ops::OpShape& s, const Device& device, bool tf32) {
  const Tensor a = s.trans_a ? zeros(s.k, s.m, DType::kF32, device) : zeros(s.m, s.k, DType::kF32, device);
  const Tensor b = s.trans_b ? zeros(s.n, s.k, DType::kF32, device) : zeros(s.k, s.n, DType::kF32, device);
  Tensor c = zeros(s.m, s.n, DType::kF32, device);
  const double ms = median_call_ms(ops::OpKind::kGemm, [&] { ops::gemm(a, s.trans_a, b, s.trans_b, 0.0f, &c, tf32); });
  return ms_rate(gemm_flops(s), ms);
}

// Bytes/s GAR gathers `width`-float rows when every one is an L2 hit: kRooflineGatherBytes gathered
// by rows of kRooflineGatherDegree entries whose sources, drawn by a fixed hash, lie in a table of a
// quarter of the L2 (its rows padded as GAR wants them, so no copy is timed).
double l2_gather_bytes_per_s(int64_t width, const Device& device) {
  const int64_t l2 = device_l2_bytes(device);
  const int64_t ld = kernels::spmm_gar_row_floats(width);
  const int64_t table_rows = std::max<int64_t>(kRooflineGatherDegree, l2 / 4 / (ld * 4));
  const int64_t rows = std::max<int64_t>(1, kRooflineGatherBytes / (width * 4) / kRooflineGatherDegree);
  const int64_t nnz = rows * kRooflineGatherDegree;
  std::vector<int64_t> indptr(static_cast<size_t>(rows + 1));
  for (int64_t r = 0; r <= rows; ++r) indptr[r] = r * kRooflineGatherDegree;
  std::vector<int32_t> indices(static_cast<size_t>(nnz));
  for (int64_t e = 0; e < nnz; ++e)
    indices[e] = static_cast<int32_t>(kernels::random_below(kL2GatherKey, static_cast<uint64_t>(e), static_cast<uint64_t>(table_rows)));
  const Tensor ptr = Tensor::from_host(indptr.data(), rows + 1, 1, DType::kI64, device);
  const Tensor idx = Tensor::from_host(indices.data(), nnz, 1, DType::kI32, device);
  const Tensor x = zeros(table_rows, ld, DType::kF32, device);
  Tensor out = Tensor::empty(rows, width, DType::kF32, device);
  kernels::SpmmArgs a;
  a.graph = {rows, table_rows, ptr.data<int64_t>(), idx.data<int32_t>(), nullptr};
  a.x = kernels::ConstMatrixView{x.f32(), table_rows, width, ld};
  a.out = kernels::MatrixView{out.f32(), rows, width, width};
  a.nnz = nnz;
  const double ms = median_call_ms(ops::OpKind::kAggregation, [&] { ops::spmm(a, device, kernels::SpmmKind::kGar); });
  return ms_rate(spmm_gathered_bytes(nnz, width), ms);
}

double copy_bytes_per_s(const Device& device) {
  const Tensor src = zeros(kRooflineCopyBytes / 4, 1, DType::kF32, device);
  Tensor dst = Tensor::empty(src.rows(), 1, DType::kF32, device);
  const double ms = median_call_ms(ops::OpKind::kOther, [&] { ops::copy(src, &dst); });
  return ms_rate(2.0 * static_cast<double>(src.nbytes()), ms);
}

// A rate measured, or 0 where its operands do not fit in the device's memory (or budget).
double unless_out_of_memory(const std::function<double()>& measure) {
  try {
    return measure();
  } catch (const ResourceError&) {
    return 0;
  }
}

}  // namespace

void measure_roofline_rates(const std::vector<ops::OpProfile::Entry>& ops, const Device& device, bool tf32,
                            RooflineRates* rates) {
  if (!device.is_cuda()) throw DeviceError("the roofline's rates are measured on a GPU, not on " + device.name());
  RooflineRates& r = *rates;
  for (const ops::OpProfile::Entry& e : ops) {
    const ops::OpShape& s = e.shape;
    const bool gemm_new = std::none_of(r.gemm.begin(), r.gemm.end(), [&](const auto& g) { return same_gemm(g, s); });
    if (e.kind == ops::OpKind::kGemm && s.m > 0 && s.n > 0 && s.k > 0 && gemm_new)
      r.gemm.push_back({s.m, s.n, s.k, s.trans_a, s.trans_b,
                        unless_out_of_memory([&] { return gemm_flops_per_s(s, device, tf32); })});
    const bool width_new =
        std::none_of(r.gather.begin(), r.gather.end(), [&](const auto& g) { return g.first == s.width; });
    if (e.kind == ops::OpKind::kAggregation && s.width > 0 && width_new)
      r.gather.emplace_back(s.width, unless_out_of_memory([&] { return l2_gather_bytes_per_s(s.width, device); }));
  }
  if (r.hbm_bytes_per_s == 0) r.hbm_bytes_per_s = unless_out_of_memory([&] { return copy_bytes_per_s(device); });
}

}  // namespace gale::engine
