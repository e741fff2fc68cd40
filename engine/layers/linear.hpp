// engine/layers/linear.hpp — x W (+ b) with its backward, shared by every layer.
#pragma once

#include <string>
#include <vector>

#include "engine/layer.hpp"

namespace gale::engine {

class Linear {
 public:
  // Parameters are created on the host (Glorot-uniform W, zero b); Model::to moves them.
  Linear(const std::string& name, int64_t in, int64_t out, bool bias, uint64_t key);
  // y = x W (+ b), x rows x in, then ReLU when asked (fused with the bias).
  Tensor forward(const Tensor& x, bool tf32, bool relu = false) const;
  // Accumulates dW = x^T g (and db = column sums of g); returns g W^T when need_input_grad.
  Tensor backward(const Tensor& x, const Tensor& grad_out, bool need_input_grad, bool tf32);
  // The two halves of backward, for layers that free tensors in between. With grad_sums (grad_out's
  // column sums, made by whatever wrote grad_out: Layer::give_output_grad_sums) db adds them
  // instead of summing grad_out.
  void accumulate_grads(const Tensor& x, const Tensor& grad_out, bool tf32, const Tensor* grad_sums = nullptr);
  // g W^T, added into `into` (beta 1) when given, else as a new tensor.
  Tensor input_grad(const Tensor& grad_out, bool tf32, Tensor* into = nullptr) const;
  // g <- g W^T for a square W, without a second g-sized tensor; then through ReLU's backward at
  // relu_of (the ReLU's output) when given, in the same pass, which also writes the result's column
  // sums into column_sums when given (ops::gemm_in_place).
  void input_grad_in_place(Tensor* grad_out, bool tf32, const Tensor* relu_of = nullptr,
                           Tensor* column_sums = nullptr) const;
  void add_parameters(std::vector<Parameter*>* out);
  int64_t in() const { return weight_.value.rows(); }
  int64_t out() const { return weight_.value.cols(); }
  Parameter& weight() { return weight_; }
  const Parameter& weight() const { return weight_; }

 private:
  Parameter weight_;
  Parameter bias_;  // undefined when the layer has no bias
};

}  // namespace gale::engine
