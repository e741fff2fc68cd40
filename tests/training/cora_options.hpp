// tests/training/cora_options.hpp — PyG's reference settings on Cora (2 layers, hidden 16, GAT 8
// heads x 8, dropout 0.5 / 0.6, Adam lr 0.01 / 0.005, weight decay 5e-4, 200 epochs), and the mean
// over seeds of the test accuracy at the best-validation epoch: what the CPU and GPU accuracy tests
// compare with PyG's 82.0 / 81.4 / 78.3 / 82.9 (tests/data/README.md).
#pragma once

#include <cstdio>
#include <string>

#include "engine/trainer.hpp"
#include "tests/training/cora_store.hpp"

namespace gale::testing {

inline engine::TrainOptions pyg_options(const std::string& model, Device device = Device::cpu()) {
  engine::TrainOptions o;
  o.store = cora_store();
  o.device = device;
  o.model.model = model;
  o.model.layers = 2;
  o.model.hidden = 16;
  o.model.dropout = 0.5f;
  o.epochs = 200;
  o.lr = 0.01f;
  o.weight_decay = 5e-4f;
  // PyG's reference GIN is GINConv(Linear): one linear layer as the MLP (anchors/pyg_accuracy.py).
  if (model == "gin") o.model.gin_mlp_layers = 1;
  if (model == "gat") {
    o.model.hidden = 8;
    o.model.heads = 8;
    o.model.dropout = 0.6f;
    o.model.attn_dropout = 0.6f;
    o.model.activation = engine::Activation::kElu;
    o.lr = 0.005f;
  }
  return o;
}

inline double mean_test_accuracy(engine::TrainOptions o, int seeds) {
  double sum = 0;
  for (int s = 0; s < seeds; ++s) {
    o.seed = static_cast<uint64_t>(s);
    const engine::TrainResult r = engine::train(o);
    std::printf("  %s %s seed %d: best valid %.3f, test %.3f (epoch %lld)\n", o.device.name().c_str(),
                o.model.model.c_str(), s, r.best_valid_acc, r.test_acc_at_best_valid,
                static_cast<long long>(r.best_epoch));
    sum += r.test_acc_at_best_valid;
  }
  std::printf("  %s %s mean test accuracy %.4f\n", o.device.name().c_str(), o.model.model.c_str(), sum / seeds);
  return sum / seeds;
}

}  // namespace gale::testing
