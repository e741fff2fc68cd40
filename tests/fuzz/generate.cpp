// Fuzzes `--generate` specs: parse_generator on the input as text, then, for specs small enough
// to make in a moment, the edges, labels, weights and features they describe.
#include <string>
#include <vector>

#include "storage/generators.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  gale::fuzz::expect_clean([&] {
    const gale::storage::GeneratorSpec g = gale::storage::parse_generator(spec);
    const int64_t n = gale::storage::generator_nodes(g);
    if (n <= 0 || n > 4096 || n * g.avg_degree > 1e5 || n * g.edge_factor > 1e5 || g.feature_dim > 256) return;
    int64_t edges = 0;
    gale::storage::generate_edges(g, [&](int64_t s, int64_t d) {
      if (s < 0 || s >= n || d < 0 || d >= n) {
        std::fprintf(stderr, "gale fuzz: generated edge (%lld, %lld) outside %lld nodes\n", static_cast<long long>(s),
                     static_cast<long long>(d), static_cast<long long>(n));
        std::abort();
      }
      if (g.weights) (void)gale::storage::generated_weight(g, s, d);
      ++edges;
    });
    std::vector<float> row(static_cast<size_t>(std::max<int64_t>(1, g.feature_dim)));
    for (int64_t v = 0; v < std::min<int64_t>(n, 64); ++v) {
      if (g.classes > 0) (void)gale::storage::generated_label(g, v);
      if (g.feature_dim > 0) gale::storage::generated_features(g, v, row.data());
    }
  });
  return 0;
}
