// CPU references of the MaxK family (kernels/maxk.hpp) against independent definitions: top-k
// against a full sort (ties, K = 1, K = width, rows of zeros, negatives, signed zeros), the
// backward scatter against the mask, SpGEMM against spmm_cpu on the densified CBSR input for
// every combination of scales, weights, self term and bias, SSpMM against spmm_cpu over the
// transpose sampled at the pattern, the two aggregations as adjoints, and the edge-group table.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/error.hpp"
#include "kernels/maxk.hpp"
#include "kernels/random.hpp"
#include "kernels/spmm.hpp"
#include "tests/common/aggregation_options.hpp"

namespace gale::kernels {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A CBSR matrix that owns its arrays.
struct Cbsr {
  int64_t rows = 0, width = 0, k = 0;
  std::vector<float> values;
  std::vector<uint8_t> index;  // rows * k * cbsr_index_bytes(width) bytes

  Cbsr(int64_t r, int64_t w, int64_t kk)
      : rows(r), width(w), k(kk), values(static_cast<size_t>(r * kk), kNaN),
        index(static_cast<size_t>(cbsr_index_size_bytes(r, w, kk)), 0xee) {}
  CbsrView view() { return {rows, width, k, values.data(), index.data()}; }
  ConstCbsrView cview() const { return {rows, width, k, values.data(), index.data()}; }
};

std::vector<float> random_floats(size_t n, uint64_t key, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * random_uniform(key, i);
  return v;
}

// Rows full of ties: values from {-2, -1, -0, +0, 1, 2}, so nearly every threshold is shared.
std::vector<float> tied_floats(size_t n, uint64_t key) {
  static const float kChoices[] = {-2.0f, -1.0f, -0.0f, 0.0f, 1.0f, 2.0f};
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = kChoices[random_below(key, i, 6)];
  return v;
}

// The documented order without bit tricks: larger value first, +0 above -0, then lower column.
bool ranks_before(float a, int64_t ca, float b, int64_t cb) {
  if (a != b) return a > b;
  if (std::signbit(a) != std::signbit(b)) return !std::signbit(a);
  return ca < cb;
}

// Top-k by a full sort of each row, then the kept columns in increasing order.
std::vector<int64_t> sorted_top_k(const float* row, int64_t width, int64_t k) {
  std::vector<int64_t> cols(static_cast<size_t>(width));
  std::iota(cols.begin(), cols.end(), 0);
  std::sort(cols.begin(), cols.end(), [&](int64_t a, int64_t b) { return ranks_before(row[a], a, row[b], b); });
  cols.resize(static_cast<size_t>(k));
  std::sort(cols.begin(), cols.end());
  return cols;
}

void expect_top_k(const std::vector<float>& x, int64_t rows, int64_t width, int64_t k, const std::string& what) {
  Cbsr out(rows, width, k);
  maxk_forward_cpu(matrix(x.data(), rows, width), out.view());
  for (int64_t r = 0; r < rows; ++r) {
    const auto want = sorted_top_k(x.data() + r * width, width, k);
    for (int64_t t = 0; t < k; ++t) {
      ASSERT_EQ(out.cview().column(r, t), want[t]) << what << " row " << r << " slot " << t;
      const float v = out.values[r * k + t], ref = x[r * width + want[t]];
      ASSERT_TRUE(v == ref && std::signbit(v) == std::signbit(ref)) << what << " row " << r << " slot " << t;
    }
  }
}

TEST(MaxkForward, KeepsTheKLargestInColumnOrderAtEveryWidthAndK) {
  for (int64_t width : {1, 7, 32, 100, 256, 257, 1024}) {
    for (int64_t k : {int64_t{1}, int64_t{8}, int64_t{16}, int64_t{32}, width}) {
      if (k > width) continue;
      const int64_t rows = 23;
      const std::string what = "width " + std::to_string(width) + " k " + std::to_string(k);
      expect_top_k(random_floats(static_cast<size_t>(rows * width), derive_key(1, width * 7 + k)), rows, width, k,
                   what + " uniform");
      expect_top_k(tied_floats(static_cast<size_t>(rows * width), derive_key(2, width * 7 + k)), rows, width, k,
                   what + " tied");
    }
  }
}

TEST(MaxkForward, TiesGoToLowerColumnsAndSignedZerosAreOrdered) {
  const int64_t width = 6;
  // Row 0: all zeros -> the first k columns. Row 1: all equal negatives. Row 2: -0 below +0.
  // Row 3: negatives only, the largest (closest to zero) survive.
  const std::vector<float> x = {0, 0, 0, 0, 0, 0,                 //
                                -3, -3, -3, -3, -3, -3,           //
                                -0.0f, 0.0f, -0.0f, 0.0f, -1, -1,  //
                                -5, -1, -4, -2, -6, -3};
  Cbsr out(4, width, 3);
  maxk_forward_cpu(matrix(x.data(), 4, width), out.view());
  const ConstCbsrView v = out.cview();
  const int64_t want[4][3] = {{0, 1, 2}, {0, 1, 2}, {0, 1, 3}, {1, 3, 5}};
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < 3; ++t) EXPECT_EQ(v.column(r, t), want[r][t]) << "row " << r << " slot " << t;
  EXPECT_TRUE(std::signbit(out.values[2 * 3 + 0]));   // column 0 of row 2 is -0, kept as -0
  EXPECT_FALSE(std::signbit(out.values[2 * 3 + 1]));  // column 1 is +0
  expect_top_k(x, 4, width, 1, "k 1");
  expect_top_k(x, 4, width, width, "k = width");
}

TEST(MaxkForward, ReadsPaddedRowsAndWritesTwoByteIndicesAboveWidth256) {
  const int64_t rows = 5, width = 300, ld = 311, k = 9;
  const auto x = random_floats(static_cast<size_t>(rows * ld), 3);
  Cbsr out(rows, width, k);
  EXPECT_EQ(out.index.size(), static_cast<size_t>(rows * k * 2));
  maxk_forward_cpu(ConstMatrixView{x.data(), rows, width, ld}, out.view());
  for (int64_t r = 0; r < rows; ++r) {
    const auto want = sorted_top_k(x.data() + r * ld, width, k);
    for (int64_t t = 0; t < k; ++t) EXPECT_EQ(out.cview().column(r, t), want[t]);
  }
}

TEST(MaxkForward, RefusesBadShapes) {
  std::vector<float> x(40, 1.0f);
  Cbsr ok(4, 10, 3);
  Cbsr zero_k(4, 10, 1);
  zero_k.k = 0;
  Cbsr big_k(4, 10, 10);
  big_k.k = 11;
  EXPECT_EQ(maxk_forward_cannot(matrix(x.data(), 4, 10), ok.view()), "");
  EXPECT_THROW(maxk_forward_cpu(matrix(x.data(), 4, 10), zero_k.view()), InputError);
  EXPECT_THROW(maxk_forward_cpu(matrix(x.data(), 4, 10), big_k.view()), InputError);
  EXPECT_THROW(maxk_forward_cpu(matrix(x.data(), 5, 8), ok.view()), InputError);
  CbsrView wide = ok.view();
  wide.width = kCbsrMaxWidth + 1;
  EXPECT_NE(maxk_forward_cannot(ConstMatrixView{x.data(), 4, wide.width, wide.width}, wide).find("width"),
            std::string::npos);
}

TEST(MaxkBackward, PassesGradientsOnlyThroughKeptColumns) {
  for (int64_t width : {7, 100, 257}) {
    const int64_t rows = 19, k = std::min<int64_t>(width, 8);
    const auto x = random_floats(static_cast<size_t>(rows * width), derive_key(4, width));
    Cbsr pattern(rows, width, k);
    maxk_forward_cpu(matrix(x.data(), rows, width), pattern.view());
    const auto dense = random_floats(static_cast<size_t>(rows * width), derive_key(5, width));
    const auto sparse = random_floats(static_cast<size_t>(rows * k), derive_key(6, width));
    for (int use : {0, 1, 2, 3}) {
      const bool use_dense = use & 1, use_sparse = use & 2;
      std::vector<float> grad(static_cast<size_t>(rows * width), kNaN);
      maxk_backward_cpu(pattern.cview(), use_sparse ? sparse.data() : nullptr,
                        use_dense ? matrix(dense.data(), rows, width) : ConstMatrixView{},
                        matrix(grad.data(), rows, width));
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int64_t> slot(static_cast<size_t>(width), -1);
        for (int64_t t = 0; t < k; ++t) slot[pattern.cview().column(r, t)] = t;
        for (int64_t c = 0; c < width; ++c) {
          float want = 0.0f;
          if (slot[c] >= 0) {
            if (use_dense) want += dense[r * width + c];
            if (use_sparse) want += sparse[r * k + slot[c]];
          }
          ASSERT_EQ(grad[r * width + c], want) << "width " << width << " use " << use << " row " << r << " col " << c;
        }
      }
    }
  }
}

TEST(CbsrToDense, IsTheInputMaskedToItsTopK) {
  const int64_t rows = 13, width = 70, k = 5;
  const auto x = random_floats(static_cast<size_t>(rows * width), 7);
  Cbsr c(rows, width, k);
  maxk_forward_cpu(matrix(x.data(), rows, width), c.view());
  std::vector<float> dense(static_cast<size_t>(rows * width), kNaN);
  cbsr_to_dense_cpu(c.cview(), matrix(dense.data(), rows, width));
  for (int64_t r = 0; r < rows; ++r) {
    float smallest_kept = std::numeric_limits<float>::infinity(), largest_dropped = -smallest_kept;
    int kept = 0;
    for (int64_t col = 0; col < width; ++col) {
      const float d = dense[r * width + col], v = x[r * width + col];
      if (d != 0.0f) {
        EXPECT_EQ(d, v);
        smallest_kept = std::min(smallest_kept, v);
        ++kept;
      } else {
        largest_dropped = std::max(largest_dropped, v);
      }
    }
    EXPECT_EQ(kept, k);
    EXPECT_GT(smallest_kept, largest_dropped);
  }
}

// ---- aggregations ---------------------------------------------------------------------------

struct Graph {
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> indices;
  CsrView view() const { return {rows, cols, indptr.data(), indices.data(), nullptr}; }
};

// Destinations are the first of more sources; row 1 a hub reading every source, every fifth row
// empty, the rest 1 to 9 entries with repeats allowed.
Graph random_graph(int64_t rows, int64_t cols, uint64_t key) {
  Graph g;
  g.rows = rows;
  g.cols = cols;
  uint64_t counter = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (r == 1) {
      for (int64_t c = 0; c < cols; ++c) g.indices.push_back(static_cast<int32_t>(c));
    } else if (r % 5 != 0) {
      const int64_t degree = 1 + static_cast<int64_t>(random_below(key, counter++, 9));
      for (int64_t t = 0; t < degree; ++t)
        g.indices.push_back(static_cast<int32_t>(random_below(key, counter++, static_cast<uint64_t>(cols))));
    }
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  return g;
}

// Which optional inputs a case sets (SSpMM ignores the bias bit).
using Options = gale::testing::AggregationOptions;

struct Inputs {
  std::vector<float> row_scale, col_scale, weight, self_coefs, bias;
  Inputs(const Graph& g, int64_t width, uint64_t key)
      : row_scale(random_floats(static_cast<size_t>(g.rows), derive_key(key, 1), 0.1f, 1.0f)),
        col_scale(random_floats(static_cast<size_t>(g.cols), derive_key(key, 2), -1.0f, 1.0f)),
        weight(random_floats(g.indices.size(), derive_key(key, 3))),
        self_coefs(random_floats(static_cast<size_t>(g.rows), derive_key(key, 4))),
        bias(random_floats(static_cast<size_t>(width), derive_key(key, 5))) {}
};

// A CBSR x with ties in it (half the rows from the tied set), one row of zeros.
Cbsr random_cbsr(int64_t rows, int64_t width, int64_t k, uint64_t key) {
  auto dense = random_floats(static_cast<size_t>(rows * width), derive_key(key, 10));
  const auto tied = tied_floats(static_cast<size_t>(rows * width), derive_key(key, 11));
  for (int64_t r = 0; r < rows; r += 2)
    std::copy(tied.begin() + r * width, tied.begin() + (r + 1) * width, dense.begin() + r * width);
  if (rows > 3) std::fill(dense.begin() + 3 * width, dense.begin() + 4 * width, 0.0f);
  Cbsr c(rows, width, k);
  maxk_forward_cpu(matrix(dense.data(), rows, width), c.view());
  return c;
}

TEST(SpgemmCbsr, EqualsSpmmOnTheDensifiedInputForEveryOptionCombination) {
  for (int64_t width : {1, 7, 33, 300}) {
    for (int64_t k : {int64_t{1}, int64_t{3}, width}) {
      if (k > width) continue;
      const Graph g = random_graph(37, 53, derive_key(20, width * 11 + k));
      const Cbsr x = random_cbsr(53, width, k, derive_key(21, width * 11 + k));
      std::vector<float> dense(static_cast<size_t>(53 * width));
      cbsr_to_dense_cpu(x.cview(), matrix(dense.data(), 53, width));
      const Inputs in(g, width, derive_key(22, width));
      for (int combo = 0; combo < Options::kCombos; ++combo) {
        const Options o = Options::from(combo);
        std::vector<float> out(static_cast<size_t>(37 * width), kNaN), ref(out.size(), kNaN);
        SpgemmCbsrArgs a;
        a.graph = g.view();
        a.x = x.cview();
        a.out = matrix(out.data(), 37, width);
        a.row_scale = o.row_scale ? in.row_scale.data() : nullptr;
        a.col_scale = o.col_scale ? in.col_scale.data() : nullptr;
        a.edge_weight = o.edge_weight ? in.weight.data() : nullptr;
        a.self_coefs = (o.self & 2) ? in.self_coefs.data() : nullptr;
        a.self_scale = (o.self & 1) ? 1.25f : 0.0f;
        a.bias = o.bias ? in.bias.data() : nullptr;
        spgemm_cbsr_cpu(a);
        SpmmArgs s;
        s.graph = g.view();
        s.x = matrix(dense.data(), 53, width);
        s.out = matrix(ref.data(), 37, width);
        s.row_scale = a.row_scale;
        s.col_scale = a.col_scale;
        s.edge_weight = a.edge_weight;
        s.self_coefs = a.self_coefs;
        s.self_scale = a.self_scale;
        s.bias = a.bias;
        spmm_cpu(s);
        // Same products in the same order (spmm's extra ones are exact zeros): equal, not close.
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_EQ(out[i], ref[i]) << "width " << width << " k " << k << " " << o.describe() << " at " << i;
      }
    }
  }
}

TEST(SspmmCbsr, EqualsSpmmOverTheTransposeSampledAtThePattern) {
  for (int64_t width : {1, 7, 33, 300}) {
    for (int64_t k : {int64_t{1}, int64_t{3}, width}) {
      if (k > width) continue;
      const Graph g = random_graph(37, 53, derive_key(30, width * 11 + k));
      // Two pattern rows past the graph's sources: only zeros land there.
      const Cbsr pattern = random_cbsr(55, width, k, derive_key(31, width * 11 + k));
      const auto grad = random_floats(static_cast<size_t>(37 * width), derive_key(32, width));
      const Inputs in(g, width, derive_key(33, width));
      const int64_t nnz = static_cast<int64_t>(g.indices.size());
      std::vector<int64_t> t_indptr(54), perm(static_cast<size_t>(nnz));
      std::vector<int32_t> t_indices(static_cast<size_t>(nnz));
      csr_transpose(g.view(), t_indptr.data(), t_indices.data(), perm.data());
      std::vector<float> t_weight(static_cast<size_t>(nnz));
      for (int64_t q = 0; q < nnz; ++q) t_weight[q] = in.weight[perm[q]];
      for (int combo = 0; combo < Options::kCombos; ++combo) {
        const Options o = Options::from(combo);
        if (o.bias) continue;  // SSpMM has no bias
        std::vector<float> gv(static_cast<size_t>(55 * k), kNaN), dense_ref(static_cast<size_t>(53 * width), kNaN);
        SspmmCbsrArgs a;
        a.graph = g.view();
        a.grad_out = matrix(grad.data(), 37, width);
        a.pattern = pattern.cview();
        a.grad_values = gv.data();
        a.row_scale = o.row_scale ? in.row_scale.data() : nullptr;
        a.col_scale = o.col_scale ? in.col_scale.data() : nullptr;
        a.edge_weight = o.edge_weight ? in.weight.data() : nullptr;
        a.self_coefs = (o.self & 2) ? in.self_coefs.data() : nullptr;
        a.self_scale = (o.self & 1) ? 1.25f : 0.0f;
        sspmm_cbsr_cpu(a);
        SpmmArgs s;
        s.graph = {53, 37, t_indptr.data(), t_indices.data(), nullptr};
        s.x = matrix(grad.data(), 37, width);
        s.out = matrix(dense_ref.data(), 53, width);
        s.row_scale = a.col_scale;
        s.col_scale = a.row_scale;
        s.edge_weight = o.edge_weight ? t_weight.data() : nullptr;
        s.self_coefs = a.self_coefs;
        s.self_scale = a.self_scale;
        spmm_cpu(s);
        for (int64_t j = 0; j < 55; ++j) {
          for (int64_t t = 0; t < k; ++t) {
            const float want = j < 53 ? dense_ref[j * width + pattern.cview().column(j, t)] : 0.0f;
            ASSERT_EQ(gv[j * k + t], want) << "width " << width << " k " << k << " " << o.describe() << " row " << j;
          }
        }
      }
    }
  }
}

// SSpMM is SpGEMM's adjoint in x's kept values: <g, SpGEMM(x)> = <SSpMM(g), x.values> (no bias).
TEST(SpgemmCbsr, SspmmIsItsAdjoint) {
  const int64_t width = 45, k = 6;
  const Graph g = random_graph(41, 60, 40);
  const Cbsr x = random_cbsr(60, width, k, 41);
  const Inputs in(g, width, 42);
  const auto grad = random_floats(static_cast<size_t>(41 * width), 43);
  std::vector<float> out(static_cast<size_t>(41 * width)), gv(static_cast<size_t>(60 * k));
  SpgemmCbsrArgs f;
  f.graph = g.view();
  f.x = x.cview();
  f.out = matrix(out.data(), 41, width);
  f.row_scale = in.row_scale.data();
  f.col_scale = in.col_scale.data();
  f.edge_weight = in.weight.data();
  f.self_coefs = in.self_coefs.data();
  f.self_scale = 0.5f;
  spgemm_cbsr_cpu(f);
  SspmmCbsrArgs b;
  b.graph = g.view();
  b.grad_out = matrix(grad.data(), 41, width);
  b.pattern = x.cview();
  b.grad_values = gv.data();
  b.row_scale = f.row_scale;
  b.col_scale = f.col_scale;
  b.edge_weight = f.edge_weight;
  b.self_coefs = f.self_coefs;
  b.self_scale = f.self_scale;
  sspmm_cbsr_cpu(b);
  double lhs = 0.0, rhs = 0.0, scale = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    lhs += static_cast<double>(grad[i]) * out[i];
    scale += std::fabs(static_cast<double>(grad[i]) * out[i]);
  }
  for (size_t i = 0; i < gv.size(); ++i) rhs += static_cast<double>(gv[i]) * x.values[i];
  EXPECT_NEAR(lhs, rhs, 1e-5 * scale);
}

TEST(SpgemmCbsr, ResultsDoNotDependOnTheThreadCount) {
  const int64_t width = 129, k = 16;
  const Graph g = random_graph(700, 900, 50);
  const Cbsr x = random_cbsr(900, width, k, 51);
  const auto grad = random_floats(static_cast<size_t>(700 * width), 52);
  const auto run = [&](std::vector<float>& out, std::vector<float>& gv) {
    SpgemmCbsrArgs f;
    f.graph = g.view();
    f.x = x.cview();
    f.out = matrix(out.data(), 700, width);
    f.self_scale = 1.0f;
    spgemm_cbsr_cpu(f);
    SspmmCbsrArgs b;
    b.graph = g.view();
    b.grad_out = matrix(grad.data(), 700, width);
    b.pattern = x.cview();
    b.grad_values = gv.data();
    b.self_scale = 1.0f;
    sspmm_cbsr_cpu(b);
  };
  std::vector<float> out1(static_cast<size_t>(700 * width)), out2 = out1, gv1(static_cast<size_t>(900 * k)), gv2 = gv1;
  run(out1, gv1);
  tbb::task_arena(1).execute([&] { run(out2, gv2); });
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(gv1, gv2);
}

TEST(SpgemmCbsr, RefusesMismatchedShapes) {
  const Graph g = random_graph(5, 8, 60);
  Cbsr x(8, 10, 2);
  std::vector<float> out(50);
  SpgemmCbsrArgs a;
  a.graph = g.view();
  a.x = x.cview();
  a.out = matrix(out.data(), 5, 10);
  EXPECT_EQ(spgemm_cbsr_cannot(a), "");
  a.out = matrix(out.data(), 5, 9);
  EXPECT_THROW(spgemm_cbsr_cpu(a), InputError);
  a.out = matrix(out.data(), 5, 10);
  a.x.rows = 7;  // fewer CBSR rows than the graph's sources
  EXPECT_NE(spgemm_cbsr_cannot(a).find("rows"), std::string::npos);
  SspmmCbsrArgs b;
  b.graph = g.view();
  b.pattern = x.cview();
  b.grad_out = matrix(out.data(), 5, 10);
  EXPECT_NE(sspmm_cbsr_cannot(b).find("grad_values"), std::string::npos);
  std::vector<float> gv(16);
  b.grad_values = gv.data();
  EXPECT_EQ(sspmm_cbsr_cannot(b), "");
  b.grad_out = matrix(out.data(), 4, 10);
  EXPECT_THROW(sspmm_cbsr_cpu(b), InputError);
}

// ---- edge groups ----------------------------------------------------------------------------

// ---- the dense layer on a CBSR input ---------------------------------------------------------

std::vector<float> densified(const Cbsr& c) {
  std::vector<float> d(static_cast<size_t>(c.rows * c.width));
  cbsr_to_dense_cpu(c.cview(), matrix(d.data(), c.rows, c.width));
  return d;
}

TEST(CbsrGemm, EqualsTheDenseProductOfTheDensifiedInput) {
  for (int64_t width : {1, 7, 256, 300}) {
    for (int64_t k : {int64_t{1}, int64_t{3}, width}) {
      if (k > width) continue;
      for (int64_t n : {1, 47}) {
        for (float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE("width " + std::to_string(width) + ", k " + std::to_string(k) + ", n " + std::to_string(n) +
                       ", beta " + std::to_string(beta));
          const int64_t rows = 9, ld = n + 3;  // padded output rows
          const Cbsr x = random_cbsr(rows, width, k, static_cast<uint64_t>(width * 100 + k));
          const auto w = random_floats(static_cast<size_t>(width * n), static_cast<uint64_t>(n));
          const auto before = random_floats(static_cast<size_t>(rows * ld), 5);
          std::vector<float> out = before;
          cbsr_gemm_cpu({x.cview(), matrix(w.data(), width, n), beta, MatrixView{out.data(), rows, n, ld}});
          const auto d = densified(x);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < n; ++j) {
              double want = beta * before[r * ld + j];
              for (int64_t c = 0; c < width; ++c) want += static_cast<double>(d[r * width + c]) * w[c * n + j];
              EXPECT_NEAR(out[r * ld + j], want, 1e-5 * std::max(1.0, std::fabs(want))) << r << ", " << j;
            }
            for (int64_t j = n; j < ld; ++j) EXPECT_EQ(out[r * ld + j], before[r * ld + j]);  // padding untouched
          }
        }
      }
    }
  }
}

// The second product (W2 on the leading rows) equals a call of its own on those rows, bit for bit,
// and leaves the first unchanged.
TEST(CbsrGemm, SecondProductOnTheLeadingRowsEqualsItsOwnCall) {
  const int64_t rows = 13, width = 256, k = 32, n = 48, n2 = 47, rows2 = 8;
  const Cbsr x = random_cbsr(rows, width, k, 77);
  const auto w = random_floats(static_cast<size_t>(width * n), 78);
  const auto w2 = random_floats(static_cast<size_t>(width * n2), 79);
  for (float beta : {0.0f, 1.0f}) {
    const auto before = random_floats(static_cast<size_t>(rows * n), 80);
    const auto before2 = random_floats(static_cast<size_t>(rows2 * n2), 81);
    std::vector<float> both = before, both2 = before2, alone = before, alone2 = before2;
    CbsrGemmArgs a{x.cview(), matrix(w.data(), width, n), beta, matrix(both.data(), rows, n)};
    a.w2 = matrix(w2.data(), width, n2);
    a.out2 = matrix(both2.data(), rows2, n2);
    cbsr_gemm_cpu(a);
    cbsr_gemm_cpu({x.cview(), matrix(w.data(), width, n), beta, matrix(alone.data(), rows, n)});
    ConstCbsrView lead = x.cview();
    lead.rows = rows2;
    cbsr_gemm_cpu({lead, matrix(w2.data(), width, n2), beta, matrix(alone2.data(), rows2, n2)});
    EXPECT_EQ(both, alone);
    EXPECT_EQ(both2, alone2);
  }
  std::vector<float> out(static_cast<size_t>(rows * n)), out2(static_cast<size_t>((rows + 1) * n2));
  CbsrGemmArgs bad{x.cview(), matrix(w.data(), width, n), 0.0f, matrix(out.data(), rows, n)};
  bad.w2 = matrix(w2.data(), width, n2);
  bad.out2 = matrix(out2.data(), rows + 1, n2);  // more rows than x
  EXPECT_THROW(cbsr_gemm_cpu(bad), InputError);
  bad.out2 = matrix(out2.data(), rows, n2 - 1);  // columns not W2's
  EXPECT_THROW(cbsr_gemm_cpu(bad), InputError);
}

TEST(CbsrGemmGrad, IsTheDenseInputGradientAtTheKeptPositionsOnly) {
  for (int64_t width : {7, 256, 300}) {
    for (int64_t k : {int64_t{1}, int64_t{5}, width}) {
      for (int terms : {1, 2}) {
        SCOPED_TRACE("width " + std::to_string(width) + ", k " + std::to_string(k) + ", terms " + std::to_string(terms));
        const int64_t rows = 11, n[2] = {47, 3}, grad_rows[2] = {rows, 6};  // term 1: a block's destinations
        const Cbsr p = random_cbsr(rows, width, k, static_cast<uint64_t>(width + k));
        std::vector<float> g[2], w[2];
        CbsrGemmGradArgs a;
        a.pattern = p.cview();
        a.terms = terms;
        for (int t = 0; t < terms; ++t) {
          g[t] = random_floats(static_cast<size_t>(grad_rows[t] * n[t]), static_cast<uint64_t>(20 + t));
          w[t] = random_floats(static_cast<size_t>(width * n[t]), static_cast<uint64_t>(30 + t));
          a.grad[t] = matrix(g[t].data(), grad_rows[t], n[t]);
          a.w[t] = matrix(w[t].data(), width, n[t]);
        }
        std::vector<float> out(static_cast<size_t>(rows * width), kNaN);
        a.grad_in = matrix(out.data(), rows, width);
        cbsr_gemm_grad_cpu(a);
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<bool> kept(static_cast<size_t>(width), false);
          for (int64_t t = 0; t < k; ++t) kept[p.cview().column(r, t)] = true;
          for (int64_t c = 0; c < width; ++c) {
            double want = 0.0;
            for (int t = 0; t < terms && kept[c]; ++t) {
              if (r >= grad_rows[t]) continue;
              for (int64_t j = 0; j < n[t]; ++j) want += static_cast<double>(g[t][r * n[t] + j]) * w[t][c * n[t] + j];
            }
            EXPECT_NEAR(out[r * width + c], want, 1e-5 * std::max(1.0, std::fabs(want))) << r << ", " << c;
          }
        }
      }
    }
  }
}

TEST(CbsrGemm, RefusesMismatchedShapes) {
  Cbsr x(4, 10, 2);
  std::vector<float> w(10 * 3), out(4 * 3);
  EXPECT_THROW(cbsr_gemm_cpu({x.cview(), matrix(w.data(), 9, 3), 0.0f, matrix(out.data(), 4, 3)}), InputError);
  EXPECT_THROW(cbsr_gemm_cpu({x.cview(), matrix(w.data(), 10, 3), 0.0f, matrix(out.data(), 3, 3)}), InputError);
  CbsrGemmGradArgs a;
  a.pattern = x.cview();
  a.terms = 3;
  a.grad_in = matrix(out.data(), 4, 10);
  EXPECT_THROW(cbsr_gemm_grad_cpu(a), InputError);
  a.terms = 1;
  a.grad[0] = matrix(out.data(), 5, 3);  // more rows than the pattern
  a.w[0] = matrix(w.data(), 10, 3);
  EXPECT_THROW(cbsr_gemm_grad_cpu(a), InputError);
}

TEST(EdgeGroups, CoverEveryEntryOnceInRowOrderWithinTheBound) {
  for (int64_t size : {int64_t{1}, int64_t{5}, kMaxkEdgeGroupSize}) {
    const Graph g = random_graph(300, 2000, 70);  // row 1: 2000 entries, 32 groups of 64
    const auto groups = edge_groups_cpu(g.view(), size);
    const int64_t nnz = static_cast<int64_t>(g.indices.size());
    int64_t expected = 0;
    for (int64_t r = 0; r < g.rows; ++r) expected += (g.indptr[r + 1] - g.indptr[r] + size - 1) / size;
    EXPECT_EQ(static_cast<int64_t>(groups.size()), expected);
    EXPECT_LE(expected, edge_groups_capacity(g.rows, nnz, size));
    int64_t next = 0;
    for (const EdgeGroup& eg : groups) {
      ASSERT_EQ(eg.start, next);  // contiguous: every entry once, in order
      ASSERT_GE(eg.count, 1);
      ASSERT_LE(eg.count, size);
      ASSERT_GE(eg.start, g.indptr[eg.row]);
      ASSERT_LE(eg.start + eg.count, g.indptr[eg.row + 1]);  // never spans two rows
      next += eg.count;
    }
    EXPECT_EQ(next, nnz);
  }
}

// Sources 2 and 9 read 4 times each, 5 three times, 7 and 0 twice, 3 once, the rest never.
Graph counted_graph() {
  Graph g;
  g.rows = 4;
  g.cols = 12;
  for (const std::vector<int32_t>& row : std::vector<std::vector<int32_t>>{
           {0, 2, 5, 9}, {2, 7, 9}, {}, {2, 2, 3, 5, 5, 7, 9, 9, 0}}) {
    g.indices.insert(g.indices.end(), row.begin(), row.end());
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  return g;
}

TEST(SspmmHubs, PicksTheMostReadSourcesLowerIdsFirstAndFlagsTheirEntries) {
  const Graph g = counted_graph();
  const auto flagged = [&](const SspmmHubs& h) {
    std::vector<int32_t> sources;
    for (size_t e = 0; e < g.indices.size(); ++e)
      if ((h.entry_mask[e / 32] >> (e % 32)) & 1u) sources.push_back(g.indices[e]);
    return sources;
  };
  // Capacity 4, at least 3 entries: 2 and 9 (4 each), then 5 (3), in id order, one place free.
  SspmmHubs h = sspmm_hubs_cpu(g.view(), 4, 3);
  EXPECT_EQ(h.ids, (std::vector<int32_t>{2, 5, 9, kSspmmNoHub}));
  ASSERT_EQ(h.entry_mask.size(), 1u);  // 16 entries, one word
  EXPECT_EQ(flagged(h), (std::vector<int32_t>{2, 5, 9, 2, 9, 2, 2, 5, 5, 9, 9}));
  // Capacity 3 with every source allowed: still 2, 5, 9; capacity 4: 0 and 7 tie at 2, 0 wins.
  EXPECT_EQ(sspmm_hubs_cpu(g.view(), 3, 1).ids, (std::vector<int32_t>{2, 5, 9}));
  EXPECT_EQ(sspmm_hubs_cpu(g.view(), 4, 1).ids, (std::vector<int32_t>{0, 2, 5, 9}));
  // Capacity 1: the tie between 2 and 9 goes to 2.
  EXPECT_EQ(sspmm_hubs_cpu(g.view(), 1, 1).ids, (std::vector<int32_t>{2}));
  // Nothing reaches 5 entries: no hubs, no flags.
  h = sspmm_hubs_cpu(g.view(), 8, 5);
  EXPECT_EQ(h.ids, std::vector<int32_t>(8, kSspmmNoHub));
  EXPECT_TRUE(flagged(h).empty());
  // A graph of more than 32 entries spans several words, bit e % 32 of word e / 32.
  Graph big;
  big.rows = 1;
  big.cols = 3;
  for (int e = 0; e < 70; ++e) big.indices.push_back(e % 3 == 1 ? 1 : 0);
  big.indptr.push_back(70);
  h = sspmm_hubs_cpu(big.view(), 1, 1);
  EXPECT_EQ(h.ids, (std::vector<int32_t>{0}));
  ASSERT_EQ(h.entry_mask.size(), 3u);
  for (int e = 0; e < 70; ++e) EXPECT_EQ((h.entry_mask[e / 32] >> (e % 32)) & 1u, e % 3 == 1 ? 0u : 1u) << e;
}

TEST(SspmmHubs, CapacityFollowsKAndPlansOutsideItAreRefused) {
  EXPECT_EQ(sspmm_hub_capacity(32), 256);  // 32 KiB of sums at k = 32
  EXPECT_EQ(sspmm_hub_capacity(16), 512);
  EXPECT_EQ(sspmm_hub_capacity(1), 1024);  // never above 1024
  EXPECT_EQ(sspmm_hub_capacity(4096), 2);
  EXPECT_EQ(sspmm_hub_capacity(0), 0);
  EXPECT_EQ(sspmm_hub_mask_words(0), 0);
  EXPECT_EQ(sspmm_hub_mask_words(33), 2);
  const Graph g = counted_graph();
  EXPECT_THROW(sspmm_hubs_cpu(g.view(), 1025), InputError);
  EXPECT_THROW(sspmm_hubs_cpu(g.view(), -1), InputError);
  EXPECT_TRUE(sspmm_hubs_cpu(g.view(), 0).ids.empty());
}

TEST(EdgeGroups, CapacityIsTightWhenEveryRowIsOneGroupPlusOne) {
  // Degrees of exactly 64 are the bound's worst case: 1 group per row, bound 2 per row.
  EXPECT_EQ(edge_groups_capacity(10, 640), 20);
  EXPECT_EQ(edge_groups_capacity(10, 0), 0);
  EXPECT_EQ(edge_groups_capacity(10, 65), 11);  // one row of 65: 2 groups
}

}  // namespace
}  // namespace gale::kernels
