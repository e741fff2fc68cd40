// PyG GATConv: z = x W (per head), attention over in-neighbours plus a self loop, heads
// concatenated, + bias. The attention kernels (kernels/gat.hpp) never form E x D messages.
#include "engine/layers/layers.hpp"
#include "engine/layers/linear.hpp"
#include "engine/ops.hpp"
#include "kernels/gat.hpp"
#include "kernels/random.hpp"
#if GALE_WITH_CUDA
#include "engine/device_context.hpp"
#endif

namespace gale::engine {

namespace {

class GatLayer : public Layer {
 public:
  GatLayer(const std::string& prefix, int64_t in, int64_t heads, int64_t per_head, float attn_dropout, uint64_t key)
      : lin_(prefix + ".lin", in, heads * per_head, /*bias=*/false, kernels::derive_key(key, 1)),
        shape_{heads, per_head, 0.2f},
        attn_dropout_(attn_dropout) {
    auto init = [&](Parameter* p, const std::string& name, int64_t rows, int64_t cols, uint64_t k) {
      p->name = prefix + "." + name;
      p->value = Tensor::zeros(rows, cols);
      p->grad = Tensor::zeros(rows, cols);
      if (k != 0) glorot_uniform(&p->value, rows, cols, k);
    };
    init(&att_src_, "att_src", heads, per_head, kernels::derive_key(key, 2));
    init(&att_dst_, "att_dst", heads, per_head, kernels::derive_key(key, 3));
    init(&bias_, "bias", 1, heads * per_head, 0);
  }

  std::string kind() const override { return "gat"; }
  int64_t in_dim() const override { return lin_.in(); }
  int64_t out_dim() const override { return lin_.out(); }

  Tensor forward(const GraphOperand& g, Tensor x, const ForwardContext& ctx) override {
    const int64_t H = shape_.heads, F = shape_.f;
    const Device dev = x.device();
    exec_ = ctx.exec;
    Tensor z = lin_.forward(x, exec_.tf32);
    Tensor el = Tensor::empty(z.rows(), H, DType::kF32, dev), er = Tensor::empty(g.num_dst(), H, DType::kF32, dev);
    Tensor alpha = Tensor::empty(g.nnz(), H, DType::kF32, dev), alpha_self = Tensor::empty(g.num_dst(), H, DType::kF32, dev);
    const float p = ctx.training ? attn_dropout_ : 0.0f;
    Tensor y = Tensor::empty(g.num_dst(), H * F, DType::kF32, dev);
    attend(g, z, p, ctx.rng_key, &el, &er, &alpha, &alpha_self, &y);
    ops::add_bias(&y, bias_.value, ctx.relu);
    if (ctx.training) {
      x_ = x;
      z_ = z;
      el_ = el;
      er_ = er;
      alpha_ = alpha;
      alpha_self_ = alpha_self;
      p_ = p;
      key_ = ctx.rng_key;
    }
    return y;
  }

  Tensor backward(const GraphOperand& g, Tensor grad, bool need_input_grad) override {
    const int64_t H = shape_.heads, F = shape_.f;
    const Device dev = grad.device();
    ops::column_sum(grad, &bias_.grad, /*accumulate=*/true);
    Tensor gz = Tensor::empty(g.num_src(), H * F, DType::kF32, dev);
    Tensor gel = Tensor::empty(g.num_src(), H, DType::kF32, dev), ger = Tensor::empty(g.num_dst(), H, DType::kF32, dev);
    attend_backward(g, grad, &gz, &gel, &ger);
    z_ = el_ = er_ = alpha_ = alpha_self_ = grad = Tensor();
    Tensor gx = lin_.backward(x_, gz, need_input_grad, exec_.tf32);
    x_ = Tensor();
    return gx;
  }

  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> p;
    lin_.add_parameters(&p);
    p.push_back(&att_src_);
    p.push_back(&att_dst_);
    p.push_back(&bias_);
    return p;
  }

 private:
  // For the roofline: a gather of z's rows over the graph, with one attention value per head an entry.
  ops::OpShape attention_shape(const GraphOperand& g, const Tensor& z) const {
    ops::OpShape s;
    s.rows = g.num_dst(), s.nnz = g.nnz(), s.width = z.cols(), s.value_bytes = 4 * shape_.heads;
    return s;
  }

  // Scores, softmax and weighted sum: y (num_dst x H*F) from z, keeping el / er / alpha for backward.
  void attend(const GraphOperand& g, const Tensor& z, float p, uint64_t key, Tensor* el, Tensor* er, Tensor* alpha,
              Tensor* alpha_self, Tensor* y) const {
    const Device& dev = z.device();
    const ops::OpTimer timer(ops::OpKind::kAggregation, dev, "gat_forward", attention_shape(g, z));
    if (dev.is_cpu()) {
      kernels::gat_scores_cpu(z.view(), shape_, att_src_.value.f32(), z.rows(), el->f32());
      kernels::gat_scores_cpu(z.view(), shape_, att_dst_.value.f32(), g.num_dst(), er->f32());
      kernels::gat_softmax_cpu(g.csr(), shape_, el->f32(), er->f32(), alpha->f32(), alpha_self->f32());
      kernels::gat_aggregate_cpu(g.csr(), shape_, alpha->f32(), alpha_self->f32(), p, key, z.view(), y->view());
      return;
    }
#if GALE_WITH_CUDA
    DeviceContext& dc = DeviceContext::get(dev.ordinal);
    kernels::gat_scores_cuda(dc.blas(), z.view(), shape_, att_src_.value.f32(), z.rows(), el->f32());
    kernels::gat_scores_cuda(dc.blas(), z.view(), shape_, att_dst_.value.f32(), g.num_dst(), er->f32());
    // Scores, softmax and the weighted sum in one kernel (fuseGNN Sec. 5.1); alpha is kept for backward.
    kernels::gat_forward_cuda(g.csr(), shape_, el->f32(), er->f32(), p, key, z.view(), alpha->f32(),
                              alpha_self->f32(), y->view(), dc.stream());
#endif
  }

  // From the destinations' gradient: gz (num_src x H*F) and the scores' gradients, accumulating
  // att_src / att_dst's gradients. Scores are el[j,h] = z[j,h,:] . att_src[h,:] (er with att_dst).
  void attend_backward(const GraphOperand& g, const Tensor& grad, Tensor* gz, Tensor* gel, Tensor* ger) {
    const Device& dev = grad.device();
    const ops::OpTimer timer(ops::OpKind::kAggregation, dev, "gat_backward", attention_shape(g, z_));
    if (dev.is_cpu()) {
      kernels::gat_backward_cpu(g.csr(), g.csc(), g.csc_edge(), shape_, el_.f32(), er_.f32(), alpha_.f32(),
                                alpha_self_.f32(), p_, key_, z_.view(), grad.view(), gz->view(), gel->f32(), ger->f32());
      kernels::gat_scores_backward_cpu(z_.view(), shape_, att_src_.value.f32(), z_.rows(), gel->f32(), gz->view(),
                                       att_src_.grad.f32());
      kernels::gat_scores_backward_cpu(z_.view(), shape_, att_dst_.value.f32(), g.num_dst(), ger->f32(), gz->view(),
                                       att_dst_.grad.f32());
      return;
    }
#if GALE_WITH_CUDA
    DeviceContext& dc = DeviceContext::get(dev.ordinal);
    const size_t ws_bytes = kernels::gat_backward_workspace_bytes(g.nnz(), g.num_dst(), shape_);
    Tensor ws = Tensor::empty(static_cast<int64_t>(ws_bytes), 1, DType::kU8, dev);
    kernels::gat_backward_cuda(g.csr(), g.csc(), g.csc_edge(), shape_, el_.f32(), er_.f32(), alpha_.f32(),
                               alpha_self_.f32(), p_, key_, z_.view(), grad.view(), gz->view(), gel->f32(), ger->f32(),
                               ws.data<unsigned char>(), ws_bytes, dc.stream());
    kernels::gat_scores_backward_cuda(dc.blas(), z_.view(), shape_, att_src_.value.f32(), z_.rows(), gel->f32(),
                                      gz->view(), att_src_.grad.f32());
    kernels::gat_scores_backward_cuda(dc.blas(), z_.view(), shape_, att_dst_.value.f32(), g.num_dst(), ger->f32(),
                                      gz->view(), att_dst_.grad.f32());
#endif
  }

  Linear lin_;
  kernels::GatShape shape_;
  float attn_dropout_;
  Parameter att_src_, att_dst_, bias_;
  ops::ExecOptions exec_;
  Tensor x_, z_, el_, er_, alpha_, alpha_self_;
  float p_ = 0.0f;
  uint64_t key_ = 0;
};

}  // namespace

std::unique_ptr<Layer> make_gat_layer(const std::string& prefix, int64_t in, int64_t heads, int64_t per_head,
                                      float attn_dropout, uint64_t seed) {
  return std::make_unique<GatLayer>(prefix, in, heads, per_head, attn_dropout, seed);
}

}  // namespace gale::engine
