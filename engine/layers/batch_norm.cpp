#include "engine/layers/batch_norm.hpp"

#include <utility>

#include "engine/ops.hpp"
#include "kernels/error.hpp"

namespace gale::engine {

BatchNorm::BatchNorm(const std::string& prefix, int64_t width) {
  auto filled = [width](float value) {
    Tensor t = Tensor::zeros(1, width);
    for (int64_t c = 0; c < width; ++c) t.f32()[c] = value;
    return t;
  };
  gamma_ = {prefix + ".weight", filled(1.0f), Tensor::zeros(1, width)};
  beta_ = {prefix + ".bias", Tensor::zeros(1, width), Tensor::zeros(1, width)};
  running_mean_ = {prefix + ".running_mean", Tensor::zeros(1, width)};
  running_var_ = {prefix + ".running_var", filled(1.0f)};
}

void BatchNorm::to(const Device& device) {
  for (Parameter* p : parameters()) {
    p->value = p->value.to(device);
    p->grad = p->grad.to(device);
  }
  for (Buffer* b : buffers()) b->value = b->value.to(device);
}

Tensor BatchNorm::forward(Tensor x, bool training, bool relu) {
  GALE_ASSERT(x.cols() == gamma_.value.cols());
  if (!training) {
    ops::batch_norm_apply(x, running_mean_.value, running_var_.value, kEps, gamma_.value, beta_.value, relu, &x);
    return x;
  }
  mean_ = Tensor::empty(1, x.cols(), DType::kF32, x.device());
  var_ = Tensor::empty(1, x.cols(), DType::kF32, x.device());
  ops::batch_norm_stats(x, &mean_, &var_);
  ops::batch_norm_update_running(mean_, var_, x.rows(), kMomentum, &running_mean_.value, &running_var_.value);
  // Backward needs the values before normalisation (and a layer may hold its output): a new tensor.
  Tensor y = Tensor::empty(x.rows(), x.cols(), DType::kF32, x.device());
  ops::batch_norm_apply(x, mean_, var_, kEps, gamma_.value, beta_.value, relu, &y);
  input_ = std::move(x);
  return y;
}

Tensor BatchNorm::backward(Tensor grad, const Tensor* relu_mask) {
  GALE_ASSERT(input_.defined() && grad.rows() == input_.rows() && grad.cols() == input_.cols());
  ops::batch_norm_backward(grad, input_, mean_, var_, kEps, gamma_.value, relu_mask, &gamma_.grad, &beta_.grad, &grad);
  input_ = mean_ = var_ = Tensor();
  return grad;
}

}  // namespace gale::engine
