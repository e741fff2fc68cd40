// engine/layers/batch_norm.hpp — batch normalisation between GNN layers (torch.nn.BatchNorm1d, as
// OGB's GCN and SAGE baselines place it: conv, norm, activation, dropout).
//
// In training it normalises each column of a layer's output by the batch's mean and biased
// variance (the whole graph's nodes in full-graph training, a block's destinations in mini-batch),
// scales by gamma and shifts by beta (learned), and moves the running mean and unbiased variance
// towards the batch's by `momentum`; in inference it normalises by the running statistics, so a
// node's output does not depend on which others share its chunk (layer-wise evaluation). The
// running statistics are buffers: checkpointed, not learned. With several data-parallel workers
// each replica keeps its own from its batches, and worker 0's are evaluated and checkpointed
// (PyTorch DDP's default broadcasts rank 0's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/layer.hpp"
#include "engine/tensor.hpp"

namespace gale::engine {

// A tensor a model keeps and checkpoints without learning it.
struct Buffer {
  std::string name;  // unique within a model, e.g. "layers.0.norm.running_mean"
  Tensor value;
};

class BatchNorm {
 public:
  static constexpr float kEps = 1e-5f;       // torch's defaults
  static constexpr float kMomentum = 0.1f;

  // gamma 1, beta 0, running mean 0 and variance 1, named prefix.weight / .bias / .running_mean /
  // .running_var, on the host.
  BatchNorm(const std::string& prefix, int64_t width);
  void to(const Device& device);
  // Returns the normalised x, through ReLU when relu (in the same pass): in x's memory in
  // inference; in training a new tensor, x and the batch's statistics kept for backward, and the
  // running statistics updated.
  Tensor forward(Tensor x, bool training, bool relu);
  // d(loss)/d(output) -> d(loss)/d(input), in place; accumulates gamma's and beta's gradients. With
  // relu_mask (ops::relu_mask of the output, when forward applied ReLU) grad is the gradient of the
  // output after ReLU, taken through ReLU's backward in the same passes.
  Tensor backward(Tensor grad, const Tensor* relu_mask = nullptr);
  std::vector<Parameter*> parameters() { return {&gamma_, &beta_}; }
  std::vector<Buffer*> buffers() { return {&running_mean_, &running_var_}; }

 private:
  Parameter gamma_, beta_;
  Buffer running_mean_, running_var_;
  Tensor input_, mean_, var_;  // the last training forward's
};

}  // namespace gale::engine
