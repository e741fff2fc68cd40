// engine/layerwise.hpp — full-neighbourhood inference a layer at a time, over chunks of nodes.
//
// Layer l's output of every node is computed from its in-neighbours' layer l - 1 outputs, one
// chunk of destination nodes at a time (their one-hop block, all neighbours), before layer l + 1
// starts. Each layer is then one pass over the edges, and the device holds one chunk's block and
// rows at a time. A batch of nodes with all of its L-hop neighbourhood instead (what a sampled
// model's forward would need) reaches most of a power-law graph from every batch: on R-MAT
// scale 16, 15 times the cost of whole-graph inference, and minutes at scale 18. This is DGL's and
// PyG's "layer-wise inference"; the layers' outputs between passes stay on the device when they
// fit there (LayerwiseOptions::device_table_bytes), else in pinned host memory (num_nodes x the
// widest layer, twice).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "engine/model.hpp"
#include "engine/tensor.hpp"
#include "kernels/cuda/budget.hpp"
#include "storage/store.hpp"

namespace gale::engine {

struct LayerwiseOptions {
  // A chunk's block has at most this many entries plus destinations (so at most this many
  // source rows), except a node with more in-neighbours, which is a chunk alone.
  int64_t max_rows = int64_t{1} << 20;
  // GAT: the blocks carry the edge map its attention needs.
  bool attention = false;
  // On a GPU: the layers' outputs between passes stay on the device while both tables (the layer
  // read and the layer written) fit in this many bytes, and each chunk's rows are gathered there;
  // else they live in pinned host memory, and the GPU gathers a chunk's rows from there over UVA.
  uint64_t device_table_bytes = 0;
  // --host-mem-budget: the host tables are charged to it (nullptr: not charged). On a GPU a table
  // it cannot hold goes to a scratch file in spill_dir when one is given (MappedHostTable), else
  // the run stops with its ResourceError; on the CPU it stops.
  kernels::cuda::MemoryBudget* host_budget = nullptr;
  std::filesystem::path spill_dir;
};

// The input features of the given global node ids (in that order), on the model's device.
using InputRows = std::function<Tensor(const std::vector<int64_t>& ids)>;

// What a GPU's libraries take from the budget beside the tensors (cuBLAS's 32 MiB workspace, with
// room to spare): left out of the room for an inference.
constexpr uint64_t kLibraryReserveBytes = uint64_t{40} << 20;

// Options for a GPU with `room` bytes free for the inference (what the budget, or 90% of the card,
// leaves beside what is already allocated, less kLibraryReserveBytes): three quarters for the layers' output tables, a
// quarter for a chunk (a sixteenth of that per float of the widest layer: the chunk's input,
// aggregate, output and the layer's temporaries).
LayerwiseOptions layerwise_options_for(uint64_t room, int64_t widest, bool attention);

// The store's CSR as `config`'s model aggregates over it: with the store's edge weights when it
// uses them (ModelConfig::edge_weights; InputError when the store has none), else without.
kernels::CsrView aggregation_csr(const storage::Store& store, const ModelConfig& config);

// The model's logits for every node of the store's graph, as a host tensor (num_nodes x
// out_dim), computed by Model::infer_layer over chunks of nodes (weighted as aggregation_csr).
Tensor layerwise_logits(Model& model, const storage::Store& store, const InputRows& input_rows,
                        const LayerwiseOptions& options);

// Roughly the bytes a whole-graph inference holds on a device: the topology (offsets, ids,
// norms), the input features, GAT's per-edge scores (`heads` 0 for the other models) and three
// activations of the widest layer. What decides between it and layer-wise inference.
uint64_t whole_graph_inference_bytes(int64_t nodes, int64_t entries, int64_t in_dim, int64_t widest, int heads);

// The chunks' boundaries: node ids [bounds[i], bounds[i + 1]) of a destination-major CSR,
// consecutive, each with at most max_rows entries plus nodes unless it is one node.
std::vector<int64_t> layerwise_chunks(const int64_t* indptr, int64_t num_nodes, int64_t max_rows);

// Input rows read on the host by read(ids, count, out) (from memory or the disk tier) into `device`
// tensors, at most kHostPartRows at a time, each part's host memory charged to `host_budget`
// (nullable) while it is read and copied.
using HostRowReader = std::function<void(const int64_t* ids, int64_t count, float* out)>;
constexpr int64_t kHostPartRows = int64_t{1} << 16;
InputRows host_input_rows(HostRowReader read, int64_t dim, const Device& device,
                          kernels::cuda::MemoryBudget* host_budget);

// Where layer outputs beyond the GPU and the host budget spill: `temp_dir`, else the directory
// the store is in.
std::filesystem::path spill_dir_for(const std::string& temp_dir, const storage::Store& store);


}  // namespace gale::engine
