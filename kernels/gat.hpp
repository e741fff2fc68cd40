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
//
// CPU versions (*_cpu, gat_cpu.cpp) are the reference; the CUDA twins (*_cuda, gat_cuda.cu) take the
// same arguments with every pointer (views, CSR arrays, el/er, alpha) in device memory, plus a
// stream. They never synchronise, draw the same dropout masks bit for bit, and follow fuseGNN's GAR
// abstraction (Sec. 4-6): one warp per destination row over the CSR forward, one per source over
// the CSC backward (a block for rows of more than kGatLongRow entries), reductions in registers and
// shared memory, no atomics.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/views.hpp"

namespace gale::kernels {

struct GatShape {
  int64_t heads = 1;
  int64_t f = 1;            // features per head
  float slope = 0.2f;       // LeakyReLU negative slope
};

// Attention scores of the first `rows` rows of z: scores[j,h] = sum_k z[j, h*f + k] * att[h*f + k]
// (PyG's alpha_src / alpha_dst, (x W).view(-1, H, F) * att).sum(-1)); scores is rows x heads.
void gat_scores_cpu(ConstMatrixView z, const GatShape& s, const float* att, int64_t rows, float* scores);
// Backward of gat_scores over the first `rows` rows, accumulating:
//   grad_z[j, h*f + k] += grad_scores[j,h] * att[h*f + k]
//   grad_att[h*f + k]  += sum_j grad_scores[j,h] * z[j, h*f + k]   (summed over j in row order)
void gat_scores_backward_cpu(ConstMatrixView z, const GatShape& s, const float* att, int64_t rows,
                             const float* grad_scores, MatrixView grad_z, float* grad_att);

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

// The CUDA twins. Declared without CUDA headers so CPU-only code can include this file.
struct CUstream_st;
typedef CUstream_st* cudaStream_t;  // NOLINT: must match cuda_runtime_api.h exactly
struct cublasContext;
typedef cublasContext* cublasHandle_t;  // NOLINT: must match cublas_api.h exactly

namespace gale::kernels {

// Twins of gat_scores_cpu / gat_scores_backward_cpu on the stream the cuBLAS handle is bound to:
// per-head dot products are strided batched GEMVs and the grad_z update one rank-1 update per head,
// so no new kernel is needed and the reductions are cuBLAS's (deterministic for a given GPU).
void gat_scores_cuda(cublasHandle_t handle, ConstMatrixView z, const GatShape& s, const float* att, int64_t rows,
                     float* scores);
void gat_scores_backward_cuda(cublasHandle_t handle, ConstMatrixView z, const GatShape& s, const float* att,
                              int64_t rows, const float* grad_scores, MatrixView grad_z, float* grad_att);

// CUDA kernels stage heads x entries coefficients per warp in shared memory; more heads than this
// are refused with an InputError (GATs use 1 to 16).
constexpr int64_t kGatCudaMaxHeads = 512;

// gat_forward_cuda and gat_backward_cuda give the rows (and, in backward, the transpose's rows) of
// more than this many entries a block each instead of a warp: a power-law graph's hubs would
// otherwise leave one warp walking up to ~10^5 entries while the rest of the GPU idles.
// (gat_softmax_cuda and gat_aggregate_cuda keep a warp per row.)
constexpr int64_t kGatLongRow = 512;

// Twin of gat_softmax_cpu.
void gat_softmax_cuda(const CsrView& g, const GatShape& s, const float* el, const float* er, float* alpha,
                      float* alpha_self, cudaStream_t stream);

// Twin of gat_aggregate_cpu: reads the alpha written by gat_softmax_cuda.
void gat_aggregate_cuda(const CsrView& g, const GatShape& s, const float* alpha, const float* alpha_self, float p,
                        uint64_t key, ConstMatrixView z, MatrixView out, cudaStream_t stream);

// gat_softmax_cuda followed by gat_aggregate_cuda in one kernel (fuseGNN Sec. 5.1): the softmax
// statistics stay in registers and the coefficients go straight into the weighted sum; alpha and
// alpha_self are still written because backward needs them. Same results as the two calls.
void gat_forward_cuda(const CsrView& g, const GatShape& s, const float* el, const float* er, float p, uint64_t key,
                      ConstMatrixView z, float* alpha, float* alpha_self, MatrixView out, cudaStream_t stream);

// Device scratch that gat_backward_cuda needs (CUB style: the caller allocates it, e.g. a
// DeviceBuffer<uint8_t> from the MemoryPool, so it is charged to the budget): the per-entry score
// gradients, nnz x heads floats, plus dst_rows x heads for the self loops. nnz is passed because
// a device CsrView's indptr cannot be read on the host.
size_t gat_backward_workspace_bytes(int64_t nnz, int64_t dst_rows, const GatShape& s);

// Twin of gat_backward_cpu with the same two phases: per destination (score gradients into the
// workspace, grad_er), then per source over the CSC (grad_z, grad_el). `workspace` holds at least
// gat_backward_workspace_bytes(nnz, g.rows, s) bytes (256-byte aligned, as the pool returns) and
// must not be reused until the stream has passed this call.
void gat_backward_cuda(const CsrView& g, const CsrView& csc, const int64_t* csc_edge, const GatShape& s,
                       const float* el, const float* er, const float* alpha, const float* alpha_self, float p,
                       uint64_t key, ConstMatrixView z, ConstMatrixView grad_out, MatrixView grad_z, float* grad_el,
                       float* grad_er, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace gale::kernels
