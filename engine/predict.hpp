// engine/predict.hpp — inference with a trained checkpoint: class predictions and logits for
// every node of a store, written as .npy files.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/ops.hpp"
#include "engine/spmm_auto.hpp"
#include "kernels/device.hpp"
#include "storage/disk_reader.hpp"

namespace gale::engine {

struct PredictOptions {
  std::string store;
  std::string checkpoint;        // a .ckpt file, or a directory holding best.ckpt
  std::string out;               // predictions.npy (int32 class per original node id); "" to skip
  std::string embeddings;        // logits.npy (f32 N x classes); "" to skip
  int threads = 0;
  // Where the forward pass runs: the CPU, or a GPU, which then holds the model, the whole graph
  // and every layer's output (one full-graph forward) when that fits in --gpu-mem-budget (or 90%
  // of the card), else runs it layer by layer over chunks of nodes (engine/layerwise.hpp).
  Device device = Device::cpu();
  uint64_t gpu_mem_budget = 0;      // bytes; 0 = no cap
  std::string gpu_mem_budget_text;  // as the user wrote it, for messages naming --gpu-mem-budget
  ops::ExecOptions exec;            // --spmm, --tf32 on a GPU
  // --host-mem-budget (0: the default from MemAvailable and the cgroup's limit): the features are
  // read whole when they fit it beside the topology and some staging, else layer by layer through
  // the disk tier (storage/host_features.hpp), which --io-engine reads with.
  uint64_t host_mem_budget = 0;
  std::string host_mem_budget_text;
  storage::IoEngine io_engine = storage::IoEngine::kAuto;
  // Where layer outputs that fit neither the GPU nor the host budget spill (a scratch file,
  // unlinked at once); "" : the directory the store is in.
  std::string temp_dir;
  // Sampled inference (engine/sampled_inference.hpp): with fanouts (one per layer, -1 for every
  // neighbour), every node's logits come from mini-batch inference through training's pipeline,
  // over batches of `batch_size` consecutive nodes, instead of its full neighbourhood: an estimate,
  // like gale train's --eval sampled, which pays when the layer-wise pass would spill its tables.
  std::vector<int> fanouts;
  // Training's default: the GPU's room for batches in flight is sized for training's batches (with
  // 4096, R-MAT 25 under a 10 GB GPU budget ran out of it).
  int64_t batch_size = 1024;
  // Called once with a line of advice before a pass that sampled inference may shorten (layer by
  // layer with the features on disk and tables that spill); the CLI prints it on stderr.
  std::function<void(const std::string&)> on_advice;
};

struct PredictReport {
  int64_t num_nodes = 0;
  double test_acc = -1;          // when the store has labels and a test split
  double prepare_seconds = 0;    // on a GPU: the graph's operand built and copied there, the features too
  double forward_seconds = 0;    // the forward pass (on a GPU: and the logits back to the host)
  uint64_t gpu_peak_bytes = 0;   // on a GPU
  int64_t layerwise_chunks = 0;  // layer by layer: the chunks of nodes a layer took (else 0)
  bool sampled = false;          // sampled inference (PredictOptions::fanouts)
  int64_t sampled_batches = 0;   // its mini-batches
  std::string features;          // where the input features came from (HostFeatures::describe, or the batches' placement)
  // `--spmm auto` over the whole graph on a GPU: the kernel measured for each width
  // (engine/spmm_auto.hpp); empty otherwise.
  std::vector<SpmmAutoChoice> spmm_choices;
};

// Throws InputError for a missing checkpoint or unwritable output, CorruptStoreError for a
// damaged checkpoint or one trained on another store. Outputs are written atomically.
PredictReport predict(const PredictOptions& options);

}  // namespace gale::engine
