#include "engine/graph.hpp"

#include <cmath>

#include "kernels/error.hpp"
#include "kernels/spmm.hpp"

namespace gale::engine {

GraphOperand::GraphOperand(kernels::CsrView csr, const std::vector<int64_t>* src_in_degree) : csr_(csr) {
  if (src_in_degree == nullptr) GALE_ASSERT(csr.rows == csr.cols);
  if (src_in_degree != nullptr) GALE_ASSERT(static_cast<int64_t>(src_in_degree->size()) == csr.cols);
  GALE_ASSERT(csr.rows <= csr.cols);
  // Per-edge arrays (attention coefficients, weights, csc_edge) are indexed by CSR position, so
  // the CSR must start at entry 0 (a full store CSR and every sampled block do).
  GALE_ASSERT(csr.rows == 0 || csr.indptr[0] == 0);
  const int64_t nnz = csr.nnz();
  csc_indptr_.resize(static_cast<size_t>(csr.cols + 1));
  csc_indices_.resize(static_cast<size_t>(nnz));
  csc_edge_.resize(static_cast<size_t>(nnz));
  kernels::csr_transpose(csr, csc_indptr_.data(), csc_indices_.data(), csc_edge_.data());
  if (csr.weights) {
    csc_weights_.resize(static_cast<size_t>(nnz));
    for (int64_t k = 0; k < nnz; ++k) csc_weights_[k] = csr.weights[csc_edge_[k]];
  }
  dst_norm_.resize(static_cast<size_t>(csr.rows));
  src_norm_.resize(static_cast<size_t>(csr.cols));
  for (int64_t i = 0; i < csr.rows; ++i)
    dst_norm_[i] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(csr.degree(i) + 1)));
  for (int64_t j = 0; j < csr.cols; ++j) {
    if (j < csr.rows) {
      src_norm_[j] = dst_norm_[j];
    } else {
      const int64_t deg = src_in_degree ? (*src_in_degree)[j] : csr.degree(j);
      src_norm_[j] = static_cast<float>(1.0 / std::sqrt(static_cast<double>(deg + 1)));
    }
  }
  inv_degree_.resize(static_cast<size_t>(csr.rows));
  for (int64_t i = 0; i < csr.rows; ++i) {
    const int64_t d = csr.degree(i);
    inv_degree_[i] = d > 0 ? 1.0f / static_cast<float>(d) : 0.0f;
  }
  self_norm_.resize(static_cast<size_t>(csr.rows));
  for (int64_t i = 0; i < csr.rows; ++i) self_norm_[i] = dst_norm_[i] * dst_norm_[i];
}

kernels::CsrView GraphOperand::csc() const {
  return {csr_.cols, csr_.rows, csc_indptr_.data(), csc_indices_.data(),
          csc_weights_.empty() ? nullptr : csc_weights_.data()};
}

}  // namespace gale::engine
