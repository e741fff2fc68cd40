// kernels/spmm.hpp — sparse × dense aggregation over a destination-major CSR (CPU in
// spmm_cpu.cpp; the CUDA families come beside it).
//
// One general form covers GCN, SAGE-mean, GIN-sum and their backward passes over the transpose:
//
//   out[r] (+)= row_scale[r] * sum_e col_scale[c_e] * w_e * x[c_e]  +  self_coef(r) * x[r]
//
// where e runs over row r's entries (c_e its column), w_e the optional edge weight, and
// self_coef(r) = self_scale + (self_coefs ? self_coefs[r] : 0) for r < min(rows, x.rows).
#pragma once

#include <cstdint>

#include "kernels/views.hpp"

namespace gale::kernels {

struct SpmmArgs {
  CsrView graph;                      // rows = out.rows, cols = x.rows
  ConstMatrixView x;
  MatrixView out;
  const float* row_scale = nullptr;   // per row (e.g. 1/deg for mean, GCN dst norm); null = 1
  const float* col_scale = nullptr;   // per column (GCN src norm); null = 1
  const float* edge_weight = nullptr; // per entry, in the graph's entry order; null = 1
  const float* self_coefs = nullptr;  // per row self term coefficient; null = 0
  float self_scale = 0.0f;            // uniform self term coefficient (GIN's 1 + eps)
  bool accumulate = false;            // add into out instead of overwriting
};

void spmm_cpu(const SpmmArgs& a);

// Transposes a CSR (rows x cols) into its CSC (cols x rows) with a stable counting sort:
// within each output row entries keep the input's row order. indptr_out has cols + 1 entries,
// indices_out and perm_out nnz; perm_out[k] is the input position of output entry k.
void csr_transpose(const CsrView& csr, int64_t* indptr_out, int32_t* indices_out, int64_t* perm_out);

}  // namespace gale::kernels
