// CPU references of the kernel families against naive loops on fresh random inputs: odd sizes,
// empty rows, a hub row, widths that are not multiples of 32, poisoned outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "kernels/dense.hpp"
#include "kernels/dtype.hpp"
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

}  // namespace
}  // namespace gale::kernels
