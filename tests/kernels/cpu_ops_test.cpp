// CPU references of the kernel families against naive loops on fresh random inputs: odd sizes,
// empty rows, a hub row, widths that are not multiples of 32, poisoned outputs.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <tuple>
#include <vector>

#include "kernels/dense.hpp"
#include "kernels/dtype.hpp"
#include "kernels/error.hpp"
#include "kernels/gat.hpp"
#include "kernels/random.hpp"
#include "kernels/spmm.hpp"

namespace gale::kernels {
namespace {

struct Graph {
  int64_t rows, cols;
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  CsrView view() const { return {rows, cols, indptr.data(), indices.data(), nullptr}; }
};

// Row 1 is a hub (all columns), every 5th row is empty, the rest random.
Graph random_graph(int64_t rows, int64_t cols, uint64_t seed) {
  Graph g{rows, cols, {0}, {}};
  CounterRng rng(seed);
  for (int64_t r = 0; r < rows; ++r) {
    std::set<int32_t> nb;
    if (r == 1) {
      for (int32_t c = 0; c < cols; ++c) nb.insert(c);
    } else if (r % 5 != 0) {
      const int64_t k = static_cast<int64_t>(rng.below(9));
      for (int64_t t = 0; t < k; ++t) nb.insert(static_cast<int32_t>(rng.below(static_cast<uint64_t>(cols))));
    }
    g.indices.insert(g.indices.end(), nb.begin(), nb.end());
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  return g;
}

std::vector<float> random_floats(size_t n, uint64_t key) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 2.0f * random_uniform(key, i) - 1.0f;
  return v;
}

TEST(Spmm, MatchesNaiveLoopsWithScalesWeightsAndSelfTerms) {
  for (int64_t width : {1, 7, 33, 100}) {
    const Graph g = random_graph(37, 53, static_cast<uint64_t>(width));
    const auto x = random_floats(static_cast<size_t>(53 * width), 1);
    const auto rs = random_floats(37, 2), cs = random_floats(53, 3), w = random_floats(g.indices.size(), 4);
    const auto self = random_floats(37, 5);
    for (bool accumulate : {false, true}) {
      std::vector<float> out(static_cast<size_t>(37 * width), accumulate ? 0.5f : std::numeric_limits<float>::quiet_NaN());
      SpmmArgs a;
      a.graph = g.view();
      a.x = matrix(x.data(), 53, width);
      a.out = matrix(out.data(), 37, width);
      a.row_scale = rs.data();
      a.col_scale = cs.data();
      a.edge_weight = w.data();
      a.self_coefs = self.data();
      a.self_scale = 0.25f;
      a.accumulate = accumulate;
      spmm_cpu(a);
      for (int64_t r = 0; r < 37; ++r) {
        for (int64_t k = 0; k < width; ++k) {
          double ref = 0;
          for (int64_t e = g.indptr[r]; e < g.indptr[r + 1]; ++e)
            ref += static_cast<double>(cs[g.indices[e]]) * w[e] * x[g.indices[e] * width + k];
          ref = rs[r] * ref + (0.25 + self[r]) * x[r * width + k] + (accumulate ? 0.5 : 0.0);
          ASSERT_NEAR(out[r * width + k], ref, 1e-4) << "row " << r << " col " << k;
        }
      }
    }
  }
}

// The output mask (SpmmArgs::out_mask, ReLU's backward folded into the aggregation that writes the
// gradient) gives exactly the product followed by relu_backward_mask: the same floats where a bit
// is set, +0 where it is clear (NaN and negative values included), under accumulate, self terms,
// bias and ReLU, at widths that are and are not multiples of 32; bits past the width are ignored.
TEST(Spmm, OutputMaskIsReluBackwardAfterTheProduct) {
  for (int64_t width : {1, 7, 31, 32, 33, 47, 64, 100}) {
    const Graph g = random_graph(37, 53, static_cast<uint64_t>(100 + width));
    const auto x = random_floats(static_cast<size_t>(53 * width), 11);
    const auto rs = random_floats(37, 12), w = random_floats(g.indices.size(), 13), self = random_floats(37, 14);
    const auto bias = random_floats(static_cast<size_t>(width), 15);
    const int64_t words = relu_mask_words(width);
    std::vector<uint32_t> mask(static_cast<size_t>(37 * words));
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<uint32_t>(random_bits(16, i));
    for (int variant = 0; variant < 4; ++variant) {
      const bool accumulate = variant & 1, epilogue = variant & 2;
      std::vector<float> start = random_floats(static_cast<size_t>(37 * width), 17);
      start[0] = std::numeric_limits<float>::quiet_NaN();  // accumulated into row 0, column 0
      SpmmArgs a;
      a.graph = g.view();
      a.x = matrix(x.data(), 53, width);
      a.row_scale = rs.data();
      a.edge_weight = w.data();
      a.self_coefs = self.data();
      a.self_scale = 0.5f;
      a.accumulate = accumulate;
      a.bias = epilogue ? bias.data() : nullptr;
      a.relu = epilogue;
      std::vector<float> want = start, got = start;
      a.out = matrix(want.data(), 37, width);
      spmm_cpu(a);
      relu_backward_mask(matrix(want.data(), 37, width), mask.data(), matrix(want.data(), 37, width));
      a.out = matrix(got.data(), 37, width);
      a.out_mask = mask.data();
      a.out_mask_words = words;
      spmm_cpu(a);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "width " << width << " accumulate " << accumulate << " bias and relu " << epilogue;
    }
  }
}

// ES-SpMM's sampled estimate (spmm_sampled_cpu): with S at least every row's length it is the
// product, bit for bit; Bucket is the product over each row's first S entries, scaled by n / S;
// FastRand's S entries are distinct and spread over the row; widths outside 1..kSpmmMaxSample throw.
TEST(SpmmSampled, IsTheProductOverTheSampleScaledByTheRowsShare) {
  const int64_t width = 7, rows = 40, cols = 1200;
  Graph g = random_graph(rows, cols, 91);  // row 1: every column (1200 entries)
  const auto x = random_floats(static_cast<size_t>(cols * width), 1);
  const auto rs = random_floats(rows, 2), w = random_floats(g.indices.size(), 4), self = random_floats(rows, 5);
  auto run = [&](int64_t s, SpmmSampling sampling, const Graph& graph, const float* row_scale, const float* weight) {
    std::vector<float> out(static_cast<size_t>(rows * width), std::numeric_limits<float>::quiet_NaN());
    SpmmArgs a;
    a.graph = graph.view();
    a.x = matrix(x.data(), cols, width);
    a.out = matrix(out.data(), rows, width);
    a.row_scale = row_scale;
    a.edge_weight = weight;
    a.self_coefs = self.data();
    a.sample_width = s;
    a.sampling = sampling;
    if (s == 0) {
      spmm_cpu(a);
    } else {
      spmm_sampled_cpu(a);
    }
    return out;
  };
  const std::vector<float> exact = run(0, SpmmSampling::kFastRand, g, rs.data(), w.data());
  for (SpmmSampling sampling : {SpmmSampling::kFastRand, SpmmSampling::kBucket})
    EXPECT_EQ(run(1200, sampling, g, rs.data(), w.data()), exact);
  // Bucket at S = 5: spmm_cpu over the first 5 entries of each row, its row scale times n / 5.
  const int64_t s = 5;
  Graph first{rows, cols, {0}, {}};
  std::vector<float> first_w, first_rs(rs);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = g.indptr[r + 1] - g.indptr[r];
    for (int64_t e = g.indptr[r]; e < g.indptr[r] + std::min(n, s); ++e) {
      first.indices.push_back(g.indices[e]);
      first_w.push_back(w[e]);
    }
    first.indptr.push_back(static_cast<int64_t>(first.indices.size()));
    if (n > s) first_rs[r] *= static_cast<float>(n) / static_cast<float>(s);
  }
  EXPECT_EQ(run(s, SpmmSampling::kBucket, g, rs.data(), w.data()), run(0, SpmmSampling::kBucket, first, first_rs.data(), first_w.data()));
  // FastRand on the 1200-entry row: 577 (which does not divide 1200), 100 distinct entries
  // reaching past the first 100; a row of 3 x 577 entries takes the next prime.
  EXPECT_EQ(spmm_sample_stride(1200, 100, SpmmSampling::kFastRand), 577);
  EXPECT_EQ(spmm_sample_stride(3 * 577, 100, SpmmSampling::kFastRand), 587);
  EXPECT_EQ(spmm_sample_stride(int64_t{577} * 587, 100, SpmmSampling::kFastRand), 593);
  for (const int64_t n : {int64_t{1200}, int64_t{3 * 577}}) {
    std::set<int64_t> picked;
    const int64_t stride = spmm_sample_stride(n, 100, SpmmSampling::kFastRand);
    for (int64_t j = 0; j < 100; ++j) picked.insert(spmm_sample_entry(j, n, stride));
    EXPECT_EQ(picked.size(), 100u) << n;
    EXPECT_GT(*picked.rbegin(), 900) << n;
    EXPECT_EQ(spmm_sample_entry(7, n, spmm_sample_stride(n, 100, SpmmSampling::kBucket)), 7);
  }
  // rows within S: every entry in order
  EXPECT_EQ(spmm_sample_entry(7, 50, spmm_sample_stride(50, 100, SpmmSampling::kFastRand)), 7);
  EXPECT_THROW(run(kSpmmMaxSample + 1, SpmmSampling::kFastRand, g, rs.data(), w.data()), InputError);
  std::vector<float> out(static_cast<size_t>(rows * width));
  SpmmArgs bad;
  bad.graph = g.view();
  bad.x = matrix(x.data(), cols, width);
  bad.out = matrix(out.data(), rows, width);
  EXPECT_THROW(spmm_sampled_cpu(bad), InputError);  // sample_width 0
}

TEST(Spmm, EntryScaleIsTheColumnScaleInEntryOrder) {
  const Graph g = random_graph(37, 53, 9);
  const auto cs = random_floats(53, 3);
  std::vector<float> out(g.indices.size());
  spmm_entry_scale(g.view(), cs.data(), out.data());
  for (size_t e = 0; e < out.size(); ++e) ASSERT_EQ(out[e], cs[static_cast<size_t>(g.indices[e])]) << "entry " << e;
  // A weighted graph's copy carries each entry's weight: the entry's whole column coefficient.
  const auto w = random_floats(g.indices.size(), 4);
  CsrView weighted = g.view();
  weighted.weights = w.data();
  spmm_entry_scale(weighted, cs.data(), out.data());
  for (size_t e = 0; e < out.size(); ++e) ASSERT_EQ(out[e], cs[static_cast<size_t>(g.indices[e])] * w[e]) << "entry " << e;
  // A view of rows 2.. (past the hub in row 1: entries not starting at 0) is refused.
  CsrView tail = g.view();
  tail.indptr += 2;
  tail.rows -= 2;
  ASSERT_GT(tail.indptr[0], 0);
  EXPECT_THROW(spmm_entry_scale(tail, cs.data(), out.data()), InputError);
}

TEST(Spmm, GarLongRowsAreTheRowsAboveTheThresholdAndFitTheirCapacity) {
  // Rows of kGarLongRow - 1, kGarLongRow and kGarLongRow + 1 entries, empty rows, a 3x hub last.
  const std::vector<int64_t> lengths{0, kGarLongRow + 1, 5, kGarLongRow, 0, kGarLongRow - 1, kGarLongRow + 1,
                                     3 * kGarLongRow};
  std::vector<int64_t> indptr{0};
  for (int64_t n : lengths) indptr.push_back(indptr.back() + n);
  const std::vector<int32_t> indices(static_cast<size_t>(indptr.back()), 0);
  const int64_t rows = static_cast<int64_t>(lengths.size());
  const CsrView g{rows, 1, indptr.data(), indices.data(), nullptr};
  EXPECT_EQ(gar_long_rows_cpu(g), (std::vector<int64_t>{1, 6, 7}));
  const int64_t capacity = gar_long_rows_capacity(rows, indptr.back());
  EXPECT_GE(capacity, 3);
  EXPECT_LE(capacity, rows);
  EXPECT_EQ(gar_long_rows_capacity(100, kGarLongRow), 0);      // no row can be above the threshold
  EXPECT_EQ(gar_long_rows_capacity(2, 100 * kGarLongRow), 2);  // never more than the rows
  EXPECT_TRUE(gar_long_rows_cpu(CsrView{0, 0, indptr.data(), indices.data(), nullptr}).empty());
}

TEST(CsrTranspose, IsStableAndRoundTrips) {
  const Graph g = random_graph(41, 29, 9);
  const int64_t nnz = static_cast<int64_t>(g.indices.size());
  std::vector<int64_t> tp(30), perm(static_cast<size_t>(nnz)), back_p(42), back_perm(static_cast<size_t>(nnz));
  std::vector<int32_t> ti(static_cast<size_t>(nnz)), back_i(static_cast<size_t>(nnz));
  csr_transpose(g.view(), tp.data(), ti.data(), perm.data());
  for (int64_t c = 0; c < 29; ++c) {
    for (int64_t k = tp[c]; k < tp[c + 1]; ++k) {
      EXPECT_EQ(g.indices[perm[k]], c);                       // perm points at the same entry
      if (k > tp[c]) EXPECT_LT(ti[k - 1], ti[k]);              // rows ascending within a column
      EXPECT_GE(perm[k], g.indptr[ti[k]]);
      EXPECT_LT(perm[k], g.indptr[ti[k] + 1]);
    }
  }
  const CsrView t{29, 41, tp.data(), ti.data(), nullptr};
  csr_transpose(t, back_p.data(), back_i.data(), back_perm.data());
  EXPECT_EQ(back_p, g.indptr);
  EXPECT_EQ(back_i, g.indices);
}

// A whole graph (a million entries or more) takes the parallel passes when 4 or more threads can
// run: the same arrays as one thread gives, hub columns and empty rows included.
TEST(CsrTranspose, ParallelPassesGiveTheOneThreadResult) {
  const int64_t rows = 80000, cols = 90000;
  Graph g{rows, cols, {0}, {}};
  CounterRng rng(7);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t k = r % 11 == 0 ? 0 : static_cast<int64_t>(rng.below(32));
    for (int64_t t = 0; t < k; ++t) {
      const uint64_t c = rng.below(static_cast<uint64_t>(cols));
      g.indices.push_back(static_cast<int32_t>(t % 3 == 0 ? c % 16 : c));  // a third on 16 hub columns
    }
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  const size_t nnz = g.indices.size();
  ASSERT_GE(nnz, size_t{1} << 20);
  auto transpose = [&](int threads) {
    std::vector<int64_t> tp(static_cast<size_t>(cols + 1)), perm(nnz);
    std::vector<int32_t> ti(nnz);
    tbb::task_arena arena(threads);
    arena.execute([&] { csr_transpose(g.view(), tp.data(), ti.data(), perm.data()); });
    return std::make_tuple(tp, ti, perm);
  };
  EXPECT_TRUE(transpose(4) == transpose(1));
}

TEST(Gemm, MatchesNaiveProductForEveryTransposeCombination) {
  const int64_t m = 13, n = 7, k = 35;
  const auto a = random_floats(static_cast<size_t>(m * k), 1), b = random_floats(static_cast<size_t>(k * n), 2);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> c(static_cast<size_t>(m * n), 1.0f);
      gemm(ta, tb, m, n, k, 2.0f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.5f, c.data(), n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0;
          for (int64_t p = 0; p < k; ++p)
            ref += static_cast<double>(ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
          EXPECT_NEAR(c[i * n + j], 2.0 * ref + 0.5, 1e-4);
        }
      }
    }
  }
}

// The GPU's C = A B runs on a transposed copy of B only where that form measured faster: many
// rows, a depth of at least 64 in whole 16-byte rows, a weight within the workspace's tail, and
// TF32 or a narrowing depth.
TEST(Gemm, WeightIsTransposedOnlyWhereThatFormMeasuredFaster) {
  const int64_t rows = kWeightTransposedRows;
  EXPECT_TRUE(weight_transposed_first(rows, 256, 256, /*tf32=*/true));
  EXPECT_TRUE(weight_transposed_first(2097152, 48, 256, true));
  EXPECT_TRUE(weight_transposed_first(rows, 256, 100, false));   // FP32: narrowing depth
  EXPECT_FALSE(weight_transposed_first(rows, 256, 256, false));  // FP32 square: NN measured 3% faster
  EXPECT_FALSE(weight_transposed_first(rows - 1, 256, 256, true));
  EXPECT_FALSE(weight_transposed_first(rows, 256, 47, true));  // depth below 64
  EXPECT_FALSE(weight_transposed_first(rows, 256, 66, true));  // rows of 66 floats are not whole 16-byte rows
  EXPECT_TRUE(weight_transposed_first(rows, 1024, 1024, true));  // 4 MiB: the tail holds it
  EXPECT_FALSE(weight_transposed_first(rows, 1024, 1028, true));
}

TEST(Dense, TransposeSwapsRowsAndColumnsAndLeavesPaddingAlone) {
  const int64_t rows = 5, cols = 3;
  const auto in = random_floats(static_cast<size_t>(rows * (cols + 2)), 7);
  std::vector<float> out(static_cast<size_t>(cols * (rows + 1)), -9.0f);
  transpose(ConstMatrixView{in.data(), rows, cols, cols + 2}, MatrixView{out.data(), cols, rows, rows + 1});
  for (int64_t r = 0; r < cols; ++r) {
    for (int64_t c = 0; c < rows; ++c) EXPECT_EQ(out[r * (rows + 1) + c], in[c * (cols + 2) + r]);
    EXPECT_EQ(out[r * (rows + 1) + rows], -9.0f);
  }
}

TEST(Dense, BiasColumnSumAndActivations) {
  const int64_t rows = 17, cols = 70;
  auto x = random_floats(static_cast<size_t>(rows * cols), 3);
  const auto bias = random_floats(static_cast<size_t>(cols), 4);
  std::vector<float> y = x;
  add_bias(matrix(y.data(), rows, cols), bias.data());
  std::vector<float> sums(static_cast<size_t>(cols), 1.0f);
  column_sum(matrix(x.data(), rows, cols), sums.data(), true);
  for (int64_t c = 0; c < cols; ++c) {
    double s = 1.0;
    for (int64_t r = 0; r < rows; ++r) {
      s += x[r * cols + c];
      EXPECT_FLOAT_EQ(y[r * cols + c], x[r * cols + c] + bias[c]);
    }
    EXPECT_NEAR(sums[c], s, 1e-5);
  }
  std::vector<float> relu(x.size()), elu(x.size()), g = random_floats(x.size(), 5), gr(x.size()), ge(x.size());
  relu_forward(matrix(x.data(), rows, cols), matrix(relu.data(), rows, cols));
  elu_forward(matrix(x.data(), rows, cols), matrix(elu.data(), rows, cols));
  relu_backward(matrix(g.data(), rows, cols), matrix(relu.data(), rows, cols), matrix(gr.data(), rows, cols));
  elu_backward(matrix(g.data(), rows, cols), matrix(elu.data(), rows, cols), matrix(ge.data(), rows, cols));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(relu[i], x[i] > 0 ? x[i] : 0.0f);
    EXPECT_EQ(gr[i], x[i] > 0 ? g[i] : 0.0f);
    EXPECT_NEAR(elu[i], x[i] > 0 ? x[i] : std::expm1(x[i]), 1e-6);
    EXPECT_NEAR(ge[i], x[i] > 0 ? g[i] : g[i] * std::exp(x[i]), 1e-5);
  }
}

// SAGE's last layer lays [grad | 0 | gh | 0] and [W_root | 0 | W | 0] out side by side: each
// block at its columns for its own rows, every other element zero, whatever the output held.
TEST(Dense, SideBySidePlacesEachBlockAndZeroesTheRest) {
  const int64_t rows = 9, cols = 96;
  const std::vector<float> a = random_floats(5 * 47, 43), b = random_floats(9 * 40, 44);
  std::vector<float> out(static_cast<size_t>(rows * cols), std::numeric_limits<float>::quiet_NaN());
  const ColumnBlock blocks[] = {{matrix(a.data(), 5, 47), 0}, {matrix(b.data(), 9, 40), 48}};
  side_by_side(blocks, 2, matrix(out.data(), rows, cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float want = 0.0f;
      if (c < 47 && r < 5) want = a[static_cast<size_t>(r * 47 + c)];
      if (c >= 48 && c < 88) want = b[static_cast<size_t>(r * 40 + c - 48)];
      ASSERT_EQ(out[static_cast<size_t>(r * cols + c)], want) << r << "," << c;
    }
  }
  side_by_side(nullptr, 0, matrix(out.data(), rows, cols));  // no blocks: all zero
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
}

TEST(Dense, ReluBitMaskGivesTheSameBackwardAsTheOutput) {
  for (int64_t cols : {1, 31, 32, 33, 100}) {
    const int64_t rows = 17;
    std::vector<float> x = random_floats(static_cast<size_t>(rows * cols), 41), y(x.size());
    x[0] = 0.0f;  // zero is not positive: its gradient is dropped
    relu_forward(matrix(x.data(), rows, cols), matrix(y.data(), rows, cols));
    std::vector<uint32_t> bits(static_cast<size_t>(rows * relu_mask_words(cols)), 0xdeadbeefu);
    relu_mask(matrix(y.data(), rows, cols), bits.data());
    const std::vector<float> g = random_floats(x.size(), 42);
    std::vector<float> want(x.size()), got(x.size());
    relu_backward(matrix(g.data(), rows, cols), matrix(y.data(), rows, cols), matrix(want.data(), rows, cols));
    relu_backward_mask(matrix(g.data(), rows, cols), bits.data(), matrix(got.data(), rows, cols));
    EXPECT_EQ(got, want) << cols << " columns";
    for (int64_t r = 0; r < rows; ++r) {  // bits past the last column stay clear
      const uint32_t last = bits[static_cast<size_t>((r + 1) * relu_mask_words(cols) - 1)];
      if (cols % 32) EXPECT_EQ(last >> (cols % 32), 0u);
    }
  }
}

TEST(Dropout, KeepsTheRightFractionScalesAndRepeatsWithTheKey) {
  const int64_t rows = 300, cols = 301;
  std::vector<float> x(static_cast<size_t>(rows * cols), 1.0f), a(x.size()), b(x.size()), c(x.size()), g(x.size());
  dropout_forward(matrix(x.data(), rows, cols), matrix(a.data(), rows, cols), 0.3f, 11);
  dropout_forward(matrix(x.data(), rows, cols), matrix(b.data(), rows, cols), 0.3f, 11);
  dropout_forward(matrix(x.data(), rows, cols), matrix(c.data(), rows, cols), 0.3f, 12);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int64_t kept = 0;
  for (float v : a) {
    if (v != 0.0f) {
      ++kept;
      EXPECT_FLOAT_EQ(v, 1.0f / 0.7f);
    }
  }
  const double frac = static_cast<double>(kept) / static_cast<double>(a.size());
  EXPECT_NEAR(frac, 0.7, 0.01);  // 90,300 draws: standard deviation 0.0015
  // Backward applies the same mask.
  dropout_backward(matrix(x.data(), rows, cols), matrix(g.data(), rows, cols), 0.3f, 11);
  EXPECT_EQ(g, a);
}

TEST(Dtype, HalfAndBfloatRoundTripWithinTheirPrecision) {
  const auto x = random_floats(1000, 7);
  for (float v : x) {
    const float scaled = v * 1000.0f;
    EXPECT_NEAR(f16_to_f32(f32_to_f16(scaled)), scaled, std::abs(scaled) * 1e-3 + 1e-4);
    EXPECT_NEAR(bf16_to_f32(f32_to_bf16(scaled)), scaled, std::abs(scaled) * 8e-3);
  }
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(5.96046448e-8f)), 5.96046448e-8f);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(0.1f), 0x2e66);                                // round to nearest even
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
}

TEST(Gat, SoftmaxRowsSumToOneAndAggregateMatchesNaive) {
  const Graph g = random_graph(23, 23, 3);
  const int64_t heads = 3, f = 5, nnz = static_cast<int64_t>(g.indices.size());
  const auto el = random_floats(static_cast<size_t>(23 * heads), 1), er = random_floats(static_cast<size_t>(23 * heads), 2);
  const auto z = random_floats(static_cast<size_t>(23 * heads * f), 3);
  std::vector<float> alpha(static_cast<size_t>(nnz * heads)), self(static_cast<size_t>(23 * heads));
  const GatShape s{heads, f, 0.2f};
  gat_softmax_cpu(g.view(), s, el.data(), er.data(), alpha.data(), self.data());
  std::vector<float> out(static_cast<size_t>(23 * heads * f), std::numeric_limits<float>::quiet_NaN());
  gat_aggregate_cpu(g.view(), s, alpha.data(), self.data(), 0.0f, 0, matrix(z.data(), 23, heads * f),
                    matrix(out.data(), 23, heads * f));
  auto leaky = [](double v) { return v > 0 ? v : 0.2 * v; };
  for (int64_t i = 0; i < 23; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      double sum = self[i * heads + h];
      std::vector<double> w{std::exp(leaky(el[i * heads + h] + er[i * heads + h]))};
      std::vector<int64_t> src{i};
      for (int64_t e = g.indptr[i]; e < g.indptr[i + 1]; ++e) {
        sum += alpha[e * heads + h];
        w.push_back(std::exp(leaky(el[g.indices[e] * heads + h] + er[i * heads + h])));
        src.push_back(g.indices[e]);
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
      double total = 0;
      for (double v : w) total += v;
      for (int64_t k = 0; k < f; ++k) {
        double ref = 0;
        for (size_t t = 0; t < src.size(); ++t) ref += w[t] / total * z[src[t] * heads * f + h * f + k];
        EXPECT_NEAR(out[i * heads * f + h * f + k], ref, 1e-5);
      }
    }
  }
}

// Forward of the GAT pieces in double, for finite differences: out[i,h,:] = sum_j m_ij a_ij z_j
// with a the softmax over N(i) + {i} of LeakyReLU(el[j,h] + er[i,h]) and m the dropout multiplier.
std::vector<double> gat_forward_ref(const Graph& g, int64_t heads, int64_t f, const std::vector<double>& el,
                                    const std::vector<double>& er, const std::vector<double>& z, float p,
                                    uint64_t key) {
  const int64_t nnz = static_cast<int64_t>(g.indices.size()), hf = heads * f;
  auto mult = [&](uint64_t counter) {
    if (p <= 0.0f) return 1.0;
    return random_uniform(key, counter) >= p ? 1.0 / (1.0 - static_cast<double>(p)) : 0.0;
  };
  auto leaky = [](double v) { return v > 0 ? v : 0.2 * v; };
  std::vector<double> out(static_cast<size_t>(g.rows * hf), 0.0);
  for (int64_t i = 0; i < g.rows; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<int64_t> src{i};
      std::vector<double> m{mult(static_cast<uint64_t>((nnz + i) * heads + h))};
      for (int64_t e = g.indptr[i]; e < g.indptr[i + 1]; ++e) {
        src.push_back(g.indices[e]);
        m.push_back(mult(static_cast<uint64_t>(e * heads + h)));
      }
      std::vector<double> w;
      double mx = -1e300, total = 0;
      for (int64_t j : src) {
        w.push_back(leaky(el[j * heads + h] + er[i * heads + h]));
        mx = std::max(mx, w.back());
      }
      for (double& v : w) total += (v = std::exp(v - mx));
      for (size_t t = 0; t < src.size(); ++t)
        for (int64_t k = 0; k < f; ++k) out[i * hf + h * f + k] += m[t] * w[t] / total * z[src[t] * hf + h * f + k];
    }
  }
  return out;
}

// Backward of softmax + aggregation (with attention dropout, through the transpose) against
// central differences of the double forward above, for <out, R>.
TEST(Gat, BackwardMatchesFiniteDifferencesWithAttentionDropout) {
  const Graph g = random_graph(19, 19, 17);
  const int64_t heads = 3, f = 5, n = 19, hf = heads * f, nnz = static_cast<int64_t>(g.indices.size());
  const float p = 0.4f;
  const uint64_t key = 23;
  const auto elf = random_floats(static_cast<size_t>(n * heads), 1), erf = random_floats(static_cast<size_t>(n * heads), 2);
  const auto zf = random_floats(static_cast<size_t>(n * hf), 3), rf = random_floats(static_cast<size_t>(n * hf), 4);
  std::vector<int64_t> tp(static_cast<size_t>(n + 1)), perm(static_cast<size_t>(nnz));
  std::vector<int32_t> ti(static_cast<size_t>(nnz));
  csr_transpose(g.view(), tp.data(), ti.data(), perm.data());
  const CsrView csc{n, n, tp.data(), ti.data(), nullptr};
  const GatShape s{heads, f, 0.2f};
  std::vector<float> alpha(static_cast<size_t>(nnz * heads)), self(static_cast<size_t>(n * heads));
  gat_softmax_cpu(g.view(), s, elf.data(), erf.data(), alpha.data(), self.data());
  std::vector<float> gz(static_cast<size_t>(n * hf), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> gel(static_cast<size_t>(n * heads), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> ger(static_cast<size_t>(n * heads), std::numeric_limits<float>::quiet_NaN());
  gat_backward_cpu(g.view(), csc, perm.data(), s, elf.data(), erf.data(), alpha.data(), self.data(), p, key,
                   matrix(zf.data(), n, hf), matrix(rf.data(), n, hf), matrix(gz.data(), n, hf), gel.data(), ger.data());

  // The f32 forward agrees with the double one under the same masks.
  std::vector<double> el(elf.begin(), elf.end()), er(erf.begin(), erf.end()), z(zf.begin(), zf.end());
  std::vector<float> out(static_cast<size_t>(n * hf));
  gat_aggregate_cpu(g.view(), s, alpha.data(), self.data(), p, key, matrix(zf.data(), n, hf), matrix(out.data(), n, hf));
  const auto out_ref = gat_forward_ref(g, heads, f, el, er, z, p, key);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], out_ref[i], 1e-5);

  auto objective = [&]() {
    const auto o = gat_forward_ref(g, heads, f, el, er, z, p, key);
    double sum = 0;
    for (size_t i = 0; i < o.size(); ++i) sum += o[i] * rf[i];
    return sum;
  };
  auto check = [&](std::vector<double>* var, const std::vector<float>& analytic, const char* what) {
    for (size_t i = 0; i < var->size(); ++i) {
      const double keep = (*var)[i];
      (*var)[i] = keep + 1e-6;
      const double up = objective();
      (*var)[i] = keep - 1e-6;
      const double down = objective();
      (*var)[i] = keep;
      const double numeric = (up - down) / 2e-6;
      EXPECT_NEAR(analytic[i], numeric, 1e-3 * std::max(1.0, std::abs(numeric))) << what << "[" << i << "]";
    }
  };
  check(&z, gz, "grad_z");
  check(&el, gel, "grad_el");
  check(&er, ger, "grad_er");
}

TEST(Dropout, ZeroProbabilityIsTheIdentity) {
  const auto x = random_floats(7 * 45, 8);
  std::vector<float> y(x.size());
  dropout_forward(matrix(x.data(), 7, 45), matrix(y.data(), 7, 45), 0.0f, 3);
  EXPECT_EQ(y, x);
}

TEST(CsrTranspose, GraphWithoutRowsGivesEmptyColumns) {
  const std::vector<int64_t> indptr{0};
  const CsrView g{0, 4, indptr.data(), nullptr, nullptr};
  std::vector<int64_t> tp(5, -1);
  csr_transpose(g, tp.data(), nullptr, nullptr);
  EXPECT_EQ(tp, std::vector<int64_t>(5, 0));
}

// Every CPU op writes each output row from one task in a fixed order, so results are the same
// bits whether TBB runs them on one thread or several.
TEST(CpuKernels, ResultsAreBitIdenticalForAnyThreadCount) {
  const int64_t n = 3001, width = 37, heads = 2, f = 11;
  const Graph g = random_graph(n, n, 31);  // row 1 is a hub over all 3001 columns
  const int64_t nnz = static_cast<int64_t>(g.indices.size());
  const auto x = random_floats(static_cast<size_t>(n * width), 1);
  const auto scale = random_floats(static_cast<size_t>(n), 2);
  const auto el = random_floats(static_cast<size_t>(n * heads), 3), er = random_floats(static_cast<size_t>(n * heads), 4);
  const auto z = random_floats(static_cast<size_t>(n * heads * f), 5), go = random_floats(static_cast<size_t>(n * heads * f), 6);
  std::vector<int64_t> tp(static_cast<size_t>(n + 1)), perm(static_cast<size_t>(nnz));
  std::vector<int32_t> ti(static_cast<size_t>(nnz));
  csr_transpose(g.view(), tp.data(), ti.data(), perm.data());
  const CsrView csc{n, n, tp.data(), ti.data(), nullptr};
  const GatShape s{heads, f, 0.2f};

  auto run_all = [&]() {
    std::vector<std::vector<float>> r;
    std::vector<float> out(static_cast<size_t>(n * width));
    SpmmArgs a;
    a.graph = g.view();
    a.x = matrix(x.data(), n, width);
    a.out = matrix(out.data(), n, width);
    a.row_scale = scale.data();
    a.self_scale = 1.5f;
    spmm_cpu(a);
    r.push_back(out);
    std::vector<float> sums(static_cast<size_t>(width));
    column_sum(matrix(x.data(), n, width), sums.data(), false);
    r.push_back(sums);
    dropout_forward(matrix(x.data(), n, width), matrix(out.data(), n, width), 0.5f, 9);
    r.push_back(out);
    std::vector<float> alpha(static_cast<size_t>(nnz * heads)), self(static_cast<size_t>(n * heads));
    gat_softmax_cpu(g.view(), s, el.data(), er.data(), alpha.data(), self.data());
    std::vector<float> agg(static_cast<size_t>(n * heads * f)), gz(agg.size()), gel(el.size()), ger(er.size());
    gat_aggregate_cpu(g.view(), s, alpha.data(), self.data(), 0.3f, 4, matrix(z.data(), n, heads * f),
                      matrix(agg.data(), n, heads * f));
    gat_backward_cpu(g.view(), csc, perm.data(), s, el.data(), er.data(), alpha.data(), self.data(), 0.3f, 4,
                     matrix(z.data(), n, heads * f), matrix(go.data(), n, heads * f), matrix(gz.data(), n, heads * f),
                     gel.data(), ger.data());
    r.insert(r.end(), {alpha, self, agg, gz, gel, ger});
    std::vector<float> w = x, m(x.size(), 0.0f), v(x.size(), 0.0f);
    AdamParams ap;
    ap.weight_decay = 0.01f;
    adam_update(w.data(), scale.data(), m.data(), v.data(), n, ap);
    r.push_back(w);
    return r;
  };
  std::vector<std::vector<float>> one, many;
  tbb::task_arena(1).execute([&] { one = run_all(); });
  tbb::task_arena().execute([&] { many = run_all(); });
  ASSERT_EQ(one.size(), many.size());
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(one[i].size(), many[i].size());
    EXPECT_EQ(0, std::memcmp(one[i].data(), many[i].data(), one[i].size() * sizeof(float))) << "output " << i;
  }
}

TEST(Adam, UpdateMatchesTheFormula) {
  std::vector<float> w{1.0f, -1.0f}, g{0.1f, -0.2f}, m{0, 0}, v{0, 0};
  AdamParams p;
  p.lr = 0.01f;
  p.weight_decay = 0.1f;
  p.step = 1;
  adam_update(w.data(), g.data(), m.data(), v.data(), 2, p);
  // First step: m_hat = g', v_hat = g'^2, so w -= lr * sign(g') (up to eps).
  EXPECT_NEAR(w[0], 1.0f - 0.01f, 1e-6);
  EXPECT_NEAR(w[1], -1.0f + 0.01f, 1e-6);
}

// GAR's chunk rule: a graph whose degrees are spread evenly takes chunks of 256 rows; the same
// graph with its heavy rows gathered at the front (a degree order) keeps 16; rows above the long-row
// threshold do not count (their own blocks take them).
TEST(GarChunkRows, TakesConsecutiveRowsUnlessSpansAreHeavy) {
  const int64_t rows = 256 * 64;
  auto graph_of = [&](const std::vector<int64_t>& degree) {
    Graph g{rows, rows, {0}, {}};
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < degree[r]; ++k) g.indices.push_back(static_cast<int32_t>((r * 7 + k) % rows));
      g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
    }
    return g;
  };
  std::vector<int64_t> spread(rows, 4);
  for (int64_t r = 0; r < rows; r += 97) spread[r] = 300;  // heavy rows, spread out
  EXPECT_EQ(gar_chunk_rows_for(graph_of(spread).view()), 256);
  std::vector<int64_t> front(spread);
  std::sort(front.begin(), front.end(), std::greater<>());  // the same degrees, heaviest first
  EXPECT_EQ(gar_chunk_rows_for(graph_of(front).view()), 16);
  std::vector<int64_t> longs(rows, 4);
  for (int64_t r = 0; r < 8; ++r) longs[r] = kGarLongRow + 1;  // long rows at the front: not counted
  EXPECT_EQ(gar_chunk_rows_for(graph_of(longs).view()), 256);
}

}  // namespace
}  // namespace gale::kernels
