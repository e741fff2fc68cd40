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
  return "";
}

void graph_norms(const GraphNormsArgs& a) {
  if (const std::string why = graph_norms_cannot(a); !why.empty()) throw InputError("graph_norms: " + why);
  const CsrView& g = a.csr;
  auto norm = [](int64_t degree) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(degree + 1))); };
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.cols, 4096), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t j = r.begin(); j < r.end(); ++j) {
      if (j < g.rows) {
        const int64_t d = g.degree(j);
        const float n = norm(d);
        a.dst_norm[j] = n;
        a.src_norm[j] = n;
        a.self_norm[j] = n * n;
        a.inv_degree[j] = d > 0 ? 1.0f / static_cast<float>(d) : 0.0f;
      } else {
        const int64_t v = a.src_ids[j];
        a.src_norm[j] = norm(a.full_indptr[v + 1] - a.full_indptr[v]);
      }
    }
  });
}

}  // namespace gale::kernels
