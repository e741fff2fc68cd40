// Fuzzes the Matrix Market reader (coordinate / array, real / integer / pattern, general /
// symmetric): whole `gale preprocess FILE.mtx`.
#include "tests/fuzz/fuzz_preprocess.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gale::storage::PreprocessOptions o;
  o.inputs = {gale::fuzz::write_input("graph.mtx", data, size).string()};
  o.format = gale::storage::InputFormat::kMatrixMarket;
  gale::fuzz::preprocess_and_open(o);
  return 0;
}
