#include "engine/model.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "engine/layers/layers.hpp"
#include "kernels/dense.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"

namespace gale::engine {

struct Model::Saved {
  bool dropped = false;     // dropout applied to this layer's input
  uint64_t dropout_key = 0;
  Tensor activated;         // ELU output (hidden layers), for its backward
  Tensor relu_mask;         // ReLU: one bit per element instead of the output itself
};

std::string activation_name(const ModelConfig& c) {
  switch (c.activation) {
    case Activation::kRelu: return "relu";
    case Activation::kElu: return "elu";
    case Activation::kMaxK: return "maxk:" + std::to_string(c.maxk);
  }
  return "?";
}

std::string norm_name(Norm norm) { return norm == Norm::kBatch ? "batch" : "none"; }

Norm parse_norm(const std::string& text) {
  if (text == "none") return Norm::kNone;
  if (text == "batch") return Norm::kBatch;
  throw InputError("--norm: expected none or batch, found '" + text + "'");
}

void parse_activation(const std::string& text, ModelConfig* c) {
  if (text == "relu") {
    c->activation = Activation::kRelu;
  } else if (text == "elu") {
    c->activation = Activation::kElu;
  } else if (text.rfind("maxk:", 0) == 0) {
    const std::string k = text.substr(5);
    int64_t value = 0;
    auto [ptr, ec] = std::from_chars(k.data(), k.data() + k.size(), value);
    if (ec != std::errc() || ptr != k.data() + k.size() || k.empty() || value < 1)
      throw InputError("--activation: expected maxk:K with a positive integer K, found '" + text + "'");
    c->activation = Activation::kMaxK;
    c->maxk = value;
  } else {
    throw InputError("--activation: expected relu, elu or maxk:K, found '" + text + "'");
  }
}

Model::Model(const ModelConfig& config, uint64_t seed) : config_(config) {
  const auto& c = config_;
  if (c.layers < 1) throw InputError("--layers: expected at least 1");
  if (c.in_dim < 1 || c.out_dim < 1) throw InputError("model: input width and class count must be positive");
  if (c.edge_weights && c.model == "gat")
    throw InputError("model: gat does not aggregate with edge weights (its attention weighs the neighbours)");
  const int64_t hidden_width = c.model == "gat" ? c.hidden * c.heads : c.hidden;
  if (c.activation == Activation::kMaxK) {
    if (c.model == "gat") throw InputError("--activation maxk: supported for gcn, sage and gin, not gat");
    if (c.maxk < 1 || c.maxk > hidden_width)
      throw InputError("--activation maxk:K: expected 1 <= K <= --hidden (" + std::to_string(hidden_width) + "), found " +
                       std::to_string(c.maxk));
  }
  for (int l = 0; l < c.layers; ++l) {
    const bool last = l + 1 == c.layers;
    const int64_t in = l == 0 ? c.in_dim : hidden_width;
    const int64_t out = last ? c.out_dim : hidden_width;
    const std::string prefix = "layers." + std::to_string(l);
    const uint64_t key = kernels::derive_key(seed ^ 0x6a1e5eedULL, static_cast<uint64_t>(l));
    if (c.model == "gcn") layers_.push_back(make_gcn_layer(prefix, in, out, key));
    else if (c.model == "sage") layers_.push_back(make_sage_layer(prefix, in, out, key));
    else if (c.model == "gin") layers_.push_back(make_gin_layer(prefix, in, out, c.gin_eps, c.gin_mlp_layers, key));
    else if (c.model == "gat")
      layers_.push_back(make_gat_layer(prefix, in, last ? 1 : c.heads, last ? c.out_dim : c.hidden, c.attn_dropout, key));
    else throw InputError("--model: expected gcn, sage, gin or gat, found '" + c.model + "'");
    if (!last && c.norm == Norm::kBatch) norms_.push_back(std::make_unique<BatchNorm>(prefix + ".norm", out));
  }
}

void Model::to(const Device& device) {
  for (auto& layer : layers_) {
    for (Parameter* p : layer->parameters()) {
      p->value = p->value.to(device);
      p->grad = p->grad.to(device);
    }
  }
  for (auto& norm : norms_) norm->to(device);
  device_ = device;
  pack_gradients();
}

void Model::pack_gradients() {
  // In the order backward finishes them (last layer first): the gradients of consecutive layers,
  // summed in one bucket by data-parallel workers, are then one run of memory, one NCCL sum.
  std::vector<Parameter*> order;
  for (size_t l = layers_.size(); l-- > 0;)
    for (Parameter* p : layer_parameters(l)) order.push_back(p);
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (Parameter* p : order) shapes.emplace_back(p->grad.rows(), p->grad.cols());
  std::vector<Tensor> packed = Tensor::packed_zeros(shapes, DType::kF32, device_);
  for (size_t i = 0; i < order.size(); ++i) {
    ops::copy(order[i]->grad, &packed[i]);
    order[i]->grad = std::move(packed[i]);
  }
}

Tensor Model::forward(const std::vector<const GraphOperand*>& graphs, const Tensor& x, bool training,
                      uint64_t rng_key, const std::function<void()>& before_weights) {
  GALE_ASSERT(graphs.size() == layers_.size());
  // Blocks chain outermost first: layer l's destinations are layer l+1's sources.
  GALE_ASSERT(x.rows() == graphs[0]->num_src() && x.cols() == config_.in_dim);
  GALE_ASSERT(x.device() == device_);
  for (size_t l = 1; l < graphs.size(); ++l) GALE_ASSERT(graphs[l]->num_src() == graphs[l - 1]->num_dst());
  for (const GraphOperand* g : graphs) GALE_ASSERT(g->device() == device_);
  graphs_ = graphs;
  saved_.clear();
  Tensor h = x;
  ops::Cbsr sparse;  // the CBSR form of h while h is MaxK's output
  bool weights_ready = !before_weights;
  const std::function<void()> ready = [&] {
    GALE_ASSERT(!weights_ready);  // once
    weights_ready = true;
    before_weights();
  };
  if (!weights_ready && !layers_[0]->takes_before_weights()) ready();
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto saved = std::make_shared<Saved>();
    if (training && config_.dropout > 0.0f) {
      saved->dropped = true;
      saved->dropout_key = kernels::derive_key(rng_key, 2 * l);
      if (h.defined()) {  // undefined: a MaxK output whose dense form this layer does not read
        Tensor d = Tensor::empty(h.rows(), h.cols(), DType::kF32, device_);
        ops::dropout(h, &d, config_.dropout, saved->dropout_key);
        h = d;
      }
      // The same masks on the kept values, so both forms still agree.
      if (sparse.values.defined()) ops::cbsr_dropout(&sparse, config_.dropout, saved->dropout_key);
    }
    const bool hidden = l + 1 < layers_.size();
    ForwardContext ctx;
    ctx.training = training;
    ctx.rng_key = kernels::derive_key(rng_key, 2 * l + 1);
    // The layer fuses ReLU where it can, unless a normalisation comes between.
    ctx.relu = hidden && config_.activation == Activation::kRelu && norms_.empty();
    ctx.exec = exec_;
    ctx.maxk_input = sparse.values.defined() ? &sparse : nullptr;
    ctx.constant_input = constant_input_ && l == 0 && !saved->dropped;
    ctx.first_layer = l == 0;
    if (!weights_ready) ctx.before_weights = &ready;
    h = layers_[l]->forward(*graphs[l], std::move(h), ctx);  // h's last owner: the layer frees it when it can
    GALE_ASSERT(weights_ready);  // the layer called it before reading a parameter
    if (hidden) normalize(l, &h, training);
    sparse = ops::Cbsr();
    if (hidden && config_.activation == Activation::kMaxK) {
      // The next layer holds the CBSR form for its backward, and returns gradients already masked.
      // The dense form is written in place only for a next layer that reads it.
      if (layers_[l + 1]->reads_dense_maxk_input()) {
        sparse = ops::maxk(h, config_.maxk, &h);
      } else {
        // Not under dropout: its masks change the kept values after this write.
        int64_t offset = 0;
        const bool dropout_next = training && config_.dropout > 0.0f;
        Tensor staged = dropout_next ? Tensor() : layers_[l + 1]->stage_maxk_input(*graphs[l + 1], &offset);
        sparse = staged.defined() ? ops::maxk(h, config_.maxk, &staged, offset) : ops::maxk(h, config_.maxk);
        h = Tensor();
      }
    } else if (hidden && config_.activation == Activation::kElu) {
      ops::elu(h, &h);
      if (training) saved->activated = h;
    } else if (hidden && training) {
      // The output itself is then owned by the next layer alone, which frees it as soon as its
      // backward no longer needs it.
      saved->relu_mask = ops::relu_mask(h);
    }
    if (training) saved_.push_back(saved);
  }
  return h;
}

int64_t Model::widest_dim() const {
  int64_t widest = 1;
  for (const auto& layer : layers_) widest = std::max({widest, layer->in_dim(), layer->out_dim()});
  return widest;
}

Tensor Model::infer_layer(size_t l, const GraphOperand& g, Tensor x) {
  GALE_ASSERT(l < layers_.size());
  GALE_ASSERT(x.rows() == g.num_src() && x.cols() == layers_[l]->in_dim());
  GALE_ASSERT(x.device() == device_ && g.device() == device_);
  const bool hidden = l + 1 < layers_.size();
  ForwardContext ctx;
  ctx.relu = hidden && config_.activation == Activation::kRelu && norms_.empty();
  ctx.exec = exec_;
  ctx.first_layer = l == 0;
  Tensor h = layers_[l]->forward(g, std::move(x), ctx);
  if (hidden) normalize(l, &h, /*training=*/false);
  if (hidden && config_.activation == Activation::kMaxK) {
    ops::maxk(h, config_.maxk, &h);  // the dense form in place; the CBSR form is not needed
  } else if (hidden && config_.activation == Activation::kElu) {
    ops::elu(h, &h);
  }
  return h;
}

void Model::backward(Tensor grad_logits, const GradHook& on_layer_grads) {
  GALE_ASSERT(saved_.size() == layers_.size());
  Tensor g = std::move(grad_logits);
  Tensor g_sums;  // g's column sums, when the backward that wrote g made them (Layer::take_input_grad_sums)
  bool relu_folded = false;  // the backward that wrote g applied ReLU's backward too (Layer::fold_input_relu)
  for (size_t l = layers_.size(); l-- > 0;) {
    Saved& s = *saved_[l];
    if (l + 1 < layers_.size()) {
      // In place: the gradient of the activation's output is not needed again. MaxK's backward
      // was folded into the next layer's (ForwardContext::maxk_input), and so may ReLU's be.
      const bool folded = config_.activation == Activation::kMaxK || relu_folded;
      if (!folded) g_sums = Tensor();  // the sums of g before this backward
      if (config_.activation == Activation::kElu) {
        ops::elu_backward(g, s.activated, &g);
      } else if (config_.activation == Activation::kRelu && norms_.empty() && !relu_folded) {
        if (layers_[l]->takes_output_grad_sums()) g_sums = Tensor::empty(1, g.cols(), DType::kF32, g.device());
        ops::relu_backward_mask(g, s.relu_mask, &g, g_sums.defined() ? &g_sums : nullptr);
      }
      if (!norms_.empty()) {
        // ReLU's backward rides in the normalisation's passes.
        const bool relu = config_.activation == Activation::kRelu;
        g = norms_[l]->backward(std::move(g), relu ? &s.relu_mask : nullptr);
        g_sums = Tensor();  // they summed the gradient of the normalisation's output
      }
      s.activated = s.relu_mask = Tensor();  // released as soon as it has served, to bound peak memory
    }
    if (g_sums.defined()) layers_[l]->give_output_grad_sums(std::move(g_sums));
    // ReLU's backward below this layer, folded into the kernel that writes its input gradient when
    // the layer can. Under input dropout its backward then comes after ReLU's instead of before:
    // both select (kept values scaled, the rest +0), so the order changes no bit.
    relu_folded = false;
    if (l > 0 && fold_relu_ && config_.activation == Activation::kRelu && norms_.empty()) {
      relu_folded = layers_[l]->fold_input_relu(*graphs_[l], saved_[l - 1]->relu_mask);
      if (relu_folded) saved_[l - 1]->relu_mask = Tensor();  // the layer holds it until its backward is done
    }
    // The gradient is handed over, so the layer frees it as soon as it is done with it.
    g = layers_[l]->backward(*graphs_[l], std::move(g), /*need_input_grad=*/l > 0);
    g_sums = layers_[l]->take_input_grad_sums();
    if (on_layer_grads) on_layer_grads(layer_parameters(l));
    if (l > 0 && s.dropped) {
      ops::dropout_backward(g, &g, config_.dropout, s.dropout_key);
      g_sums = Tensor();  // the sums of g before dropout's backward
    }
  }
  saved_.clear();
}

std::vector<Parameter*> Model::layer_parameters(size_t l) {
  std::vector<Parameter*> params = layers_[l]->parameters();
  if (l < norms_.size()) {
    for (Parameter* p : norms_[l]->parameters()) params.push_back(p);
  }
  return params;
}

std::vector<Parameter*> Model::parameters() {
  std::vector<Parameter*> all;
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (Parameter* p : layer_parameters(l)) all.push_back(p);
  }
  return all;
}

std::vector<std::vector<Parameter*>> Model::parameters_by_layer() {
  std::vector<std::vector<Parameter*>> out;
  for (size_t l = 0; l < layers_.size(); ++l) out.push_back(layer_parameters(l));
  return out;
}

std::vector<Buffer*> Model::buffers() {
  std::vector<Buffer*> all;
  for (auto& norm : norms_) {
    for (Buffer* b : norm->buffers()) all.push_back(b);
  }
  return all;
}

void Model::normalize(size_t l, Tensor* h, bool training) {
  if (l >= norms_.size()) return;
  // ReLU in the normalisation's pass (the layer could not fuse it); the other activations follow as
  // without one.
  *h = norms_[l]->forward(std::move(*h), training, config_.activation == Activation::kRelu);
}

void Model::zero_grad() {
  std::vector<Tensor*> grads;
  for (Parameter* p : parameters()) grads.push_back(&p->grad);
  ops::zero_many(grads);
}

int64_t Model::num_parameters() {
  int64_t n = 0;
  for (Parameter* p : parameters()) n += p->value.numel();
  return n;
}

double softmax_cross_entropy(const Tensor& logits, const int32_t* labels, const std::vector<int64_t>& rows,
                             Tensor* grad, int64_t* correct) {
  const int64_t c = logits.cols();
  GALE_ASSERT(c > 0);
  if (grad) GALE_ASSERT(grad->rows() == logits.rows() && grad->cols() == c);
  for (int64_t r : rows) {
    GALE_ASSERT(r >= 0 && r < logits.rows());
    GALE_ASSERT(labels[r] >= 0 && labels[r] < c);
  }
  return kernels::softmax_cross_entropy_cpu(logits.view(), labels, rows.data(), static_cast<int64_t>(rows.size()),
                                            grad ? grad->view() : kernels::MatrixView{}, correct);
}

Adam::Adam(std::vector<Parameter*> params, float lr, float weight_decay, float beta1, float beta2, float eps)
    : params_(std::move(params)), lr_(lr), weight_decay_(weight_decay), beta1_(beta1), beta2_(beta2), eps_(eps) {
  for (Parameter* p : params_) {
    m_.push_back(Tensor::zeros(p->value.rows(), p->value.cols(), DType::kF32, p->value.device()));
    v_.push_back(Tensor::zeros(p->value.rows(), p->value.cols(), DType::kF32, p->value.device()));
  }
}

void Adam::step() {
  ++step_;
  kernels::AdamParams a;
  a.lr = lr_;
  a.beta1 = beta1_;
  a.beta2 = beta2_;
  a.eps = eps_;
  a.weight_decay = weight_decay_;
  a.step = step_;
  std::vector<ops::AdamSlot> slots;
  for (size_t i = 0; i < params_.size(); ++i) slots.push_back({&params_[i]->value, &params_[i]->grad, &m_[i], &v_[i]});
  ops::adam_update_many(slots, a);
}

}  // namespace gale::engine
