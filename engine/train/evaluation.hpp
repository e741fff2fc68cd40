// engine/train/evaluation.hpp — the accuracy of every split after an epoch, by full-neighbourhood
// inference in evaluation mode (no dropout) on the lead replica (every replica holds the same
// weights): over the whole graph at once, or layer by layer over chunks of nodes
// (engine/layerwise.hpp) when the features are not all on the GPU or the whole graph's inference
// would not fit beside them (--eval auto), or as --eval says. Beyond memory (features on disk)
// --eval auto samples instead: mini-batch inference with the training fanouts over at most 2^17
// nodes of each split, through training's batch sources (MiniBatchEpochs::sampled_accuracy).
#pragma once

#include "engine/train/minibatch_epoch.hpp"
#include "engine/train/replicas.hpp"
#include "engine/train/run.hpp"
#include "engine/train/whole_graph.hpp"
#include "engine/trainer.hpp"

namespace gale::engine::train_parts {

class Evaluation {
 public:
  // Decides whole-graph or layer-wise once, from where the lead replica's features live (so after
  // Replicas::place_batch_sources) and what its GPU may hold.
  // `host_features`: where the host reads features from (Replicas::host_features), or null.
  // `minibatch`: the run's mini-batch epochs (null for full-graph training), which sampled
  // evaluation runs its batches through.
  Evaluation(const TrainRun& run, Replica& lead, storage::HostFeatures* host_features, WholeGraph& whole,
             MiniBatchEpochs* minibatch);
  bool whole_graph() const { return whole_graph_; }
  bool sampled() const { return sampled_; }
  // Fills m's train_acc, valid_acc and test_acc (left 0 with --eval none).
  void evaluate(EpochMetrics* m);

 private:
  Tensor layerwise_logits_on_host();

  const TrainRun& run_;
  Replica& lead_;
  storage::HostFeatures* host_features_;
  WholeGraph& whole_;
  MiniBatchEpochs* const minibatch_;
  const bool replicas_host_on_disk_;
  bool sampled_ = false;
  bool whole_graph_ = true;
};

}  // namespace gale::engine::train_parts
