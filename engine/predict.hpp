// engine/predict.hpp — inference with a trained checkpoint: class predictions and logits for
// every node of a store, written as .npy files.
#pragma once

#include <cstdint>
#include <string>

namespace gale::engine {

struct PredictOptions {
  std::string store;
  std::string checkpoint;        // a .ckpt file, or a directory holding best.ckpt
  std::string out;               // predictions.npy (int32 class per original node id); "" to skip
  std::string embeddings;        // logits.npy (f32 N x classes); "" to skip
  int threads = 0;
};

struct PredictReport {
  int64_t num_nodes = 0;
  double test_acc = -1;          // when the store has labels and a test split
};

// Throws InputError for a missing checkpoint or unwritable output, CorruptStoreError for a
// damaged checkpoint or one trained on another store. Outputs are written atomically.
PredictReport predict(const PredictOptions& options);

}  // namespace gale::engine
