// tests/training/checkpoint_weights.hpp — a finished run's weights, read back from its checkpoint.
#pragma once

#include <filesystem>
#include <vector>

#include "engine/checkpoint.hpp"
#include "engine/trainer.hpp"

namespace gale::testing {

// Every parameter of --checkpoint-dir/latest.ckpt, in the model's order.
inline std::vector<std::vector<float>> final_weights(const engine::TrainOptions& o) {
  const engine::CheckpointState s = engine::load_checkpoint(std::filesystem::path(o.checkpoint_dir) / "latest.ckpt");
  std::vector<std::vector<float>> out;
  for (const engine::Tensor& t : s.params) out.push_back(t.to_vector());
  return out;
}

}  // namespace gale::testing
