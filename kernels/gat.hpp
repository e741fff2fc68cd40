// kernels/gat.hpp — graph attention (GATConv, Veličković et al.; PyG semantics) on a CSR, with a
// self loop on every destination, computed per destination row so no E x D message tensor is
// ever formed. Only the E x heads attention coefficients are kept for backward.
//
//   s_ij = LeakyReLU(el[j,h] + er[i,h], slope)        for j in N(i) and j = i (the self loop)
//   a_ij = softmax over j of s_ij (per head)
//   out[i, h, :] = sum_j drop(a_ij) * z[j, h, :]
//
// z is sources x (heads * f), el sources x heads, er destinations x heads. Edge-valued arrays are
// in CSR entry order (E x heads) with the self loop kept apart (destinations x heads). Attention
// dropout: entry (e, h) is kept when random_uniform(key, e * heads + h) >= p, the self entry of
// row i uses counter (E + i) * heads + h.
#pragma once

#include <cstdint>

#include "kernels/views.hpp"

namespace gale::kernels {

struct GatShape {
  int64_t heads = 1;
  int64_t f = 1;            // features per head
  float slope = 0.2f;       // LeakyReLU negative slope
};

// Writes the softmax coefficients (before dropout) for every entry and self loop.
void gat_softmax_cpu(const CsrView& g, const GatShape& s, const float* el, const float* er, float* alpha,
                     float* alpha_self);

// out (destinations x heads*f) = attention-weighted sum of z rows, with attention dropout p
// (p = 0: none).
void gat_aggregate_cpu(const CsrView& g, const GatShape& s, const float* alpha, const float* alpha_self, float p,
                       uint64_t key, ConstMatrixView z, MatrixView out);

// Backward of aggregate + softmax for the destinations' gradient `grad_out`:
//   grad_z (sources x heads*f) = sum_i drop(a_ij) grad_out[i]   (over the transpose, no atomics)
//   grad_el (sources x heads), grad_er (destinations x heads): gradients of the scores' inputs.
// `csc` / `csc_edge` are the transpose of g and the CSR position of each CSC entry.
void gat_backward_cpu(const CsrView& g, const CsrView& csc, const int64_t* csc_edge, const GatShape& s,
                      const float* el, const float* er, const float* alpha, const float* alpha_self, float p,
                      uint64_t key, ConstMatrixView z, ConstMatrixView grad_out, MatrixView grad_z, float* grad_el,
                      float* grad_er);

}  // namespace gale::kernels
