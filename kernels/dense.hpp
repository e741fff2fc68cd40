// kernels/dense.hpp — dense helpers the layers are built from: GEMM (OpenBLAS on the CPU),
// bias, activations, dropout and the Adam update. CPU versions in dense_cpu.cpp.
//
// Elementwise ops run TBB-parallel over rows; reductions (column sums) are done per column block
// in a fixed order, so results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "kernels/views.hpp"

namespace gale::kernels {

// C = alpha * op(A) * op(B) + beta * C, row-major; op transposes when the flag is set.
// op(A) is M x K, op(B) is K x N, C is M x N.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// out[r][c] += bias[c] for every row.
void add_bias(MatrixView out, const float* bias);
// out[c] (+)= sum over rows of x[r][c]; summed in row order per column.
void column_sum(ConstMatrixView x, float* out, bool accumulate);

// out = max(x, 0); may alias.
void relu_forward(ConstMatrixView x, MatrixView out);
// grad_in = grad_out * (y > 0), where y is the forward output; may alias grad_out.
void relu_backward(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in);
// out = x > 0 ? x : exp(x) - 1 (alpha 1, as torch.nn.functional.elu); may alias.
void elu_forward(ConstMatrixView x, MatrixView out);
// grad_in = grad_out * (y > 0 ? 1 : y + 1), from the forward output y.
void elu_backward(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in);

// Inverted dropout: element (r, c) is kept when random_uniform(key, r * cols + c) >= p and then
// scaled by 1 / (1 - p). The mask is recomputed from the key in backward, never stored.
void dropout_forward(ConstMatrixView x, MatrixView out, float p, uint64_t key);
void dropout_backward(ConstMatrixView grad_out, MatrixView grad_in, float p, uint64_t key);

struct AdamParams {
  float lr = 0.01f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step = 1;  // 1-based, after incrementing
};
// torch.optim.Adam: g += wd * w; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
void adam_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamParams& p);

}  // namespace gale::kernels
