// kernels/maxk_cpu.cpp — CPU references of the MaxK family (maxk.hpp) and the argument checks the
// CUDA twins share. Straightforward loops, parallel over output rows with a fixed summation
// order, written to be read against the formulas in maxk.hpp.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/error.hpp"
#include "kernels/maxk.hpp"
#include "kernels/spmm.hpp"

namespace gale::kernels {

namespace {

// The order-preserving key of a float (the CUDA twin in maxk.cu computes the same): larger floats
// give larger unsigned keys. Positives get the sign bit set, negatives have every bit flipped.
uint32_t order_key(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

std::string cbsr_shape_cannot(const char* name, int64_t rows, int64_t width, int64_t k) {
  const std::string n(name);
  if (rows < 0) return n + " has a negative row count";
  if (width < 1 || width > kCbsrMaxWidth)
    return n + " has width " + std::to_string(width) + ", CBSR takes 1 to " + std::to_string(kCbsrMaxWidth);
  if (k < 1 || k > width)
    return n + " keeps k = " + std::to_string(k) + " of " + std::to_string(width) + " columns; k must be in [1, width]";
  return "";
}

std::string matrix_cannot(const char* name, int64_t rows, int64_t cols, int64_t ld, int64_t want_rows,
                          int64_t want_cols) {
  const std::string n(name);
  if (rows != want_rows || cols != want_cols)
    return n + " is " + std::to_string(rows) + " x " + std::to_string(cols) + ", expected " +
           std::to_string(want_rows) + " x " + std::to_string(want_cols);
  if (ld < cols) return n + " has a leading dimension below its width";
  return "";
}

std::string graph_cannot(const CsrView& g) {
  if (g.rows < 0 || g.cols < 0) return "the graph has a negative size";
  return "";
}

void require(const std::string& why, const char* op) {
  if (!why.empty()) throw InputError(std::string(op) + ": " + why);
}

// Row ranges for tbb::parallel_for; the grain keeps per-task work above the scheduling cost.
tbb::blocked_range<int64_t> rows_range(int64_t rows) { return {0, rows, 64}; }

}  // namespace

// ---- argument checks ------------------------------------------------------------------------

std::string maxk_forward_cannot(ConstMatrixView x, const CbsrView& out) {
  std::string why = cbsr_shape_cannot("out", out.rows, out.width, out.k);
  if (why.empty()) why = matrix_cannot("x", x.rows, x.cols, x.ld, out.rows, out.width);
  return why;
}

std::string maxk_backward_cannot(const ConstCbsrView& pattern, ConstMatrixView grad_dense, MatrixView grad_in) {
  std::string why = cbsr_shape_cannot("the pattern", pattern.rows, pattern.width, pattern.k);
  if (why.empty()) why = matrix_cannot("grad_in", grad_in.rows, grad_in.cols, grad_in.ld, pattern.rows, pattern.width);
  if (why.empty() && grad_dense.data != nullptr)
    why = matrix_cannot("grad_dense", grad_dense.rows, grad_dense.cols, grad_dense.ld, pattern.rows, pattern.width);
  return why;
}

std::string spgemm_cbsr_cannot(const SpgemmCbsrArgs& a) {
  std::string why = graph_cannot(a.graph);
  if (why.empty()) why = cbsr_shape_cannot("x", a.x.rows, a.x.width, a.x.k);
  if (why.empty() && a.x.rows < a.graph.cols)
    why = "x has " + std::to_string(a.x.rows) + " rows, the graph " + std::to_string(a.graph.cols) + " columns";
  if (why.empty()) why = matrix_cannot("out", a.out.rows, a.out.cols, a.out.ld, a.graph.rows, a.x.width);
  return why;
}

std::string sspmm_cbsr_cannot(const SspmmCbsrArgs& a) {
  std::string why = graph_cannot(a.graph);
  if (why.empty()) why = cbsr_shape_cannot("the pattern", a.pattern.rows, a.pattern.width, a.pattern.k);
  if (why.empty() && a.pattern.rows < a.graph.cols)
    why = "the pattern has " + std::to_string(a.pattern.rows) + " rows, the graph " + std::to_string(a.graph.cols) +
          " columns";
  if (why.empty())
    why = matrix_cannot("grad_out", a.grad_out.rows, a.grad_out.cols, a.grad_out.ld, a.graph.rows, a.pattern.width);
  if (why.empty() && a.grad_values == nullptr && a.pattern.rows > 0) why = "grad_values is null";
  return why;
}

std::string cbsr_gemm_cannot(const CbsrGemmArgs& a) {
  std::string why = cbsr_shape_cannot("x", a.x.rows, a.x.width, a.x.k);
  if (why.empty()) why = matrix_cannot("W", a.w.rows, a.w.cols, a.w.ld, a.x.width, a.w.cols);
  if (why.empty()) why = matrix_cannot("out", a.out.rows, a.out.cols, a.out.ld, a.x.rows, a.w.cols);
  if (why.empty() && a.w.cols < 1) why = "W has no columns";
  if (why.empty() && a.w2.data != nullptr) {
    if (a.out2.rows < 0 || a.out2.rows > a.x.rows)
      why = "out2 has " + std::to_string(a.out2.rows) + " rows, x " + std::to_string(a.x.rows);
    if (why.empty()) why = matrix_cannot("W2", a.w2.rows, a.w2.cols, a.w2.ld, a.x.width, a.w2.cols);
    if (why.empty()) why = matrix_cannot("out2", a.out2.rows, a.out2.cols, a.out2.ld, a.out2.rows, a.w2.cols);
    if (why.empty() && a.w2.cols < 1) why = "W2 has no columns";
  }
  return why;
}

std::string cbsr_gemm_grad_cannot(const CbsrGemmGradArgs& a) {
  const ConstCbsrView& p = a.pattern;
  std::string why = cbsr_shape_cannot("the pattern", p.rows, p.width, p.k);
  if (why.empty() && (a.terms < 1 || a.terms > 2)) why = "takes 1 or 2 terms, got " + std::to_string(a.terms);
  for (int t = 0; why.empty() && t < a.terms; ++t) {
    const ConstMatrixView& g = a.grad[t];
    if (g.rows > p.rows || g.rows < 0)
      why = "grad " + std::to_string(t) + " has " + std::to_string(g.rows) + " rows, the pattern " + std::to_string(p.rows);
    if (why.empty()) why = matrix_cannot("grad", g.rows, g.cols, g.ld, g.rows, a.w[t].cols);
    if (why.empty()) why = matrix_cannot("W", a.w[t].rows, a.w[t].cols, a.w[t].ld, p.width, g.cols);
    if (why.empty() && g.cols < 1) why = "W has no columns";
  }
  if (why.empty()) why = matrix_cannot("grad_in", a.grad_in.rows, a.grad_in.cols, a.grad_in.ld, p.rows, p.width);
  return why;
}

// ---- MaxK -----------------------------------------------------------------------------------

void maxk_forward_cpu(ConstMatrixView x, const CbsrView& out) {
  require(maxk_forward_cannot(x, out), "maxk_forward");
  const int64_t width = out.width, k = out.k;
  tbb::parallel_for(rows_range(out.rows), [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<uint32_t> key(static_cast<size_t>(width));
    std::vector<int32_t> cols(static_cast<size_t>(width));
    for (int64_t r = range.begin(); r < range.end(); ++r) {
      const float* xr = x.row(r);
      for (int64_t c = 0; c < width; ++c) key[c] = order_key(xr[c]);
      std::iota(cols.begin(), cols.end(), 0);
      // A strict total order: larger key first, then the lower column. Its first k elements are
      // the k largest values with ties going to the lower columns.
      const auto before = [&](int32_t a, int32_t b) { return key[a] != key[b] ? key[a] > key[b] : a < b; };
      if (k < width) std::nth_element(cols.begin(), cols.begin() + (k - 1), cols.end(), before);
      std::sort(cols.begin(), cols.begin() + k);
      for (int64_t t = 0; t < k; ++t) {
        out.values[r * k + t] = xr[cols[t]];
        out.set_column(r, t, cols[t]);
      }
    }
  });
}

namespace {

// The scatter both maxk_backward_cpu and cbsr_to_dense_cpu are: zeros, then at each kept column
// dense + sparse (either alone when the other is absent, so values pass through bit for bit).
void scatter_rows(const ConstCbsrView& p, const float* sparse, ConstMatrixView dense, MatrixView out) {
  const int64_t width = p.width, k = p.k;
  tbb::parallel_for(rows_range(p.rows), [&](const tbb::blocked_range<int64_t>& range) {
    for (int64_t r = range.begin(); r < range.end(); ++r) {
      float* o = out.row(r);
      std::fill(o, o + width, 0.0f);
      for (int64_t t = 0; t < k; ++t) {
        const int64_t c = p.column(r, t);
        float v = 0.0f;
        if (dense.data != nullptr && sparse != nullptr) {
          v = dense.row(r)[c] + sparse[r * k + t];
        } else if (dense.data != nullptr) {
          v = dense.row(r)[c];
        } else if (sparse != nullptr) {
          v = sparse[r * k + t];
        }
        o[c] = v;
      }
    }
  });
}

}  // namespace

void maxk_backward_cpu(const ConstCbsrView& pattern, const float* grad_values, ConstMatrixView grad_dense,
                       MatrixView grad_in) {
  require(maxk_backward_cannot(pattern, grad_dense, grad_in), "maxk_backward");
  scatter_rows(pattern, grad_values, grad_dense, grad_in);
}

void cbsr_to_dense_cpu(const ConstCbsrView& x, MatrixView out) {
  require(maxk_backward_cannot(x, ConstMatrixView{}, out), "cbsr_to_dense");
  scatter_rows(x, x.values, ConstMatrixView{}, out);
}

// ---- aggregations ---------------------------------------------------------------------------

void spgemm_cbsr_cpu(const SpgemmCbsrArgs& a) {
  require(spgemm_cbsr_cannot(a), "spgemm_cbsr");
  const CsrView& g = a.graph;
  const ConstCbsrView& x = a.x;
  const int64_t width = x.width, k = x.k;
  const int64_t self_rows = std::min(g.rows, x.rows);
  // Per element the operations and their order are spmm_cpu's on the densified x: the same
  // products summed in entry order (spmm_cpu's extra terms are coef * 0), then row scale, self
  // term, bias. So the two agree exactly on finite inputs.
  tbb::parallel_for(rows_range(g.rows), [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<float> acc(static_cast<size_t>(width));
    for (int64_t r = range.begin(); r < range.end(); ++r) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t e = g.indptr[r]; e < g.indptr[r + 1]; ++e) {
        const int32_t c = g.indices[e];
        float coef = a.col_scale ? a.col_scale[c] : 1.0f;
        if (a.edge_weight) coef *= a.edge_weight[e];
        for (int64_t t = 0; t < k; ++t) acc[x.column(c, t)] += coef * x.values[c * k + t];
      }
      const float rs = a.row_scale ? a.row_scale[r] : 1.0f;
      float* o = a.out.row(r);
      for (int64_t c = 0; c < width; ++c) o[c] = rs * acc[c];
      float self = 0.0f;
      if (r < self_rows) self = a.self_scale + (a.self_coefs ? a.self_coefs[r] : 0.0f);
      if (self != 0.0f)
        for (int64_t t = 0; t < k; ++t) o[x.column(r, t)] += self * x.values[r * k + t];
      if (a.bias)
        for (int64_t c = 0; c < width; ++c) o[c] += a.bias[c];
    }
  });
}

void sspmm_cbsr_cpu(const SspmmCbsrArgs& a) {
  require(sspmm_cbsr_cannot(a), "sspmm_cbsr");
  const CsrView& g = a.graph;
  const ConstCbsrView& p = a.pattern;
  const int64_t k = p.k;
  const int64_t nnz = g.nnz();
  // The transpose lists, for every source j, the destinations i that read it, in row order.
  std::vector<int64_t> t_indptr(static_cast<size_t>(g.cols + 1));
  std::vector<int32_t> t_indices(static_cast<size_t>(nnz));
  std::vector<int64_t> t_perm(static_cast<size_t>(nnz));
  csr_transpose(g, t_indptr.data(), t_indices.data(), t_perm.data());
  const int64_t self_rows = std::min(g.rows, p.rows);  // as spgemm_cbsr's self term
  // Per element the operations and their order are spmm_cpu's over the transpose (row scale
  // col_scale, column scale row_scale, weights permuted), sampled at the pattern.
  tbb::parallel_for(rows_range(p.rows), [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<float> acc(static_cast<size_t>(k));
    std::vector<int64_t> cols(static_cast<size_t>(k));
    for (int64_t j = range.begin(); j < range.end(); ++j) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t t = 0; t < k; ++t) cols[t] = p.column(j, t);
      if (j < g.cols) {
        for (int64_t q = t_indptr[j]; q < t_indptr[j + 1]; ++q) {
          const int32_t i = t_indices[q];
          float coef = a.row_scale ? a.row_scale[i] : 1.0f;
          if (a.edge_weight) coef *= a.edge_weight[t_perm[q]];
          const float* gi = a.grad_out.row(i);
          for (int64_t t = 0; t < k; ++t) acc[t] += coef * gi[cols[t]];
        }
      }
      const float cs = a.col_scale && j < g.cols ? a.col_scale[j] : 1.0f;
      float self = 0.0f;
      if (j < self_rows) self = a.self_scale + (a.self_coefs ? a.self_coefs[j] : 0.0f);
      for (int64_t t = 0; t < k; ++t) {
        float v = cs * acc[t];
        if (self != 0.0f) v += self * a.grad_out.row(j)[cols[t]];
        a.grad_values[j * k + t] = v;
      }
    }
  });
}

// ---- the dense layer on a CBSR input --------------------------------------------------------

void cbsr_gemm_cpu(const CbsrGemmArgs& a) {
  require(cbsr_gemm_cannot(a), "cbsr_gemm");
  const ConstCbsrView& x = a.x;
  const int64_t k = x.k;
  const auto product = [&](ConstMatrixView wm, MatrixView out, int64_t r) {
    float* o = out.row(r);
    const int64_t n = wm.cols;
    for (int64_t j = 0; j < n; ++j) o[j] = a.beta == 0.0f ? 0.0f : a.beta * o[j];
    for (int64_t t = 0; t < k; ++t) {
      const float v = x.values[r * k + t];
      const float* w = wm.row(x.column(r, t));
      for (int64_t j = 0; j < n; ++j) o[j] += v * w[j];
    }
  };
  tbb::parallel_for(rows_range(x.rows), [&](const tbb::blocked_range<int64_t>& range) {
    for (int64_t r = range.begin(); r < range.end(); ++r) {
      product(a.w, a.out, r);
      if (a.w2.data != nullptr && r < a.out2.rows) product(a.w2, a.out2, r);
    }
  });
}

void cbsr_gemm_grad_cpu(const CbsrGemmGradArgs& a) {
  require(cbsr_gemm_grad_cannot(a), "cbsr_gemm_grad");
  const ConstCbsrView& p = a.pattern;
  tbb::parallel_for(rows_range(p.rows), [&](const tbb::blocked_range<int64_t>& range) {
    for (int64_t r = range.begin(); r < range.end(); ++r) {
      float* o = a.grad_in.row(r);
      std::fill(o, o + p.width, 0.0f);
      for (int64_t t = 0; t < p.k; ++t) {
        const int64_t c = p.column(r, t);
        float sum = 0.0f;
        for (int term = 0; term < a.terms; ++term) {
          if (r >= a.grad[term].rows) continue;
          const float* g = a.grad[term].row(r);
          const float* w = a.w[term].row(c);
          for (int64_t j = 0; j < a.grad[term].cols; ++j) sum += g[j] * w[j];
        }
        o[c] = sum;
      }
    }
  });
}

// ---- SSpMM's hub plan --------------------------------------------------------------------------

std::string sspmm_hubs_cannot(const CsrView& graph, int capacity) {
  if (capacity < 0 || capacity > kSspmmMaxHubs)
    return "capacity " + std::to_string(capacity) + " is outside [0, " + std::to_string(kSspmmMaxHubs) + "]";
  if (graph.cols >= (int64_t{1} << 31))
    return "the graph has " + std::to_string(graph.cols) + " columns, at most 2^31 - 1 fit";
  return "";
}

SspmmHubs sspmm_hubs_cpu(const CsrView& graph, int capacity, int64_t min_entries) {
  const std::string why = sspmm_hubs_cannot(graph, capacity);
  if (!why.empty()) throw InputError("sspmm hubs: " + why);
  const int64_t end = graph.rows == 0 ? 0 : graph.indptr[graph.rows];
  std::vector<int64_t> counts(static_cast<size_t>(graph.cols), 0);
  for (int64_t e = graph.rows == 0 ? 0 : graph.indptr[0]; e < end; ++e) ++counts[static_cast<size_t>(graph.indices[e])];
  // Most entries first, lower id first among equals (the CUDA twin's stable radix sort).
  std::vector<int32_t> order(static_cast<size_t>(graph.cols));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return counts[a] > counts[b]; });
  SspmmHubs h;
  for (int32_t v : order) {
    if (static_cast<int>(h.ids.size()) == capacity || counts[static_cast<size_t>(v)] < std::max<int64_t>(min_entries, 1))
      break;
    h.ids.push_back(v);
  }
  std::sort(h.ids.begin(), h.ids.end());
  std::vector<char> is_hub(static_cast<size_t>(graph.cols), 0);
  for (int32_t v : h.ids) is_hub[static_cast<size_t>(v)] = 1;
  h.ids.resize(static_cast<size_t>(capacity), kSspmmNoHub);
  h.entry_mask.assign(static_cast<size_t>(sspmm_hub_mask_words(end)), 0u);
  for (int64_t e = graph.rows == 0 ? 0 : graph.indptr[0]; e < end; ++e)
    if (is_hub[static_cast<size_t>(graph.indices[e])]) h.entry_mask[static_cast<size_t>(e / 32)] |= 1u << (e % 32);
  return h;
}

// ---- edge groups ----------------------------------------------------------------------------

int64_t edge_groups_capacity(int64_t rows, int64_t nnz, int64_t group_size) {
  return std::min(rows, nnz) + nnz / group_size;
}

std::vector<EdgeGroup> edge_groups_cpu(const CsrView& graph, int64_t group_size) {
  if (group_size < 1 || group_size > (int64_t{1} << 30))
    throw InputError("edge groups: group size " + std::to_string(group_size) + " is out of range");
  if (graph.rows >= (int64_t{1} << 31))
    throw InputError("edge groups: the graph has " + std::to_string(graph.rows) + " rows, at most 2^31 - 1 fit");
  std::vector<EdgeGroup> groups;
  groups.reserve(static_cast<size_t>(edge_groups_capacity(graph.rows, graph.nnz(), group_size)));
  for (int64_t r = 0; r < graph.rows; ++r) {
    for (int64_t s = graph.indptr[r]; s < graph.indptr[r + 1]; s += group_size) {
      EdgeGroup eg;
      eg.start = s;
      eg.row = static_cast<int32_t>(r);
      eg.count = static_cast<int32_t>(std::min(group_size, graph.indptr[r + 1] - s));
      groups.push_back(eg);
    }
  }
  return groups;
}

}  // namespace gale::kernels
