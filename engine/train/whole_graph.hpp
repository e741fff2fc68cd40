// engine/train/whole_graph.hpp — the whole graph on the lead device, for full-graph training and
// whole-graph evaluation: its aggregation operand and every node's features, each built on first
// use (a run that trains on sampled blocks may have a graph that does not fit on the device whole,
// and then never asks), and the labelled splits' node ids there.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/graph.hpp"
#include "engine/spmm_auto.hpp"
#include "engine/tensor.hpp"
#include "engine/train/run.hpp"

namespace gale::engine::train_parts {

class WholeGraph {
 public:
  WholeGraph(const TrainRun& run, const Device& device);
  ~WholeGraph();
  WholeGraph(const WholeGraph&) = delete;
  WholeGraph& operator=(const WholeGraph&) = delete;

  // The operand every layer aggregates over: built on the host once, copied to the device once
  // (with the edge map only when attention needs it).
  std::vector<const GraphOperand*> graphs();
  // Every node's features on the device (f32).
  const Tensor& features();
  // The labelled nodes of each split (i64 on the device).
  const Tensor& train_rows() const { return train_rows_; }
  const Tensor& valid_rows() const { return valid_rows_; }
  const Tensor& test_rows() const { return test_rows_; }
  // `--spmm auto`'s choices over the operand so far (none before graphs() builds it).
  std::vector<SpmmAutoChoice> spmm_choices() const;

 private:
  const TrainRun& run_;
  Device device_;
  std::optional<GraphOperand> graph_;
  Tensor features_;
  uint64_t host_charge_ = 0;  // the features' bytes held in host memory (CPU runs)
  Tensor train_rows_, valid_rows_, test_rows_;
};

// ids as an n x 1 i64 tensor on `device`.
Tensor ids_tensor(const std::vector<int64_t>& ids, const Device& device);

}  // namespace gale::engine::train_parts
