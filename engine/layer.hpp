// engine/layer.hpp — a GNN layer: what it holds, forward, backward. No autograd tape: each layer
// keeps what its backward needs from the last training forward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/graph.hpp"
#include "engine/ops.hpp"
#include "engine/tensor.hpp"

namespace gale::engine {

struct Parameter {
  std::string name;   // unique within a model, e.g. "layers.0.weight"; checkpoints key on it
  Tensor value;
  Tensor grad;        // same shape; accumulated by backward, zeroed by Model::zero_grad
};

struct ForwardContext {
  bool training = false;
  uint64_t rng_key = 0;   // per step and layer; attention dropout draws from it
  bool relu = false;      // apply ReLU to the output (fused into the aggregation where the layer can)
  ops::ExecOptions exec;  // kernel choices; a layer keeps them for its backward
  // Set when x is the output of MaxK (MaxK-GNN): its CBSR form, with the same values. A layer
  // that takes it aggregates the CBSR form (SpGEMM forward, SSpMM backward), and the input
  // gradient its backward returns is then restricted to the kept positions: MaxK's own backward
  // is folded into it, so the model applies no further mask. x is then the dense form, or
  // undefined for a layer that does not read it (Layer::reads_dense_maxk_input).
  const ops::Cbsr* maxk_input = nullptr;
  // x is the same tensor, unchanged, at every call (full-graph training's resident input
  // features, no dropout): on a whole graph a layer may keep what it derives from x alone (the
  // first layer's A x) from one step to the next.
  bool constant_input = false;
  // The model's first layer: x is the model's input (which the caller holds), not a previous
  // layer's activation (which nothing else keeps once the forward has moved on).
  bool first_layer = false;
  // Given to a first layer that takes it (Layer::takes_before_weights): called exactly once, after
  // the layer has enqueued its work that reads no parameter (an aggregate-first layer's A x) and
  // before anything that does. The caller finishes the previous step's update there (Model::forward).
  const std::function<void()>* before_weights = nullptr;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string kind() const = 0;
  virtual int64_t in_dim() const = 0;
  virtual int64_t out_dim() const = 0;
  // x: num_src x in_dim, on the graph's device. Returns num_dst x out_dim (after ReLU when
  // ctx.relu). A training forward keeps what backward needs; backward releases it. x is taken by
  // value so that a layer given the last reference (Model::forward moves each activation in) can
  // free it as soon as it no longer needs it.
  virtual Tensor forward(const GraphOperand& g, Tensor x, const ForwardContext& ctx) = 0;
  // grad_out: num_dst x out_dim, for the last training forward. Accumulates parameter gradients;
  // returns the num_src x in_dim input gradient when need_input_grad, else an undefined Tensor.
  // grad_out is taken by value so a layer can release it as soon as it is done with it.
  virtual Tensor backward(const GraphOperand& g, Tensor grad_out, bool need_input_grad) = 0;
  virtual std::vector<Parameter*> parameters() = 0;
  // Whether forward calls ForwardContext::before_weights itself (after its parameter-free work);
  // otherwise the model calls it before the layer's forward.
  virtual bool takes_before_weights() const { return false; }
  // Whether forward, given a MaxK input (ForwardContext::maxk_input), also reads its dense form
  // x. When it does not, the model writes only the CBSR form (top-k without its dense pass) and
  // hands the layer an undefined x.
  virtual bool reads_dense_maxk_input() const { return true; }
  // For a layer that does not read the dense form but lays it beside something else in an operand
  // of its own (SAGE's [A x | x_dst]): that operand, allocated now for the coming forward on g,
  // and in *col_offset the column where the model's top-k writes the dense form, in the same pass
  // as the CBSR form (no separate scatter). Undefined when the layer has none for g.
  virtual Tensor stage_maxk_input(const GraphOperand& g, int64_t* col_offset) {
    (void)g;
    (void)col_offset;
    return Tensor();
  }
  // Bias gradients without another pass over the gradient. The kernel that writes a layer's output
  // gradient can sum its columns from the values it writes, and those sums are the layer's bias
  // gradient: MaxK's backward, folded into the next layer's (kernels/maxk.hpp; its gradient is
  // zero past the kept positions), and ReLU's, in the model. The model takes them after a backward
  // (undefined when the layer made none) and gives them to the layer below before its backward,
  // which then adds them to its bias gradient instead of summing its grad_out. A layer may ignore
  // what it is given.
  virtual Tensor take_input_grad_sums() { return Tensor(); }
  virtual void give_output_grad_sums(Tensor sums) { (void)sums; }
  // Whether the layer uses what it is given: then the model also has ReLU's backward sum the
  // columns of the gradient it writes (ops::relu_backward_mask).
  virtual bool takes_output_grad_sums() const { return false; }
  // ReLU's backward folded into this layer's, as MaxK's is (ForwardContext::maxk_input): mask is
  // ops::relu_mask of the last training forward's input (the ReLU output of the layer below), for
  // the coming backward on g only. Returns whether that backward will return its input gradient
  // already masked, by the kernel that writes it (an SpMM's output mask, kernels/spmm.hpp): the
  // model then applies no mask of its own. Such a gradient comes without column sums
  // (take_input_grad_sums), so the layer below sums its gradient itself. false: the layer keeps
  // nothing and the model applies ReLU's backward as a pass of its own, which also sums the
  // columns; so a layer declines where its kernel could not apply the mask itself.
  virtual bool fold_input_relu(const GraphOperand& g, Tensor mask) {
    (void)g;
    (void)mask;
    return false;
  }
};

}  // namespace gale::engine
