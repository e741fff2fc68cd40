// Fuzzes the text edge-list reader (plain, or gzip when the bytes start with its magic): whole
// `gale preprocess FILE`.
#include "tests/fuzz/fuzz_preprocess.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gale::storage::PreprocessOptions o;
  o.inputs = {gale::fuzz::write_input("edges.txt", data, size).string()};
  o.format = gale::storage::InputFormat::kEdgeList;
  gale::fuzz::preprocess_and_open(o);
  return 0;
}
