// storage/generators.hpp — synthetic graphs streamed into a store, so a dataset of any size can be
// made with no download: R-MAT (Graph500 parameters) and a planted-partition graph (SBM) whose
// features carry a class signal the graph amplifies.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gale::storage {

struct GeneratorSpec {
  std::string kind;                 // "rmat" or "sbm"
  // rmat
  int scale = 0;
  double edge_factor = 16, a = 0.57, b = 0.19, c = 0.19;
  // sbm
  int64_t nodes = 0;
  double avg_degree = 10, homophily = 0.8;
  // order=class: classes numbered in blocks of consecutive ids (node v in class v * classes / nodes),
  // as after a community-ordering relabel, so a window of consecutive rows shares its neighbours;
  // order=random (the default): each node's class drawn at random.
  bool class_order = false;
  // both (rmat: features / classes optional)
  int64_t classes = 0, feature_dim = 0;
  // weights=uniform: every edge gets a weight drawn uniformly from [0.1, 1), the same both ways
  // (generated_weight); weights=none (the default): no graph/weights.npy.
  bool weights = false;
  uint64_t seed = 0;
  bool seed_given = false;          // false: preprocess uses --seed
};

// Parses "rmat:scale=21,edge-factor=16" / "sbm:nodes=1M,classes=16,avg-degree=20,feature-dim=128"
// (sbm also takes homophily=H and order=random|class; both take weights=none|uniform);
// numbers accept K, M, G suffixes. Throws InputError naming --generate and the bad key.
GeneratorSpec parse_generator(const std::string& spec);

int64_t generator_nodes(const GeneratorSpec& g);
// Emits every generated edge (src, dst) — each undirected edge once; the caller adds reverses.
// Generation runs in parallel chunks; emit is called from one thread, in a fixed order.
void generate_edges(const GeneratorSpec& g, const std::function<void(int64_t, int64_t)>& emit);
// Class of node v (-1 when the spec has no classes).
int32_t generated_label(const GeneratorSpec& g, int64_t v);
// Weight of the undirected edge {s, d} (weights=uniform): a pure function of the pair and the seed.
float generated_weight(const GeneratorSpec& g, int64_t s, int64_t d);
// Feature row of node v (feature_dim values).
void generated_features(const GeneratorSpec& g, int64_t v, float* row);

}  // namespace gale::storage
