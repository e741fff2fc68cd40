// tests/training/layerwise_checks.hpp — layer-wise inference (engine/layerwise.hpp) against the
// whole-graph forward on Cora, on a given device; shared by the CPU and GPU tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/graph.hpp"
#include "engine/layerwise.hpp"
#include "engine/model.hpp"
#include "kernels/random.hpp"
#include "storage/store.hpp"
#include "tests/training/cora_store.hpp"

namespace gale::testing {

// A 3-layer model of `kind` with `activation` ("relu", "elu", "maxk:K"), random weights: its
// logits from layer-wise inference in chunks of at most `max_rows` rows (the layers' outputs on a
// GPU when they fit in `device_table_bytes`) equal the whole-graph forward's on every node. Summation orders differ (other graphs, other kernels' splits), so the
// logits agree to float rounding; MaxK's selection can flip on a near-tie, so there every logit
// of all but a few rows must agree and every row's argmax but a few.
// With `edge_weights` the model aggregates with the weights of weighted_sbm_store() instead.
inline void expect_layerwise_equals_whole_graph(const std::string& kind, const std::string& activation,
                                                const Device& device, int64_t max_rows,
                                                uint64_t device_table_bytes = 0, bool edge_weights = false,
                                                engine::Norm norm = engine::Norm::kNone) {
  using namespace engine;
  SCOPED_TRACE(kind + " " + activation + " max_rows " + std::to_string(max_rows) +
               (device_table_bytes > 0 ? " tables on the device" : "") + (edge_weights ? " weighted" : "") +
               (norm != Norm::kNone ? " batch norm" : ""));
  const storage::Store store = storage::Store::open(edge_weights ? weighted_sbm_store() : cora_store());
  const int64_t n = store.num_nodes(), d = store.feature_dim();
  ModelConfig c;
  c.model = kind;
  c.layers = 3;
  c.in_dim = d;
  c.hidden = 32;
  c.heads = 2;
  c.out_dim = store.num_classes();
  parse_activation(activation, &c);
  c.edge_weights = edge_weights;
  c.norm = norm;
  Model model(c, 11);
  // Running statistics of a trained model (means around 0.1, variances in [0.5, 1.5)): inference
  // normalises by them, chunk by chunk as over the whole graph.
  uint64_t counter = 0;
  for (Buffer* b : model.buffers()) {
    const bool variance = b->name.find("running_var") != std::string::npos;
    for (int64_t i = 0; i < b->value.numel(); ++i)
      b->value.f32()[i] = (variance ? 0.5f : -0.4f) + kernels::random_uniform(91, counter++);
  }
  model.to(device);
  const bool attention = kind == "gat";
  Tensor features = Tensor::empty(n, d);
  store.read_features(0, n, features.f32());
  const GraphOperand whole = GraphOperand(aggregation_csr(store, c)).to(device, attention);
  EXPECT_EQ(whole.weighted(), edge_weights);
  const std::vector<const GraphOperand*> graphs(3, &whole);
  const std::vector<float> expected = model.forward(graphs, features.to(device), /*training=*/false, 0).to_vector();

  LayerwiseOptions o;
  o.max_rows = max_rows;
  o.attention = attention;
  o.device_table_bytes = device_table_bytes;
  const Tensor got = layerwise_logits(
      model, store,
      [&](const std::vector<int64_t>& ids) {
        const Tensor at = Tensor::from_host(ids.data(), static_cast<int64_t>(ids.size()), 1, DType::kI64, Device::cpu());
        return ops::gather_rows(features, at).to(device);
      },
      o);
  ASSERT_EQ(got.rows(), n);
  ASSERT_EQ(got.cols(), c.out_dim);
  ASSERT_TRUE(got.device().is_cpu());
  const float* g = got.f32();
  int64_t rows_off = 0, argmax_off = 0;
  for (int64_t v = 0; v < n; ++v) {
    const float* e = expected.data() + v * c.out_dim;
    const float* r = g + v * c.out_dim;
    bool off = false;
    for (int64_t j = 0; j < c.out_dim; ++j) off = off || !(std::fabs(r[j] - e[j]) <= 1e-4f * (1.0f + std::fabs(e[j])));
    rows_off += off ? 1 : 0;
    argmax_off += std::max_element(r, r + c.out_dim) - r != std::max_element(e, e + c.out_dim) - e ? 1 : 0;
  }
  const bool maxk = c.activation == Activation::kMaxK;
  EXPECT_LE(rows_off, maxk ? n / 200 : 0) << "rows whose logits differ";
  EXPECT_LE(argmax_off, maxk ? n / 500 : 0) << "rows whose prediction differs";
}

}  // namespace gale::testing
