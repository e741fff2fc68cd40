// engine/layers/layers.hpp — the GNN layers Gale offers, with PyTorch Geometric's semantics so
// accuracies compare with PyG's: GCNConv, SAGEConv (mean), GINConv, GATConv.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/layer.hpp"

namespace gale::engine {

// out = D^-1/2 (A + I) D^-1/2 x W + b  (symmetric normalisation with a self loop).
std::unique_ptr<Layer> make_gcn_layer(const std::string& prefix, int64_t in, int64_t out, uint64_t seed);
// out = mean_j x_j W_l + b + x_i W_r  (mean aggregation, root weight).
std::unique_ptr<Layer> make_sage_layer(const std::string& prefix, int64_t in, int64_t out, uint64_t seed);
// out = MLP((1 + eps) x_i + sum_j x_j); MLP = Linear (mlp_layers = 1) or Linear-ReLU-Linear (2).
std::unique_ptr<Layer> make_gin_layer(const std::string& prefix, int64_t in, int64_t out, float eps,
                                      int mlp_layers, uint64_t seed);
// Multi-head attention with a self loop; heads concatenated; attention dropout attn_dropout.
std::unique_ptr<Layer> make_gat_layer(const std::string& prefix, int64_t in, int64_t heads, int64_t per_head,
                                      float attn_dropout, uint64_t seed);

// Glorot-uniform initialisation of a fan_in x fan_out tensor from a counter-RNG key.
void glorot_uniform(Tensor* t, int64_t fan_in, int64_t fan_out, uint64_t key);

}  // namespace gale::engine
