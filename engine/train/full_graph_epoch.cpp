#include "engine/train/full_graph_epoch.hpp"

#include <chrono>

#include "engine/devices.hpp"
#include "engine/ops.hpp"

namespace gale::engine::train_parts {

void train_full_graph_epoch(Replica& replica, WholeGraph& whole, uint64_t epoch_key, EpochMetrics* m) {
  Model& model = *replica.model;
  const Tensor& x = whole.features();
  const auto t0 = std::chrono::steady_clock::now();
  model.zero_grad();
  Tensor logits = model.forward(whole.graphs(), x, /*training=*/true, epoch_key);
  Tensor grad = Tensor::empty(logits.rows(), logits.cols(), DType::kF32, replica.dev);
  m->loss = ops::softmax_cross_entropy(logits, replica.labels_all, whole.train_rows(), &grad).loss;
  logits = Tensor();
  model.backward(std::move(grad));
  replica.adam->step();
  synchronize(replica.dev);
  m->compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m->batches = 1;
}

}  // namespace gale::engine::train_parts
