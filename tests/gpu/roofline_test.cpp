// The roofline's rates and bound on a GPU (engine/roofline.hpp): the FLOP/s cuBLAS reaches on a
// large square fp32 GEMM is positive and below any GPU's fp32 ceiling; the bound of a profiled
// full-graph epoch on a small random graph is positive and no longer than the epoch itself; the
// aggregation floor stays below GAR's time on a skewed graph far larger than the L2, whose hot rows
// the L2 serves (R-MAT's case, where a floor from gathers measured on the graph's own first indices
// came out 1.5-1.9x above the epoch). Skips with a reason when no device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/devices.hpp"
#include "engine/graph.hpp"
#include "engine/model.hpp"
#include "engine/ops.hpp"
#include "engine/roofline.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/random.hpp"

namespace gale::engine {
namespace {

bool have_gpu() { return kernels::cuda::device_count() > 0; }

struct RandomGraph {
  int64_t n = 0;
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> indices;
  kernels::CsrView view() const { return {n, n, indptr.data(), indices.data(), nullptr}; }
};

// Each row 1-16 random sources (repeats kept: an aggregation takes them as they come): uniform, or
// with `skew` the source n u^skew for a uniform u, so that low ids are hot as in R-MAT.
RandomGraph random_graph(uint64_t key, int64_t n, double skew = 0) {
  RandomGraph g;
  g.n = n;
  uint64_t c = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t deg = 1 + static_cast<int64_t>(kernels::random_below(key, c++, 16));
    std::vector<int32_t> row;
    for (int64_t e = 0; e < deg; ++e) {
      const int64_t src = skew > 0 ? static_cast<int64_t>(static_cast<double>(n) * std::pow(kernels::random_uniform(key, c++), skew))
                                   : static_cast<int64_t>(kernels::random_below(key, c++, static_cast<uint64_t>(n)));
      row.push_back(static_cast<int32_t>(std::min(src, n - 1)));
    }
    std::sort(row.begin(), row.end());
    g.indices.insert(g.indices.end(), row.begin(), row.end());
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  return g;
}

TEST(RooflineGpu, SquareFp32GemmRateIsPositiveAndBelowTheCeiling) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  ops::OpShape s;
  s.m = s.n = s.k = 4096;
  const std::vector<ops::OpProfile::Entry> gemm = {{"gemm", ops::OpKind::kGemm, 0, 1, s}};
  RooflineRates r;
  measure_roofline_rates(gemm, Device::cuda(0), /*tf32=*/false, &r);
  ASSERT_EQ(r.gemm.size(), 1u);
  // An H100's fp32 peak is 67 TFLOP/s; 200 is beyond any GPU's fp32 without tensor cores.
  EXPECT_GT(r.gemm[0].flops_per_s, 1e11);
  EXPECT_LT(r.gemm[0].flops_per_s, 200e12);
  EXPECT_GT(r.hbm_bytes_per_s, 1e10);
}

// Full-graph epochs of `model` on g (forward, loss over every node, backward, Adam), as `gale bench
// train` times them: the median wall milliseconds of 5 after 2 warm-up, and the ops of the 5.
double profiled_epochs(const std::string& model, const RandomGraph& g, std::vector<ops::OpProfile::Entry>* table) {
  const Device dev = Device::cuda(0);
  ModelConfig cfg;
  cfg.model = model;
  cfg.layers = 2;
  cfg.in_dim = 64;
  cfg.hidden = 128;
  cfg.out_dim = 8;
  Model m(cfg, 1);
  m.to(dev);
  m.set_constant_input(true);
  Adam adam(m.parameters(), 0.01f, 0.0f);
  const GraphOperand op = GraphOperand(g.view()).to(dev, false);
  const std::vector<const GraphOperand*> graphs(2, &op);
  std::vector<float> xs(static_cast<size_t>(g.n * cfg.in_dim));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = kernels::random_uniform(5, i) - 0.5f;
  std::vector<int32_t> labels(static_cast<size_t>(g.n));
  std::vector<int64_t> rows(static_cast<size_t>(g.n));
  for (int64_t v = 0; v < g.n; ++v) {
    labels[v] = static_cast<int32_t>(v % cfg.out_dim);
    rows[v] = v;
  }
  const Tensor x = Tensor::from_host(xs.data(), g.n, cfg.in_dim, DType::kF32, dev);
  const Tensor y = Tensor::from_host(labels.data(), g.n, 1, DType::kI32, dev);
  const Tensor ids = Tensor::from_host(rows.data(), g.n, 1, DType::kI64, dev);
  auto step = [&] {
    m.zero_grad();
    Tensor logits = m.forward(graphs, x, /*training=*/true, 1);
    Tensor grad = Tensor::empty(logits.rows(), logits.cols(), DType::kF32, dev);
    ops::softmax_cross_entropy(logits, y, ids, &grad);
    logits = Tensor();
    m.backward(std::move(grad));
    adam.step();
    synchronize(dev);
  };
  for (int i = 0; i < 2; ++i) step();
  std::vector<double> ms;
  ops::OpProfile profile;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  *table = profile.table();
  std::sort(ms.begin(), ms.end());
  return ms[2];
}

TEST(RooflineGpu, BoundOfAProfiledEpochIsPositiveAndNoLongerThanTheEpoch) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  const RandomGraph g = random_graph(11, 50000);
  RooflineRates rates;  // kept from model to model, as `gale bench train` keeps them
  for (const char* model : {"gcn", "sage", "gin"}) {
    std::vector<ops::OpProfile::Entry> table;
    const double epoch_ms = profiled_epochs(model, g, &table);
    measure_roofline_rates(table, Device::cuda(0), false, &rates);
    const RooflineBound b = roofline_bound(table, rates, 5);
    EXPECT_GT(b.gemm_ms, 0) << model;
    EXPECT_GT(b.agg_ms, 0) << model;
    EXPECT_GT(b.other_ms, 0) << model;
    // A few percent for timing noise: the rates are medians of single calls.
    EXPECT_LE(roofline_efficiency(b, epoch_ms), 1.05) << model << ": bound " << b.ms() << " ms, epoch " << epoch_ms;
  }
}

TEST(RooflineGpu, AggregationFloorIsBelowGarOnASkewedGraphBeyondTheL2) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  const Device dev = Device::cuda(0);
  const RandomGraph g = random_graph(12, 2'000'000, /*skew=*/3.0);  // 2M x 256 floats: 2 GB of sources
  const GraphOperand op = GraphOperand(g.view()).to(dev, false);
  for (const int64_t width : {64, 256}) {
    const Tensor x = Tensor::zeros(g.n, width, DType::kF32, dev);
    Tensor out = Tensor::empty(g.n, width, DType::kF32, dev);
    kernels::SpmmArgs a;
    a.graph = op.csr();
    a.x = x.view();
    a.out = out.view();
    a.nnz = static_cast<int64_t>(g.indices.size());
    for (int i = 0; i < 3; ++i) ops::spmm(a, dev, kernels::SpmmKind::kGar);
    std::vector<double> ms;
    std::vector<ops::OpProfile::Entry> table;
    for (int i = 0; i < 5; ++i) {
      ops::OpProfile profile;
      ops::spmm(a, dev, kernels::SpmmKind::kGar);
      ms.push_back(profile.ms(ops::OpKind::kAggregation));
      table = profile.table();
    }
    std::sort(ms.begin(), ms.end());
    RooflineRates rates;
    measure_roofline_rates(table, dev, false, &rates);
    const RooflineBound b = roofline_bound(table, rates, 1);
    EXPECT_GT(b.agg_ms, 0) << width;
    EXPECT_LE(b.agg_ms, 1.05 * ms[2]) << "width " << width << ": floor " << b.agg_ms << " ms, GAR " << ms[2] << " ms";
  }
}

}  // namespace
}  // namespace gale::engine
