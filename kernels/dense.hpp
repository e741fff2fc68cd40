// kernels/dense.hpp — dense helpers the layers are built from: GEMM (OpenBLAS on the CPU,
// cuBLAS on the GPU), bias, activations, dropout, the Adam update and the softmax cross-entropy
// loss on the GPU. CPU versions in dense_cpu.cpp, their CUDA twins (*_cuda) in dense_cuda.cu.
//
// Elementwise ops run TBB-parallel over rows; reductions (column sums) are done per column block
// in a fixed order, so results do not depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/views.hpp"

namespace gale::kernels {

// C = alpha * op(A) * op(B) + beta * C, row-major; op transposes when the flag is set.
// op(A) is M x K, op(B) is K x N, C is M x N.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// out (in.cols x in.rows) = in transposed; out must not overlap in.
void transpose(ConstMatrixView in, MatrixView out);

// Whether the GPU's C = A B (neither transposed) should run on a transposed copy of B, as
// C = A (B^T)^T (ops::gemm and ops::gemm_bias do so, the copy a temporary of the pool). cuBLASLt's
// fastest form has both operands' depth contiguous, the layout torch.nn.Linear keeps its weight
// in; Gale's layers keep W as in x out. Measured on an H200 with cuBLAS 13.0, the heuristic's first
// algorithm each way, 2M rows: in TF32, 256 outputs of depth 256 1.55 -> 1.11 ms, of depth 100
// 1.06 -> 0.99, 48 outputs of depth 256 0.78 -> 0.60; in FP32 only narrowing products gain (256
// outputs of depth 100 3.12 -> 2.80 ms) while square ones lose 3%. Hence: at least
// kWeightTransposedRows rows (below, the two forms measured within noise of each other either
// way), a depth of at least 64 in whole 16-byte rows, B within kTransposedWeightBytes, and TF32 or
// a depth below the width. The choice depends on the shape alone, so a run repeats bit for bit.
constexpr int64_t kWeightTransposedRows = int64_t{1} << 18;
constexpr size_t kTransposedWeightBytes = size_t{4} << 20;
bool weight_transposed_first(int64_t m, int64_t n, int64_t k, bool tf32);

// out[r][c] += bias[c] for every row; add_bias_relu then applies max(., 0) in the same pass.
void add_bias(MatrixView out, const float* bias);
void add_bias_relu(MatrixView out, const float* bias);
// out[c] (+)= sum over rows of x[r][c]; summed in row order per column.
void column_sum(ConstMatrixView x, float* out, bool accumulate);

// y += alpha * x, elementwise over equal shapes (layers add a root or residual term this way).
void axpy(ConstMatrixView x, float alpha, MatrixView y);
// out[r][c] = value over the view (a column block of a wider matrix, say).
void fill_block(MatrixView out, float value);

// Operands laid side by side in one pass: out[r][c] = x[r][c - col] for the block whose columns
// [col, col + x.cols) hold c when r < x.rows, else 0. Blocks must not overlap and must lie within
// out's columns; at most kMaxSideBySide of them. Where a layer built such an operand from a copy
// per block and a fill per gap (one launch each on a GPU), this is one.
struct ColumnBlock {
  ConstMatrixView x;
  int64_t col = 0;
};
constexpr int kMaxSideBySide = 4;
void side_by_side(const ColumnBlock* blocks, int count, MatrixView out);

// out = max(x, 0); may alias.
void relu_forward(ConstMatrixView x, MatrixView out);
// grad_in = grad_out * (y > 0), where y is the forward output; may alias grad_out.
void relu_backward(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in);
// ReLU's backward needs only where the output was positive: one bit per element, so a model keeps
// 1/32 of an activation for it. Row r's words start at r * relu_mask_words(cols); bit c % 32 of
// word c / 32 is (y[r][c] > 0).
inline int64_t relu_mask_words(int64_t cols) { return (cols + 31) / 32; }
void relu_mask(ConstMatrixView y, uint32_t* bits);
// grad_in = grad_out where the mask bit is set, else 0; may alias grad_out.
void relu_backward_mask(ConstMatrixView grad_out, const uint32_t* bits, MatrixView grad_in);

// out = x > 0 ? x : exp(x) - 1 (alpha 1, as torch.nn.functional.elu); may alias.
void elu_forward(ConstMatrixView x, MatrixView out);
// grad_in = grad_out * (y > 0 ? 1 : y + 1), from the forward output y.
void elu_backward(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in);

// Inverted dropout: element (r, c) is kept when random_uniform(key, r * cols + c) >= p and then
// scaled by 1 / (1 - p). The mask is recomputed from the key in backward, never stored.
void dropout_forward(ConstMatrixView x, MatrixView out, float p, uint64_t key);
void dropout_backward(ConstMatrixView grad_out, MatrixView grad_in, float p, uint64_t key);

// Batch normalisation (torch.nn.BatchNorm1d over the rows: one mean and variance per column).
// Training statistics in one pass: per column the sums of x and of x^2 in double (the square of a
// float is exact there), in a fixed order; mean = sum / rows and the biased var = sum of squares /
// rows - mean^2 (never below 0), computed in double.
void batch_norm_stats(ConstMatrixView x, float* mean, float* var);
// y = (x - mean) * s + beta with s = gamma / sqrt(var + eps) per column (float), then max(y, 0)
// when relu; may alias. With the batch's statistics in training, the running ones in inference.
void batch_norm_apply(ConstMatrixView x, const float* mean, const float* var, float eps, const float* gamma,
                      const float* beta, bool relu, MatrixView y);
// Backward through batch_norm_apply with the batch's own statistics (which depend on x). With
// invstd = 1 / sqrt(var + eps) and xhat = (x - mean) * invstd per column, sum_g = sum_r grad_out and
// sum_gx = sum_r grad_out * xhat (double, then float): grad_gamma += sum_gx, grad_beta += sum_g,
// grad_x = gamma * invstd / rows * (rows * grad_out - sum_g - xhat * sum_gx). grad_x may alias grad_out.
// With relu_bits (relu_mask's layout, of the normalised output's ReLU), grad_out is first taken
// through ReLU's backward: zero where the bit is clear, in the same passes.
void batch_norm_backward(ConstMatrixView grad_out, ConstMatrixView x, const float* mean, const float* var, float eps,
                         const float* gamma, const uint32_t* relu_bits, float* grad_gamma, float* grad_beta,
                         MatrixView grad_x);
// running = (1 - momentum) * running + momentum * batch for `cols` columns; the variance enters
// unbiased (times rows / (rows - 1); as it is for one row), as torch does.
void batch_norm_update_running(const float* mean, const float* var, int64_t rows, float momentum, float* running_mean,
                               float* running_var, int64_t cols);

struct AdamParams {
  float lr = 0.01f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step = 1;  // 1-based, after incrementing
};
// Mean softmax cross-entropy over the n_rows logits rows listed in `rows` (labels indexed by logits
// row); log-sum-exp shifted by the row maximum, in double. grad (null data: no gradient) gets
// d loss / d logits for every row: zero for rows not listed, k contributions for a row listed k
// times (torch's cross_entropy over an index with repeats). `correct`, when non-null, counts the
// listed rows whose first maximum is the label. Rows and labels must be in range. grad_over > 0:
// the gradient is that of the sum over the listed rows divided by grad_over instead of n_rows (a
// data-parallel worker's share of a step's mean over all workers' rows); the loss stays the mean.
double softmax_cross_entropy_cpu(ConstMatrixView logits, const int32_t* labels, const int64_t* rows, int64_t n_rows,
                                 MatrixView grad, int64_t* correct, int64_t grad_over = 0);
// Its seeds form, twin of softmax_cross_entropy_seeds_cuda: every logits row listed once, in order,
// row i's label labels[label_ids[i]] (labels[i] without ids). Ids and labels must be in range.
double softmax_cross_entropy_seeds_cpu(ConstMatrixView logits, const int32_t* labels, const int64_t* label_ids,
                                       MatrixView grad, int64_t* correct, int64_t grad_over = 0);

// torch.optim.Adam: g += wd * w; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
void adam_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamParams& p);

// One tensor of a step over several: weights, gradient, moments, element count.
struct AdamTensor {
  float* w;
  const float* g;
  float* m;
  float* v;
  int64_t n;
};

}  // namespace gale::kernels

// The CUDA twins. Declared without CUDA headers so CPU-only code can include this file; the types
// are forward-declared exactly as cuda_runtime_api.h and cublas_api.h declare them.
struct CUstream_st;
typedef CUstream_st* cudaStream_t;  // NOLINT: must match cuda_runtime_api.h exactly
struct cublasContext;
typedef cublasContext* cublasHandle_t;  // NOLINT: must match cublas_api.h exactly

namespace gale::kernels {

// Every pointer and view below is in device memory. The ops are stream-ordered and never
// synchronise the host; each matches its CPU twin above (same arguments, same semantics) and
// draws the same random numbers, so a run can move between CPU and GPU.

// Twin of gemm, on the stream the handle is bound to (cuda::CublasHandle binds one for life).
// tf32 = false computes in full FP32 (close to OpenBLAS, ~1e-6 relative); tf32 = true lets cuBLAS
// round the inputs to TF32 on the tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32: ~8x the FP32 rate
// on Hopper, ~1e-3 relative error), a choice the caller makes per layer.
// With `workspace` (the handle's) the product goes through cuBLASLt, with one algorithm per size
// class of problems (the heuristic asked once per class: sampled blocks change their row counts
// every batch, and each question costs tens of microseconds of host time), tuned when GEMM tuning
// is on (below); without, or when cuBLASLt has no algorithm, through cublasGemmEx.
void gemm_cuda(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
               bool tf32 = false, void* workspace = nullptr, size_t workspace_bytes = 0);

// GEMM tuning (process-wide, off by default; `--tune-gemm`). cuBLASLt's heuristic does not always
// put its fastest candidate first: for Gale's full-graph shapes on an H100 (2M x 256 outputs,
// TF32) its first pick took 3.65 / 2.31 / 1.59 ms at depth 512 / 256 / 100 where its third took
// 2.18 / 1.56 / 1.09. With tuning on, a product of at least kGemmTuneMacs multiply-adds and
// beta = 0, seen a second time in the same size class, layout and alignment (full-graph training
// repeats its shapes every epoch), times the heuristic's first
// kGemmTuneCandidates candidates on its own operands (beta = 0 makes the reruns harmless; the host
// waits for them once) and keeps the fastest, the lowest-ranked within 2% of it, for that shape
// from then on (beta != 0 calls of the shape too). Which candidate wins can differ between runs
// when two are that close, and different algorithms round differently: runs that must repeat bit
// for bit leave tuning off.
constexpr double kGemmTuneMacs = 4.0e9;
constexpr int kGemmTuneCandidates = 8;
void set_gemm_tuning(bool on);
bool gemm_tuning();

// c = op(a) op(b) + beta c + bias (one value per column of the row-major c), then ReLU when
// relu: gemm_cuda then add_bias(_relu)_cuda in one cuBLASLt call (the bias epilogue), so the
// product makes one trip through memory. `workspace` is the handle's (cuBLAS and cuBLASLt calls
// on one stream may share it). Returns false, having done nothing, when cuBLASLt offers no
// algorithm for the shape (or bias is null, or k is 0): the caller then does the two steps.
bool gemm_bias_cuda(cublasHandle_t handle, void* workspace, size_t workspace_bytes, bool trans_a, bool trans_b,
                    int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                    float* c, int64_t ldc, const float* bias, bool relu, bool tf32 = false);

void transpose_cuda(ConstMatrixView in, MatrixView out, cudaStream_t stream);
void add_bias_cuda(MatrixView out, const float* bias, cudaStream_t stream);
void add_bias_relu_cuda(MatrixView out, const float* bias, cudaStream_t stream);
void axpy_cuda(ConstMatrixView x, float alpha, MatrixView y, cudaStream_t stream);
// One thread per element or four (16-byte stores where aligned): a narrow column block of many
// rows (2 floats of 2M rows) takes ~0.02 ms where cudaMemset2DAsync took 0.67.
void fill_block_cuda(MatrixView out, float value, cudaStream_t stream);
void side_by_side_cuda(const ColumnBlock* blocks, int count, MatrixView out, cudaStream_t stream);
// Deterministic: each column is reduced over rows in double in an order fixed by the shape alone
// (no atomics), so two calls give bit-identical results on any GPU. Rows are summed in chunks in
// parallel and the chunks' partial sums added in order, in a workspace (CUB style: the caller
// allocates it, e.g. from the pool) of column_sum_workspace_bytes(x.rows, x.cols) bytes, 8-byte
// aligned, not reused until the stream has passed this call.
size_t column_sum_workspace_bytes(int64_t rows, int64_t cols);
void column_sum_cuda(ConstMatrixView x, float* out, bool accumulate, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream);

void relu_forward_cuda(ConstMatrixView x, MatrixView out, cudaStream_t stream);
void relu_backward_cuda(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in, cudaStream_t stream);
void relu_mask_cuda(ConstMatrixView y, uint32_t* bits, cudaStream_t stream);
void relu_backward_mask_cuda(ConstMatrixView grad_out, const uint32_t* bits, MatrixView grad_in, cudaStream_t stream);
// The same, and sums = its output's column sums (the bias gradient of the layer below the ReLU) from
// the values it writes: column_sum_cuda's two passes and workspace (column_sum_workspace_bytes),
// the first of them writing grad_in as it reads; deterministic like column_sum_cuda.
void relu_backward_mask_sum_cuda(ConstMatrixView grad_out, const uint32_t* bits, MatrixView grad_in, float* sums,
                                 void* workspace, size_t workspace_bytes, cudaStream_t stream);
// column_sum_cuda over a matrix written in row panels (ops::gemm_in_place), in its two passes: a
// panel of rows [first_row, first_row + rows) of a total_rows-row matrix (first_row a multiple of
// column_sum_chunk_rows(total_rows)) gets relu_backward_cuda's values written to grad_in (which may
// be grad_out; the three views hold just the panel's rows) and their pass-1 sums put in the
// workspace (column_sum_workspace_bytes(total_rows, cols)); after the last panel
// column_sum_finish_cuda writes out (+)= the sums: bit for bit column_sum_cuda of the whole.
int64_t column_sum_chunk_rows(int64_t total_rows);
void relu_backward_sum_rows_cuda(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in, int64_t first_row,
                                 int64_t total_rows, void* workspace, size_t workspace_bytes, cudaStream_t stream);
void column_sum_finish_cuda(int64_t total_rows, int64_t cols, float* out, bool accumulate, const void* workspace,
                            size_t workspace_bytes, cudaStream_t stream);
// Twins of the batch normalisation ops, deterministic like column_sum_cuda (the same reductions,
// the statistics' two sums and the backward's two in one pass each), in a workspace of batch_norm_workspace_bytes(x.rows, x.cols) bytes (8-byte aligned, not reused
// until the stream has passed the call).
size_t batch_norm_workspace_bytes(int64_t rows, int64_t cols);
void batch_norm_stats_cuda(ConstMatrixView x, float* mean, float* var, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream);
void batch_norm_apply_cuda(ConstMatrixView x, const float* mean, const float* var, float eps, const float* gamma,
                           const float* beta, bool relu, MatrixView y, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream);
void batch_norm_backward_cuda(ConstMatrixView grad_out, ConstMatrixView x, const float* mean, const float* var,
                              float eps, const float* gamma, const uint32_t* relu_bits, float* grad_gamma,
                              float* grad_beta, MatrixView grad_x, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream);
void batch_norm_update_running_cuda(const float* mean, const float* var, int64_t rows, float momentum,
                                    float* running_mean, float* running_var, int64_t cols, cudaStream_t stream);
void elu_forward_cuda(ConstMatrixView x, MatrixView out, cudaStream_t stream);
void elu_backward_cuda(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in, cudaStream_t stream);

// Masks bit-identical to dropout_forward / dropout_backward for the same key.
void dropout_forward_cuda(ConstMatrixView x, MatrixView out, float p, uint64_t key, cudaStream_t stream);
void dropout_backward_cuda(ConstMatrixView grad_out, MatrixView grad_in, float p, uint64_t key,
                           cudaStream_t stream);

// Same float operations in the same order as adam_update, without FMA contraction.
void adam_update_cuda(float* w, const float* g, float* m, float* v, int64_t n, const AdamParams& p,
                      cudaStream_t stream);
// adam_update_cuda over several tensors, element for element the same arithmetic, in one launch per
// kAdamTensorsPerLaunch tensors (a model's step in one launch instead of one per parameter).
constexpr int kAdamTensorsPerLaunch = 32;
void adam_update_many_cuda(const AdamTensor* tensors, int count, const AdamParams& p, cudaStream_t stream);
// Zeroes several float arrays, kAdamTensorsPerLaunch to a launch (a model's gradients at once).
void zero_many_cuda(float* const* data, const int64_t* counts, int count, cudaStream_t stream);

// Device scratch softmax_cross_entropy_cuda needs (CUB style: the caller allocates it, e.g. a
// DeviceBuffer<uint8_t> from the MemoryPool, so it is charged to the budget): one double loss and
// one int32 hit per listed row or per logits row, whichever are more, and one int32 multiplicity
// per logits row.
size_t softmax_cross_entropy_workspace_bytes(int64_t logits_rows, int64_t n_rows);

// Twin of softmax_cross_entropy_cpu: mean softmax cross-entropy over the n_rows
// logits rows listed in `rows` (labels indexed by logits row).
//   *loss_out (device double) = the mean loss; 0 when n_rows is 0.
//   *correct_out (device int64, may be null) = how many listed rows are argmax-correct (the first
//     maximum wins ties, as on the CPU).
//   grad (may have null data: no gradient) = d loss / d logits, written for EVERY row: zero for
//     rows not listed, and a row listed k times gets k contributions, as the CPU accumulates.
// Rows' losses are summed in double in a fixed order, so the loss is deterministic. A listed row or
// its label out of range makes the loss NaN (the kernel cannot throw) instead of reading out of
// bounds. `workspace` holds softmax_cross_entropy_workspace_bytes(logits.rows, n_rows) bytes,
// 256-byte aligned as the pool returns, and must not be reused until the stream has passed this call.
// grad_over: as the CPU's.
void softmax_cross_entropy_cuda(ConstMatrixView logits, const int32_t* labels, const int64_t* rows, int64_t n_rows,
                                MatrixView grad, double* loss_out, int64_t* correct_out, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream, int64_t grad_over = 0);

// A training step's loss in two launches: every logits row is a seed, listed once in order (rows 0
// .. logits.rows - 1), and row i's label is labels[label_ids[i]] (labels[i] when label_ids is null),
// read straight from the whole graph's labels (n_labels of them) by the batch's seed ids. The same
// outputs as softmax_cross_entropy_cuda over those rows and gathered labels (grad required), bit for
// bit; an id or label out of range makes the loss NaN and that row's gradient zero. The workspace:
// softmax_cross_entropy_workspace_bytes(logits.rows, logits.rows).
void softmax_cross_entropy_seeds_cuda(ConstMatrixView logits, const int32_t* labels, const int64_t* label_ids,
                                      int64_t n_labels, MatrixView grad, double* loss_out, int64_t* correct_out,
                                      void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                      int64_t grad_over = 0);

}  // namespace gale::kernels
