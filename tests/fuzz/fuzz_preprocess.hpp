// tests/fuzz/fuzz_preprocess.hpp — a whole `gale preprocess` of fuzzed input files into a store in
// the scratch directory: the importer parses every byte, and a store that comes out must open and
// verify. Graphs are bounded to kFuzzNodes nodes (--num-nodes, unless the harness says the input
// states its own count), so an id of a few million is an error to report, not minutes of work.
#pragma once

#include "storage/preprocess.hpp"
#include "storage/store.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace gale::fuzz {

constexpr int64_t kFuzzNodes = 4096;

inline void preprocess_and_open(storage::PreprocessOptions o, bool bound_nodes = true) {
  if (bound_nodes) o.num_nodes = kFuzzNodes;
  o.output = (scratch() / "out.gale").string();
  o.overwrite = true;
  o.mem_budget = uint64_t{64} << 20;  // small inputs: never a big sort buffer
  o.temp_dir = scratch().string();
  expect_clean([&] {
    storage::preprocess(o);
    const storage::Store store = storage::Store::open(o.output);
    store.verify();
  });
}

}  // namespace gale::fuzz
