// GCN, SAGE and GIN layers: a Linear and a normalised SpMM each, ordered so the SpMM runs on the
// narrower of the input and output widths (aggregation is linear, so A (x W) = (A x) W), as
// PyG's GCNConv does. With equal widths the transform goes first when the layer has a root term
// (SAGE), and the aggregation first otherwise (GCN, GIN), whichever keeps less for backward (see
// AggregateLinear::forward). A constant input (full-graph training's resident features) lets the
// first layer keep A x from one step to the next instead of computing it twice per step.
//
// When the transform goes first the layer's bias, its SAGE root term and the ReLU that follows
// it are fused into the aggregation kernel (fuseGNN Sec. 5): the aggregated rows make one trip
// through memory.
#include "engine/layers/layers.hpp"
#include "engine/layers/linear.hpp"
#include "engine/ops.hpp"
#include "engine/spmm_auto.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "kernels/spmm.hpp"

namespace gale::engine {

namespace {

Parameter make_bias(const std::string& name, int64_t out) {
  Parameter b;
  b.name = name;
  b.value = Tensor::zeros(1, out);
  b.grad = Tensor::zeros(1, out);
  return b;
}

// `t` with zero rows appended up to `rows` (a block's root gradient covers only its destinations).
Tensor pad_rows(const Tensor& t, int64_t rows) { return ops::side_by_side(rows, t.cols(), {{&t, 0}}, t.device()); }

// Which normalised aggregation a layer applies, forward over the CSR and backward over the CSC.
enum class Norm { kGcn, kMean, kSum };

struct Epilogue {
  const Tensor* bias = nullptr;
  bool relu = false;
  bool accumulate = false;  // add into `out`'s current values
};

// A column scale for an SpMM over the CSR (or the CSC): the operand's per-entry copy when it keeps
// one (a whole graph on a GPU: read coalesced as the entries' weights, the edge weights already
// multiplied in), else the per-column array itself beside the edge weights, if any.
void set_col_scale(const GraphOperand& g, GraphOperand::EntryScale which, const float* col_scale, bool csc,
                   kernels::SpmmArgs* a) {
  if (const float* per_entry = g.entry_scale(which)) {
    a->edge_weight = per_entry;
  } else {
    a->col_scale = col_scale;
    a->edge_weight = (csc ? g.csc() : g.csr()).weights;
  }
}

// The aggregation `a` over g's CSR (csc: its CSC) with the kernel exec asks for: auto measures on
// a whole graph on a GPU (engine/spmm_auto.hpp), tc takes the graph's translation.
void run_spmm(const GraphOperand& g, bool csc, kernels::SpmmArgs a, const ops::ExecOptions& exec) {
  if (exec.spmm == kernels::SpmmKind::kAuto && spmm_auto_measures(g)) return spmm_auto(g, csc, a, exec);
  if (exec.spmm == kernels::SpmmKind::kTensorCore) a.tc = g.tc_plan(csc);
  ops::spmm(a, g.device(), exec.spmm);
}

// Whether run_spmm over g applies an output mask inside its kernel: on the CPU every kernel does;
// on a GPU GAR does, forced, or under auto on a whole graph (where GAR competes and wins on every
// graph measured but a community-ordered one). Elsewhere (a sampled block under auto gets the
// memory-aware kernel; GAS, tc) ops::spmm masks in a pass of its own, which costs what the model's
// own relu_backward_mask costs without its column sums.
bool aggregation_masks_in_kernel(const GraphOperand& g, const ops::ExecOptions& exec) {
  if (g.device().is_cpu()) return true;
  return exec.spmm == kernels::SpmmKind::kGar || (exec.spmm == kernels::SpmmKind::kAuto && spmm_auto_measures(g));
}

// out = A_norm x (+ epilogue), out preallocated (num_dst x width); x a view (a column block of a
// wider tensor allowed) on the graph's device.
void aggregate(const GraphOperand& g, Norm norm, float self_scale, kernels::ConstMatrixView x, Tensor* out,
               const ops::ExecOptions& exec, const Epilogue& ep = {}) {
  kernels::SpmmArgs a;
  a.graph = g.csr();
  a.long_rows = g.gar_long_rows(/*csc=*/false);
  a.gar_chunk_rows = g.gar_chunk_rows(/*csc=*/false);
  a.nnz = g.nnz();
  a.x = x;
  a.out = out->view();
  a.edge_weight = g.csr().weights;  // null when unweighted
  switch (norm) {
    case Norm::kGcn:
      a.row_scale = g.dst_norm();
      set_col_scale(g, GraphOperand::EntryScale::kGcnCsr, g.src_norm(), /*csc=*/false, &a);
      a.self_coefs = g.self_norm();
      break;
    case Norm::kMean: a.row_scale = g.inv_degree(); break;
    case Norm::kSum: a.self_scale = self_scale; break;
  }
  a.bias = ep.bias ? ep.bias->f32() : nullptr;
  a.relu = ep.relu;
  a.accumulate = ep.accumulate;
  a.sample_width = exec.spmm_sample_width;
  a.sampling = exec.spmm_sampling;
  run_spmm(g, /*csc=*/false, a, exec);
}
void aggregate(const GraphOperand& g, Norm norm, float self_scale, const Tensor& x, Tensor* out,
               const ops::ExecOptions& exec, const Epilogue& ep = {}) {
  aggregate(g, norm, self_scale, x.view(), out, exec, ep);
}

// w (rows x cols) with zero columns after it up to `cols` columns (w itself when it has them).
Tensor padded_columns(const Tensor& w, int64_t cols) {
  if (w.cols() == cols) return w;
  return ops::side_by_side(w.rows(), cols, {{&w, 0}}, w.device());
}

// The scales of `aggregate` on the CBSR aggregations' arguments (SpgemmCbsrArgs, SspmmCbsrArgs).
template <typename Args>
void set_scales(const GraphOperand& g, Norm norm, float self_scale, Args* a) {
  a->graph = g.csr();
  a->edge_weight = g.csr().weights;  // null when unweighted
  switch (norm) {
    case Norm::kGcn:
      a->row_scale = g.dst_norm();
      a->col_scale = g.src_norm();
      a->self_coefs = g.self_norm();
      break;
    case Norm::kMean: a->row_scale = g.inv_degree(); break;
    case Norm::kSum: a->self_scale = self_scale; break;
  }
}

// `aggregate` of a MaxK output given in CBSR form (MaxK-GNN's SpGEMM), into the first x.width
// columns of out (num_dst rows; it may be wider).
void aggregate_cbsr(const GraphOperand& g, Norm norm, float self_scale, const ops::Cbsr& x, Tensor* out) {
  GALE_ASSERT(out->rows() == g.num_dst() && out->cols() >= x.width);
  kernels::SpgemmCbsrArgs a;
  set_scales(g, norm, self_scale, &a);
  a.x = x.view();
  a.out = out->view();
  a.out.cols = x.width;
  ops::spgemm(a, g.device(), g.edge_groups());
}

// The gradient of aggregate_cbsr with respect to the kept values (MaxK-GNN's SSpMM):
// num_src x k, from the destinations' gradient.
Tensor aggregate_cbsr_backward(const GraphOperand& g, Norm norm, float self_scale, const ops::Cbsr& pattern,
                               kernels::ConstMatrixView grad) {
  Tensor gv = Tensor::empty(pattern.rows(), pattern.k(), DType::kF32, pattern.device());
  kernels::SspmmCbsrArgs a;
  set_scales(g, norm, self_scale, &a);
  a.grad_out = grad;
  a.pattern = pattern.view();
  a.grad_values = gv.f32();
  a.hubs = g.sspmm_hubs(pattern.k());
  ops::sspmm(a, g.device(), g.edge_groups());
  return gv;
}

// The transpose of `aggregate`: gradient of the sources (num_src x width) from the destinations'
// gradient (num_dst x width), both views (column blocks of wider tensors allowed); with out_mask
// (ops::relu_mask of the sources' values) ReLU's backward applied to it, in the same kernel where
// that kernel can (kernels::SpmmArgs::out_mask).
void aggregate_backward(const GraphOperand& g, Norm norm, float self_scale, kernels::ConstMatrixView grad,
                        kernels::MatrixView out, const ops::ExecOptions& exec, const Tensor* out_mask = nullptr) {
  // The sampled product is an estimate for inference: its gradient would need the transpose of
  // the sample, not a sample of the transpose.
  if (exec.spmm == kernels::SpmmKind::kSampled)
    throw InputError("--spmm sampled: an inference kernel (gale predict); training needs every edge's gradient");
  kernels::SpmmArgs a;
  a.graph = g.csc();
  a.long_rows = g.gar_long_rows(/*csc=*/true);
  a.gar_chunk_rows = g.gar_chunk_rows(/*csc=*/true);
  a.nnz = g.nnz();
  a.x = grad;
  a.out = out;
  a.edge_weight = g.csc().weights;  // null when unweighted
  switch (norm) {
    case Norm::kGcn:
      a.row_scale = g.src_norm();
      set_col_scale(g, GraphOperand::EntryScale::kGcnCsc, g.dst_norm(), /*csc=*/true, &a);
      a.self_coefs = g.self_norm();
      break;
    case Norm::kMean: set_col_scale(g, GraphOperand::EntryScale::kMeanCsc, g.inv_degree(), /*csc=*/true, &a); break;
    case Norm::kSum: a.self_scale = self_scale; break;
  }
  if (out_mask != nullptr) {
    GALE_ASSERT(out_mask->rows() == out.rows && out_mask->cols() == kernels::relu_mask_words(out.cols));
    GALE_ASSERT(out_mask->device() == g.device());
    a.out_mask = out_mask->data<uint32_t>();
    a.out_mask_words = out_mask->cols();
  }
  run_spmm(g, /*csc=*/true, a, exec);
}

Tensor aggregate_backward(const GraphOperand& g, Norm norm, float self_scale, const Tensor& grad,
                          const ops::ExecOptions& exec, const Tensor* out_mask = nullptr) {
  Tensor out = Tensor::empty(g.num_src(), grad.cols(), DType::kF32, grad.device());
  aggregate_backward(g, norm, self_scale, grad.view(), out.view(), exec, out_mask);
  return out;
}

// Aggregation and a bias-free Linear in the cheaper order, plus a bias, an optional root Linear
// on the destinations' own features (SAGE's lin_r) and an optional ReLU.
class AggregateLinear {
 public:
  AggregateLinear(const std::string& prefix, int64_t in, int64_t out, Norm norm, float self_scale, uint64_t key,
                  std::unique_ptr<Linear> root = nullptr)
      : lin_(prefix + ".lin", in, out, /*bias=*/false, kernels::derive_key(key, 1)),
        bias_(make_bias(prefix + ".bias", out)),
        root_(std::move(root)),
        norm_(norm),
        self_scale_(self_scale) {}

  Tensor forward(const GraphOperand& g, Tensor x, const ForwardContext& ctx) {
    exec_ = ctx.exec;
    // A narrowing layer transforms first (the SpMM then runs on the narrower width). At equal
    // widths a layer with a root term does too: it keeps its input x for the root's gradient
    // anyway, which is all a transform-first backward needs. Without one, aggregating first
    // keeps A x instead of x, and its backward then never holds more than two num_nodes x width
    // tensors (dW from A x and the gradient; the gradient times W^T; its aggregation), where a
    // transform-first backward holds x, the gradient and its aggregation at once: on 2M nodes at
    // hidden 256, 2 GiB less at the peak of GCN and GIN training, for a bias and ReLU pass that
    // the aggregation no longer fuses.
    transform_first_ = lin_.out() < lin_.in() || (lin_.out() == lin_.in() && root_ != nullptr);
    saved_is_aggregated_ = false;
    stacked_input_ = false;
    cbsr_linear_ = false;
    Tensor y;
    // A MaxK input is aggregated over its CBSR form (MaxK-GNN's SpGEMM) unless the layer narrows:
    // then transforming the dense form first (zeros included) and aggregating the narrow result
    // moves fewer bytes than any aggregation at the input width.
    if (ctx.training && ctx.maxk_input) maxk_ = *ctx.maxk_input;
    sparse_input_ = ctx.maxk_input != nullptr && !reads_dense_maxk_input();
    if (sparse_input_) {
      // Never reads x (the model did not write its dense form). With a root term the SpGEMM's
      // output and the destinations' own rows sit side by side, [A x | x_dst], so one GEMM of
      // depth 2 in against [W; W_root] does both products, the bias and the ReLU: on 2M nodes at
      // width 256 it reads 4 GiB and writes 2, where a GEMM and a second accumulating one read 6
      // and write 4 (3.6 ms against 1.8 + 2.9, H100). Backward then forms dW and dW_root in one
      // GEMM that reads grad once. (A column of ones for the bias, so that the GEMM needs no
      // epilogue and backward gets the bias gradient from it too, padded to 4 columns: 516-deep
      // GEMMs measured 3.9 ms forward and 5.1 ms for the weight gradient, against 3.6 and 2.4.)
      const int64_t in = lin_.in();
      // The operand the model's top-k already wrote x_dst's dense form into (stage_maxk_input),
      // or a new one.
      const bool staged = staged_.defined() && staged_.rows() == g.num_dst() && staged_.device() == ctx.maxk_input->device();
      Tensor a = staged ? std::move(staged_) : Tensor::empty(g.num_dst(), root_ ? 2 * in : in, DType::kF32,
                                                             ctx.maxk_input->device());
      staged_ = Tensor();
      aggregate_cbsr(g, norm_, self_scale_, *ctx.maxk_input, &a);
      if (root_ && !staged) ops::cbsr_to_dense(ops::cbsr_rows(*ctx.maxk_input, g.num_dst()), &a, /*col_offset=*/in);
      weights_now(ctx);
      if (root_) {
        y = Tensor::empty(g.num_dst(), lin_.out(), DType::kF32, a.device());
        ops::gemm_bias(a, stacked_weights(), 0.0f, &y, bias_.value, ctx.relu, exec_.tf32);
      } else {
        y = transform_with_bias(a, Tensor(), ctx.relu);
      }
      if (ctx.training) saved_ = a;  // kept: the SpGEMM's output (and x_dst) is what dW needs
      return y;
    }
    const Tensor x_dst = root_ ? x.rows_slice(0, g.num_dst()) : Tensor();  // the root term's rows
    if (transform_first_) {
      weights_now(ctx);
      // A narrowing layer on a MaxK input multiplies its CBSR form (k values a row) while W fits
      // the CBSR kernels; its backward then forms the input gradient at the kept positions only,
      // with a root term from the side-by-side pair's weights (backward_pair).
      // t = x W goes to rows that GAR gathers without padding them first (47 columns in rows of
      // 48: kernels::spmm_gar_row_floats), from W with zero columns to match.
      const int64_t out = lin_.out(), t_ld = kernels::spmm_gar_row_floats(out);
      cbsr_linear_ = ctx.maxk_input != nullptr && ops::cbsr_gemm_fits(x.device(), lin_.in(), t_ld, 1) &&
                     (!root_ || ops::cbsr_gemm_fits(x.device(), lin_.in(), 2 * pair_half(), 1));
      const Tensor w = padded_columns(lin_.weight().value, t_ld);
      Tensor t;
      if (cbsr_linear_) {  // x W and, with a root term, x_dst W_root from one pass over the CBSR form
        t = Tensor::empty(ctx.maxk_input->rows(), t_ld, DType::kF32, x.device());
        if (root_) {
          y = Tensor::empty(g.num_dst(), out, DType::kF32, x.device());
          ops::cbsr_gemm(*ctx.maxk_input, w, 0.0f, &t, &root_->weight().value, &y);
        } else {
          ops::cbsr_gemm(*ctx.maxk_input, w, 0.0f, &t);
        }
      } else if (root_ && out < lin_.in() && g.num_dst() == g.num_src()) {
        // A narrowing layer with a root term on a whole graph: x [W | W_root] in one GEMM that reads
        // x once, into rows of 2 t_ld, then x W_root copied out as the output the aggregation adds
        // to (SAGE's last layer, 2M x 256 to 47, H200 TF32: 0.58 + 1.00 ms for the two products, the
        // second one's 47-float rows unaligned).
        const Tensor both_w = ops::side_by_side(lin_.in(), 2 * t_ld, {{&w, 0}, {&root_->weight().value, t_ld}}, x.device());
        t = ops::matmul(x, both_w, exec_.tf32);
        y = Tensor::empty(g.num_dst(), out, DType::kF32, x.device());
        ops::copy_columns(t, t_ld, &y);
      } else {
        t = ops::matmul(x, w, exec_.tf32);
        if (root_) y = root_->forward(x_dst, exec_.tf32);
      }
      if (!root_) y = Tensor::empty(g.num_dst(), out, DType::kF32, x.device());
      kernels::ConstMatrixView t_view = t.view();
      t_view.cols = out;
      aggregate(g, norm_, self_scale_, t_view, &y, exec_, {&bias_.value, ctx.relu, /*accumulate=*/root_ != nullptr});
      if (ctx.training) saved_ = x;
    } else if (root_ && exec_.stack_operands && ctx.first_layer && ctx.constant_input && g.whole_graph()) {
      // [A x | x] (kept) times [W; W_root]: one GEMM with the bias (and ReLU) epilogue.
      stacked_input_ = true;
      const Tensor s = stacked_input(g, x);
      weights_now(ctx);
      y = Tensor::empty(g.num_dst(), lin_.out(), DType::kF32, s.device());
      ops::gemm_bias(s, stacked_weights(), 0.0f, &y, bias_.value, ctx.relu, exec_.tf32);
      if (ctx.training) saved_ = x;
      return y;
    } else {
      Tensor a = aggregated_input(g, x, ctx.training && ctx.constant_input);
      weights_now(ctx);
      if (!ctx.first_layer && !root_) x = Tensor();  // a previous activation, needed no more
      y = transform_with_bias(a, x_dst, ctx.relu);
      // The first layer's input is the model's input, which its caller holds anyway: backward
      // recomputes A x from it (or finds it kept, for a constant input), which buys a num_dst x in
      // tensor of memory for one more SpMM on the narrow width. A hidden layer keeps A x instead,
      // so its input (the previous activation) is freed as soon as the forward has moved on.
      if (ctx.training) {
        saved_is_aggregated_ = !ctx.first_layer;
        saved_ = saved_is_aggregated_ ? a : x;
      }
    }
    if (ctx.training && root_) x_dst_ = x_dst;
    return y;
  }

  // ForwardContext::before_weights, where forward reaches its first parameter.
  static void weights_now(const ForwardContext& ctx) {
    if (ctx.before_weights) (*ctx.before_weights)();
  }

  // Frees each tensor as soon as it has served: the peak is the saved input, the incoming gradient
  // and one new gradient-sized tensor.
  Tensor backward(const GraphOperand& g, Tensor grad, bool need_input_grad) {
    ops::add_column_sums(grad, out_grad_sums_.defined() ? &out_grad_sums_ : nullptr, &bias_.grad);
    out_grad_sums_ = Tensor();
    in_grad_sums_ = Tensor();
    const Tensor input_relu_mask = std::move(input_relu_mask_);  // fold_input_relu: only on the last path below
    input_relu_mask_ = Tensor();
    if (sparse_input_) return backward_maxk(g, std::move(grad), need_input_grad);
    if (stacked_input_) {  // [dW; dW_root] = [A x | x]^T grad, one GEMM; a first layer: no input gradient
      accumulate_stacked_grads(kept_.s, grad);
      saved_ = Tensor();
      return Tensor();
    }
    if (transform_first_ && root_ && lin_.out() < lin_.in()) return backward_pair(g, std::move(grad), need_input_grad);
    if (root_) root_->accumulate_grads(x_dst_, grad, exec_.tf32);
    x_dst_ = Tensor();
    Tensor gx;
    if (transform_first_) {
      // Without a root term A^T grad goes into rows of whole 16-byte pieces (47 -> 48 columns, zero
      // past out), as forward's x W does: its aggregation writes aligned rows, and the two GEMMs
      // that read it, the weight gradient and the input gradient against W with zero columns to
      // match, get an aligned width and depth. (GCN's and GIN's last layer at 47 classes, 2M
      // nodes, H200, TF32: the two GEMMs 1.04 ms each at 47.) A root term's layer keeps its own
      // (backward_pair pads the narrowing one).
      const int64_t out = lin_.out(), ld = root_ ? out : kernels::spmm_gar_row_floats(out);
      const Tensor w = padded_columns(lin_.weight().value, ld);
      Tensor gh;
      if (ld == out) {
        gh = aggregate_backward(g, norm_, self_scale_, grad, exec_);
        lin_.accumulate_grads(saved_, gh, exec_.tf32);
      } else {
        gh = Tensor::zeros(g.num_src(), ld, DType::kF32, grad.device());
        kernels::MatrixView block = gh.view();
        block.cols = out;
        aggregate_backward(g, norm_, self_scale_, grad.view(), block, exec_);
        Tensor dw = Tensor::empty(lin_.in(), ld, DType::kF32, gh.device());
        ops::gemm(saved_, true, gh, false, 0.0f, &dw, exec_.tf32);
        ops::axpy_columns(dw, 0, 1.0f, &lin_.weight().grad);
      }
      saved_ = Tensor();
      if (!need_input_grad) return Tensor();
      if (cbsr_linear_ && maxk_.values.defined()) {  // the gradient at the kept positions, directly
        grad = Tensor();
        gx = Tensor::empty(g.num_src(), lin_.in(), DType::kF32, gh.device());
        ops::cbsr_gemm_grad(maxk_, {{gh, w}}, &gx, new_input_grad_sums(gx));
        maxk_ = ops::Cbsr();
        return gx;
      }
      if (root_) {
        gx = root_->input_grad(grad, exec_.tf32);  // rows = num_dst = num_src on a full graph
        if (gx.rows() < g.num_src()) gx = pad_rows(gx, g.num_src());
        grad = Tensor();
        lin_.input_grad(gh, exec_.tf32, &gx);
      } else {
        grad = Tensor();
        gx = Tensor::empty(g.num_src(), lin_.in(), DType::kF32, gh.device());
        ops::gemm(gh, false, w, true, 0.0f, &gx, exec_.tf32);
      }
      return masked_by_maxk_input(std::move(gx));
    }
    lin_.accumulate_grads(saved_aggregate(g), grad, exec_.tf32);
    saved_ = Tensor();
    if (!need_input_grad) return Tensor();
    Tensor ga = lin_.input_grad(grad, exec_.tf32);
    if (!root_) grad = Tensor();
    gx = aggregate_backward(g, norm_, self_scale_, ga, exec_, input_relu_mask.defined() ? &input_relu_mask : nullptr);
    ga = Tensor();
    if (root_) {
      Tensor gx_dst = gx.rows_slice(0, g.num_dst());
      root_->input_grad(grad, exec_.tf32, &gx_dst);
    }
    return gx;
  }

  void add_parameters(std::vector<Parameter*>* out) {
    lin_.add_parameters(out);
    out->push_back(&bias_);
    if (root_) root_->add_parameters(out);
  }

 private:
  // a W (+ x_dst W_root) + bias, then ReLU when asked: the bias and ReLU ride on the last GEMM's
  // epilogue (ops::gemm_bias).
  Tensor transform_with_bias(const Tensor& a, const Tensor& x_dst, bool relu) const {
    Tensor y = Tensor::empty(a.rows(), lin_.out(), DType::kF32, a.device());
    if (!root_) {
      ops::gemm_bias(a, lin_.weight().value, 0.0f, &y, bias_.value, relu, exec_.tf32);
      return y;
    }
    ops::gemm(a, false, lin_.weight().value, false, 0.0f, &y, exec_.tf32);
    ops::gemm_bias(x_dst, root_->weight().value, 1.0f, &y, bias_.value, relu, exec_.tf32);
    return y;
  }

  // Whether kept_ was computed from this very input on this graph (its x reference pins the
  // storage, so a matching pointer is the same, unchanged input).
  bool kept_for(const GraphOperand& g, const Tensor& x) const {
    return kept_.graph == g.id() && kept_.x.f32() == x.f32() && kept_.x.rows() == x.rows() && kept_.x.cols() == x.cols();
  }

  // [A x | x] of a constant input (ExecOptions::stack_operands), kept like aggregated_input's A x.
  Tensor stacked_input(const GraphOperand& g, const Tensor& x) {
    if (kept_.s.defined() && kept_for(g, x)) return kept_.s;
    const int64_t in = lin_.in();
    Tensor a = Tensor::empty(g.num_dst(), in, DType::kF32, x.device());
    aggregate(g, norm_, self_scale_, x, &a, exec_);
    const Tensor x_dst = x.rows_slice(0, g.num_dst());
    const Tensor s = ops::side_by_side(g.num_dst(), 2 * in, {{&a, 0}, {&x_dst, in}}, x.device());
    kept_ = {g.id(), x, Tensor(), s};
    return s;
  }

  // dW += s[:, :in]^T grad and dW_root += s[:, in:]^T grad for a side-by-side s = [A x | x_dst],
  // from one GEMM that reads grad once.
  void accumulate_stacked_grads(const Tensor& s, const Tensor& grad) {
    const int64_t in = lin_.in();
    Tensor stacked = Tensor::empty(2 * in, lin_.out(), DType::kF32, grad.device());
    ops::gemm(s, true, grad, false, 0.0f, &stacked, exec_.tf32);
    ops::axpy(stacked.rows_slice(0, in), 1.0f, &lin_.weight().grad);
    ops::axpy(stacked.rows_slice(in, 2 * in), 1.0f, &root_->weight().grad);
  }

  // A x for the aggregate-first order: the kept one when it was computed from this very tensor on
  // this graph (kept_for), else computed now, and kept when `keep` (a constant input on a whole
  // graph).
  Tensor aggregated_input(const GraphOperand& g, const Tensor& x, bool keep) {
    if (kept_.a.defined() && kept_for(g, x)) return kept_.a;
    Tensor a = Tensor::empty(g.num_dst(), lin_.in(), DType::kF32, x.device());
    aggregate(g, norm_, self_scale_, x, &a, exec_);
    if (keep && g.whole_graph()) kept_ = {g.id(), x, a};
    return a;
  }

  // The aggregate-first forward's A x: saved (a hidden layer), kept or recomputed (the first).
  Tensor saved_aggregate(const GraphOperand& g) {
    return saved_is_aggregated_ ? saved_ : aggregated_input(g, saved_, /*keep=*/false);
  }

  // [W; W_root] (2 in x out), the weights of the side-by-side [A x | x_dst] (MaxK input).
  Tensor stacked_weights() const {
    const int64_t in = lin_.in();
    Tensor stacked = Tensor::empty(2 * in, lin_.out(), DType::kF32, lin_.weight().value.device());
    Tensor block = stacked.rows_slice(0, in);
    ops::copy(lin_.weight().value, &block);
    block = stacked.rows_slice(in, 2 * in);
    ops::copy(root_->weight().value, &block);
    return stacked;
  }

  // Backward of a narrowing transform-first layer with a root term (SAGE's last layer): its two
  // products share their input x, so the two gradients they need sit side by side, [grad | gh]
  // (gh = A^T grad, num_src rows; grad zero past num_dst), each in a half of pair_half() columns
  // so that grad's rows suit GAR's gathers with no copy, and one GEMM of x^T by the pair gives
  // dW_root and dW, one of the pair by [W_root | W]^T (or one CBSR term under MaxK) the input
  // gradient: x and the pair are read once each instead of twice. The pair is small (2 x the
  // narrow width), so this only adds the pair's own width to the moment grad and it coexist.
  // grad's padding columns are zeros of its own: GAR's 16-byte gathers of grad's rows read them,
  // while the same kernel writes gh (a gh beside grad's last column was read as it was written).
  Tensor backward_pair(const GraphOperand& g, Tensor grad, bool need_input_grad) {
    const int64_t in = lin_.in(), out = lin_.out(), half = pair_half(), n = 2 * half;
    Tensor pair;  // [grad | 0 | 0 | 0], gh's columns written below
    {
      const Tensor grad_dst = grad.rows_slice(0, g.num_dst());
      pair = ops::side_by_side(g.num_src(), n, {{&grad_dst, 0}}, grad.device());
    }
    grad = Tensor();
    x_dst_ = Tensor();
    const Tensor& p = pair;
    kernels::ConstMatrixView grad_block = p.view();
    grad_block.rows = g.num_dst();
    grad_block.cols = out;
    kernels::MatrixView gh_block = pair.view();
    gh_block.data += half;
    gh_block.cols = out;
    aggregate_backward(g, norm_, self_scale_, grad_block, gh_block, exec_);
    Tensor dw = Tensor::empty(in, n, DType::kF32, pair.device());
    ops::gemm(saved_, true, pair, false, 0.0f, &dw, exec_.tf32);
    saved_ = Tensor();
    ops::axpy_columns(dw, 0, 1.0f, &root_->weight().grad);
    ops::axpy_columns(dw, half, 1.0f, &lin_.weight().grad);
    dw = Tensor();
    if (!need_input_grad) {
      maxk_ = ops::Cbsr();
      return Tensor();
    }
    // [W_root | 0 | W | 0], the pair's columns
    const Tensor w = ops::side_by_side(in, n, {{&root_->weight().value, 0}, {&lin_.weight().value, half}}, pair.device());
    Tensor gx = Tensor::empty(g.num_src(), in, DType::kF32, pair.device());
    if (cbsr_linear_ && maxk_.values.defined()) {
      ops::cbsr_gemm_grad(maxk_, {{pair, w}}, &gx, new_input_grad_sums(gx));  // at the kept positions only
      maxk_ = ops::Cbsr();
      return gx;
    }
    ops::gemm(pair, false, w, true, 0.0f, &gx, exec_.tf32);
    pair = Tensor();
    return masked_by_maxk_input(std::move(gx));
  }

  // Columns of each half of backward_pair's [grad | A^T grad]: the narrow width rounded up to
  // whole 64-byte pieces (47 -> 48), so that grad's rows suit GAR's gathers.
  int64_t pair_half() const { return (lin_.out() + 15) / 16 * 16; }

  // A dense input gradient; for a MaxK input (its pattern kept from forward) restricted to the
  // kept positions, where that input's gradient lives.
  Tensor masked_by_maxk_input(Tensor gx) {
    if (!maxk_.values.defined()) return gx;
    Tensor masked = Tensor::empty(gx.rows(), gx.cols(), DType::kF32, gx.device());
    ops::maxk_backward(maxk_, nullptr, &gx, &masked, new_input_grad_sums(masked));
    maxk_ = ops::Cbsr();
    return masked;
  }

  // A 1 x width tensor for the column sums of the input gradient gx that a MaxK backward is about
  // to write (kept for take_input_grad_sums).
  Tensor* new_input_grad_sums(const Tensor& gx) {
    in_grad_sums_ = Tensor::empty(1, gx.cols(), DType::kF32, gx.device());
    return &in_grad_sums_;
  }

  // Backward for a MaxK input aggregated in CBSR form: dW (and dW_root) from the saved SpGEMM
  // output (beside x_dst), the input gradient at the kept positions only: SSpMM of grad W^T, plus
  // the root term's grad W_r^T, through MaxK's backward.
  Tensor backward_maxk(const GraphOperand& g, Tensor grad, bool need_input_grad) {
    const ops::Cbsr pattern = std::move(maxk_);
    maxk_ = ops::Cbsr();
    if (root_) {  // [dW; dW_root] = [A x | x_dst]^T grad, one GEMM that reads grad once
      accumulate_stacked_grads(saved_, grad);
    } else {
      lin_.accumulate_grads(saved_, grad, exec_.tf32);
    }
    saved_ = Tensor();
    if (!need_input_grad) return Tensor();
    // The two input-gradient terms are two GEMMs. Side by side from one GEMM against [W; W_root]
    // (ExecOptions::stack_operands) they read grad once (2.4 ms against 3.1, H100, 2M x 256), but
    // that 2 x in wide tensor lives until MaxK's backward has written gx: SAGE's peak 0.55 GiB
    // higher.
    if (root_ && exec_.stack_operands && g.num_dst() == g.num_src()) {
      const int64_t in = lin_.in();
      Tensor both = Tensor::empty(g.num_dst(), 2 * in, DType::kF32, grad.device());  // [grad W^T | grad W_root^T]
      ops::gemm(grad, false, stacked_weights(), true, 0.0f, &both, exec_.tf32);
      grad = Tensor();
      const Tensor& b = both;
      kernels::ConstMatrixView ga = b.view(), g_root = b.view();
      ga.cols = g_root.cols = in;
      g_root.data += in;
      const Tensor gv = aggregate_cbsr_backward(g, norm_, self_scale_, pattern, ga);
      Tensor gx = Tensor::empty(g.num_src(), in, DType::kF32, gv.device());
      ops::maxk_backward(pattern, gv.f32(), g_root, &gx, new_input_grad_sums(gx));
      return gx;
    }
    Tensor ga = lin_.input_grad(grad, exec_.tf32);
    const Tensor gv = aggregate_cbsr_backward(g, norm_, self_scale_, pattern, ga.view());
    ga = Tensor();
    Tensor g_root;
    if (root_) {
      g_root = root_->input_grad(grad, exec_.tf32);
      if (g_root.rows() < g.num_src()) g_root = pad_rows(g_root, g.num_src());
    }
    grad = Tensor();
    Tensor gx = Tensor::empty(g.num_src(), lin_.in(), DType::kF32, gv.device());
    ops::maxk_backward(pattern, &gv, root_ ? &g_root : nullptr, &gx, new_input_grad_sums(gx));
    return gx;
  }

 public:
  int64_t in() const { return lin_.in(); }
  int64_t out() const { return lin_.out(); }
  // A MaxK input's dense form is read only by a narrowing layer (transform-first, above).
  bool reads_dense_maxk_input() const { return lin_.in() > lin_.out(); }
  // The last forward aggregated its dense input first (not transform-first, not MaxK's CBSR).
  bool aggregates_first() const { return !transform_first_ && !sparse_input_; }
  // Layer::stage_maxk_input: [A x | x_dst]'s operand for a whole graph (the top-k writes all of
  // its input's rows, which are x_dst's only when the graph's sources are its destinations).
  Tensor stage_maxk_input(const GraphOperand& g, int64_t* col_offset) {
    staged_ = Tensor();
    if (!root_ || reads_dense_maxk_input() || g.num_dst() != g.num_src()) return Tensor();
    staged_ = Tensor::empty(g.num_dst(), 2 * lin_.in(), DType::kF32, g.device());
    *col_offset = lin_.in();
    return staged_;
  }
  // Layer::fold_input_relu: an aggregate-first backward without a root term ends in the aggregation
  // that writes the input gradient, which applies the mask as its output mask (the other orders
  // end in a GEMM, or a root term's GEMM adds into the aggregation's output afterwards), where its
  // kernel applies it in place (aggregation_masks_in_kernel).
  bool fold_input_relu(const GraphOperand& g, Tensor mask) {
    input_relu_mask_ = Tensor();
    if (!aggregates_first() || root_ || stacked_input_ || !aggregation_masks_in_kernel(g, exec_)) return false;
    input_relu_mask_ = std::move(mask);
    return true;
  }
  // Layer::take_input_grad_sums and Layer::give_output_grad_sums.
  Tensor take_input_grad_sums() { return std::move(in_grad_sums_); }
  void give_output_grad_sums(Tensor sums) { out_grad_sums_ = std::move(sums); }
  // That forward's output once more (same inputs, same ops, same bits), from A x: the kept one, or
  // recomputed from the saved input. Only after an aggregate-first training forward, before its
  // backward.
  Tensor output_again(const GraphOperand& g, bool relu) {
    GALE_ASSERT(aggregates_first() && saved_.defined());
    return transform_with_bias(saved_aggregate(g), x_dst_, relu);
  }

 private:
  Linear lin_;
  Parameter bias_;
  std::unique_ptr<Linear> root_;
  Norm norm_;
  float self_scale_;
  ops::ExecOptions exec_;
  bool transform_first_ = false;
  bool saved_is_aggregated_ = false;  // saved_ holds A x (a hidden layer), not x
  bool sparse_input_ = false;  // the last forward aggregated a MaxK input's CBSR form
  bool cbsr_linear_ = false;   // the last transform-first forward multiplied a MaxK input's CBSR form
  // The input x (transform-first; aggregate-first in the first layer, which recomputes A x from it),
  // A x (aggregate-first in a hidden layer), or the SpGEMM output for a MaxK input.
  Tensor saved_;
  Tensor x_dst_;  // the destinations' own input rows (root term)
  struct Kept {
    uint64_t graph = 0;
    Tensor x, a;
    Tensor s;  // [A x | x] instead of a (stacked_input)
  } kept_;  // A x of a constant input (aggregated_input)
  bool stacked_input_ = false;  // the last forward multiplied the kept [A x | x] (stacked_input)
  ops::Cbsr maxk_;  // the CBSR form of a MaxK input, for backward
  Tensor staged_;         // stage_maxk_input's operand, until the forward takes it
  Tensor out_grad_sums_;  // column sums of the next backward's grad, when given (the bias gradient)
  Tensor in_grad_sums_;   // column sums of the input gradient the last backward returned, when made
  Tensor input_relu_mask_;  // fold_input_relu's mask, for the next backward
};

// A layer that is one AggregateLinear: GCN (PyG GCNConv) and SAGE (PyG SAGEConv, mean:
// lin_l(mean_j x_j) + lin_r(x_i), lin_l carrying the bias; parameter order neigh.lin, neigh.bias,
// root is the checkpoints' order).
class ConvLayer : public Layer {
 public:
  ConvLayer(std::string kind, AggregateLinear conv) : kind_(std::move(kind)), conv_(std::move(conv)) {}
  std::string kind() const override { return kind_; }
  int64_t in_dim() const override { return conv_.in(); }
  int64_t out_dim() const override { return conv_.out(); }
  Tensor forward(const GraphOperand& g, Tensor x, const ForwardContext& ctx) override {
    return conv_.forward(g, std::move(x), ctx);
  }
  Tensor backward(const GraphOperand& g, Tensor grad, bool need_input_grad) override {
    return conv_.backward(g, std::move(grad), need_input_grad);
  }
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> p;
    conv_.add_parameters(&p);
    return p;
  }
  bool takes_before_weights() const override { return true; }
  bool reads_dense_maxk_input() const override { return conv_.reads_dense_maxk_input(); }
  Tensor stage_maxk_input(const GraphOperand& g, int64_t* col_offset) override {
    return conv_.stage_maxk_input(g, col_offset);
  }
  Tensor take_input_grad_sums() override { return conv_.take_input_grad_sums(); }
  void give_output_grad_sums(Tensor sums) override { conv_.give_output_grad_sums(std::move(sums)); }
  bool takes_output_grad_sums() const override { return true; }
  bool fold_input_relu(const GraphOperand& g, Tensor mask) override { return conv_.fold_input_relu(g, std::move(mask)); }

 private:
  std::string kind_;
  AggregateLinear conv_;
};

// PyG GINConv: nn((1 + eps) x_i + sum_j x_j). The MLP's first Linear is folded into the
// aggregation (it is linear), so the SpMM runs on the narrower width, and the MLP's inner ReLU is
// fused into it.
class GinLayer : public Layer {
 public:
  GinLayer(const std::string& prefix, int64_t in, int64_t out, float eps, int mlp_layers, uint64_t key)
      : first_(prefix + ".mlp.0", in, out, Norm::kSum, 1.0f + eps, kernels::derive_key(key, 1)) {
    if (mlp_layers >= 2) second_ = std::make_unique<Linear>(prefix + ".mlp.2", out, out, true, kernels::derive_key(key, 2));
  }
  std::string kind() const override { return "gin"; }
  int64_t in_dim() const override { return first_.in(); }
  int64_t out_dim() const override { return first_.out(); }
  Tensor forward(const GraphOperand& g, Tensor x, const ForwardContext& ctx) override {
    if (!second_) return first_.forward(g, std::move(x), ctx);
    ForwardContext inner = ctx;
    inner.relu = true;
    Tensor z = first_.forward(g, std::move(x), inner);
    exec_ = ctx.exec;
    // A first layer that keeps A x (a constant input) gets its hidden activation back in backward
    // from one GEMM (1.5 ms on 2M nodes, 100 -> 256) instead of holding a nodes x width tensor
    // from forward to backward (2 GiB at GIN's peak).
    recompute_hidden_ = ctx.training && ctx.constant_input && first_.aggregates_first();
    hidden_ = ctx.training && !recompute_hidden_ ? z : Tensor();
    return second_->forward(z, exec_.tf32, ctx.relu);
  }
  Tensor backward(const GraphOperand& g, Tensor grad, bool need_input_grad) override {
    if (!second_) {
      first_.give_output_grad_sums(std::move(out_grad_sums_));
      return first_.backward(g, std::move(grad), need_input_grad);
    }
    Tensor hidden = recompute_hidden_ ? first_.output_again(g, /*relu=*/true) : std::move(hidden_);
    second_->accumulate_grads(hidden, grad, exec_.tf32, out_grad_sums_.defined() ? &out_grad_sums_ : nullptr);
    out_grad_sums_ = Tensor();
    // The MLP's hidden width equals its output width: the input gradient overwrites grad in row
    // panels, written back through the inner ReLU's backward, so the hidden activation, grad and
    // its gradient never coexist as three tensors. Those passes also sum its columns, the first
    // Linear's bias gradient (a column_sum pass less: 0.42 ms a 2M x 256 layer, H200).
    Tensor gz = std::move(grad);
    Tensor gz_sums = Tensor::empty(1, gz.cols(), DType::kF32, gz.device());
    second_->input_grad_in_place(&gz, exec_.tf32, &hidden, &gz_sums);
    hidden = Tensor();
    first_.give_output_grad_sums(std::move(gz_sums));
    return first_.backward(g, std::move(gz), need_input_grad);
  }
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> p;
    first_.add_parameters(&p);
    if (second_) second_->add_parameters(&p);
    return p;
  }
  bool takes_before_weights() const override { return true; }  // first_ calls it (the MLP comes after)
  bool reads_dense_maxk_input() const override { return first_.reads_dense_maxk_input(); }
  Tensor take_input_grad_sums() override { return first_.take_input_grad_sums(); }
  void give_output_grad_sums(Tensor sums) override { out_grad_sums_ = std::move(sums); }
  bool takes_output_grad_sums() const override { return true; }
  // The MLP's first Linear and the aggregation write the input gradient, last (first_'s backward).
  bool fold_input_relu(const GraphOperand& g, Tensor mask) override {
    return first_.fold_input_relu(g, std::move(mask));
  }

 private:
  AggregateLinear first_;
  std::unique_ptr<Linear> second_;
  ops::ExecOptions exec_;
  Tensor hidden_;
  Tensor out_grad_sums_;  // Layer::give_output_grad_sums: the MLP's last bias gradient
  bool recompute_hidden_ = false;
};

}  // namespace

std::unique_ptr<Layer> make_gcn_layer(const std::string& prefix, int64_t in, int64_t out, uint64_t seed) {
  return std::make_unique<ConvLayer>("gcn", AggregateLinear(prefix, in, out, Norm::kGcn, 0.0f, seed));
}
std::unique_ptr<Layer> make_sage_layer(const std::string& prefix, int64_t in, int64_t out, uint64_t seed) {
  return std::make_unique<ConvLayer>(
      "sage", AggregateLinear(prefix + ".neigh", in, out, Norm::kMean, 0.0f, kernels::derive_key(seed, 1),
                              std::make_unique<Linear>(prefix + ".root", in, out, /*bias=*/false,
                                                       kernels::derive_key(seed, 2))));
}
std::unique_ptr<Layer> make_gin_layer(const std::string& prefix, int64_t in, int64_t out, float eps, int mlp_layers,
                                      uint64_t seed) {
  return std::make_unique<GinLayer>(prefix, in, out, eps, mlp_layers, seed);
}

}  // namespace gale::engine
