#include "storage/generators.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "storage/text_reader.hpp"

namespace gale::storage {

using kernels::derive_key;
using kernels::random_bits;
using kernels::random_uniform;

namespace {

double parse_number(const std::string& key, const std::string& value) {
  std::string v = value;
  double scale = 1;
  if (!v.empty()) {
    const char s = static_cast<char>(std::toupper(static_cast<unsigned char>(v.back())));
    if (s == 'K') scale = 1e3;
    else if (s == 'M') scale = 1e6;
    else if (s == 'G' || s == 'B') scale = 1e9;
    if (scale != 1) v.pop_back();
  }
  double x;
  if (!parse_double(v, &x) || !std::isfinite(x) || x < 0)
    throw InputError("--generate: '" + key + "' expects a non-negative number, found '" + value + "'");
  return x * scale;
}

// Standard normal from two counter draws (Box-Muller).
float gaussian(uint64_t key, uint64_t counter) {
  const double u1 = (static_cast<double>(random_bits(key, 2 * counter) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  const double u2 = static_cast<double>(random_bits(key, 2 * counter + 1) >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// A bijection on [0, 2^scale): Graph500 scrambles vertex ids so that the R-MAT degree skew is not
// aligned with id order. Odd multipliers and xor-shifts are invertible modulo 2^scale.
int64_t scramble(int64_t v, int scale, uint64_t key) {
  const uint64_t mask = scale >= 64 ? ~0ULL : ((1ULL << scale) - 1);
  uint64_t x = static_cast<uint64_t>(v);
  const uint64_t m1 = (kernels::mix64(key) | 1ULL), m2 = (kernels::mix64(key + 1) | 1ULL);
  const int shift = std::max(1, scale / 2);
  x = (x * m1) & mask;
  x ^= x >> shift;
  x = (x * m2) & mask;
  x ^= x >> shift;
  return static_cast<int64_t>(x & mask);
}

// The key=value pairs after "kind:" in `spec` (colon: where the kind ends), by key; a repeated key
// keeps its last value.
std::map<std::string, std::string> split_generator_keys(const std::string& spec, size_t colon) {
  std::map<std::string, std::string> kv;
  if (colon != std::string::npos) {
    std::string rest = spec.substr(colon + 1);
    size_t pos = 0;
    while (pos < rest.size()) {
      size_t comma = rest.find(',', pos);
      if (comma == std::string::npos) comma = rest.size();
      const std::string item = rest.substr(pos, comma - pos);
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        throw InputError("--generate: expected key=value, found '" + item + "' in '" + spec + "'");
      kv[item.substr(0, eq)] = item.substr(eq + 1);
      pos = comma + 1;
    }
  }
  return kv;
}

// A spec's keys, taken one at a time: each is parsed and checked as it is taken and then dropped,
// so the keys left at the end are the unknown ones.
class GeneratorKeys {
 public:
  GeneratorKeys(std::string kind, std::map<std::string, std::string> kv) : kind_(std::move(kind)), kv_(std::move(kv)) {}

  // A non-negative number with an optional K, M, G suffix; `fallback` when absent and not required.
  double number(const char* key, bool required, double fallback) {
    auto it = kv_.find(key);
    if (it == kv_.end()) {
      if (required) throw InputError("--generate " + kind_ + ": missing '" + key + "='");
      return fallback;
    }
    const double v = parse_number(key, it->second);
    kv_.erase(it);
    return v;
  }
  // Counts, checked before the cast (a double beyond int64 does not convert).
  int64_t count(const char* key, bool required, double fallback) {
    const double v = number(key, required, fallback);
    if (v > 4.0e18) throw InputError("--generate " + kind_ + ": '" + key + "' is too large");
    return static_cast<int64_t>(v);
  }
  // Seeds are whole 64-bit numbers; a double would round those above 2^53.
  std::optional<uint64_t> seed() {
    auto it = kv_.find("seed");
    if (it == kv_.end()) return std::nullopt;
    const std::string& v = it->second;
    uint64_t seed = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), seed);
    if (ec != std::errc() || p != v.data() + v.size() || v.empty())
      throw InputError("--generate: 'seed' expects a non-negative integer, found '" + v + "'");
    kv_.erase(it);
    return seed;
  }
  // One of two words, as given (the message lists them in this order); nothing when absent.
  std::optional<std::string> choice(const char* key, const char* first, const char* second) {
    auto it = kv_.find(key);
    if (it == kv_.end()) return std::nullopt;
    if (it->second != first && it->second != second)
      throw InputError("--generate " + kind_ + ": '" + key + "' expects " + first + " or " + second + ", found '" +
                       it->second + "'");
    const std::string v = it->second;
    kv_.erase(it);
    return v;
  }
  // Every key was taken.
  void expect_none_left() const {
    if (!kv_.empty()) throw InputError("--generate " + kind_ + ": unknown key '" + kv_.begin()->first + "'");
  }

 private:
  const std::string kind_;
  std::map<std::string, std::string> kv_;
};

// rmat's keys and their ranges (a + b + c below 1).
void read_rmat_keys(GeneratorKeys* keys, GeneratorSpec* g) {
  const double scale = keys->number("scale", true, 0);  // checked before the cast: 6e9 does not fit an int
  if (!(scale >= 1 && scale <= 40)) throw InputError("--generate rmat: 'scale' must be between 1 and 40");
  g->scale = static_cast<int>(scale);
  g->edge_factor = keys->number("edge-factor", false, 16);
  g->a = keys->number("a", false, 0.57);
  g->b = keys->number("b", false, 0.19);
  g->c = keys->number("c", false, 0.19);
  if (g->a + g->b + g->c >= 1.0) throw InputError("--generate rmat: a + b + c must be below 1");
  // 'feature-dim' as for sbm; 'features' is kept as its older spelling.
  g->feature_dim = keys->count("feature-dim", false, keys->number("features", false, 0));
  g->classes = keys->count("classes", false, 0);
}

// sbm's keys and their ranges (classes at most nodes), the order after the ranges.
void read_sbm_keys(GeneratorKeys* keys, GeneratorSpec* g) {
  g->nodes = keys->count("nodes", true, 0);
  g->classes = keys->count("classes", true, 0);
  g->avg_degree = keys->number("avg-degree", false, 10);
  g->feature_dim = keys->count("feature-dim", false, 32);
  g->homophily = keys->number("homophily", false, 0.8);
  if (g->nodes < 2) throw InputError("--generate sbm: 'nodes' must be at least 2");
  if (g->classes < 1 || g->classes > g->nodes) throw InputError("--generate sbm: 'classes' must be between 1 and nodes");
  if (g->homophily > 1) throw InputError("--generate sbm: 'homophily' must be between 0 and 1");
  if (g->feature_dim < 1) throw InputError("--generate sbm: 'feature-dim' must be at least 1");
  if (const auto order = keys->choice("order", "class", "random")) g->class_order = *order == "class";
}

}  // namespace

GeneratorSpec parse_generator(const std::string& spec) {
  GeneratorSpec g;
  const size_t colon = spec.find(':');
  g.kind = spec.substr(0, colon);
  if (g.kind != "rmat" && g.kind != "sbm")
    throw InputError("--generate: expected rmat:... or sbm:..., found '" + spec + "'");
  GeneratorKeys keys(g.kind, split_generator_keys(spec, colon));
  if (const auto seed = keys.seed()) {
    g.seed = *seed;
    g.seed_given = true;
  }
  if (g.kind == "rmat") read_rmat_keys(&keys, &g);
  else read_sbm_keys(&keys, &g);
  if (const auto weights = keys.choice("weights", "none", "uniform")) g.weights = *weights == "uniform";
  keys.expect_none_left();
  return g;
}

float generated_weight(const GeneratorSpec& g, int64_t s, int64_t d) {
  const uint64_t lo = static_cast<uint64_t>(std::min(s, d)), hi = static_cast<uint64_t>(std::max(s, d));
  return 0.1f + 0.9f * kernels::random_uniform(derive_key(derive_key(g.seed, 5), lo), hi);
}

int64_t generator_nodes(const GeneratorSpec& g) { return g.kind == "rmat" ? (int64_t{1} << g.scale) : g.nodes; }

int32_t generated_label(const GeneratorSpec& g, int64_t v) {
  if (g.classes < 1) return -1;
  if (g.class_order) return static_cast<int32_t>(static_cast<__int128>(v) * g.classes / g.nodes);
  return static_cast<int32_t>(kernels::random_below(derive_key(g.seed, 1), static_cast<uint64_t>(v),
                                                    static_cast<uint64_t>(g.classes)));
}

void generated_features(const GeneratorSpec& g, int64_t v, float* row) {
  const int64_t d = g.feature_dim;
  const uint64_t noise_key = derive_key(g.seed, 3);
  if (g.kind == "rmat" || g.classes < 1) {
    for (int64_t k = 0; k < d; ++k) row[k] = gaussian(noise_key, static_cast<uint64_t>(v * d + k));
    return;
  }
  // Class centroid plus unit noise. The centroid's length is independent of the width (the
  // 1/sqrt(d)) and shrinks with the degree: two rounds of mean aggregation over ~degree neighbours
  // cut the noise faster than the class mix dilutes the centroid, and the degree^-0.75 keeps a
  // 2-hop mean near 90% accurate at homophily 0.8 for degrees 4 to 20, while a node's own
  // features give 10-55% (measured with a nearest-class-mean classifier in preprocess_test.cpp).
  const double spread = 3.2 * std::pow(std::max(g.avg_degree, 1.0), -0.75);
  const auto signal = static_cast<float>(spread / std::sqrt(static_cast<double>(d)));
  const uint64_t centroid_key = derive_key(g.seed, 2);
  const int64_t c = generated_label(g, v);
  for (int64_t k = 0; k < d; ++k)
    row[k] = signal * gaussian(centroid_key, static_cast<uint64_t>(c * d + k)) +
             gaussian(noise_key, static_cast<uint64_t>(v * d + k));
}

void generate_edges(const GeneratorSpec& g, const std::function<void(int64_t, int64_t)>& emit) {
  constexpr int64_t kChunk = 1 << 20;
  const int64_t n = generator_nodes(g);
  if (g.kind == "rmat") {
    const int64_t m = static_cast<int64_t>(std::llround(static_cast<double>(n) * g.edge_factor));
    const uint64_t key = derive_key(g.seed, 10);
    const double ab = g.a + g.b, a_ab = g.a / ab, c_cd = g.c / (1.0 - ab);
    std::vector<std::pair<int64_t, int64_t>> chunk;
    for (int64_t begin = 0; begin < m; begin += kChunk) {
      const int64_t end = std::min(m, begin + kChunk);
      chunk.resize(static_cast<size_t>(end - begin));
      tbb::parallel_for(tbb::blocked_range<int64_t>(begin, end, 4096), [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t e = r.begin(); e < r.end(); ++e) {
          int64_t src = 0, dst = 0;
          for (int bit = 0; bit < g.scale; ++bit) {
            const uint64_t ctr = static_cast<uint64_t>(e) * 64 + static_cast<uint64_t>(bit);
            const double r1 = random_uniform(key, 2 * ctr), r2 = random_uniform(key, 2 * ctr + 1);
            // Quadrant: a (0,0), b (0,1), c (1,0), d (1,1), as the anchor scripts draw it.
            const int64_t bs = r1 >= ab ? 1 : 0;
            const int64_t bd = bs == 0 ? (r2 >= a_ab ? 1 : 0) : (r2 >= c_cd ? 1 : 0);
            src |= bs << bit;
            dst |= bd << bit;
          }
          chunk[e - begin] = {scramble(src, g.scale, key), scramble(dst, g.scale, key)};
        }
      });
      for (const auto& [s, d] : chunk) emit(s, d);
    }
    return;
  }
  // SBM: every node draws avg_degree / 2 partners (the caller stores both directions); with
  // probability `homophily` from its own class, else uniformly.
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(g.classes));
  for (int64_t v = 0; v < n; ++v) members[generated_label(g, v)].push_back(v);
  const double half = g.avg_degree / 2.0;
  const int64_t whole = static_cast<int64_t>(half);
  const double frac = half - static_cast<double>(whole);
  const uint64_t key = derive_key(g.seed, 20);
  std::vector<std::vector<int64_t>> partners;
  for (int64_t begin = 0; begin < n; begin += kChunk / 16) {
    const int64_t end = std::min(n, begin + kChunk / 16);
    partners.assign(static_cast<size_t>(end - begin), {});
    tbb::parallel_for(tbb::blocked_range<int64_t>(begin, end, 1024), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t v = r.begin(); v < r.end(); ++v) {
        const uint64_t vk = derive_key(key, static_cast<uint64_t>(v));
        uint64_t ctr = 0;
        const int64_t k = whole + (random_uniform(vk, ctr++) < frac ? 1 : 0);
        const auto& own = members[generated_label(g, v)];
        auto& out = partners[v - begin];
        for (int64_t j = 0; j < k; ++j) {
          if (random_uniform(vk, ctr++) < g.homophily) {
            out.push_back(own[kernels::random_below(vk, ctr++, own.size())]);
          } else {
            out.push_back(static_cast<int64_t>(kernels::random_below(vk, ctr++, static_cast<uint64_t>(n))));
          }
        }
      }
    });
    for (int64_t v = begin; v < end; ++v) {
      for (int64_t u : partners[v - begin]) emit(v, u);
    }
  }
}

}  // namespace gale::storage
