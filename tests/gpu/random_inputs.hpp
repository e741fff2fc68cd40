// tests/gpu/random_inputs.hpp — the fresh random inputs the aggregation kernels' GPU tests share:
// a CSR with empty rows, hubs and rows of every length in between, and uniform values.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/random.hpp"
#include "kernels/views.hpp"

namespace gale::kernels::testing {

struct Graph {
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  int64_t nnz() const { return indptr.back(); }
  CsrView csr() const { return {rows, cols, indptr.data(), indices.data(), nullptr}; }
};

// Every fifth row empty; rows 7 and rows - 3 hubs of `hub_degree` entries; every seventh other row
// 20 to 119 entries, every thirteenth 100 to 299 (either side of the kernels' per-row thresholds);
// the rest 1 to 11. Sources drawn from all `cols` ids (repeats allowed; cols > rows is a block).
inline Graph random_graph(uint64_t key, int64_t rows, int64_t cols, int64_t hub_degree) {
  Graph g;
  g.rows = rows;
  g.cols = cols;
  g.indptr.push_back(0);
  uint64_t counter = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t degree = 1 + static_cast<int64_t>(random_below(key, counter++, 11));
    if (r % 7 == 3) degree = 20 + static_cast<int64_t>(random_below(key, counter++, 100));
    if (r % 13 == 6) degree = 100 + static_cast<int64_t>(random_below(key, counter++, 200));
    if (r % 5 == 0) degree = 0;
    if (r == 7 || r == rows - 3) degree = hub_degree;
    for (int64_t k = 0; k < degree; ++k)
      g.indices.push_back(static_cast<int32_t>(random_below(key, counter++, static_cast<uint64_t>(cols))));
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  return g;
}

inline std::vector<float> uniform(uint64_t key, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * random_uniform(key, i);
  return v;
}

}  // namespace gale::kernels::testing
