// tests/training/cora_store.hpp — builds the Cora store once per test binary.
#pragma once

#include <filesystem>
#include <string>

#include "storage/preprocess.hpp"

namespace gale::testing {

// ../shared/data/cora (copied into tests/data) as a store with row-normalised features, as PyG's
// reference script uses.
inline std::string cora_store() {
  static const std::string path = [] {
    const auto dir = std::filesystem::temp_directory_path() / ("gale-cora-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    storage::PreprocessOptions o;
    o.inputs = {std::string(GALE_SOURCE_DIR) + "/tests/data/cora"};
    o.output = (dir / "cora.gale").string();
    o.normalize_features_row = true;
    o.overwrite = true;  // a store left by an earlier process with the same pid (killed mid-run)
    storage::preprocess(o);
    return o.output;
  }();
  return path;
}

// A planted-partition store of 3000 nodes with uniform edge weights in [0.1, 1) (the generator's
// weights=uniform), for what weighted aggregation must match.
inline std::string weighted_sbm_store() {
  static const std::string path = [] {
    const auto dir = std::filesystem::temp_directory_path() / ("gale-wsbm-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    storage::PreprocessOptions o;
    o.generate = "sbm:nodes=3000,classes=5,avg-degree=8,feature-dim=24,seed=4,weights=uniform";
    o.output = (dir / "wsbm.gale").string();
    o.overwrite = true;
    storage::preprocess(o);
    return o.output;
  }();
  return path;
}

}  // namespace gale::testing
