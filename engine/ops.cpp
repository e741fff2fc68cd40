#include "engine/ops.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/dense.hpp"
#include "kernels/error.hpp"
#include "kernels/gather.hpp"
#include "kernels/spmm_tc.hpp"
#if GALE_WITH_CUDA
#include "engine/device_context.hpp"
#endif

namespace gale::engine::ops {

namespace {

void same_device(const Tensor& a, const Tensor& b, const char* op) {
  if (a.device() != b.device())
    throw InternalError(std::string(op) + ": operands on " + a.device().name() + " and " + b.device().name());
}

void same_shape(const Tensor& a, const Tensor& b, const char* op) {
  if (a.rows() != b.rows() || a.cols() != b.cols())
    throw InternalError(std::string(op) + ": shapes " + std::to_string(a.rows()) + "x" + std::to_string(a.cols()) +
                        " and " + std::to_string(b.rows()) + "x" + std::to_string(b.cols()));
}

#if GALE_WITH_CUDA
DeviceContext& context(const Tensor& t) { return DeviceContext::get(t.device().ordinal); }
cudaStream_t stream(const Tensor& t) { return context(t).stream(); }
#endif

#if GALE_WITH_CUDA
// A GEMM's right operand as the GPU takes it: transposed into a temporary where
// kernels::weight_transposed_first says that form is faster (the layers' weights, in x out, read
// as torch.nn.Linear keeps them), else as stored.
struct RightOperand {
  const float* data;
  int64_t ld;
  bool trans;
  Tensor copy;  // the transposed copy, freed (stream-ordered) after the product is queued
};
RightOperand right_operand(const Tensor& b, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, bool tf32) {
  if (trans_a || trans_b || !kernels::weight_transposed_first(m, n, k, tf32)) return {b.f32(), b.cols(), trans_b, {}};
  Tensor copy = Tensor::empty(n, k, DType::kF32, b.device());
  kernels::transpose_cuda(b.view(), copy.view(), stream(b));
  return {copy.f32(), k, true, copy};
}
#endif

[[noreturn]] void no_cuda() { throw DeviceError("this build has no CUDA backend"); }

thread_local OpProfile::Impl* active_profile = nullptr;

// OpShape for the roofline: a GEMM's product, an op's bytes read and written (`passes` times each
// tensor's bytes), an aggregation's gather.
OpShape gemm_shape(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
  OpShape s;
  s.m = m, s.n = n, s.k = k, s.trans_a = trans_a, s.trans_b = trans_b;
  return s;
}
OpShape traffic(double bytes) {
  OpShape s;
  s.bytes = bytes;
  return s;
}
OpShape traffic(const Tensor& t, int passes) { return traffic(static_cast<double>(t.nbytes()) * passes); }
OpShape gather_shape(int64_t rows, int64_t nnz, int64_t width, int64_t value_bytes) {
  OpShape s;
  s.rows = rows, s.nnz = std::max<int64_t>(nnz, 0), s.width = width, s.value_bytes = value_bytes;
  return s;
}
std::string gemm_name(const char* op, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
  if (active_profile == nullptr) return "";
  return std::string(op) + " " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
         (trans_a ? " a^T" : "") + (trans_b ? " b^T" : "");
}

}  // namespace

// ---- OpProfile ---------------------------------------------------------------------------------

struct OpProfile::Impl {
  struct Mark {
    OpKind kind;
    std::string name;
    OpShape shape;
    std::chrono::steady_clock::time_point cpu_start;
    double cpu_ms = -1;  // CPU ops: measured at the end; CUDA ops: -1 until collected
#if GALE_WITH_CUDA
    std::unique_ptr<kernels::cuda::Event> start, end;
#endif
  };
  std::vector<Mark> marks;
#if GALE_WITH_CUDA
  // Collected marks' events, reused: a profile of every op of an epoch creates its events once.
  std::vector<std::unique_ptr<kernels::cuda::Event>> spare_events;
  std::unique_ptr<kernels::cuda::Event> event(int device) {
    for (size_t i = spare_events.size(); i-- > 0;) {
      if (spare_events[i]->device() != device) continue;
      std::unique_ptr<kernels::cuda::Event> e = std::move(spare_events[i]);
      spare_events[i] = std::move(spare_events.back());
      spare_events.pop_back();
      return e;
    }
    return std::make_unique<kernels::cuda::Event>(device, kernels::cuda::Event::Timing::kEnabled);
  }
#endif
  double totals[kOpKinds] = {};
  std::vector<OpProfile::Entry> by_name;

  // One table row: the same GEMM product or aggregation (an elementwise op's bytes may differ).
  static bool same_work(const OpShape& a, const OpShape& b) {
    return a.m == b.m && a.n == b.n && a.k == b.k && a.trans_a == b.trans_a && a.trans_b == b.trans_b &&
           a.rows == b.rows && a.nnz == b.nnz && a.width == b.width && a.value_bytes == b.value_bytes;
  }

  void collect() {
    for (size_t i = 0; i < marks.size(); ++i) {
      Mark& m = marks[i];
      double gap = 0;
#if GALE_WITH_CUDA
      if (m.start) {
        m.cpu_ms = kernels::cuda::elapsed_ms(*m.start, *m.end);
        // The idle time since the op before ended (a nested op starts before it: no gap).
        const Mark* before = i > 0 ? &marks[i - 1] : nullptr;
        if (before != nullptr && before->end && before->end->device() == m.start->device())
          gap = std::max(0.0, static_cast<double>(kernels::cuda::elapsed_ms(*before->end, *m.start)));
      }
#endif
      totals[static_cast<int>(m.kind)] += m.cpu_ms;
      auto it = std::find_if(by_name.begin(), by_name.end(),
                             [&](const OpProfile::Entry& e) { return e.name == m.name && same_work(e.shape, m.shape); });
      if (it == by_name.end()) it = by_name.insert(by_name.end(), OpProfile::Entry{m.name, m.kind, 0, 0, m.shape});
      it->shape.bytes += (m.shape.bytes - it->shape.bytes) / static_cast<double>(it->calls + 1);  // the running mean
      it->ms += m.cpu_ms;
      it->gap_ms += gap;
      ++it->calls;
    }
#if GALE_WITH_CUDA
    for (Mark& m : marks) {
      if (!m.start) continue;
      spare_events.push_back(std::move(m.start));
      spare_events.push_back(std::move(m.end));
    }
#endif
    marks.clear();
  }
};

OpProfile::OpProfile() : impl_(std::make_unique<Impl>()) { active_profile = impl_.get(); }
OpProfile::~OpProfile() {
  if (active_profile == impl_.get()) active_profile = nullptr;
}
double OpProfile::ms(OpKind kind) {
  impl_->collect();
  return impl_->totals[static_cast<int>(kind)];
}
std::vector<OpProfile::Entry> OpProfile::table() {
  impl_->collect();
  std::vector<Entry> t = impl_->by_name;
  std::sort(t.begin(), t.end(), [](const Entry& a, const Entry& b) { return a.ms > b.ms; });
  return t;
}
void OpProfile::reset() {
  impl_->collect();
  for (double& t : impl_->totals) t = 0;
  impl_->by_name.clear();
}

OpProfile::Scope::Scope(OpProfile* profile) : previous_(active_profile) {
  if (profile != nullptr) active_profile = profile->impl_.get();
}
OpProfile::Scope::~Scope() { active_profile = previous_; }

OpTimer::OpTimer(OpKind kind, const Device& device, std::string name, const OpShape& shape)
    : profile_(active_profile) {
  if (profile_ == nullptr) return;
  slot_ = profile_->marks.size();
  OpProfile::Impl::Mark m;
  m.kind = kind;
  m.name = std::move(name);
  m.shape = shape;
  if (device.is_cuda()) {
#if GALE_WITH_CUDA
    DeviceContext& ctx = DeviceContext::get(device.ordinal);
    m.start = profile_->event(device.ordinal);
    m.end = profile_->event(device.ordinal);
    m.start->record(ctx.stream());
#endif
  } else {
    m.cpu_start = std::chrono::steady_clock::now();
  }
  profile_->marks.push_back(std::move(m));
}

OpTimer::~OpTimer() {
  if (profile_ == nullptr) return;
  OpProfile::Impl::Mark& m = profile_->marks[slot_];
#if GALE_WITH_CUDA
  if (m.end) {
    try {
      m.end->record(DeviceContext::get(m.end->device()).stream());
    } catch (...) {
      m.start.reset();  // a failed record only loses this op's time
      m.end.reset();
      m.cpu_ms = 0;
    }
    return;
  }
#endif
  m.cpu_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - m.cpu_start).count();
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float beta, Tensor* c, bool tf32) {
  same_device(a, b, "gemm");
  same_device(a, *c, "gemm");
  const int64_t m = trans_a ? a.cols() : a.rows();
  const int64_t k = trans_a ? a.rows() : a.cols();
  const int64_t kb = trans_b ? b.cols() : b.rows();
  const int64_t n = trans_b ? b.rows() : b.cols();
  GALE_ASSERT(k == kb && c->rows() == m && c->cols() == n);
  const OpTimer timer(OpKind::kGemm, a.device(), gemm_name("gemm", m, n, k, trans_a, trans_b),
                      gemm_shape(m, n, k, trans_a, trans_b));
  if (a.device().is_cpu()) {
    kernels::gemm(trans_a, trans_b, m, n, k, 1.0f, a.f32(), a.cols(), b.f32(), b.cols(), beta, c->f32(), n);
    return;
  }
#if GALE_WITH_CUDA
  kernels::cuda::CublasHandle& blas = context(a).blas();
  const RightOperand right = right_operand(b, trans_a, trans_b, m, n, k, tf32);
  kernels::gemm_cuda(blas, trans_a, right.trans, m, n, k, 1.0f, a.f32(), a.cols(), right.data, right.ld, beta, c->f32(),
                     n, tf32, blas.workspace(), blas.workspace_bytes());
#else
  (void)tf32;
  no_cuda();
#endif
}

void set_gemm_tuning(bool on) {
#if GALE_WITH_CUDA
  kernels::set_gemm_tuning(on);
#else
  (void)on;
#endif
}

void gemm_in_place(Tensor* a, const Tensor& b, bool trans_b, bool tf32, int64_t panel_rows, const Tensor* relu_of,
                   Tensor* column_sums) {
  // 256 MiB panels: in GIN's backward on 2M x 256 (two layers, H100, tf32) the GEMMs took 3.1 ms
  // and the copies 3.2 where 32 panels of 65536 rows a layer took 3.5 and 3.45.
  if (panel_rows == 0) panel_rows = std::max<int64_t>(1, kGemmPanelBytes / (std::max<int64_t>(1, a->cols()) * 4));
  GALE_ASSERT(b.rows() == b.cols() && b.rows() == a->cols() && panel_rows > 0);
  GALE_ASSERT(relu_of == nullptr || (relu_of->rows() == a->rows() && relu_of->cols() == a->cols()));
  GALE_ASSERT(column_sums == nullptr || column_sums->numel() == a->cols());
  // The sums ride in ReLU's passes on a GPU: panels of whole chunks, one workspace for all of them.
  const bool sums_in_passes = column_sums != nullptr && relu_of != nullptr && a->device().is_cuda();
  Tensor sum_ws;
#if GALE_WITH_CUDA
  if (sums_in_passes) {
    const int64_t chunk = kernels::column_sum_chunk_rows(a->rows());
    panel_rows = std::max(chunk, panel_rows / chunk * chunk);
    sum_ws = Tensor::empty(static_cast<int64_t>(kernels::column_sum_workspace_bytes(a->rows(), a->cols())), 1,
                           DType::kU8, a->device());
  }
#endif
  if (a->rows() > 0) {
    Tensor scratch = Tensor::empty(std::min(panel_rows, a->rows()), a->cols(), DType::kF32, a->device());
    for (int64_t r0 = 0; r0 < a->rows(); r0 += panel_rows) {
      const int64_t r1 = std::min(a->rows(), r0 + panel_rows);
      Tensor panel = a->rows_slice(r0, r1);
      Tensor out = scratch.rows_slice(0, r1 - r0);
      gemm(panel, false, b, trans_b, 0.0f, &out, tf32);
      if (sums_in_passes) {
#if GALE_WITH_CUDA
        const Tensor y = relu_of->rows_slice(r0, r1);
        const OpTimer timer(OpKind::kOther, y.device(), "relu_backward", traffic(y, 3));
        kernels::relu_backward_sum_rows_cuda(out.view(), y.view(), panel.view(), r0, a->rows(),
                                             sum_ws.data<unsigned char>(), static_cast<size_t>(sum_ws.rows()),
                                             stream(y));
#endif
      } else if (relu_of) {
        relu_backward(out, relu_of->rows_slice(r0, r1), &panel);
      } else {
        copy(out, &panel);
      }
    }
  }
  if (column_sums == nullptr) return;
  if (!sums_in_passes || a->rows() == 0) return column_sum(*a, column_sums, /*accumulate=*/false);
#if GALE_WITH_CUDA
  kernels::column_sum_finish_cuda(a->rows(), a->cols(), column_sums->f32(), /*accumulate=*/false,
                                  sum_ws.data<unsigned char>(), static_cast<size_t>(sum_ws.rows()), stream(*a));
#endif
}

void gemm_bias(const Tensor& a, const Tensor& b, float beta, Tensor* c, const Tensor& bias, bool relu, bool tf32) {
  same_device(a, b, "gemm_bias");
  same_device(a, *c, "gemm_bias");
  same_device(a, bias, "gemm_bias");
  const int64_t m = a.rows(), k = a.cols(), n = b.cols();
  GALE_ASSERT(b.rows() == k && c->rows() == m && c->cols() == n && bias.numel() == n);
#if GALE_WITH_CUDA
  if (a.device().is_cuda()) {
    const OpTimer timer(OpKind::kGemm, a.device(), gemm_name("gemm+bias", m, n, k, false, false),
                        gemm_shape(m, n, k, false, false));
    kernels::cuda::CublasHandle& blas = context(a).blas();
    const RightOperand right = right_operand(b, false, false, m, n, k, tf32);
    if (kernels::gemm_bias_cuda(blas, blas.workspace(), blas.workspace_bytes(), false, right.trans, m, n, k, a.f32(), k,
                                right.data, right.ld, beta, c->f32(), n, bias.f32(), relu, tf32))
      return;
  }
#endif
  gemm(a, false, b, false, beta, c, tf32);
  add_bias(c, bias, relu);
}

Tensor matmul(const Tensor& a, const Tensor& b, bool tf32) {
  Tensor c = Tensor::empty(a.rows(), b.cols(), DType::kF32, a.device());
  gemm(a, false, b, false, 0.0f, &c, tf32);
  return c;
}

void add_bias(Tensor* y, const Tensor& bias, bool relu) {
  same_device(*y, bias, "add_bias");
  GALE_ASSERT(bias.numel() == y->cols());
  const OpTimer timer(OpKind::kOther, y->device(), relu ? "add_bias_relu" : "add_bias", traffic(*y, 2));
  if (y->device().is_cpu()) {
    return relu ? kernels::add_bias_relu(y->view(), bias.f32()) : kernels::add_bias(y->view(), bias.f32());
  }
#if GALE_WITH_CUDA
  if (relu) return kernels::add_bias_relu_cuda(y->view(), bias.f32(), stream(*y));
  kernels::add_bias_cuda(y->view(), bias.f32(), stream(*y));
#else
  no_cuda();
#endif
}

void add_column_sums(const Tensor& x, const Tensor* sums, Tensor* out) {
  if (sums != nullptr) return axpy(*sums, 1.0f, out);
  column_sum(x, out, /*accumulate=*/true);
}

void column_sum(const Tensor& x, Tensor* out, bool accumulate) {
  same_device(x, *out, "column_sum");
  GALE_ASSERT(out->numel() == x.cols());
  const OpTimer timer(OpKind::kOther, x.device(), "column_sum", traffic(x, 1));
  if (x.device().is_cpu()) return kernels::column_sum(x.view(), out->f32(), accumulate);
#if GALE_WITH_CUDA
  const size_t bytes = kernels::column_sum_workspace_bytes(x.rows(), x.cols());
  Tensor ws = Tensor::empty(static_cast<int64_t>(bytes), 1, DType::kU8, x.device());
  kernels::column_sum_cuda(x.view(), out->f32(), accumulate, ws.data<unsigned char>(), bytes, stream(x));
#else
  no_cuda();
#endif
}

namespace {

// The statistics and parameters of a batch normalisation over x: 1 x cols each, on x's device.
void check_norm_columns(const Tensor& x, std::initializer_list<const Tensor*> columns, const char* op) {
  for (const Tensor* t : columns) {
    same_device(x, *t, op);
    GALE_ASSERT(t->numel() == x.cols());
  }
}

#if GALE_WITH_CUDA
Tensor norm_workspace(const Tensor& x, size_t* bytes) {
  *bytes = kernels::batch_norm_workspace_bytes(x.rows(), x.cols());
  return Tensor::empty(static_cast<int64_t>(*bytes), 1, DType::kU8, x.device());
}
#endif

}  // namespace

void batch_norm_stats(const Tensor& x, Tensor* mean, Tensor* var) {
  check_norm_columns(x, {mean, var}, "batch_norm_stats");
  GALE_ASSERT(x.rows() >= 1);
  const OpTimer timer(OpKind::kOther, x.device(), "batch_norm_stats", traffic(x, 1));
  if (x.device().is_cpu()) return kernels::batch_norm_stats(x.view(), mean->f32(), var->f32());
#if GALE_WITH_CUDA
  size_t bytes = 0;
  Tensor ws = norm_workspace(x, &bytes);
  kernels::batch_norm_stats_cuda(x.view(), mean->f32(), var->f32(), ws.data<unsigned char>(), bytes, stream(x));
#else
  no_cuda();
#endif
}

void batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& var, float eps, const Tensor& gamma,
                      const Tensor& beta, bool relu, Tensor* y) {
  check_norm_columns(x, {&mean, &var, &gamma, &beta}, "batch_norm_apply");
  same_device(x, *y, "batch_norm_apply");
  same_shape(x, *y, "batch_norm_apply");
  const OpTimer timer(OpKind::kOther, x.device(), relu ? "batch_norm_apply_relu" : "batch_norm_apply",
                      traffic(x, 2));
  if (x.device().is_cpu())
    return kernels::batch_norm_apply(x.view(), mean.f32(), var.f32(), eps, gamma.f32(), beta.f32(), relu, y->view());
#if GALE_WITH_CUDA
  size_t bytes = 0;
  Tensor ws = norm_workspace(x, &bytes);
  kernels::batch_norm_apply_cuda(x.view(), mean.f32(), var.f32(), eps, gamma.f32(), beta.f32(), relu, y->view(),
                                 ws.data<unsigned char>(), bytes, stream(x));
#else
  no_cuda();
#endif
}

void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& mean, const Tensor& var, float eps,
                         const Tensor& gamma, const Tensor* relu_mask, Tensor* grad_gamma, Tensor* grad_beta,
                         Tensor* grad_x) {
  check_norm_columns(x, {&mean, &var, &gamma, grad_gamma, grad_beta}, "batch_norm_backward");
  same_shape(x, grad_out, "batch_norm_backward");
  same_shape(x, *grad_x, "batch_norm_backward");
  same_device(x, grad_out, "batch_norm_backward");
  same_device(x, *grad_x, "batch_norm_backward");
  GALE_ASSERT(x.rows() >= 1);
  const uint32_t* bits = nullptr;
  if (relu_mask != nullptr) {
    same_device(x, *relu_mask, "batch_norm_backward");
    GALE_ASSERT(relu_mask->rows() == x.rows() && relu_mask->cols() == kernels::relu_mask_words(x.cols()));
    bits = relu_mask->data<uint32_t>();
  }
  const OpTimer timer(OpKind::kOther, x.device(), bits != nullptr ? "batch_norm_relu_backward" : "batch_norm_backward",
                      traffic(x, 3));
  if (x.device().is_cpu())
    return kernels::batch_norm_backward(grad_out.view(), x.view(), mean.f32(), var.f32(), eps, gamma.f32(), bits,
                                        grad_gamma->f32(), grad_beta->f32(), grad_x->view());
#if GALE_WITH_CUDA
  size_t bytes = 0;
  Tensor ws = norm_workspace(x, &bytes);
  kernels::batch_norm_backward_cuda(grad_out.view(), x.view(), mean.f32(), var.f32(), eps, gamma.f32(), bits,
                                    grad_gamma->f32(), grad_beta->f32(), grad_x->view(), ws.data<unsigned char>(),
                                    bytes, stream(x));
#else
  no_cuda();
#endif
}

void batch_norm_update_running(const Tensor& mean, const Tensor& var, int64_t rows, float momentum,
                               Tensor* running_mean, Tensor* running_var) {
  check_norm_columns(mean, {&var, running_mean, running_var}, "batch_norm_update_running");
  const OpTimer timer(OpKind::kOther, mean.device(), "batch_norm_update_running");
  if (mean.device().is_cpu())
    return kernels::batch_norm_update_running(mean.f32(), var.f32(), rows, momentum, running_mean->f32(),
                                              running_var->f32(), mean.numel());
#if GALE_WITH_CUDA
  kernels::batch_norm_update_running_cuda(mean.f32(), var.f32(), rows, momentum, running_mean->f32(),
                                          running_var->f32(), mean.numel(), stream(mean));
#else
  no_cuda();
#endif
}

void axpy(const Tensor& x, float alpha, Tensor* y) {
  same_device(x, *y, "axpy");
  same_shape(x, *y, "axpy");
  const OpTimer timer(OpKind::kOther, x.device(), "axpy", traffic(*y, 3));
  if (x.device().is_cpu()) return kernels::axpy(x.view(), alpha, y->view());
#if GALE_WITH_CUDA
  kernels::axpy_cuda(x.view(), alpha, y->view(), stream(x));
#else
  no_cuda();
#endif
}

void zero(Tensor* t) {
  if (t->nbytes() == 0) return;
  const OpTimer timer(OpKind::kOther, t->device(), "zero", traffic(*t, 1));
  if (t->device().is_cpu()) return t->fill(0.0f);
#if GALE_WITH_CUDA
  GALE_CHECK_CUDA(cudaMemsetAsync(t->data<unsigned char>(), 0, t->nbytes(), stream(*t)));
#else
  no_cuda();
#endif
}

void zero_many(const std::vector<Tensor*>& tensors) {
  if (tensors.empty()) return;
  const Device device = tensors[0]->device();
  for (const Tensor* t : tensors) {
    if (t->nbytes() == 0) continue;
    same_device(*tensors[0], *t, "zero_many");
    GALE_ASSERT(t->dtype() == DType::kF32);
  }
  if (device.is_cpu()) {
    for (Tensor* t : tensors) zero(t);
    return;
  }
  double bytes = 0;
  for (const Tensor* t : tensors) bytes += static_cast<double>(t->nbytes());
  const OpTimer timer(OpKind::kOther, device, "zero", traffic(bytes));
#if GALE_WITH_CUDA
  std::vector<float*> data;
  std::vector<int64_t> counts;
  for (Tensor* t : tensors) {
    if (t->nbytes() == 0) continue;
    data.push_back(t->f32());
    counts.push_back(t->numel());
  }
  kernels::zero_many_cuda(data.data(), counts.data(), static_cast<int>(data.size()), stream(*tensors[0]));
#else
  no_cuda();
#endif
}

Tensor side_by_side(int64_t rows, int64_t cols, std::initializer_list<PlacedBlock> blocks, const Device& device) {
  GALE_ASSERT(blocks.size() <= static_cast<size_t>(kernels::kMaxSideBySide));
  kernels::ColumnBlock views[kernels::kMaxSideBySide];
  int count = 0;
  double read = 0;
  for (const PlacedBlock& b : blocks) {
    GALE_ASSERT(b.src->dtype() == DType::kF32 && b.src->device() == device);
    GALE_ASSERT(b.src->rows() <= rows && b.col >= 0 && b.col + b.src->cols() <= cols);
    for (int k = 0; k < count; ++k)
      GALE_ASSERT(b.col >= views[k].col + views[k].x.cols || b.col + b.src->cols() <= views[k].col);
    views[count++] = kernels::ColumnBlock{b.src->view(), b.col};
    read += static_cast<double>(b.src->nbytes());
  }
  Tensor out = Tensor::empty(rows, cols, DType::kF32, device);
  if (out.nbytes() == 0) return out;
  const OpTimer timer(OpKind::kOther, device, "side_by_side", traffic(read + static_cast<double>(out.nbytes())));
  if (device.is_cpu()) {
    kernels::side_by_side(views, count, out.view());
    return out;
  }
#if GALE_WITH_CUDA
  kernels::side_by_side_cuda(views, count, out.view(), stream(out));
#else
  no_cuda();
#endif
  return out;
}

void axpy_columns(const Tensor& x, int64_t col, float alpha, Tensor* y) {
  same_device(x, *y, "axpy_columns");
  GALE_ASSERT(x.rows() == y->rows() && col >= 0 && col + y->cols() <= x.cols());
  kernels::ConstMatrixView block = x.view();
  block.data += col;
  block.cols = y->cols();
  const OpTimer timer(OpKind::kOther, x.device(), "axpy", traffic(*y, 3));
  if (x.device().is_cpu()) return kernels::axpy(block, alpha, y->view());
#if GALE_WITH_CUDA
  kernels::axpy_cuda(block, alpha, y->view(), stream(x));
#else
  no_cuda();
#endif
}

void copy_columns(const Tensor& x, int64_t col, Tensor* y) {
  same_device(x, *y, "copy_columns");
  GALE_ASSERT(x.dtype() == DType::kF32 && y->dtype() == DType::kF32);
  GALE_ASSERT(x.rows() == y->rows() && col >= 0 && col + y->cols() <= x.cols());
  if (y->nbytes() == 0) return;
  const OpTimer timer(OpKind::kOther, x.device(), "copy_columns", traffic(*y, 2));
  // The block laid alone into y (kernels::side_by_side; 2M rows of 47 floats: 0.38 ms on an H200,
  // as cudaMemcpy2DAsync).
  kernels::ColumnBlock block{x.view(), 0};
  block.x.data += col;
  block.x.cols = y->cols();
  if (x.device().is_cpu()) return kernels::side_by_side(&block, 1, y->view());
#if GALE_WITH_CUDA
  kernels::side_by_side_cuda(&block, 1, y->view(), stream(x));
#else
  no_cuda();
#endif
}

void copy(const Tensor& src, Tensor* dst) {
  same_device(src, *dst, "copy");
  same_shape(src, *dst, "copy");
  GALE_ASSERT(src.dtype() == dst->dtype());
  if (src.nbytes() == 0) return;
  const OpTimer timer(OpKind::kOther, src.device(), "copy", traffic(src, 2));
  if (src.device().is_cpu()) {
    std::memcpy(dst->data<unsigned char>(), src.data<unsigned char>(), src.nbytes());
    return;
  }
#if GALE_WITH_CUDA
  kernels::cuda::copy_on_device(dst->data<unsigned char>(), src.data<unsigned char>(), src.nbytes(), stream(src));
#else
  no_cuda();
#endif
}

Tensor gather_rows(const Tensor& src, const Tensor& ids) {
  same_device(src, ids, "gather_rows");
  GALE_ASSERT(ids.dtype() == DType::kI64 && ids.cols() == 1 && dtype_size(src.dtype()) == 4);
  Tensor out = Tensor::empty(ids.rows(), src.cols(), src.dtype(), src.device());
  if (out.nbytes() == 0) return out;
  const OpTimer timer(OpKind::kOther, src.device(), "gather_rows",
                      traffic(static_cast<double>(ids.nbytes() + 2 * out.nbytes())));
  // A bit-exact row copy: 4-byte elements of any type travel as floats.
  const kernels::ConstMatrixView from{reinterpret_cast<const float*>(src.data<int32_t>()), src.rows(), src.cols(),
                                      src.cols()};
  const kernels::MatrixView to{reinterpret_cast<float*>(out.data<int32_t>()), out.rows(), out.cols(), out.cols()};
  if (src.device().is_cpu()) {
    kernels::gather_rows(from, ids.data<int64_t>(), ids.rows(), to);
    return out;
  }
#if GALE_WITH_CUDA
  kernels::gather_rows_cuda(from, ids.data<int64_t>(), ids.rows(), to, stream(src));
#else
  no_cuda();
#endif
  return out;
}

void relu(const Tensor& x, Tensor* out) {
  same_device(x, *out, "relu");
  same_shape(x, *out, "relu");
  const OpTimer timer(OpKind::kOther, x.device(), "relu", traffic(x, 2));
  if (x.device().is_cpu()) return kernels::relu_forward(x.view(), out->view());
#if GALE_WITH_CUDA
  kernels::relu_forward_cuda(x.view(), out->view(), stream(x));
#else
  no_cuda();
#endif
}

void relu_backward(const Tensor& grad_out, const Tensor& y, Tensor* grad_in) {
  same_device(grad_out, y, "relu_backward");
  same_shape(grad_out, y, "relu_backward");
  const OpTimer timer(OpKind::kOther, y.device(), "relu_backward", traffic(y, 3));
  if (y.device().is_cpu()) return kernels::relu_backward(grad_out.view(), y.view(), grad_in->view());
#if GALE_WITH_CUDA
  kernels::relu_backward_cuda(grad_out.view(), y.view(), grad_in->view(), stream(y));
#else
  no_cuda();
#endif
}

Tensor relu_mask(const Tensor& y) {
  Tensor mask = Tensor::empty(y.rows(), kernels::relu_mask_words(y.cols()), DType::kI32, y.device());
  const OpTimer timer(OpKind::kOther, y.device(), "relu_mask", traffic(static_cast<double>(y.nbytes() + mask.nbytes())));
  auto* bits = mask.data<uint32_t>();
  if (y.device().is_cpu()) {
    kernels::relu_mask(y.view(), bits);
    return mask;
  }
#if GALE_WITH_CUDA
  kernels::relu_mask_cuda(y.view(), bits, stream(y));
  return mask;
#else
  no_cuda();
#endif
}

void relu_backward_mask(const Tensor& grad_out, const Tensor& mask, Tensor* grad_in, Tensor* column_sums) {
  same_device(grad_out, mask, "relu_backward_mask");
  same_shape(grad_out, *grad_in, "relu_backward_mask");
  GALE_ASSERT(mask.rows() == grad_out.rows() && mask.cols() == kernels::relu_mask_words(grad_out.cols()));
  GALE_ASSERT(column_sums == nullptr || column_sums->numel() == grad_out.cols());
  const OpTimer timer(OpKind::kOther, grad_out.device(), "relu_backward_mask",
                      traffic(static_cast<double>(2 * grad_out.nbytes() + mask.nbytes())));
  const auto* bits = mask.data<uint32_t>();
  if (grad_out.device().is_cpu()) {
    kernels::relu_backward_mask(grad_out.view(), bits, grad_in->view());
    if (column_sums != nullptr) kernels::column_sum(grad_in->view(), column_sums->f32(), /*accumulate=*/false);
    return;
  }
#if GALE_WITH_CUDA
  if (column_sums != nullptr) {
    const size_t bytes = kernels::column_sum_workspace_bytes(grad_out.rows(), grad_out.cols());
    Tensor ws = Tensor::empty(static_cast<int64_t>(bytes), 1, DType::kU8, grad_out.device());
    kernels::relu_backward_mask_sum_cuda(grad_out.view(), bits, grad_in->view(), column_sums->f32(),
                                         ws.data<unsigned char>(), bytes, stream(grad_out));
    return;
  }
  kernels::relu_backward_mask_cuda(grad_out.view(), bits, grad_in->view(), stream(grad_out));
#else
  no_cuda();
#endif
}

void elu(const Tensor& x, Tensor* out) {
  same_device(x, *out, "elu");
  same_shape(x, *out, "elu");
  const OpTimer timer(OpKind::kOther, x.device(), "elu", traffic(x, 2));
  if (x.device().is_cpu()) return kernels::elu_forward(x.view(), out->view());
#if GALE_WITH_CUDA
  kernels::elu_forward_cuda(x.view(), out->view(), stream(x));
#else
  no_cuda();
#endif
}

void elu_backward(const Tensor& grad_out, const Tensor& y, Tensor* grad_in) {
  same_device(grad_out, y, "elu_backward");
  same_shape(grad_out, y, "elu_backward");
  const OpTimer timer(OpKind::kOther, y.device(), "elu_backward", traffic(y, 3));
  if (y.device().is_cpu()) return kernels::elu_backward(grad_out.view(), y.view(), grad_in->view());
#if GALE_WITH_CUDA
  kernels::elu_backward_cuda(grad_out.view(), y.view(), grad_in->view(), stream(y));
#else
  no_cuda();
#endif
}

void dropout(const Tensor& x, Tensor* out, float p, uint64_t key) {
  same_device(x, *out, "dropout");
  same_shape(x, *out, "dropout");
  const OpTimer timer(OpKind::kOther, x.device(), "dropout", traffic(x, 2));
  if (x.device().is_cpu()) return kernels::dropout_forward(x.view(), out->view(), p, key);
#if GALE_WITH_CUDA
  kernels::dropout_forward_cuda(x.view(), out->view(), p, key, stream(x));
#else
  no_cuda();
#endif
}

void dropout_backward(const Tensor& grad_out, Tensor* grad_in, float p, uint64_t key) {
  same_device(grad_out, *grad_in, "dropout_backward");
  same_shape(grad_out, *grad_in, "dropout_backward");
  const OpTimer timer(OpKind::kOther, grad_out.device(), "dropout_backward", traffic(grad_out, 2));
  if (grad_out.device().is_cpu()) return kernels::dropout_backward(grad_out.view(), grad_in->view(), p, key);
#if GALE_WITH_CUDA
  kernels::dropout_backward_cuda(grad_out.view(), grad_in->view(), p, key, stream(grad_out));
#else
  no_cuda();
#endif
}

void spmm(const kernels::SpmmArgs& a, const Device& device, kernels::SpmmKind kind) {
#if GALE_WITH_CUDA
  // An output mask that the CUDA kernel cannot apply (only GAR does, kernels/spmm.hpp): the product
  // without it, then ReLU's backward as a pass of its own, as before the fold. The CPU twins all
  // apply it.
  if (a.out_mask != nullptr && device.is_cuda() && kernels::spmm_resolve(kind, a) != kernels::SpmmKind::kGar) {
    GALE_ASSERT(a.out_mask_words == kernels::relu_mask_words(a.out.cols));
    kernels::SpmmArgs unmasked = a;
    unmasked.out_mask = nullptr;
    unmasked.out_mask_words = 0;
    spmm(unmasked, device, kind);
    const OpTimer timer(OpKind::kOther, device, "relu_backward_mask",
                        traffic(static_cast<double>(a.out.rows) * (8.0 * static_cast<double>(a.out.cols) +
                                                                   4.0 * static_cast<double>(a.out_mask_words))));
    kernels::relu_backward_mask_cuda(a.out, a.out_mask, a.out, DeviceContext::get(device.ordinal).stream());
    return;
  }
#endif
  const OpTimer timer(OpKind::kAggregation, device,
                      active_profile ? std::string("spmm ") + kernels::spmm_kind_name(kind) + " w" + std::to_string(a.out.cols) +
                                           (a.bias || a.relu ? " fused" : "") + (a.out_mask ? " masked" : "")
                                     : "",
                      gather_shape(a.out.rows, device.is_cpu() ? a.graph.nnz() : a.nnz, a.out.cols,
                                   a.edge_weight || a.graph.weights ? 4 : 0));
  if (device.is_cpu()) {
    if (kind == kernels::SpmmKind::kSampled) return kernels::spmm_sampled_cpu(a);
    if (kind == kernels::SpmmKind::kTensorCore) return kernels::spmm_tc_cpu(a);  // the TF32 twin
    return kernels::spmm_cpu(a);
  }
#if GALE_WITH_CUDA
  const cudaStream_t s = DeviceContext::get(device.ordinal).stream();
  const int64_t ld = kernels::spmm_resolve(kind, a) == kernels::SpmmKind::kGar ? kernels::spmm_gar_padded_ld(a) : 0;
  if (ld > 0 && a.graph.rows > 0) {
    Tensor padded = Tensor::empty(a.x.rows, ld, DType::kF32, device);
    kernels::cuda::copy_rows_on_device(padded.f32(), ld * sizeof(float), a.x.data,
                                       a.x.ld * sizeof(float), a.x.cols * sizeof(float), a.x.rows, s);
    // GAR's 16-byte gathers read the padding too (and drop it): zeros, not whatever the pool held.
    kernels::fill_block_cuda({padded.f32() + a.x.cols, a.x.rows, ld - a.x.cols, ld}, 0.0f, s);
    kernels::SpmmArgs b = a;
    b.x = kernels::ConstMatrixView{padded.f32(), a.x.rows, a.x.cols, ld};
    return kernels::spmm_cuda(kernels::SpmmKind::kGar, b, s);
  }
  kernels::spmm_cuda(kind, a, s);
#else
  (void)kind;
  no_cuda();
#endif
}

// Adam reads w, g, m and v and writes w, m and v.
constexpr int kAdamPasses = 7;

void adam_update(Tensor* w, const Tensor& g, Tensor* m, Tensor* v, const kernels::AdamParams& p) {
  same_device(*w, g, "adam_update");
  same_shape(*w, g, "adam_update");
  const OpTimer timer(OpKind::kOther, w->device(), "adam", traffic(*w, kAdamPasses));
  if (w->device().is_cpu()) return kernels::adam_update(w->f32(), g.f32(), m->f32(), v->f32(), w->numel(), p);
#if GALE_WITH_CUDA
  kernels::adam_update_cuda(w->f32(), g.f32(), m->f32(), v->f32(), w->numel(), p, stream(*w));
#else
  no_cuda();
#endif
}

void adam_update_many(const std::vector<AdamSlot>& slots, const kernels::AdamParams& p) {
  if (slots.empty()) return;
  const Device device = slots[0].w->device();
  for (const AdamSlot& s : slots) {
    same_device(*slots[0].w, *s.w, "adam_update_many");
    same_device(*s.w, *s.g, "adam_update_many");
    same_shape(*s.w, *s.g, "adam_update_many");
  }
  if (device.is_cpu()) {
    for (const AdamSlot& s : slots) adam_update(s.w, *s.g, s.m, s.v, p);
    return;
  }
  double bytes = 0;
  for (const AdamSlot& s : slots) bytes += static_cast<double>(s.w->nbytes()) * kAdamPasses;
  const OpTimer timer(OpKind::kOther, device, "adam", traffic(bytes));
#if GALE_WITH_CUDA
  std::vector<kernels::AdamTensor> tensors;
  for (const AdamSlot& s : slots)
    if (s.w->numel() > 0) tensors.push_back({s.w->f32(), s.g->f32(), s.m->f32(), s.v->f32(), s.w->numel()});
  kernels::adam_update_many_cuda(tensors.data(), static_cast<int>(tensors.size()), p, stream(*slots[0].w));
#else
  no_cuda();
#endif
}

namespace {

void check_loss_args(const Tensor& logits, const Tensor& labels, const Tensor& rows, const Tensor* grad) {
  same_device(logits, labels, "softmax_cross_entropy");
  same_device(logits, rows, "softmax_cross_entropy");
  GALE_ASSERT(labels.dtype() == DType::kI32 && labels.numel() == logits.rows());
  GALE_ASSERT(rows.dtype() == DType::kI64);
  if (grad) {
    same_device(logits, *grad, "softmax_cross_entropy");
    same_shape(logits, *grad, "softmax_cross_entropy");
  }
}

// The loss reads the logits and the listed rows' ids and writes the gradient.
OpShape loss_traffic(const Tensor& logits, const Tensor& rows, const Tensor* grad) {
  return traffic(static_cast<double>(logits.nbytes() * (grad ? 2 : 1) + rows.nbytes()));
}

}  // namespace

LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& rows, Tensor* grad,
                                 int64_t grad_over) {
  LossResult r;
  if (logits.device().is_cpu()) {
    check_loss_args(logits, labels, rows, grad);
    const OpTimer timer(OpKind::kOther, logits.device(), "softmax_cross_entropy", loss_traffic(logits, rows, grad));
    const int64_t n = rows.numel();
    const int64_t* ids = rows.data<int64_t>();
    const int32_t* y = labels.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      GALE_ASSERT(ids[i] >= 0 && ids[i] < logits.rows());
      GALE_ASSERT(y[ids[i]] >= 0 && y[ids[i]] < logits.cols());
    }
    r.loss = kernels::softmax_cross_entropy_cpu(logits.view(), y, ids, n, grad ? grad->view() : kernels::MatrixView{},
                                                &r.correct, grad_over);
    return r;
  }
  // The GPU computes into 16 bytes of device memory, which come back to the host here.
  Tensor results = Tensor::empty(16, 1, DType::kU8, logits.device());
  softmax_cross_entropy_async(logits, labels, rows, grad, &results, 0, grad_over);
  const Tensor host = results.to(Device::cpu());  // waits for the device
  std::memcpy(&r.loss, host.data<unsigned char>(), 8);
  std::memcpy(&r.correct, host.data<unsigned char>() + 8, 8);
  return r;
}

void softmax_cross_entropy_async(const Tensor& logits, const Tensor& labels, const Tensor& rows, Tensor* grad,
                                 Tensor* results, int64_t slot, int64_t grad_over) {
  same_device(logits, *results, "softmax_cross_entropy_async");
  GALE_ASSERT(results->dtype() == DType::kU8 && slot >= 0 && static_cast<int64_t>(results->nbytes()) >= 16 * (slot + 1));
  unsigned char* out = results->data<unsigned char>() + 16 * slot;
  if (logits.device().is_cpu()) {
    const LossResult r = softmax_cross_entropy(logits, labels, rows, grad, grad_over);
    std::memcpy(out, &r.loss, 8);
    std::memcpy(out + 8, &r.correct, 8);
    return;
  }
#if GALE_WITH_CUDA
  check_loss_args(logits, labels, rows, grad);
  const OpTimer timer(OpKind::kOther, logits.device(), "softmax_cross_entropy", loss_traffic(logits, rows, grad));
  const int64_t n = rows.numel();
  const size_t ws = kernels::softmax_cross_entropy_workspace_bytes(logits.rows(), n);
  Tensor scratch = Tensor::empty(static_cast<int64_t>(ws), 1, DType::kU8, logits.device());
  kernels::softmax_cross_entropy_cuda(logits.view(), labels.data<int32_t>(), rows.data<int64_t>(), n,
                                      grad ? grad->view() : kernels::MatrixView{}, reinterpret_cast<double*>(out),
                                      reinterpret_cast<int64_t*>(out + 8), scratch.data<unsigned char>(), ws,
                                      stream(logits), grad_over);
#else
  no_cuda();
#endif
}

void softmax_cross_entropy_seeds_async(const Tensor& logits, const Tensor& labels, const Tensor& label_ids, Tensor* grad,
                                       Tensor* results, int64_t slot, int64_t grad_over) {
  same_device(logits, labels, "softmax_cross_entropy_seeds");
  same_device(logits, *results, "softmax_cross_entropy_seeds");
  same_device(logits, *grad, "softmax_cross_entropy_seeds");
  same_shape(logits, *grad, "softmax_cross_entropy_seeds");
  GALE_ASSERT(labels.dtype() == DType::kI32);
  GALE_ASSERT(label_ids.defined() ? label_ids.dtype() == DType::kI64 && label_ids.numel() == logits.rows()
                                  : labels.numel() == logits.rows());
  if (label_ids.defined()) same_device(logits, label_ids, "softmax_cross_entropy_seeds");
  GALE_ASSERT(results->dtype() == DType::kU8 && slot >= 0 && static_cast<int64_t>(results->nbytes()) >= 16 * (slot + 1));
  unsigned char* out = results->data<unsigned char>() + 16 * slot;
  const int64_t* ids = label_ids.defined() ? label_ids.data<int64_t>() : nullptr;
  const OpTimer timer(OpKind::kOther, logits.device(), "softmax_cross_entropy",
                      traffic(static_cast<double>(2 * logits.nbytes() + (ids ? label_ids.nbytes() : 0) +
                                                  static_cast<size_t>(logits.rows()) * sizeof(int32_t))));
  if (logits.device().is_cpu()) {
    const int32_t* y = labels.data<int32_t>();
    for (int64_t i = 0; i < logits.rows(); ++i) {
      const int64_t id = ids ? ids[i] : i;
      GALE_ASSERT(id >= 0 && id < labels.numel() && y[id] >= 0 && y[id] < logits.cols());
    }
    LossResult r;
    r.loss = kernels::softmax_cross_entropy_seeds_cpu(logits.view(), y, ids, grad->view(), &r.correct, grad_over);
    std::memcpy(out, &r.loss, 8);
    std::memcpy(out + 8, &r.correct, 8);
    return;
  }
#if GALE_WITH_CUDA
  const size_t ws = kernels::softmax_cross_entropy_workspace_bytes(logits.rows(), logits.rows());
  Tensor scratch = Tensor::empty(static_cast<int64_t>(ws), 1, DType::kU8, logits.device());
  kernels::softmax_cross_entropy_seeds_cuda(logits.view(), labels.data<int32_t>(), ids, labels.numel(), grad->view(),
                                            reinterpret_cast<double*>(out), reinterpret_cast<int64_t*>(out + 8),
                                            scratch.data<unsigned char>(), ws, stream(logits), grad_over);
#else
  no_cuda();
#endif
}

// ---- MaxK --------------------------------------------------------------------------------------

kernels::CbsrView Cbsr::view() {
  return {values.rows(), width, values.cols(), values.f32(), index.data<unsigned char>()};
}
kernels::ConstCbsrView Cbsr::view() const {
  return {values.rows(), width, values.cols(), values.f32(), index.data<unsigned char>()};
}

Cbsr maxk(const Tensor& y, int64_t k, Tensor* dense, int64_t col_offset) {
  GALE_ASSERT(dense == nullptr || (dense->rows() == y.rows() && col_offset >= 0 &&
                                   dense->cols() >= col_offset + y.cols() && dense->device() == y.device()));
  GALE_ASSERT(dense == nullptr || col_offset == 0 || dense->f32() != y.f32());
  kernels::MatrixView block;  // the dense form's columns, rows dense->cols() apart
  if (dense) {
    block = dense->view();
    block.data += col_offset;
    block.cols = y.cols();
  }
  Cbsr c;
  c.width = y.cols();
  c.values = Tensor::empty(y.rows(), k, DType::kF32, y.device());
  c.index = Tensor::empty(y.rows(), k * kernels::cbsr_index_bytes(y.cols()), DType::kU8, y.device());
  const OpTimer timer(OpKind::kOther, y.device(), "maxk",
                      traffic(static_cast<double>(y.nbytes() * (dense ? 2 : 1) + c.values.nbytes() + c.index.nbytes())));
  if (y.device().is_cpu()) {
    kernels::maxk_forward_cpu(y.view(), c.view());
    if (dense) kernels::cbsr_to_dense_cpu(c.view(), block);
    return c;
  }
#if GALE_WITH_CUDA
  kernels::maxk_forward_cuda(y.view(), c.view(), stream(y), block);
  return c;
#else
  no_cuda();
#endif
}

void cbsr_to_dense(const Cbsr& c, Tensor* out, int64_t col_offset) {
  GALE_ASSERT(out->rows() == c.rows() && col_offset >= 0 && out->cols() >= col_offset + c.width &&
              out->device() == c.device());
  kernels::MatrixView block = out->view();  // the column block, rows out->cols() apart
  block.data += col_offset;
  block.cols = c.width;
  const OpTimer timer(OpKind::kOther, out->device(), "cbsr_to_dense",
                      traffic(static_cast<double>(c.values.nbytes() + c.index.nbytes()) +
                              static_cast<double>(c.rows() * c.width) * sizeof(float)));
  if (out->device().is_cpu()) return kernels::cbsr_to_dense_cpu(c.view(), block);
#if GALE_WITH_CUDA
  kernels::cbsr_to_dense_cuda(c.view(), block, stream(*out));
#else
  no_cuda();
#endif
}

void cbsr_dropout(Cbsr* c, float p, uint64_t key) {
  const OpTimer timer(OpKind::kOther, c->device(), "cbsr_dropout", traffic(c->values, 2));
  if (c->device().is_cpu()) return kernels::cbsr_dropout_cpu(c->view(), p, key);
#if GALE_WITH_CUDA
  kernels::cbsr_dropout_cuda(c->view(), p, key, stream(c->values));
#else
  no_cuda();
#endif
}

void maxk_backward(const Cbsr& pattern, const Tensor* grad_values, const Tensor* grad_dense, Tensor* grad_in,
                   Tensor* column_sums) {
  maxk_backward(pattern, grad_values ? grad_values->f32() : nullptr,
                grad_dense ? grad_dense->view() : kernels::ConstMatrixView{}, grad_in, column_sums);
}

void maxk_backward(const Cbsr& pattern, const float* gv, kernels::ConstMatrixView gd, Tensor* grad_in,
                   Tensor* column_sums) {
  GALE_ASSERT(grad_in->rows() == pattern.rows() && grad_in->cols() == pattern.width);
  GALE_ASSERT(column_sums == nullptr || column_sums->numel() == pattern.width);
  Tensor partial;  // the kernel's per-warp rows of column sums (kernels/maxk.hpp), when it makes them
  {
    const OpTimer timer(OpKind::kOther, grad_in->device(), "maxk_backward", traffic(*grad_in, 1));
    if (grad_in->device().is_cpu()) {
      kernels::maxk_backward_cpu(pattern.view(), gv, gd, grad_in->view());
    } else {
#if GALE_WITH_CUDA
      if (column_sums != nullptr && pattern.width <= kernels::kMaxkSumWidth)
        partial = Tensor::empty(kernels::maxk_backward_sum_rows(pattern.rows()), pattern.width, DType::kF32,
                                grad_in->device());
      kernels::maxk_backward_cuda(pattern.view(), gv, gd, grad_in->view(), stream(*grad_in),
                                  partial.defined() ? partial.f32() : nullptr);
#else
      no_cuda();
#endif
    }
  }
  if (column_sums != nullptr) column_sum(partial.defined() ? partial : *grad_in, column_sums, /*accumulate=*/false);
}

Cbsr cbsr_rows(const Cbsr& c, int64_t rows) {
  if (rows == c.rows()) return c;
  return {c.values.rows_slice(0, rows), c.index.rows_slice(0, rows), c.width};
}

bool cbsr_gemm_fits(const Device& device, int64_t width, int64_t n, int terms) {
  if (device.is_cpu()) return true;
#if GALE_WITH_CUDA
  return kernels::cbsr_gemm_cuda_cannot(width, n, terms).empty();
#else
  (void)width;
  (void)n;
  (void)terms;
  return false;
#endif
}

void cbsr_gemm(const Cbsr& x, const Tensor& w, float beta, Tensor* out, const Tensor* w2, Tensor* out2) {
  GALE_ASSERT((w2 == nullptr) == (out2 == nullptr));
  kernels::CbsrGemmArgs a;
  a.x = x.view();
  a.w = w.view();
  a.beta = beta;
  a.out = out->view();
  if (w2 != nullptr) {
    a.w2 = w2->view();
    a.out2 = out2->view();
  }
  const OpTimer timer(OpKind::kGemm, out->device(),
                      active_profile ? "cbsr_gemm k" + std::to_string(x.k()) + " " + std::to_string(x.width) + "x" +
                                           std::to_string(w.cols()) +
                                           (w2 != nullptr ? " and x" + std::to_string(w2->cols()) : std::string())
                                     : "",
                      gemm_shape(x.rows(), w.cols(), x.k(), false, false));  // w2's term left out: a lower bound
  if (out->device().is_cpu()) return kernels::cbsr_gemm_cpu(a);
#if GALE_WITH_CUDA
  kernels::cbsr_gemm_cuda(a, stream(*out));
#else
  no_cuda();
#endif
}

void cbsr_gemm_grad(const Cbsr& pattern, const std::vector<std::pair<Tensor, Tensor>>& terms, Tensor* grad_in,
                    Tensor* column_sums) {
  GALE_ASSERT(!terms.empty() && terms.size() <= 2);
  GALE_ASSERT(column_sums == nullptr || column_sums->numel() == pattern.width);
  kernels::CbsrGemmGradArgs a;
  a.pattern = pattern.view();
  a.terms = static_cast<int>(terms.size());
  for (size_t t = 0; t < terms.size(); ++t) {
    a.grad[t] = terms[t].first.view();
    a.w[t] = terms[t].second.view();
  }
  a.grad_in = grad_in->view();
  int64_t grad_cols = 0;  // the terms side by side: one product over the kept positions
  for (const auto& t : terms) grad_cols += t.first.cols();
  Tensor partial;
  {
    const OpTimer timer(OpKind::kGemm, grad_in->device(),
                        active_profile ? "cbsr_gemm_grad k" + std::to_string(pattern.k()) + " x" +
                                             std::to_string(terms.size())
                                       : "",
                        gemm_shape(pattern.rows(), pattern.k(), grad_cols, false, true));
    if (grad_in->device().is_cpu()) {
      kernels::cbsr_gemm_grad_cpu(a);
    } else {
#if GALE_WITH_CUDA
      if (column_sums != nullptr && kernels::cbsr_gemm_grad_sums_cannot(a).empty()) {
        partial = Tensor::empty(kernels::cbsr_gemm_grad_sum_rows(pattern.rows()), pattern.width, DType::kF32,
                                grad_in->device());
        a.column_partial = partial.f32();
      }
      kernels::cbsr_gemm_grad_cuda(a, stream(*grad_in));
#else
      no_cuda();
#endif
    }
  }
  // The column sums from the kernel's per-warp rows (kernels/maxk.hpp) or, without them, from grad_in.
  if (column_sums != nullptr) column_sum(partial.defined() ? partial : *grad_in, column_sums, /*accumulate=*/false);
}

namespace {

// A CBSR aggregation gathers k kept values a row. Its graph lives in device memory on a GPU, where
// the entry count is not known here: the bound then counts only its output rows.
OpShape cbsr_gather_shape(const kernels::CsrView& graph, int64_t rows, int64_t k, const Device& device) {
  return gather_shape(rows, device.is_cpu() ? graph.nnz() : 0, k, graph.weights ? 4 : 0);
}

}  // namespace

void spgemm(const kernels::SpgemmCbsrArgs& a, const Device& device, const kernels::EdgeGroupsView& groups) {
  const OpTimer timer(OpKind::kAggregation, device,
                      active_profile ? "spgemm k" + std::to_string(a.x.k) + " w" + std::to_string(a.out.cols) : "",
                      cbsr_gather_shape(a.graph, a.out.rows, a.x.k, device));
  if (device.is_cpu()) return kernels::spgemm_cbsr_cpu(a);
#if GALE_WITH_CUDA
  kernels::spgemm_cbsr_cuda(a, groups, DeviceContext::get(device.ordinal).stream());
#else
  (void)groups;
  no_cuda();
#endif
}

void sspmm(const kernels::SspmmCbsrArgs& a, const Device& device, const kernels::EdgeGroupsView& groups) {
  const OpTimer timer(OpKind::kAggregation, device,
                      active_profile ? "sspmm k" + std::to_string(a.pattern.k) + " w" + std::to_string(a.grad_out.cols)
                                     : "",
                      cbsr_gather_shape(a.graph, a.pattern.rows, a.pattern.k, device));
  if (device.is_cpu()) return kernels::sspmm_cbsr_cpu(a);
#if GALE_WITH_CUDA
  kernels::sspmm_cbsr_cuda(a, groups, DeviceContext::get(device.ordinal).stream());
#else
  (void)groups;
  no_cuda();
#endif
}

}  // namespace gale::engine::ops
