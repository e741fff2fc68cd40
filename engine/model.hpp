// engine/model.hpp — a stack of GNN layers with activation and dropout between them, the loss,
// and Adam. What the trainer drives; the layers themselves live in engine/layers/.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/graph.hpp"
#include "engine/layer.hpp"
#include "engine/layers/batch_norm.hpp"
#include "engine/ops.hpp"
#include "engine/tensor.hpp"

namespace gale::engine {

// Between layers: ReLU, ELU, or MaxK (MaxK-GNN: keep each row's k largest values, zero the rest;
// the next layer then aggregates the sparse CBSR form).
enum class Activation { kRelu, kElu, kMaxK };
// After each hidden layer, before its activation: nothing, or batch normalisation
// (engine/layers/batch_norm.hpp; --norm batch).
enum class Norm { kNone, kBatch };

struct ModelConfig {
  std::string model = "sage";     // gcn | sage | gin | gat
  int layers = 2;
  int64_t in_dim = 0;
  int64_t hidden = 16;
  int64_t out_dim = 0;            // classes
  int heads = 8;                  // GAT: hidden layers have `heads` heads of `hidden` features each,
                                  // concatenated; the output layer has one head (as PyG's example)
  float dropout = 0.5f;           // on the input of every layer (PyG examples' placement)
  float attn_dropout = 0.6f;      // GAT attention coefficients
  Activation activation = Activation::kRelu;  // between layers (GAT examples use ELU)
  int64_t maxk = 0;               // k of Activation::kMaxK (1 <= k <= hidden width)
  Norm norm = Norm::kNone;
  float gin_eps = 0.0f;           // GIN: (1 + eps) * x_i + sum_j x_j
  int gin_mlp_layers = 2;         // GIN's MLP depth (Linear-ReLU-Linear)
  // GCN, SAGE, GIN: aggregate with the graph's edge weights (GCN as PyG's GCNConv with
  // edge_weight: weighted degrees; SAGE a mean and GIN a sum of weighted messages, as DGL's convs
  // with edge_weight). The graph operands carry the weights or not (engine/graph.hpp); this says
  // which the model was trained with, so inference builds the same.
  bool edge_weights = false;
};

// "none" or "batch": the --norm spelling, also used in checkpoints; the parse throws InputError
// naming --norm.
std::string norm_name(Norm norm);
Norm parse_norm(const std::string& text);
// "relu", "elu" or "maxk:K": the --activation spelling, also used in checkpoints.
std::string activation_name(const ModelConfig& c);
// Parses that spelling into c.activation (and c.maxk); throws InputError naming --activation.
void parse_activation(const std::string& text, ModelConfig* c);

// Builds the model with Glorot-uniform weights and zero biases drawn from `seed`, on the host;
// to() moves it to the device it trains on.
class Model {
 public:
  Model(const ModelConfig& config, uint64_t seed);
  const ModelConfig& config() const { return config_; }

  // Moves every parameter and gradient to `device` (graphs and inputs must then live there too).
  // The gradients are packed in one buffer there, in the order backward finishes them (last
  // layer's first; Tensor::packed_zeros), so a bucket of consecutive ones is one sum.
  void to(const Device& device);
  const Device& device() const { return device_; }
  // Kernel choices for the layers (--spmm, --tf32); the model's identity does not depend on them.
  void set_exec(const ops::ExecOptions& exec) { exec_ = exec; }
  // The caller's promise that forward's x is the same tensor with the same contents at every call
  // (full-graph training's resident features). Without input dropout the first layer then keeps
  // its aggregation A x on a whole graph instead of computing it twice per step (forward, and
  // again in backward); it holds one num_nodes x in_dim tensor for that.
  void set_constant_input(bool constant) { constant_input_ = constant; }
  // ReLU's backward (without a normalisation) folded into the kernel of the next layer's backward
  // that writes the gradient it masks, where that layer can (Layer::fold_input_relu; the default).
  // Off: always a pass of its own, the same values (tests compare the two).
  void set_fold_relu(bool fold) { fold_relu_ = fold; }

  // One graph per layer (the same full graph for all, or the sampled blocks outermost first).
  // x: graphs[0]->num_src x in_dim. Returns graphs.back()->num_dst x out_dim logits.
  // before_weights, when given, is called once, before the forward first reads a parameter, and
  // after the work that reads none (the first layer's aggregation A x where it aggregates first):
  // a data-parallel worker finishes the previous step's update there (waits for the gradient sums,
  // Adam), so that work overlaps the sums. The parameters may change inside the call.
  Tensor forward(const std::vector<const GraphOperand*>& graphs, const Tensor& x, bool training,
                 uint64_t rng_key, const std::function<void()>& before_weights = {});
  // Inference through layer l alone (no dropout, nothing kept for backward): x is the previous
  // layer's activated output (the model's input for l = 0) over g's sources; returns g's
  // destinations' output, activated unless l is the last layer. A MaxK output is returned dense
  // (zeros past the kept values), so the next call aggregates it as any dense input: the same
  // function as forward's CBSR path, up to the order of float additions. Layer-wise inference
  // (engine/layerwise.hpp) chains these over chunks of nodes.
  Tensor infer_layer(size_t l, const GraphOperand& g, Tensor x);
  size_t num_layers() const { return layers_.size(); }
  int64_t layer_out_dim(size_t l) const { return layers_[l]->out_dim(); }
  // The widest of the layers' inputs and outputs.
  int64_t widest_dim() const;
  // Backpropagates d(loss)/d(logits) through the last training forward. Takes the gradient over
  // (and overwrites it): pass std::move(grad) to let its memory go as early as possible.
  // on_layer_grads, when given, is called with each layer's parameters as soon as their gradients
  // are final (last layer first), so data-parallel workers can start summing them while the layers
  // below still run.
  using GradHook = std::function<void(const std::vector<Parameter*>&)>;
  void backward(Tensor grad_logits, const GradHook& on_layer_grads = {});

  // Every parameter: each layer's, then its normalisation's, input layer first.
  std::vector<Parameter*> parameters();
  // The same, grouped by layer (input layer first; a layer's group holds its normalisation's).
  std::vector<std::vector<Parameter*>> parameters_by_layer();
  // What the model keeps without learning (the normalisations' running statistics), in order.
  std::vector<Buffer*> buffers();
  void zero_grad();
  int64_t num_parameters();

 private:
  ModelConfig config_;
  Device device_ = Device::cpu();
  ops::ExecOptions exec_;
  bool constant_input_ = false;
  bool fold_relu_ = true;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::unique_ptr<BatchNorm>> norms_;  // one per hidden layer with Norm::kBatch, else none
  std::vector<Parameter*> layer_parameters(size_t l);
  void pack_gradients();
  // Hidden layer l's normalisation of its output h, then ReLU when that is the activation (which
  // the layer fuses itself without a normalisation); nothing without one.
  void normalize(size_t l, Tensor* h, bool training);
  // Saved by forward for backward: per layer, its input after dropout, dropout key, pre-activation.
  struct Saved;
  std::vector<std::shared_ptr<Saved>> saved_;
  std::vector<const GraphOperand*> graphs_;
};

// Mean softmax cross-entropy over `rows` of logits (labels indexed by row). Writes
// d(loss)/d(logits) into grad (zero for rows not listed) when grad is non-null; returns the loss.
// `correct`, when non-null, receives how many of those rows are argmax-correct.
double softmax_cross_entropy(const Tensor& logits, const int32_t* labels,
                             const std::vector<int64_t>& rows, Tensor* grad, int64_t* correct);

// Adam with L2 weight decay added to the gradient (torch.optim.Adam's weight_decay). Its moments
// live on the parameters' device: build it after Model::to.
class Adam {
 public:
  Adam(std::vector<Parameter*> params, float lr, float weight_decay, float beta1 = 0.9f,
       float beta2 = 0.999f, float eps = 1e-8f);
  void step();
  int64_t steps() const { return step_; }
  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  // State for checkpoints: first and second moments, one pair per parameter in order.
  std::vector<Tensor>& first_moments() { return m_; }
  std::vector<Tensor>& second_moments() { return v_; }
  void set_steps(int64_t s) { step_ = s; }

 private:
  std::vector<Parameter*> params_;
  float lr_, weight_decay_, beta1_, beta2_, eps_;
  int64_t step_ = 0;
  std::vector<Tensor> m_, v_;
};

}  // namespace gale::engine
