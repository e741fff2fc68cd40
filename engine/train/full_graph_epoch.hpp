// engine/train/full_graph_epoch.hpp — one epoch of full-graph training: every layer on the whole
// graph, the loss over the labelled training nodes, one optimizer step.
#pragma once

#include <cstdint>

#include "engine/train/replicas.hpp"
#include "engine/train/whole_graph.hpp"
#include "engine/trainer.hpp"

namespace gale::engine::train_parts {

// Trains `replica` for one epoch (dropout keyed on epoch_key); fills m's loss, compute_s, batches.
void train_full_graph_epoch(Replica& replica, WholeGraph& whole, uint64_t epoch_key, EpochMetrics* m);

}  // namespace gale::engine::train_parts
