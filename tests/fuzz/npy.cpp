// Fuzzes the .npy reader, header and body: the input as an edge array (`--edges e.npy`), then as
// a feature array beside a fixed edge list (`--features f.npy`), then its header alone.
#include <cstring>

#include "storage/npy.hpp"
#include "tests/fuzz/fuzz_preprocess.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fz = gale::fuzz;
  const std::string npy = fz::write_input("array.npy", data, size).string();
  gale::storage::PreprocessOptions edges;
  edges.edges_npy = npy;
  edges.format = gale::storage::InputFormat::kNpy;
  fz::preprocess_and_open(edges);

  static const char kEdges[] = "0 1\n1 2\n2 3\n3 0\n";
  gale::storage::PreprocessOptions features;
  features.inputs = {fz::write_input("ring.txt", reinterpret_cast<const uint8_t*>(kEdges), std::strlen(kEdges)).string()};
  features.features_npy = npy;
  fz::preprocess_and_open(features);

  fz::expect_clean([&] { (void)gale::storage::read_npy_header(npy); });
  return 0;
}
