// engine/graph.hpp — what a layer aggregates over: a full graph or one sampled block.
//
// Destination-major CSR (rows = destinations, in-neighbours as entries) plus, built once here,
// its transpose (CSC) for backward passes and the GCN normalisation factors. The destinations are
// the first num_dst sources (a full graph has num_dst == num_src), so a layer's self / root term
// for destination i reads source row i.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/views.hpp"

namespace gale::engine {

class GraphOperand {
 public:
  // Borrows `csr` (its arrays must outlive this object). `src_in_degree`, when given, is the
  // in-degree in the full graph of every source (size csr.cols); sources that are also
  // destinations use their degree in `csr` instead. Without it, csr.cols must equal csr.rows.
  explicit GraphOperand(kernels::CsrView csr, const std::vector<int64_t>* src_in_degree = nullptr);

  int64_t num_dst() const { return csr_.rows; }
  int64_t num_src() const { return csr_.cols; }
  const kernels::CsrView& csr() const { return csr_; }
  // Transpose: rows = sources, entries = destinations; csc_edge()[k] is the CSR position of
  // CSC entry k, so per-edge values (attention, weights) can be read in either order.
  kernels::CsrView csc() const;
  const int64_t* csc_edge() const { return csc_edge_.data(); }

  // GCN symmetric normalisation with a self loop: 1 / sqrt(in-degree + 1).
  const float* dst_norm() const { return dst_norm_.data(); }
  const float* src_norm() const { return src_norm_.data(); }
  // GCN's self-loop coefficient of each destination: dst_norm^2 = 1 / (in-degree + 1).
  const float* self_norm() const { return self_norm_.data(); }
  // SAGE mean: 1 / in-degree (0 for a destination without in-neighbours).
  const float* inv_degree() const { return inv_degree_.data(); }

 private:
  kernels::CsrView csr_;
  std::vector<int64_t> csc_indptr_;
  std::vector<int32_t> csc_indices_;
  std::vector<float> csc_weights_;
  std::vector<int64_t> csc_edge_;
  std::vector<float> dst_norm_, src_norm_, self_norm_, inv_degree_;
};

}  // namespace gale::engine
