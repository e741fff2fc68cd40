// PyG GATConv: z = x W (per head), attention over in-neighbours plus a self loop, heads
// concatenated, + bias. The attention kernels (kernels/gat.hpp) never form E x D messages.
#include <tbb/parallel_for.h>

#include <algorithm>

#include "engine/layers/layers.hpp"
#include "engine/layers/linear.hpp"
#include "kernels/dense.hpp"
#include "kernels/gat.hpp"
#include "kernels/random.hpp"

namespace gale::engine {

namespace {

// Runs body(r) for every row in parallel; each row is written by one task only.
template <typename Body>
void for_rows(int64_t rows, int64_t cols, Body&& body) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, grain), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) body(i);
  });
}

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

  Tensor forward(const GraphOperand& g, const Tensor& x, const ForwardContext& ctx) override {
    const int64_t H = shape_.heads, F = shape_.f;
    Tensor z = lin_.forward(x);
    Tensor el = scores(z, att_src_, z.rows());
    Tensor er = scores(z, att_dst_, g.num_dst());
    Tensor alpha = Tensor::empty(g.csr().nnz(), H), alpha_self = Tensor::empty(g.num_dst(), H);
    kernels::gat_softmax_cpu(g.csr(), shape_, el.f32(), er.f32(), alpha.f32(), alpha_self.f32());
    const float p = ctx.training ? attn_dropout_ : 0.0f;
    Tensor y = Tensor::empty(g.num_dst(), H * F);
    kernels::gat_aggregate_cpu(g.csr(), shape_, alpha.f32(), alpha_self.f32(), p, ctx.rng_key, z.view(), y.view());
    kernels::add_bias(y.view(), bias_.value.f32());
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

  Tensor backward(const GraphOperand& g, const Tensor& grad, bool need_input_grad) override {
    const int64_t H = shape_.heads, F = shape_.f;
    kernels::column_sum(grad.view(), bias_.grad.f32(), /*accumulate=*/true);
    Tensor gz = Tensor::empty(g.num_src(), H * F);
    Tensor gel = Tensor::empty(g.num_src(), H), ger = Tensor::empty(g.num_dst(), H);
    kernels::gat_backward_cpu(g.csr(), g.csc(), g.csc_edge(), shape_, el_.f32(), er_.f32(), alpha_.f32(),
                              alpha_self_.f32(), p_, key_, z_.view(), grad.view(), gz.view(), gel.f32(), ger.f32());
    // Scores are el[j,h] = z[j,h,:] . att_src[h,:] (and er with att_dst over destinations).
    score_backward(gel, att_src_, z_.rows(), &gz);
    score_backward(ger, att_dst_, g.num_dst(), &gz);
    return lin_.backward(x_, gz, need_input_grad);
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
  // s[j,h] = sum_k z[j,h,k] att[h,k] for the first `rows` rows of z (PyG's alpha_src / alpha_dst:
  // (x W).view(-1, H, F) * att).sum(-1)). Rows are independent, so they run in parallel.
  Tensor scores(const Tensor& z, const Parameter& att, int64_t rows) const {
    const int64_t H = shape_.heads, F = shape_.f;
    Tensor s = Tensor::empty(rows, H);
    const float* a = att.value.f32();
    const float* zp = z.f32();
    float* sp = s.f32();
    for_rows(rows, H * F, [&](int64_t j) {
      const float* zj = zp + j * H * F;
      for (int64_t h = 0; h < H; ++h) {
        float acc = 0.0f;
        for (int64_t k = 0; k < F; ++k) acc += zj[h * F + k] * a[h * F + k];
        sp[j * H + h] = acc;
      }
    });
    return s;
  }

  // From d(loss)/d(scores) over the first `rows` rows: accumulates into att's gradient and gz.
  void score_backward(const Tensor& gs, Parameter& att, int64_t rows, Tensor* gz) const {
    const int64_t H = shape_.heads, F = shape_.f;
    // d att[h,k] = sum_j gs[j,h] z[j,h,k]: formed as a rows x HF product, then summed per column
    // (deterministic order), so no per-thread partial sums are needed.
    Tensor prod = Tensor::empty(rows, H * F);
    const float* a = att.value.f32();
    const float* zp = z_.f32();
    const float* gsp = gs.f32();
    float* pp = prod.f32();
    float* gzp = gz->f32();
    for_rows(rows, H * F, [&](int64_t j) {
      const float* zj = zp + j * H * F;
      float* pj = pp + j * H * F;
      float* gzj = gzp + j * H * F;
      for (int64_t h = 0; h < H; ++h) {
        const float g = gsp[j * H + h];
        for (int64_t k = 0; k < F; ++k) {
          pj[h * F + k] = g * zj[h * F + k];
          gzj[h * F + k] += g * a[h * F + k];
        }
      }
    });
    kernels::column_sum(prod.view(), att.grad.f32(), /*accumulate=*/true);
  }

  Linear lin_;
  kernels::GatShape shape_;
  float attn_dropout_;
  Parameter att_src_, att_dst_, bias_;
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
