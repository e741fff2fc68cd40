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

}  // namespace gale::testing
