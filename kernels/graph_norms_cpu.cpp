#include <tbb/parallel_for.h>

#include <cmath>

#include "kernels/error.hpp"
#include "kernels/graph_norms.hpp"

namespace gale::kernels {

std::string graph_norms_cannot(const GraphNormsArgs& a) {
  if (!a.dst_norm || !a.src_norm || !a.self_norm || !a.inv_degree) return "every output array is needed";
  if (a.csr.rows < 0 || a.csr.rows > a.csr.cols) return "expected rows <= cols";
  if (a.csr.rows < a.csr.cols && (!a.src_ids || !a.full_indptr))
    return "sources that are not destinations need src_ids and the full graph's indptr";
  if (a.csr.rows < a.csr.cols && a.csr.weights && !a.full_degree)
    return "weighted sources that are not destinations need the full graph's weighted degrees";
  return "";
}

namespace {

// The weighted degree of rows [begin, end) of a row's weights: a double sum in entry order,
// rounded to f32 (the CUDA twin sums in the same order).
float weighted_degree(const float* w, int64_t begin, int64_t end) {
  double d = 0;
  for (int64_t e = begin; e < end; ++e) d += w[e];
  return static_cast<float>(d);
}

}  // namespace

std::vector<float> weighted_in_degree(const CsrView& graph) {
  GALE_ASSERT(graph.weights != nullptr);
  std::vector<float> out(static_cast<size_t>(graph.rows));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, graph.rows, 4096), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i)
      out[i] = weighted_degree(graph.weights, graph.indptr[i], graph.indptr[i + 1]);
  });
  return out;
}

void graph_norms(const GraphNormsArgs& a) {
  if (const std::string why = graph_norms_cannot(a); !why.empty()) throw InputError("graph_norms: " + why);
  const CsrView& g = a.csr;
  auto norm = [](double degree) { return degree + 1.0 > 0.0 ? static_cast<float>(1.0 / std::sqrt(degree + 1.0)) : 0.0f; };
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.cols, 4096), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t j = r.begin(); j < r.end(); ++j) {
      if (j < g.rows) {
        const int64_t d = g.degree(j);
        const float n = norm(g.weights ? weighted_degree(g.weights, g.indptr[j], g.indptr[j + 1]) : static_cast<double>(d));
        a.dst_norm[j] = n;
        a.src_norm[j] = n;
        a.self_norm[j] = n * n;
        a.inv_degree[j] = d > 0 ? 1.0f / static_cast<float>(d) : 0.0f;
      } else {
        const int64_t v = a.src_ids[j];
        a.src_norm[j] = norm(g.weights ? a.full_degree[v] : static_cast<double>(a.full_indptr[v + 1] - a.full_indptr[v]));
      }
    }
  });
}

}  // namespace gale::kernels
