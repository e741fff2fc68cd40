// engine/layerwise.hpp — full-neighbourhood inference a layer at a time, over chunks of nodes.
//
// Layer l's output of every node is computed from its in-neighbours' layer l - 1 outputs, one
// chunk of destination nodes at a time (their one-hop block, all neighbours), before layer l + 1
// starts. Each layer is then one pass over the edges, and the device holds one chunk's block and
// rows at a time. A batch of nodes with all of its L-hop neighbourhood instead (what a sampled
// model's forward would need) reaches most of a power-law graph from every batch: on R-MAT
// scale 16, 15 times the cost of whole-graph inference, and minutes at scale 18. This is DGL's and
// PyG's "layer-wise inference"; the layers' outputs between passes stay in host memory
// (num_nodes x the widest layer, twice).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/model.hpp"
#include "engine/tensor.hpp"
#include "storage/store.hpp"

namespace gale::engine {

struct LayerwiseOptions {
  // A chunk's block has at most this many entries plus destinations (so at most this many
  // source rows), except a node with more in-neighbours, which is a chunk alone.
  int64_t max_rows = int64_t{1} << 20;
  // GAT: the blocks carry the edge map its attention needs.
  bool attention = false;
};

// The input features of the given global node ids (in that order), on the model's device.
using InputRows = std::function<Tensor(const std::vector<int64_t>& ids)>;

// The model's logits for every node of the store's graph, as a host tensor (num_nodes x
// out_dim), computed by Model::infer_layer over chunks of nodes.
Tensor layerwise_logits(Model& model, const storage::Store& store, const InputRows& input_rows,
                        const LayerwiseOptions& options);

// The chunks' boundaries: node ids [bounds[i], bounds[i + 1]) of a destination-major CSR,
// consecutive, each with at most max_rows entries plus nodes unless it is one node.
std::vector<int64_t> layerwise_chunks(const int64_t* indptr, int64_t num_nodes, int64_t max_rows);

// Rows `ids` of a host tensor, gathered in parallel into a new host tensor.
Tensor gather_host_rows(const Tensor& table, const std::vector<int64_t>& ids);

}  // namespace gale::engine
