// engine/ops.hpp — the ops layers, the model and the trainer are written in. Each takes tensors,
// runs on their device — the CPU reference or its CUDA twin from kernels/, on the device's compute
// stream — and checks that every operand lives on that one device. Outputs are allocated on the same
// device (from its budgeted pool); nothing here synchronises the host except where a result must
// come back to it (the loss).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.hpp"
#include "kernels/dense.hpp"
#include "kernels/maxk.hpp"
#include "kernels/spmm.hpp"

namespace gale::engine::ops {

// How the compute ops run, chosen by the user (`--spmm`, `--tf32`) and passed down, never inlined.
struct ExecOptions {
  kernels::SpmmKind spmm = kernels::SpmmKind::kAuto;  // CUDA aggregation kernel family
  bool tf32 = false;                                 // cuBLAS GEMMs on TF32 tensor cores
  // SAGE's side-by-side operands that cost memory (`--stack-operands`): a first layer on a constant
  // input keeps [A x | x] and multiplies it by [W; W_root] in one GEMM, forward and backward (one
  // more copy of the input on the device); a hidden layer on a MaxK input forms both input-gradient
  // terms, grad [W; W_root]^T, in one GEMM (a 2 x in wide gradient until MaxK's backward).
  bool stack_operands = false;
  // spmm == kSampled (`--spmm sampled:S[:bucket]`, inference only): ES-SpMM's sample width and
  // strategy for the whole-graph aggregations of GCN, SAGE and GIN (CPU and GPU).
  int64_t spmm_sample_width = 0;
  kernels::SpmmSampling spmm_sampling = kernels::SpmmSampling::kFastRand;
  // --deterministic: spmm == kAuto lets only deterministic kernels compete (engine/spmm_auto.hpp).
  bool deterministic = false;
};

// ---- per-op-kind timing (gale bench train) ----------------------------------------------------

enum class OpKind { kAggregation, kGemm, kOther };
constexpr int kOpKinds = 3;

// What an op must do, for the epoch's lower bound (engine/roofline.hpp): the fields of its kind,
// the rest zero. A GEMM's product (op(a) m x k, op(b) k x n); an aggregation's destination rows,
// graph entries, feature width and edge-value bytes (4 with edge weights, else 0); another op's
// bytes read and written at least once. An op left all zero counts nothing in the bound.
struct OpShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t rows = 0, nnz = 0, width = 0, value_bytes = 0;
  double bytes = 0;
};

// While alive, collects the time of every op the calling thread issues, by kind: on a CUDA device
// the GPU time between events recorded around the op on the compute stream (ops run in stream
// order, so the kinds add up to the stream's busy time), on the CPU the wall time. Costs two
// events per op; without a live profile OpTimer does nothing.
class OpProfile {
 public:
  OpProfile();
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;
  // Milliseconds per kind of the ops finished so far; waits for the device.
  double ms(OpKind kind);
  // Per op name and shape (a GEMM's or an aggregation's; other ops by name alone): total
  // milliseconds and calls, largest first; waits for the device.
  struct Entry {
    std::string name;
    OpKind kind;
    double ms = 0;
    int64_t calls = 0;
    OpShape shape;  // one call's; `bytes` the mean of the calls'
    // On a GPU: milliseconds the stream sat with nothing to run between the previous op's end and
    // each call's start (the host late, or the stream waiting for another: a gather, the sums).
    double gap_ms = 0;
  };
  std::vector<Entry> table();
  void reset();

  struct Impl;

  // Makes `profile` the calling thread's live one until the scope ends, then restores the one
  // before: for a pipeline stage that may run on any thread of a pool.
  class Scope {
   public:
    explicit Scope(OpProfile* profile);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Impl* previous_;
  };

 private:
  std::unique_ptr<Impl> impl_;
};

// Marks one op for the live OpProfile, if any (RAII: from construction to destruction). `name`
// names the op (and its shape, where it matters) in OpProfile::table; `shape` is what the
// roofline counts for it.
class OpTimer {
 public:
  OpTimer(OpKind kind, const Device& device, std::string name, const OpShape& shape = {});
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  OpProfile::Impl* profile_;
  size_t slot_ = 0;
};

// ---- ops ---------------------------------------------------------------------------------------

// GPU GEMMs choose among cuBLASLt's candidates by timing them once per large repeated shape
// (kernels::set_gemm_tuning; `--tune-gemm`). Process-wide; no effect on the CPU.
void set_gemm_tuning(bool on);

// c = op(a) op(b) + beta c, op transposing when the flag is set. c must be allocated with the
// product's shape (beta = 0 overwrites it).
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float beta, Tensor* c, bool tf32);
// a b as a new tensor.
Tensor matmul(const Tensor& a, const Tensor& b, bool tf32);
// c = a b + beta c + bias (1 x cols), then ReLU when relu: gemm and add_bias in one pass where the
// device can (cuBLASLt's bias epilogue on a GPU), else one after the other.
void gemm_bias(const Tensor& a, const Tensor& b, float beta, Tensor* c, const Tensor& bias, bool relu, bool tf32);

void add_bias(Tensor* y, const Tensor& bias, bool relu = false);  // y[r] += bias (then ReLU, one pass)
void column_sum(const Tensor& x, Tensor* out, bool accumulate);  // out (1 x cols) (+)= sum of rows
// out += x's column sums: `sums` when the pass that wrote x made them (a bias gradient handed over
// by Layer::give_output_grad_sums), else summed from x.
void add_column_sums(const Tensor& x, const Tensor* sums, Tensor* out);
void axpy(const Tensor& x, float alpha, Tensor* y);              // y += alpha x
void zero(Tensor* t);
// Zeroes f32 tensors of one device (a model's gradients): one launch on a GPU.
void zero_many(const std::vector<Tensor*>& tensors);
void copy(const Tensor& src, Tensor* dst);  // same shape and dtype, same device
// y += alpha x[:, col, col + y.cols()) over y's rows (x.rows() == y.rows()): a column block of a
// side-by-side operand handed back.
void axpy_columns(const Tensor& x, int64_t col, float alpha, Tensor* y);
// y = x[:, col, col + y.cols()) over y's rows (x.rows() == y.rows(), f32): a column block of a
// side-by-side product taken out as a tensor of its own.
void copy_columns(const Tensor& x, int64_t col, Tensor* y);
// A new rows x cols f32 tensor on `device` holding each block's tensor at its rows [0, src->rows())
// and columns [col, col + src->cols()), zero everywhere else (kernels::side_by_side): operands
// laid side by side, or padded with zero rows or columns, in one pass, one launch on a GPU. Blocks
// must not overlap; at most kernels::kMaxSideBySide.
struct PlacedBlock {
  const Tensor* src = nullptr;
  int64_t col = 0;
};
Tensor side_by_side(int64_t rows, int64_t cols, std::initializer_list<PlacedBlock> blocks, const Device& device);
// out[i] = src[ids[i]] for every row id (i64, n x 1) of a 4-byte dtype (f32 or i32), bit for bit.
Tensor gather_rows(const Tensor& src, const Tensor& ids);
// a <- a op(b) for a square op(b) (cols x cols), in place: row panels go through a scratch of at
// most panel_rows rows (0: as many as fit in kGemmPanelBytes), so the product needs no second
// a-sized tensor. With relu_of (a's shape), each panel is written back through ReLU's backward
// (kept where relu_of > 0, else 0), which then costs no pass of its own. With column_sums (1 x
// cols) also = the column sums of what is written (the bias gradient of the layer below the
// ReLU): bit for bit column_sum of the result, summed on a GPU by the passes that write the
// panels (panels then of whole column_sum chunks, kernels::column_sum_chunk_rows).
constexpr int64_t kGemmPanelBytes = int64_t{256} << 20;
void gemm_in_place(Tensor* a, const Tensor& b, bool trans_b, bool tf32, int64_t panel_rows = 0,
                   const Tensor* relu_of = nullptr, Tensor* column_sums = nullptr);

void relu(const Tensor& x, Tensor* out);  // may alias
void relu_backward(const Tensor& grad_out, const Tensor& y, Tensor* grad_in);
// One bit per element of y > 0 (kernels/dense.hpp's layout), as a rows x words i32 tensor: what
// ReLU's backward needs, at 1/32 of the activation's memory.
Tensor relu_mask(const Tensor& y);
// grad_in (may alias grad_out) = grad_out where the mask bit is set, else 0. With column_sums
// (1 x cols): also = grad_in's column sums (the bias gradient of the layer below), summed from
// the values written in the same pass on a GPU.
void relu_backward_mask(const Tensor& grad_out, const Tensor& mask, Tensor* grad_in, Tensor* column_sums = nullptr);
void elu(const Tensor& x, Tensor* out);
void elu_backward(const Tensor& grad_out, const Tensor& y, Tensor* grad_in);
// Batch normalisation over x's rows, one mean and variance per column (kernels/dense.hpp): the
// batch's statistics (mean and biased var, 1 x cols each; x has at least one row); y (may alias x)
// = (x - mean) / sqrt(var + eps) * gamma + beta with given statistics, then ReLU when relu; the backward through the
// batch's own statistics, accumulating gamma's and beta's gradients (grad_x may alias grad_out;
// with relu_mask, relu_mask's bits of the normalised output, ReLU's backward first, in its passes);
// and the running statistics' update from a batch of `rows` rows.
void batch_norm_stats(const Tensor& x, Tensor* mean, Tensor* var);
void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& var, float eps, const Tensor& gamma,
                      const Tensor& beta, bool relu, Tensor* y);
void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& var, float eps,
                         const Tensor& gamma, const Tensor* relu_mask, Tensor* grad_gamma, Tensor* grad_beta,
                         Tensor* grad_x);
void batch_norm_update_running(const Tensor& mean, const Tensor& var, int64_t rows, float momentum,
                               Tensor* running_mean, Tensor* running_var);
void dropout(const Tensor& x, Tensor* out, float p, uint64_t key);
void dropout_backward(const Tensor& grad_out, Tensor* grad_in, float p, uint64_t key);

// SpMM with spmm.hpp's general form; every pointer in `a` lives on `device`. On CUDA `kind`
// picks the kernel family (a.nnz must be set for kAuto). When it comes to GAR and x's rows do not
// suit its gathers (kernels::spmm_gar_padded_ld: a width of 100 or 47 in a dense tensor), x is
// first copied into padded rows (a temporary, charged to the budget): the copy costs far less
// than gathers that straddle cache lines or cannot be 16 bytes wide. An output mask (a.out_mask,
// relu_mask_words(width) words a row) is applied by every kind: by GAR and the CPU twins in the
// kernel, by the other CUDA kinds in a pass of their own after it.
void spmm(const kernels::SpmmArgs& a, const Device& device, kernels::SpmmKind kind);

void adam_update(Tensor* w, const Tensor& g, Tensor* m, Tensor* v, const kernels::AdamParams& p);
// adam_update over several parameters of one device, with the same arithmetic: one launch on a GPU.
struct AdamSlot {
  Tensor* w;
  const Tensor* g;
  Tensor* m;
  Tensor* v;
};
void adam_update_many(const std::vector<AdamSlot>& slots, const kernels::AdamParams& p);

// ---- MaxK (kernels/maxk.hpp) -------------------------------------------------------------------

// MaxK's output in CBSR form: exactly k kept values per row and their columns.
struct Cbsr {
  Tensor values;      // rows x k, f32
  Tensor index;       // rows x (k * kernels::cbsr_index_bytes(width)) bytes (u8): uint8 or uint16 columns
  int64_t width = 0;  // the dense width the columns index into
  int64_t rows() const { return values.rows(); }
  int64_t k() const { return values.cols(); }
  const Device& device() const { return values.device(); }
  kernels::CbsrView view();
  kernels::ConstCbsrView view() const;
};
// The k largest values of every row of y (ties to the lower column). With `dense` (y.rows x y.cols,
// and it may be y itself) the dense form too, as cbsr_to_dense would write it, in the same pass;
// with a col_offset, into columns [col_offset, col_offset + y.cols) of a wider dense (not y),
// whose other columns are left as they are.
Cbsr maxk(const Tensor& y, int64_t k, Tensor* dense = nullptr, int64_t col_offset = 0);
// Columns [col_offset, col_offset + width) of out (rows x at least that many columns) = the dense
// form: kept values in place, zeros elsewhere; out's other columns are left as they are.
void cbsr_to_dense(const Cbsr& c, Tensor* out, int64_t col_offset = 0);
// Dropout on the kept values with the masks dropout() draws for the same key on the dense form.
void cbsr_dropout(Cbsr* c, float p, uint64_t key);
// grad_in = at kept positions (grad_dense) + (grad_values), 0 elsewhere; either may be null.
// With column_sums (1 x width): also = the column sums of grad_in (the bias gradient of the layer
// that produced MaxK's input), made on a GPU by the same pass from the values it writes
// (kernels/maxk.hpp), not by reading the mostly-zero grad_in again.
void maxk_backward(const Cbsr& pattern, const Tensor* grad_values, const Tensor* grad_dense, Tensor* grad_in,
                   Tensor* column_sums = nullptr);
// The same with grad_values (pattern.rows x k floats) and grad_dense (a view: a column block of a
// wider tensor allowed) on grad_in's device; either may be null / empty.
void maxk_backward(const Cbsr& pattern, const float* grad_values, kernels::ConstMatrixView grad_dense, Tensor* grad_in,
                   Tensor* column_sums = nullptr);
// The first `rows` rows of c (a sampled block's destinations), sharing its storage.
Cbsr cbsr_rows(const Cbsr& c, int64_t rows);
// Whether cbsr_gemm and cbsr_gemm_grad take a width x n W (terms of them) on this device: always
// on the CPU; on a GPU while W fits in shared memory (a narrowing layer's). Otherwise a layer uses
// the dense form and GEMMs.
bool cbsr_gemm_fits(const Device& device, int64_t width, int64_t n, int terms);
// out = x W + beta * out for a CBSR x: the dense layer after MaxK without the dense input. With w2
// and out2, also out2 = x[0, out2 rows) W2 + beta * out2 from the same reads of x (a SAGE layer's
// root term on its destinations).
void cbsr_gemm(const Cbsr& x, const Tensor& w, float beta, Tensor* out, const Tensor* w2 = nullptr,
               Tensor* out2 = nullptr);
// grad_in (dense, pattern.rows x width) = sum over the terms of grad W^T, at pattern's kept
// positions only (MaxK's backward folded in), 0 elsewhere. A term's grad may have fewer rows.
// column_sums as for maxk_backward.
void cbsr_gemm_grad(const Cbsr& pattern, const std::vector<std::pair<Tensor, Tensor>>& terms, Tensor* grad_in,
                    Tensor* column_sums = nullptr);
// The CBSR aggregations; `groups` is the graph's edge-group table on a GPU (ignored on the CPU).
void spgemm(const kernels::SpgemmCbsrArgs& a, const Device& device, const kernels::EdgeGroupsView& groups);
void sspmm(const kernels::SspmmCbsrArgs& a, const Device& device, const kernels::EdgeGroupsView& groups);

struct LossResult {
  double loss = 0;      // mean over the listed rows
  int64_t correct = 0;  // listed rows whose argmax is the label
};
// Softmax cross-entropy over the logits rows listed in `rows` (i64 ids, n x 1), labels indexed by
// logits row (i32, logits.rows x 1), all on the logits' device. grad (may be null) receives
// d loss / d logits for every row. Waits for the device to return the two numbers.
// grad_over > 0: the gradient is the sum's over grad_over rows instead of the mean's over `rows`
// (kernels::softmax_cross_entropy_cpu; a data-parallel worker's share of its step).
LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& rows, Tensor* grad,
                                 int64_t grad_over = 0);
// The same without waiting: the mean loss (f64) and the hit count (i64) are written in stream order
// to bytes [16 slot, 16 slot + 16) of `results` (a u8 tensor on the logits' device), to be read
// once for many batches (a training step then never blocks the host).
void softmax_cross_entropy_async(const Tensor& logits, const Tensor& labels, const Tensor& rows, Tensor* grad,
                                 Tensor* results, int64_t slot, int64_t grad_over = 0);
// A training step's form of it: every logits row is a seed, in order; row i's label is
// labels[label_ids[i]] (i64 ids into the whole graph's i32 labels), or labels[i] when label_ids is
// undefined (then labels has one per row). The gradient is required. On the GPU, two launches and no
// gather of the labels (kernels::softmax_cross_entropy_seeds_cuda).
void softmax_cross_entropy_seeds_async(const Tensor& logits, const Tensor& labels, const Tensor& label_ids, Tensor* grad,
                                       Tensor* results, int64_t slot, int64_t grad_over = 0);

}  // namespace gale::engine::ops
