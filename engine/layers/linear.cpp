#include "engine/layers/linear.hpp"

#include <cmath>

#include "engine/layers/layers.hpp"
#include "kernels/random.hpp"

namespace gale::engine {

void glorot_uniform(Tensor* t, int64_t fan_in, int64_t fan_out, uint64_t key) {
  const float bound = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
  float* p = t->f32();
  for (int64_t i = 0; i < t->numel(); ++i)
    p[i] = (2.0f * kernels::random_uniform(key, static_cast<uint64_t>(i)) - 1.0f) * bound;
}

Linear::Linear(const std::string& name, int64_t in, int64_t out, bool bias, uint64_t key) {
  weight_.name = name + ".weight";
  weight_.value = Tensor::empty(in, out);
  weight_.grad = Tensor::zeros(in, out);
  glorot_uniform(&weight_.value, in, out, key);
  if (bias) {
    bias_.name = name + ".bias";
    bias_.value = Tensor::zeros(1, out);
    bias_.grad = Tensor::zeros(1, out);
  }
}

Tensor Linear::forward(const Tensor& x, bool tf32, bool relu) const {
  if (bias_.value.defined()) {
    Tensor y = Tensor::empty(x.rows(), out(), DType::kF32, x.device());
    ops::gemm_bias(x, weight_.value, 0.0f, &y, bias_.value, relu, tf32);
    return y;
  }
  Tensor y = ops::matmul(x, weight_.value, tf32);
  if (relu) ops::relu(y, &y);
  return y;
}

void Linear::accumulate_grads(const Tensor& x, const Tensor& g, bool tf32, const Tensor* grad_sums) {
  ops::gemm(x, true, g, false, 1.0f, &weight_.grad, tf32);
  if (bias_.value.defined()) ops::add_column_sums(g, grad_sums, &bias_.grad);
}

Tensor Linear::input_grad(const Tensor& g, bool tf32, Tensor* into) const {
  if (into) {
    ops::gemm(g, false, weight_.value, true, 1.0f, into, tf32);
    return *into;
  }
  Tensor gx = Tensor::empty(g.rows(), in(), DType::kF32, g.device());
  ops::gemm(g, false, weight_.value, true, 0.0f, &gx, tf32);
  return gx;
}

void Linear::input_grad_in_place(Tensor* g, bool tf32, const Tensor* relu_of, Tensor* column_sums) const {
  ops::gemm_in_place(g, weight_.value, /*trans_b=*/true, tf32, /*panel_rows=*/0, relu_of, column_sums);
}

Tensor Linear::backward(const Tensor& x, const Tensor& g, bool need_input_grad, bool tf32) {
  accumulate_grads(x, g, tf32);
  return need_input_grad ? input_grad(g, tf32) : Tensor();
}

void Linear::add_parameters(std::vector<Parameter*>* out) {
  out->push_back(&weight_);
  if (bias_.value.defined()) out->push_back(&bias_);
}

}  // namespace gale::engine
