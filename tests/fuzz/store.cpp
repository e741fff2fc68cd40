// Fuzzes opening a store: the input replaces manifest.json of a small, valid store (its arrays
// untouched), then Store::open, `gale info`'s description, --verify, and reads of feature rows,
// as a run would.
#include <vector>

#include "storage/preprocess.hpp"
#include "storage/store.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace {

// A 64-node store, made once per process.
const std::filesystem::path& base_store() {
  static const std::filesystem::path path = [] {
    gale::storage::PreprocessOptions o;
    o.generate = "sbm:nodes=64,classes=3,avg-degree=4,feature-dim=8,seed=1";
    o.output = (gale::fuzz::scratch() / "base.gale").string();
    o.overwrite = true;
    gale::storage::preprocess(o);
    return std::filesystem::path(o.output);
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fz = gale::fuzz;
  const std::filesystem::path store = base_store();
  fz::write_input("base.gale/manifest.json", data, size);
  fz::expect_clean([&] {
    const gale::storage::Store s = gale::storage::Store::open(store);
    (void)gale::storage::describe_store(s);
    s.verify();
    if (s.has_features() && s.num_nodes() > 0) {
      const std::vector<int64_t> ids = {0, s.num_nodes() - 1, s.num_nodes() / 2};
      std::vector<float> rows(ids.size() * static_cast<size_t>(s.feature_dim()));
      s.read_feature_rows(ids.data(), static_cast<int64_t>(ids.size()), rows.data());
    }
  });
  return 0;
}
