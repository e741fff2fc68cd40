// GCN, SAGE and GIN layers: a Linear and a normalised SpMM each, ordered so the SpMM runs on the
// narrower of the input and output widths (aggregation is linear, so A (x W) = (A x) W), as
// PyG's GCNConv does.
#include <cstring>

#include "engine/layers/layers.hpp"
#include "engine/layers/linear.hpp"
#include "kernels/dense.hpp"
#include "kernels/random.hpp"
#include "kernels/spmm.hpp"

namespace gale::engine {

namespace {

// Adds src rows [0, src.rows) into dst (same width).
void add_rows(Tensor* dst, const Tensor& src) {
  float* d = dst->f32();
  const float* s = src.f32();
  for (int64_t i = 0; i < src.numel(); ++i) d[i] += s[i];
}

Parameter make_bias(const std::string& name, int64_t out) {
  Parameter b;
  b.name = name;
  b.value = Tensor::zeros(1, out);
  b.grad = Tensor::zeros(1, out);
  return b;
}

// Which normalised aggregation a layer applies, forward over the CSR and backward over the CSC.
enum class Norm { kGcn, kMean, kSum };

Tensor aggregate(const GraphOperand& g, Norm norm, float self_scale, const Tensor& x) {
  Tensor out = Tensor::empty(g.num_dst(), x.cols());
  kernels::SpmmArgs a;
  a.graph = g.csr();
  a.x = x.view();
  a.out = out.view();
  switch (norm) {
    case Norm::kGcn:
      a.row_scale = g.dst_norm();
      a.col_scale = g.src_norm();
      a.self_coefs = g.self_norm();
      break;
    case Norm::kMean: a.row_scale = g.inv_degree(); break;
    case Norm::kSum: a.self_scale = self_scale; break;
  }
  kernels::spmm_cpu(a);
  return out;
}

// The transpose of `aggregate`: gradient of the sources from the destinations' gradient.
Tensor aggregate_backward(const GraphOperand& g, Norm norm, float self_scale, const Tensor& grad) {
  Tensor out = Tensor::empty(g.num_src(), grad.cols());
  kernels::SpmmArgs a;
  a.graph = g.csc();
  a.x = grad.view();
  a.out = out.view();
  switch (norm) {
    case Norm::kGcn:
      a.row_scale = g.src_norm();
      a.col_scale = g.dst_norm();
      a.self_coefs = g.self_norm();
      break;
    case Norm::kMean: a.col_scale = g.inv_degree(); break;
    case Norm::kSum: a.self_scale = self_scale; break;
  }
  kernels::spmm_cpu(a);
  return out;
}

// Aggregation followed (or preceded, when narrower) by a bias-free Linear, plus a bias.
class AggregateLinear {
 public:
  AggregateLinear(const std::string& prefix, int64_t in, int64_t out, Norm norm, float self_scale, uint64_t key)
      : lin_(prefix + ".lin", in, out, /*bias=*/false, kernels::derive_key(key, 1)),
        bias_(make_bias(prefix + ".bias", out)),
        norm_(norm),
        self_scale_(self_scale) {}

  Tensor forward(const GraphOperand& g, const Tensor& x, bool training) {
    transform_first_ = lin_.out() < lin_.in();
    Tensor y;
    if (transform_first_) {
      y = aggregate(g, norm_, self_scale_, lin_.forward(x));
    } else {
      Tensor a = aggregate(g, norm_, self_scale_, x);
      y = lin_.forward(a);
      if (training) saved_ = a;
    }
    if (training && transform_first_) saved_ = x;
    kernels::add_bias(y.view(), bias_.value.f32());
    return y;
  }

  Tensor backward(const GraphOperand& g, const Tensor& grad, bool need_input_grad) {
    kernels::column_sum(grad.view(), bias_.grad.f32(), /*accumulate=*/true);
    if (transform_first_) {
      const Tensor gh = aggregate_backward(g, norm_, self_scale_, grad);
      return lin_.backward(saved_, gh, need_input_grad);
    }
    const Tensor ga = lin_.backward(saved_, grad, need_input_grad);
    if (!need_input_grad) return Tensor();
    return aggregate_backward(g, norm_, self_scale_, ga);
  }

  void add_parameters(std::vector<Parameter*>* out) {
    lin_.add_parameters(out);
    out->push_back(&bias_);
  }
  int64_t in() const { return lin_.in(); }
  int64_t out() const { return lin_.out(); }

 private:
  Linear lin_;
  Parameter bias_;
  Norm norm_;
  float self_scale_;
  bool transform_first_ = false;
  Tensor saved_;  // x (transform first) or the aggregated input (aggregate first)
};

class GcnLayer : public Layer {
 public:
  GcnLayer(const std::string& prefix, int64_t in, int64_t out, uint64_t key)
      : conv_(prefix, in, out, Norm::kGcn, 0.0f, key) {}
  std::string kind() const override { return "gcn"; }
  int64_t in_dim() const override { return conv_.in(); }
  int64_t out_dim() const override { return conv_.out(); }
  Tensor forward(const GraphOperand& g, const Tensor& x, const ForwardContext& ctx) override {
    return conv_.forward(g, x, ctx.training);
  }
  Tensor backward(const GraphOperand& g, const Tensor& grad, bool need_input_grad) override {
    return conv_.backward(g, grad, need_input_grad);
  }
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> p;
    conv_.add_parameters(&p);
    return p;
  }

 private:
  AggregateLinear conv_;
};

// PyG SAGEConv (mean): lin_l(mean_j x_j) + lin_r(x_i); lin_l carries the bias.
class SageLayer : public Layer {
 public:
  SageLayer(const std::string& prefix, int64_t in, int64_t out, uint64_t key)
      : neigh_(prefix + ".neigh", in, out, Norm::kMean, 0.0f, kernels::derive_key(key, 1)),
        root_(prefix + ".root", in, out, /*bias=*/false, kernels::derive_key(key, 2)) {}
  std::string kind() const override { return "sage"; }
  int64_t in_dim() const override { return neigh_.in(); }
  int64_t out_dim() const override { return neigh_.out(); }
  Tensor forward(const GraphOperand& g, const Tensor& x, const ForwardContext& ctx) override {
    Tensor y = neigh_.forward(g, x, ctx.training);
    const Tensor x_dst = x.rows_slice(0, g.num_dst());
    add_rows(&y, root_.forward(x_dst));
    if (ctx.training) x_dst_ = x_dst;
    return y;
  }
  Tensor backward(const GraphOperand& g, const Tensor& grad, bool need_input_grad) override {
    Tensor gx = neigh_.backward(g, grad, need_input_grad);
    const Tensor g_root = root_.backward(x_dst_, grad, need_input_grad);
    if (need_input_grad) add_rows(&gx, g_root);
    return gx;
  }
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> p;
    neigh_.add_parameters(&p);
    root_.add_parameters(&p);
    return p;
  }

 private:
  AggregateLinear neigh_;
  Linear root_;
  Tensor x_dst_;
};

// PyG GINConv: nn((1 + eps) x_i + sum_j x_j). The MLP's first Linear is folded into the
// aggregation (it is linear), so the SpMM runs on the narrower width.
class GinLayer : public Layer {
 public:
  GinLayer(const std::string& prefix, int64_t in, int64_t out, float eps, int mlp_layers, uint64_t key)
      : first_(prefix + ".mlp.0", in, out, Norm::kSum, 1.0f + eps, kernels::derive_key(key, 1)) {
    if (mlp_layers >= 2) second_ = std::make_unique<Linear>(prefix + ".mlp.2", out, out, true, kernels::derive_key(key, 2));
  }
  std::string kind() const override { return "gin"; }
  int64_t in_dim() const override { return first_.in(); }
  int64_t out_dim() const override { return first_.out(); }
  Tensor forward(const GraphOperand& g, const Tensor& x, const ForwardContext& ctx) override {
    Tensor z = first_.forward(g, x, ctx.training);
    if (!second_) return z;
    kernels::relu_forward(z.view(), z.view());
    if (ctx.training) hidden_ = z;
    return second_->forward(z);
  }
  Tensor backward(const GraphOperand& g, const Tensor& grad, bool need_input_grad) override {
    if (!second_) return first_.backward(g, grad, need_input_grad);
    Tensor gz = second_->backward(hidden_, grad, true);
    kernels::relu_backward(gz.view(), hidden_.view(), gz.view());
    return first_.backward(g, gz, need_input_grad);
  }
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> p;
    first_.add_parameters(&p);
    if (second_) second_->add_parameters(&p);
    return p;
  }

 private:
  AggregateLinear first_;
  std::unique_ptr<Linear> second_;
  Tensor hidden_;
};

}  // namespace

std::unique_ptr<Layer> make_gcn_layer(const std::string& prefix, int64_t in, int64_t out, uint64_t seed) {
  return std::make_unique<GcnLayer>(prefix, in, out, seed);
}
std::unique_ptr<Layer> make_sage_layer(const std::string& prefix, int64_t in, int64_t out, uint64_t seed) {
  return std::make_unique<SageLayer>(prefix, in, out, seed);
}
std::unique_ptr<Layer> make_gin_layer(const std::string& prefix, int64_t in, int64_t out, float eps, int mlp_layers,
                                      uint64_t seed) {
  return std::make_unique<GinLayer>(prefix, in, out, eps, mlp_layers, seed);
}

}  // namespace gale::engine
