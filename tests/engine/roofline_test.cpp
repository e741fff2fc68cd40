// The roofline's arithmetic (engine/roofline.hpp): given fixed rates and a small op list, each term
// of the bound is what its formula says; ops without a shape or a rate count nothing; an empty
// list, zero epochs and an unmeasured epoch give zeros; OpProfile records the shapes the bound reads.
// The rates themselves are measured on a GPU (tests/gpu/roofline_test.cpp).
#include <gtest/gtest.h>

#include <vector>

#include "engine/roofline.hpp"

namespace gale::engine {
namespace {

using ops::OpKind;
using ops::OpProfile;
using ops::OpShape;

OpProfile::Entry gemm(int64_t m, int64_t n, int64_t k, bool trans_b, int64_t calls) {
  OpShape s;
  s.m = m, s.n = n, s.k = k, s.trans_b = trans_b;
  return {"gemm", OpKind::kGemm, 0, calls, s};
}

OpProfile::Entry aggregation(int64_t rows, int64_t nnz, int64_t width, int64_t calls) {
  OpShape s;
  s.rows = rows, s.nnz = nnz, s.width = width;
  return {"spmm", OpKind::kAggregation, 0, calls, s};
}

OpProfile::Entry other(double bytes, int64_t calls) {
  OpShape s;
  s.bytes = bytes;
  return {"relu", OpKind::kOther, 0, calls, s};
}

RooflineRates rates() {
  RooflineRates r;
  r.gemm.push_back({1000, 100, 50, false, false, 1e12});  // 1 TFLOP/s
  r.gemm.push_back({1000, 100, 50, false, true, 5e11});   // the same product with b transposed: half
  r.gather.emplace_back(64, 1e11);                        // 100 GB/s of gathered rows
  r.hbm_bytes_per_s = 2e12;                               // 2 TB/s
  return r;
}

TEST(Roofline, SpmmBytesAreIndexValueGatheredRowsAndOutput) {
  // 10 rows: 11 row pointers; 40 entries of a 4-byte index and value; 40 gathered and 10 written
  // rows of 8 floats.
  EXPECT_DOUBLE_EQ(spmm_min_bytes(10, 40, 8, 4), 11 * 8 + 40 * 8 + 40 * 8 * 4 + 10 * 8 * 4);
  EXPECT_DOUBLE_EQ(spmm_min_bytes(10, 40, 8, 0), 11 * 8 + 40 * 4 + 40 * 8 * 4 + 10 * 8 * 4);
  EXPECT_DOUBLE_EQ(spmm_min_bytes(0, 0, 8, 4), 8);
  // Split into what crosses HBM whatever the cache holds and the gathered rows.
  EXPECT_DOUBLE_EQ(spmm_dram_bytes(10, 40, 8, 4), 11 * 8 + 40 * 8 + 10 * 8 * 4);
  EXPECT_DOUBLE_EQ(spmm_gathered_bytes(40, 8), 40 * 8 * 4);
  EXPECT_DOUBLE_EQ(spmm_min_bytes(10, 40, 8, 4), spmm_dram_bytes(10, 40, 8, 4) + spmm_gathered_bytes(40, 8));
}

TEST(Roofline, AnAggregationTakesTheLongerOfItsGatherAndItsDramFloor) {
  RooflineRates r = rates();  // gathers at 100 GB/s, HBM at 2 TB/s: the gathers bound
  const std::vector<OpProfile::Entry> ops = {aggregation(1000, 5000, 64, 1)};
  EXPECT_NEAR(roofline_bound(ops, r, 1).agg_ms, spmm_gathered_bytes(5000, 64) / 1e11 * 1e3, 1e-12);
  r.gather[0].second = 1e15;  // gathers all but free: the indices and the output bound
  EXPECT_NEAR(roofline_bound(ops, r, 1).agg_ms, spmm_dram_bytes(1000, 5000, 64, 0) / 2e12 * 1e3, 1e-12);
}

TEST(Roofline, EachTermIsItsWorkAtItsRatePerEpoch) {
  // Summed over 2 epochs: per epoch 3 GEMMs of 2*1000*100*50 = 1e7 FLOPs at 1e12 (0.01 ms each),
  // 1 transposed at 5e11 (0.02 ms), 2 aggregations at 100 GB/s and 4 ops of 1 MB at 2 TB/s.
  const std::vector<OpProfile::Entry> ops = {gemm(1000, 100, 50, false, 6), gemm(1000, 100, 50, true, 2),
                                             aggregation(1000, 5000, 64, 4), other(1e6, 8)};
  const RooflineBound b = roofline_bound(ops, rates(), 2);
  EXPECT_NEAR(b.gemm_ms, 3 * 0.01 + 0.02, 1e-12);
  EXPECT_NEAR(b.agg_ms, 2 * spmm_gathered_bytes(5000, 64) / 1e11 * 1e3, 1e-12);
  EXPECT_NEAR(b.other_ms, 4 * 1e6 / 2e12 * 1e3, 1e-12);
  EXPECT_DOUBLE_EQ(b.ms(), b.gemm_ms + b.agg_ms + b.other_ms);
  EXPECT_NEAR(roofline_efficiency(b, 2 * b.ms()), 0.5, 1e-12);
}

TEST(Roofline, OpsWithoutAShapeOrARateCountNothing) {
  const std::vector<OpProfile::Entry> ops = {
      gemm(2000, 100, 50, false, 1),    // a shape never measured
      gemm(0, 0, 0, false, 1),          // a GEMM-kind op with no shape
      aggregation(1000, 5000, 128, 1),  // a width never measured
      aggregation(0, 0, 0, 1),
      other(0, 3),
  };
  const RooflineBound b = roofline_bound(ops, rates(), 1);
  EXPECT_EQ(b.ms(), 0.0);
  RooflineRates none;
  EXPECT_EQ(roofline_bound({gemm(1000, 100, 50, false, 1), other(1e6, 1)}, none, 1).ms(), 0.0);
}

TEST(Roofline, EmptyListZeroEpochsAndNoEpochGiveZero) {
  EXPECT_EQ(roofline_bound({}, rates(), 5).ms(), 0.0);
  EXPECT_EQ(roofline_bound({other(1e6, 4)}, rates(), 0).ms(), 0.0);
  RooflineBound b;
  b.gemm_ms = 1.0;
  EXPECT_EQ(roofline_efficiency(b, 0.0), 0.0);
  EXPECT_EQ(roofline_efficiency(RooflineBound{}, 3.0), 0.0);
}

TEST(Roofline, RatesAreFoundByExactShapeAndWidth) {
  const RooflineRates r = rates();
  OpShape s;
  s.m = 1000, s.n = 100, s.k = 50;
  EXPECT_EQ(r.gemm_rate(s), 1e12);
  s.trans_b = true;
  EXPECT_EQ(r.gemm_rate(s), 5e11);
  s.trans_a = true;
  EXPECT_EQ(r.gemm_rate(s), 0.0);
  EXPECT_EQ(r.gather_rate(64), 1e11);
  EXPECT_EQ(r.gather_rate(32), 0.0);
}

// The profile hands the roofline each op's shape: a GEMM's product and transposes, an
// aggregation's rows, entries and width, an elementwise op's bytes (one row per name, their mean).
TEST(Roofline, OpProfileRecordsTheShapesTheBoundNeeds) {
  const Tensor a = Tensor::zeros(6, 4), b = Tensor::zeros(5, 4);
  Tensor c = Tensor::zeros(6, 5);
  Tensor x = Tensor::zeros(10, 3), y = Tensor::zeros(2, 3);
  const std::vector<int64_t> indptr = {0, 2, 3};
  const std::vector<int32_t> indices = {0, 1, 1};
  const Tensor src = Tensor::zeros(2, 3);
  Tensor out = Tensor::zeros(2, 3);
  ops::OpProfile profile;
  ops::gemm(a, false, b, true, 0.0f, &c, false);
  ops::relu(x, &x);
  ops::relu(y, &y);
  kernels::SpmmArgs args;
  args.graph = {2, 2, indptr.data(), indices.data(), nullptr};
  args.x = src.view();
  args.out = out.view();
  ops::spmm(args, Device::cpu(), kernels::SpmmKind::kAuto);
  const std::vector<OpProfile::Entry> table = profile.table();
  ASSERT_EQ(table.size(), 3u);
  for (const OpProfile::Entry& e : table) {
    if (e.kind == OpKind::kGemm) {
      EXPECT_EQ(e.name, "gemm 6x5x4 b^T");
      EXPECT_EQ(e.shape.m, 6);
      EXPECT_EQ(e.shape.n, 5);
      EXPECT_EQ(e.shape.k, 4);
      EXPECT_FALSE(e.shape.trans_a);
      EXPECT_TRUE(e.shape.trans_b);
    } else if (e.kind == OpKind::kAggregation) {
      EXPECT_EQ(e.shape.rows, 2);
      EXPECT_EQ(e.shape.nnz, 3);
      EXPECT_EQ(e.shape.width, 3);
      EXPECT_EQ(e.shape.value_bytes, 0);
    } else {
      EXPECT_EQ(e.name, "relu");
      EXPECT_EQ(e.calls, 2);
      EXPECT_DOUBLE_EQ(e.shape.bytes, (2 * 30 * 4 + 2 * 6 * 4) / 2.0);  // read and written, 30 and 6 floats
    }
  }
}

}  // namespace
}  // namespace gale::engine
