// Fuzzes the OGB folder reader: the input, split on "\n@@\n", becomes raw/edge.csv,
// raw/num-node-list.csv, raw/node-feat.csv, raw/node-label.csv and split/s/{train,valid,test}.csv
// in that order (missing parts: files left out), then `gale preprocess FOLDER`.
#include <array>
#include <fstream>
#include <string_view>

#include "tests/fuzz/fuzz_preprocess.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fz = gale::fuzz;
  namespace fs = std::filesystem;
  static const std::array<const char*, 7> kFiles = {"raw/edge.csv",       "raw/num-node-list.csv", "raw/node-feat.csv",
                                                    "raw/node-label.csv", "split/s/train.csv",     "split/s/valid.csv",
                                                    "split/s/test.csv"};
  const fs::path dir = fz::scratch() / "ogb";
  fs::remove_all(dir);
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  for (size_t f = 0; f < kFiles.size() && !rest.empty(); ++f) {
    const size_t cut = rest.find("\n@@\n");
    const std::string_view part = rest.substr(0, cut);
    fz::write_input(std::string("ogb/") + kFiles[f], reinterpret_cast<const uint8_t*>(part.data()), part.size());
    rest = cut == std::string_view::npos ? std::string_view() : rest.substr(cut + 4);
  }
  // The folder states its node count (num-node-list.csv): read as it is, unless it says more than
  // kFuzzNodes, which would be minutes of legitimate work, not a finding.
  std::ifstream count(dir / "raw/num-node-list.csv");
  long long nodes = 0;
  if (count >> nodes && nodes > fz::kFuzzNodes) return 0;
  gale::storage::PreprocessOptions o;
  o.inputs = {dir.string()};
  o.format = gale::storage::InputFormat::kOgb;
  fz::preprocess_and_open(o, /*bound_nodes=*/!fs::exists(dir / "raw/num-node-list.csv"));
  return 0;
}
