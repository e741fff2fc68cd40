// engine/sampled_inference.hpp — gale predict's sampled inference: every node's logits from
// mini-batch inference with given fanouts, through the training pipeline's batch sources (the
// CPU or GPU sampler, the GPU feature tiers, the host's features in memory or on the disk tier;
// engine/train/minibatch_epoch.hpp), over batches that deal the node ids round them (batch b of B:
// ids b, b + B, b + 2B, ...; scheduler::EpochPlan::strided). Each draw is keyed on a
// fixed key and the batch's number, so two runs sample the same neighbourhoods, and a run with its
// features on disk predicts exactly what one with them in memory predicts. An estimate of the
// full-neighbourhood prediction (exact when each fanout covers every neighbour).
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "engine/checkpoint.hpp"
#include "engine/model.hpp"
#include "engine/predict.hpp"
#include "engine/tensor.hpp"

namespace gale::engine {

// Every node's class (argmax; entry v for stored node v) and, when `keep_logits`, its logits on the
// host (N x classes), from the checkpoint's model `config` and weights, with o.fanouts,
// o.batch_size and o's device and budgets; fills report's sampled, sampled_batches, features,
// forward_seconds and gpu_peak_bytes. Without keep_logits no N x classes matrix is held: a
// 33.5M-node graph's 47 classes are 6.3 GB of f32, more than a run beyond memory may have.
struct SampledPredictions {
  std::vector<int32_t> classes;
  Tensor logits;  // undefined unless keep_logits
};
SampledPredictions sampled_predictions(const CheckpointState& state, const std::filesystem::path& file,
                                       const ModelConfig& config, const PredictOptions& o, bool keep_logits,
                                       PredictReport* report);

}  // namespace gale::engine
