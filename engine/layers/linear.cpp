#include "engine/layers/linear.hpp"

#include <cmath>

#include "engine/layers/layers.hpp"
#include "kernels/dense.hpp"
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

Tensor Linear::forward(const Tensor& x) const {
  Tensor y = Tensor::empty(x.rows(), out());
  kernels::gemm(false, false, x.rows(), out(), in(), 1.0f, x.f32(), x.cols(), weight_.value.f32(), out(), 0.0f, y.f32(),
                out());
  if (bias_.value.defined()) kernels::add_bias(y.view(), bias_.value.f32());
  return y;
}

Tensor Linear::backward(const Tensor& x, const Tensor& g, bool need_input_grad) {
  kernels::gemm(true, false, in(), out(), x.rows(), 1.0f, x.f32(), x.cols(), g.f32(), g.cols(), 1.0f,
                weight_.grad.f32(), out());
  if (bias_.value.defined()) kernels::column_sum(g.view(), bias_.grad.f32(), /*accumulate=*/true);
  if (!need_input_grad) return Tensor();
  Tensor gx = Tensor::empty(g.rows(), in());
  kernels::gemm(false, true, g.rows(), in(), out(), 1.0f, g.f32(), g.cols(), weight_.value.f32(), out(), 0.0f,
                gx.f32(), in());
  return gx;
}

void Linear::add_parameters(std::vector<Parameter*>* out) {
  out->push_back(&weight_);
  if (bias_.value.defined()) out->push_back(&bias_);
}

}  // namespace gale::engine
