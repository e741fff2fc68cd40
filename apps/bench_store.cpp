#include "apps/bench_store.hpp"

#include <stdlib.h>

#include <chrono>
#include <cstdio>

#include "kernels/error.hpp"
#include "storage/generators.hpp"
#include "storage/preprocess.hpp"

namespace gale::apps {

namespace fs = std::filesystem;

void BenchStore::check(const std::string& store, const std::string& generate, const std::string& bench) {
  if (store.empty() == generate.empty())
    throw InputError(bench + ": expected a STORE path or --generate SPEC (exactly one)");
  if (!generate.empty()) storage::parse_generator(generate);
}

BenchStore::BenchStore(const std::string& store, const std::string& generate, const std::string& bench) {
  check(store, generate, bench);
  if (!store.empty()) {
    path_ = label_ = store;
    return;
  }
  std::string pattern = (fs::temp_directory_path() / "gale-bench-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr)
    throw InputError(bench + ": cannot create a temporary directory in " + fs::temp_directory_path().string());
  temp_ = pattern;
  try {
    storage::PreprocessOptions o;
    o.generate = generate;
    o.output = (temp_ / "graph.gale").string();
    o.temp_dir = temp_.string();
    const auto t0 = std::chrono::steady_clock::now();
    const storage::PreprocessReport report = storage::preprocess(o);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "bench: generated %s: %lld nodes, %lld edges in %.1f s\n", generate.c_str(),
                 static_cast<long long>(report.num_nodes), static_cast<long long>(report.num_edges), secs);
    path_ = o.output;
    label_ = generate;
  } catch (...) {
    std::error_code ec;
    fs::remove_all(temp_, ec);
    throw;
  }
}

BenchStore::~BenchStore() {
  if (temp_.empty()) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

}  // namespace gale::apps
