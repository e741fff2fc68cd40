// Every layer's backward against central finite differences of an independent float64
// reference forward, on small random graphs with empty rows and a hub, as blocks (more sources
// than destinations) and as full graphs; the 2-layer Model (dropout placement, activation,
// attention dropout) the same way; GraphOperand's transpose and norms; the loss and Adam against
// hand computations; determinism across seeds and thread counts.
#include <gtest/gtest.h>

#include <numeric>
#include <tbb/task_arena.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernels/error.hpp"
#include "engine/graph.hpp"
#include "engine/layers/layers.hpp"
#include "engine/model.hpp"
#include "kernels/dense.hpp"
#include "kernels/random.hpp"

namespace gale::engine {
namespace {

using Params = std::map<std::string, std::vector<double>>;

struct TestGraph {
  int64_t dst = 0, src = 0;
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  std::vector<int64_t> src_degree;  // full-graph in-degree of each source
  // A full graph the block could have been sampled from: source j is node j, of degree src_degree[j].
  std::vector<int64_t> src_ids, full_indptr;
  // Optional edge weights (entry order) and each source's weighted full-graph in-degree.
  std::vector<float> weights, full_degree;
  kernels::CsrView view() const {
    return {dst, src, indptr.data(), indices.data(), weights.empty() ? nullptr : weights.data()};
  }
  const float* degrees() const { return full_degree.empty() ? nullptr : full_degree.data(); }
  double weight(int64_t e) const { return weights.empty() ? 1.0 : weights[e]; }
  // GCN's degree of source j: its row's (weighted) entries as a destination, else the full graph's.
  double degree(int64_t j, bool as_dst) const {
    if (!as_dst && j >= dst) return weights.empty() ? static_cast<double>(src_degree[j]) : full_degree[j];
    if (weights.empty()) return static_cast<double>(indptr[j + 1] - indptr[j]);
    double d = 0;
    for (int64_t e = indptr[j]; e < indptr[j + 1]; ++e) d += weights[e];
    return static_cast<float>(d);  // as graph_norms rounds it
  }
};

// The graph with edge weights in [0.25, 2.25) and outer sources' weighted degrees of 0.5 to 3.
TestGraph weighted(TestGraph g, uint64_t seed) {
  for (size_t e = 0; e < g.indices.size(); ++e)
    g.weights.push_back(static_cast<float>(0.25 + 2.0 * kernels::random_uniform(seed, e)));
  for (int64_t j = 0; j < g.src; ++j) g.full_degree.push_back(0.5f + 0.625f * static_cast<float>(j % 5));
  return g;
}

// Destination 0 is a hub (every source), every 4th destination has no in-neighbours.
TestGraph random_graph(int64_t dst, int64_t src, uint64_t seed) {
  TestGraph g;
  g.dst = dst;
  g.src = src;
  kernels::CounterRng rng(seed);
  g.indptr.push_back(0);
  for (int64_t i = 0; i < dst; ++i) {
    std::set<int32_t> nb;
    if (i == 0) {
      for (int32_t j = 0; j < src; ++j) nb.insert(j);
    } else if (i % 4 != 3) {
      const int64_t k = 1 + static_cast<int64_t>(rng.below(4));
      for (int64_t t = 0; t < k; ++t) nb.insert(static_cast<int32_t>(rng.below(static_cast<uint64_t>(src))));
    }
    nb.erase(static_cast<int32_t>(i));  // self loops are the layers' business
    g.indices.insert(g.indices.end(), nb.begin(), nb.end());
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  for (int64_t j = 0; j < src; ++j) g.src_degree.push_back(j < dst ? g.indptr[j + 1] - g.indptr[j] : 1 + (j % 5));
  g.full_indptr.push_back(0);
  for (int64_t j = 0; j < src; ++j) {
    g.src_ids.push_back(j);
    g.full_indptr.push_back(g.full_indptr.back() + g.src_degree[j]);
  }
  return g;
}

std::vector<double> random_vector(size_t n, uint64_t key) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 2.0 * kernels::random_uniform(key, i) - 1.0;
  return v;
}

// ---- float64 reference forwards (row-major, independent of the engine's kernels) ----

// y (rows x out) = x (rows x in) W (in x out)
std::vector<double> matmul(const std::vector<double>& x, int64_t rows, int64_t in, const std::vector<double>& w, int64_t out) {
  std::vector<double> y(static_cast<size_t>(rows * out), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < in; ++k)
      for (int64_t c = 0; c < out; ++c) y[r * out + c] += x[r * in + k] * w[k * out + c];
  return y;
}

void add_bias(std::vector<double>* y, const std::vector<double>& b) {
  const size_t w = b.size();
  for (size_t i = 0; i < y->size(); ++i) (*y)[i] += b[i % w];
}

using Reference = std::function<std::vector<double>(const TestGraph&, const std::vector<double>& x, const Params&)>;

std::vector<double> gcn_ref(const TestGraph& g, const std::vector<double>& x, const Params& p, int64_t in, int64_t out,
                            const std::string& pre) {
  const auto h = matmul(x, g.src, in, p.at(pre + ".lin.weight"), out);
  auto norm = [&](int64_t j, bool as_dst) { return 1.0 / std::sqrt(g.degree(j, as_dst) + 1.0); };
  std::vector<double> y(static_cast<size_t>(g.dst * out), 0.0);
  for (int64_t i = 0; i < g.dst; ++i) {
    const double di = norm(i, true);
    for (int64_t e = g.indptr[i]; e < g.indptr[i + 1]; ++e)
      for (int64_t c = 0; c < out; ++c)
        y[i * out + c] += di * g.weight(e) * norm(g.indices[e], false) * h[g.indices[e] * out + c];
    for (int64_t c = 0; c < out; ++c) y[i * out + c] += di * di * h[i * out + c];
  }
  add_bias(&y, p.at(pre + ".bias"));
  return y;
}

std::vector<double> sage_ref(const TestGraph& g, const std::vector<double>& x, const Params& p, int64_t in, int64_t out,
                             const std::string& pre) {
  std::vector<double> mean(static_cast<size_t>(g.dst * in), 0.0);
  for (int64_t i = 0; i < g.dst; ++i) {
    const int64_t deg = g.indptr[i + 1] - g.indptr[i];
    for (int64_t e = g.indptr[i]; e < g.indptr[i + 1]; ++e)
      for (int64_t k = 0; k < in; ++k) mean[i * in + k] += g.weight(e) * x[g.indices[e] * in + k] / static_cast<double>(deg);
  }
  auto y = matmul(mean, g.dst, in, p.at(pre + ".neigh.lin.weight"), out);
  add_bias(&y, p.at(pre + ".neigh.bias"));
  const std::vector<double> x_dst(x.begin(), x.begin() + g.dst * in);
  const auto root = matmul(x_dst, g.dst, in, p.at(pre + ".root.weight"), out);
  for (size_t i = 0; i < y.size(); ++i) y[i] += root[i];
  return y;
}

std::vector<double> gin_ref(const TestGraph& g, const std::vector<double>& x, const Params& p, int64_t in, int64_t out,
                            double eps, bool two, const std::string& pre) {
  std::vector<double> agg(static_cast<size_t>(g.dst * in), 0.0);
  for (int64_t i = 0; i < g.dst; ++i) {
    for (int64_t k = 0; k < in; ++k) agg[i * in + k] = (1.0 + eps) * x[i * in + k];
    for (int64_t e = g.indptr[i]; e < g.indptr[i + 1]; ++e)
      for (int64_t k = 0; k < in; ++k) agg[i * in + k] += g.weight(e) * x[g.indices[e] * in + k];
  }
  auto z = matmul(agg, g.dst, in, p.at(pre + ".mlp.0.lin.weight"), out);
  add_bias(&z, p.at(pre + ".mlp.0.bias"));
  if (!two) return z;
  for (auto& v : z) v = v > 0 ? v : 0;
  auto y = matmul(z, g.dst, out, p.at(pre + ".mlp.2.weight"), out);
  add_bias(&y, p.at(pre + ".mlp.2.bias"));
  return y;
}

// Attention dropout as kernels/gat.hpp specifies it: entry (e, h) kept when
// random_uniform(key, e * heads + h) >= p, the self loop of row i at counter (E + i) * heads + h.
std::vector<double> gat_ref(const TestGraph& g, const std::vector<double>& x, const Params& p, int64_t in, int64_t heads,
                            int64_t f, const std::string& pre, float attn_p = 0.0f, uint64_t attn_key = 0) {
  const int64_t nnz = static_cast<int64_t>(g.indices.size());
  auto mult = [&](int64_t counter) {
    if (attn_p <= 0.0f) return 1.0;
    return kernels::random_uniform(attn_key, static_cast<uint64_t>(counter)) >= attn_p
               ? 1.0 / (1.0 - static_cast<double>(attn_p)) : 0.0;
  };
  const int64_t hf = heads * f;
  const auto z = matmul(x, g.src, in, p.at(pre + ".lin.weight"), hf);
  const auto& as = p.at(pre + ".att_src");
  const auto& ad = p.at(pre + ".att_dst");
  auto score = [&](int64_t j, int64_t h, const std::vector<double>& a) {
    double s = 0;
    for (int64_t k = 0; k < f; ++k) s += z[j * hf + h * f + k] * a[h * f + k];
    return s;
  };
  std::vector<double> y(static_cast<size_t>(g.dst * hf), 0.0);
  for (int64_t i = 0; i < g.dst; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<int64_t> srcs(g.indices.begin() + g.indptr[i], g.indices.begin() + g.indptr[i + 1]);
      srcs.push_back(i);
      std::vector<double> keep;
      for (int64_t e = g.indptr[i]; e < g.indptr[i + 1]; ++e) keep.push_back(mult(e * heads + h));
      keep.push_back(mult((nnz + i) * heads + h));
      std::vector<double> s;
      double mx = -1e300;
      for (int64_t j : srcs) {
        double v = score(j, h, as) + score(i, h, ad);
        v = v > 0 ? v : 0.2 * v;
        s.push_back(v);
        mx = std::max(mx, v);
      }
      double sum = 0;
      for (auto& v : s) sum += (v = std::exp(v - mx));
      for (size_t t = 0; t < srcs.size(); ++t)
        for (int64_t k = 0; k < f; ++k) y[i * hf + h * f + k] += keep[t] * s[t] / sum * z[srcs[t] * hf + h * f + k];
    }
  }
  add_bias(&y, p.at(pre + ".bias"));
  return y;
}

// ---- the check ----

Params read_params(Layer& layer) {
  Params p;
  for (Parameter* q : layer.parameters()) {
    const auto v = q->value.to_vector();
    p[q->name] = std::vector<double>(v.begin(), v.end());
  }
  return p;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The rng key of the training forward in check_layer (attention dropout draws from it).
constexpr uint64_t kLayerKey = 7;

// Compares analytic gradients of L = <layer(x), R> with central differences of the reference.
void check_layer(Layer& layer, const TestGraph& g, const Reference& ref, uint64_t seed) {
  const int64_t in = layer.in_dim(), out = layer.out_dim();
  const GraphOperand op(g.view(), g.src_ids.data(), g.full_indptr.data(), /*with_transpose=*/true, g.degrees());
  const std::vector<double> x = random_vector(static_cast<size_t>(g.src * in), seed + 1);
  const std::vector<double> r = random_vector(static_cast<size_t>(g.dst * out), seed + 2);
  Params params = read_params(layer);

  // The f32 layer agrees with the reference forward.
  Tensor xt = Tensor::from_vector(std::vector<float>(x.begin(), x.end()), g.src, in);
  for (Parameter* q : layer.parameters()) q->grad.fill(0.0f);
  const Tensor y = layer.forward(op, xt, ForwardContext{true, kLayerKey});
  const auto y_ref = ref(g, x, params);
  ASSERT_EQ(static_cast<int64_t>(y_ref.size()), y.numel());
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.f32()[i], y_ref[i], 1e-4 * (1 + std::abs(y_ref[i]))) << i;

  const Tensor gx = layer.backward(op, Tensor::from_vector(std::vector<float>(r.begin(), r.end()), g.dst, out), true);
  constexpr double kStep = 1e-6;
  auto expect_close = [](double analytic, double numeric, const std::string& what) {
    EXPECT_NEAR(analytic, numeric, 2e-3 * std::max(1.0, std::abs(numeric))) << what;
  };
  // Input gradient.
  for (size_t i = 0; i < x.size(); ++i) {
    auto xp = x, xm = x;
    xp[i] += kStep;
    xm[i] -= kStep;
    const double numeric = (dot(ref(g, xp, params), r) - dot(ref(g, xm, params), r)) / (2 * kStep);
    expect_close(gx.f32()[i], numeric, "d/dx[" + std::to_string(i) + "]");
  }
  // Every parameter's gradient.
  for (Parameter* q : layer.parameters()) {
    const auto grad = q->grad.to_vector();
    for (size_t i = 0; i < grad.size(); ++i) {
      Params pp = params, pm = params;
      pp[q->name][i] += kStep;
      pm[q->name][i] -= kStep;
      const double numeric = (dot(ref(g, x, pp), r) - dot(ref(g, x, pm), r)) / (2 * kStep);
      expect_close(grad[i], numeric, "d/d" + q->name + "[" + std::to_string(i) + "]");
    }
  }
}

// Blocks (9 destinations, 14 sources) and full graphs (11 x 11); narrow and wide outputs so both
// orders of aggregation and transformation run; narrowing layers to 11 columns, whose backward
// (without a root term) lays A^T grad in rows of 12 (kernels::spmm_gar_row_floats), and whose
// forward on a full graph (with a root term) forms x W and x W_root in one product.
struct Case {
  int64_t dst, src, in, out;
};
const Case kCases[] = {{9, 14, 5, 3}, {11, 11, 3, 6}, {9, 14, 13, 11}, {12, 12, 13, 11}};

TEST(GcnLayer, BackwardMatchesFiniteDifferences) {
  for (const Case& c : kCases) {
    auto layer = make_gcn_layer("l", c.in, c.out, 1);
    check_layer(*layer, random_graph(c.dst, c.src, 3), [&](const TestGraph& g, const auto& x, const Params& p) {
      return gcn_ref(g, x, p, c.in, c.out, "l");
    }, 10);
  }
}

TEST(SageLayer, BackwardMatchesFiniteDifferences) {
  for (const Case& c : kCases) {
    auto layer = make_sage_layer("l", c.in, c.out, 2);
    check_layer(*layer, random_graph(c.dst, c.src, 4), [&](const TestGraph& g, const auto& x, const Params& p) {
      return sage_ref(g, x, p, c.in, c.out, "l");
    }, 20);
  }
}

TEST(GinLayer, BackwardMatchesFiniteDifferences) {
  for (const Case& c : kCases) {
    for (int mlp : {1, 2}) {
      auto layer = make_gin_layer("l", c.in, c.out, 0.3f, mlp, 3);
      check_layer(*layer, random_graph(c.dst, c.src, 5), [&](const TestGraph& g, const auto& x, const Params& p) {
        return gin_ref(g, x, p, c.in, c.out, 0.3, mlp == 2, "l");
      }, 30);
    }
  }
}

// Edge weights (ModelConfig::edge_weights): GCN's weighted degrees, SAGE's mean and GIN's sum of
// weighted messages, forward against the reference and backward against its finite differences.
TEST(GcnLayer, WeightedBackwardMatchesFiniteDifferences) {
  for (const Case& c : kCases) {
    auto layer = make_gcn_layer("l", c.in, c.out, 1);
    check_layer(*layer, weighted(random_graph(c.dst, c.src, 3), 31), [&](const TestGraph& g, const auto& x, const Params& p) {
      return gcn_ref(g, x, p, c.in, c.out, "l");
    }, 10);
  }
}

TEST(SageLayer, WeightedBackwardMatchesFiniteDifferences) {
  for (const Case& c : kCases) {
    auto layer = make_sage_layer("l", c.in, c.out, 2);
    check_layer(*layer, weighted(random_graph(c.dst, c.src, 4), 32), [&](const TestGraph& g, const auto& x, const Params& p) {
      return sage_ref(g, x, p, c.in, c.out, "l");
    }, 20);
  }
}

TEST(GinLayer, WeightedBackwardMatchesFiniteDifferences) {
  for (const Case& c : kCases) {
    auto layer = make_gin_layer("l", c.in, c.out, 0.3f, 2, 3);
    check_layer(*layer, weighted(random_graph(c.dst, c.src, 5), 33), [&](const TestGraph& g, const auto& x, const Params& p) {
      return gin_ref(g, x, p, c.in, c.out, 0.3, true, "l");
    }, 30);
  }
}

// Weights of one are the unweighted layers bit for bit (degrees, coefficients and sums alike).
TEST(Layers, EdgeWeightsOfOneEqualTheUnweightedLayerExactly) {
  for (const Case& c : kCases) {
    TestGraph plain = random_graph(c.dst, c.src, 8);
    TestGraph ones = plain;
    ones.weights.assign(plain.indices.size(), 1.0f);
    for (int64_t j = 0; j < plain.src; ++j) ones.full_degree.push_back(static_cast<float>(plain.src_degree[j]));
    const std::vector<double> xd = random_vector(static_cast<size_t>(c.src * c.in), 9);
    const Tensor x = Tensor::from_vector(std::vector<float>(xd.begin(), xd.end()), c.src, c.in);
    for (int kind = 0; kind < 3; ++kind) {
      auto make = [&] {
        return kind == 0 ? make_gcn_layer("l", c.in, c.out, 1)
                         : kind == 1 ? make_sage_layer("l", c.in, c.out, 2) : make_gin_layer("l", c.in, c.out, 0.3f, 2, 3);
      };
      auto a = make();
      auto b = make();
      const GraphOperand pa(plain.view(), plain.src_ids.data(), plain.full_indptr.data());
      const GraphOperand pb(ones.view(), ones.src_ids.data(), ones.full_indptr.data(), true, ones.degrees());
      ASSERT_TRUE(pb.weighted());
      const Tensor ya = a->forward(pa, x, ForwardContext{true, kLayerKey});
      const Tensor yb = b->forward(pb, x, ForwardContext{true, kLayerKey});
      EXPECT_EQ(ya.to_vector(), yb.to_vector()) << kind;
      // A fresh gradient each: GIN's backward overwrites its argument in place.
      auto r = [&] { return Tensor::from_vector(std::vector<float>(static_cast<size_t>(c.dst * c.out), 0.5f), c.dst, c.out); };
      EXPECT_EQ(a->backward(pa, r(), true).to_vector(), b->backward(pb, r(), true).to_vector()) << kind;
    }
  }
}

TEST(GatLayer, BackwardMatchesFiniteDifferences) {
  for (const Case& c : kCases) {
    for (int64_t heads : {1, 3}) {
      auto layer = make_gat_layer("l", c.in, heads, c.out, /*attn_dropout=*/0.0f, 4);
      check_layer(*layer, random_graph(c.dst, c.src, 6), [&](const TestGraph& g, const auto& x, const Params& p) {
        return gat_ref(g, x, p, c.in, heads, c.out, "l");
      }, 40);
    }
  }
}

// Attention dropout during training: the masks are a pure function of the forward's key, so
// the differentiated function is fixed and finite differences apply.
TEST(GatLayer, BackwardWithAttentionDropoutMatchesFiniteDifferences) {
  for (const Case& c : kCases) {
    auto layer = make_gat_layer("l", c.in, 3, c.out, /*attn_dropout=*/0.4f, 4);
    check_layer(*layer, random_graph(c.dst, c.src, 7), [&](const TestGraph& g, const auto& x, const Params& p) {
      return gat_ref(g, x, p, c.in, 3, c.out, "l", 0.4f, kLayerKey);
    }, 45);
  }
}

// Model::forward in float64, built from the layer references: dropout on every layer input
// (key derive_key(K, 2l), element (r, c) at counter r * cols + c, scale 1 / (1 - p)), the layer
// (attention dropout keyed derive_key(K, 2l + 1)), ELU between layers, nothing after the last.
std::vector<double> model_ref(const ModelConfig& cfg, const TestGraph& g, const std::vector<double>& x, const Params& p,
                              bool training, uint64_t key) {
  std::vector<double> h = x;
  int64_t width = cfg.in_dim;
  for (int l = 0; l < cfg.layers; ++l) {
    const bool last = l + 1 == cfg.layers;
    if (training && cfg.dropout > 0.0f) {
      const uint64_t k = kernels::derive_key(key, 2 * static_cast<uint64_t>(l));
      for (size_t i = 0; i < h.size(); ++i)
        h[i] = kernels::random_uniform(k, i) >= cfg.dropout ? h[i] / (1.0 - static_cast<double>(cfg.dropout)) : 0.0;
    }
    const std::string pre = "layers." + std::to_string(l);
    const int64_t heads = cfg.model == "gat" && !last ? cfg.heads : 1;
    const int64_t out = last ? cfg.out_dim : (cfg.model == "gat" ? cfg.heads * cfg.hidden : cfg.hidden);
    if (cfg.model == "gcn") h = gcn_ref(g, h, p, width, out, pre);
    else if (cfg.model == "sage") h = sage_ref(g, h, p, width, out, pre);
    else if (cfg.model == "gin") h = gin_ref(g, h, p, width, out, cfg.gin_eps, cfg.gin_mlp_layers == 2, pre);
    else h = gat_ref(g, h, p, width, heads, out / heads, pre, training ? cfg.attn_dropout : 0.0f,
                     kernels::derive_key(key, 2 * static_cast<uint64_t>(l) + 1));
    width = out;
    if (last) continue;
    if (cfg.norm == Norm::kBatch) {  // training: the batch's mean and biased variance per column
      const std::vector<double>& gamma = p.at(pre + ".norm.weight");
      const std::vector<double>& beta = p.at(pre + ".norm.bias");
      const size_t rows = h.size() / static_cast<size_t>(width);
      for (int64_t c = 0; c < width; ++c) {
        double mean = 0, var = 0;
        for (size_t r = 0; r < rows; ++r) mean += h[r * width + c];
        mean /= static_cast<double>(rows);
        for (size_t r = 0; r < rows; ++r) var += (h[r * width + c] - mean) * (h[r * width + c] - mean);
        var /= static_cast<double>(rows);
        for (size_t r = 0; r < rows; ++r)
          h[r * width + c] = (h[r * width + c] - mean) / std::sqrt(var + BatchNorm::kEps) * gamma[c] + beta[c];
      }
    }
    if (cfg.activation == Activation::kElu) {
      for (auto& v : h) v = v > 0 ? v : std::expm1(v);
    } else if (cfg.activation == Activation::kRelu) {
      for (auto& v : h) v = std::max(v, 0.0);
    } else {  // MaxK: each row keeps its k largest values (ties to the lower column)
      for (size_t r = 0; r * width < h.size(); ++r) {
        std::vector<int64_t> cols(static_cast<size_t>(width));
        std::iota(cols.begin(), cols.end(), 0);
        const double* row = h.data() + r * width;
        std::stable_sort(cols.begin(), cols.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
        for (size_t i = static_cast<size_t>(cfg.maxk); i < cols.size(); ++i) h[r * width + cols[i]] = 0.0;
      }
    }
  }
  return h;
}

Params read_params(Model& model) {
  Params p;
  for (Parameter* q : model.parameters()) {
    const auto v = q->value.to_vector();
    p[q->name] = std::vector<double>(v.begin(), v.end());
  }
  return p;
}

ModelConfig small_config(const std::string& kind, float dropout) {
  ModelConfig cfg;
  cfg.model = kind;
  cfg.in_dim = 4;
  cfg.hidden = 3;
  cfg.heads = 2;
  cfg.out_dim = 3;
  cfg.dropout = dropout;
  cfg.attn_dropout = dropout;
  cfg.activation = Activation::kElu;
  cfg.gin_eps = 0.1f;
  return cfg;
}

// A training step of `cfg` on graph g (every layer), input x and output weights r: the output
// against the float64 reference, then every parameter gradient of <y, r> against central
// differences of the reference (a training forward's masks are a pure function of its key, so
// the differentiated function is fixed).
void check_model_gradients(const ModelConfig& cfg, uint64_t seed, const TestGraph& g, uint64_t key,
                           uint64_t data_key, const std::string& what, bool stacked_input = false) {
  Model model(cfg, seed);
  // Biases away from zero: a ReLU layer's empty row on an all-zero input would otherwise sit on the
  // kink, where central differences see half a slope.
  for (Parameter* q : model.parameters()) {
    const std::string& n = q->name;
    if (n.size() < 4 || n.compare(n.size() - 4, 4, "bias") != 0) continue;
    std::vector<float> b(static_cast<size_t>(q->value.numel()));
    for (size_t i = 0; i < b.size(); ++i) b[i] = 0.05f * static_cast<float>(i + 1);
    q->value = Tensor::from_vector(b, q->value.rows(), q->value.cols());
  }
  if (stacked_input) {  // a constant input: SAGE's first layer keeps [A x | x] (ExecOptions::stack_operands)
    ops::ExecOptions exec;
    exec.stack_operands = true;
    model.set_exec(exec);
    model.set_constant_input(true);
  }
  const GraphOperand op(g.view());
  const std::vector<const GraphOperand*> graphs(static_cast<size_t>(cfg.layers), &op);
  const auto x = random_vector(static_cast<size_t>(g.src * cfg.in_dim), data_key);
  const auto r = random_vector(static_cast<size_t>(g.dst * cfg.out_dim), data_key + 1);
  const Params params = read_params(model);
  model.zero_grad();
  const Tensor y =
      model.forward(graphs, Tensor::from_vector(std::vector<float>(x.begin(), x.end()), g.src, cfg.in_dim), true, key);
  const auto y_ref = model_ref(cfg, g, x, params, true, key);
  ASSERT_EQ(y.numel(), static_cast<int64_t>(y_ref.size()));
  for (int64_t i = 0; i < y.numel(); ++i)
    ASSERT_NEAR(y.f32()[i], y_ref[i], 1e-4 * (1 + std::abs(y_ref[i]))) << what << " output " << i;
  model.backward(Tensor::from_vector(std::vector<float>(r.begin(), r.end()), g.dst, cfg.out_dim));
  constexpr double kStep = 1e-6;
  for (Parameter* q : model.parameters()) {
    const auto grad = q->grad.to_vector();
    for (size_t i = 0; i < grad.size(); ++i) {
      Params pp = params, pm = params;
      pp[q->name][i] += kStep;
      pm[q->name][i] -= kStep;
      const double numeric =
          (dot(model_ref(cfg, g, x, pp, true, key), r) - dot(model_ref(cfg, g, x, pm, true, key), r)) / (2 * kStep);
      EXPECT_NEAR(grad[i], numeric, 2e-3 * std::max(1.0, std::abs(numeric))) << what << " " << q->name << "[" << i << "]";
    }
  }
}

// A layer given a MaxK input (ForwardContext::maxk_input) on a block (9 destinations of 14
// sources): a narrowing one multiplies the CBSR form, a square one aggregates it (SpGEMM; SAGE's
// [A x | x_dst] beside each other in one GEMM) without reading the dense form at all (it gets an
// undefined x); both form the input gradient at the kept positions only: the same output and
// parameter gradients as the dense path on the masked input, and that path's input gradient at
// the kept positions, zero elsewhere.
TEST(Layers, ALayerOnAMaxKInputEqualsTheDensePathMaskedOnABlock) {
  // (in, out): narrowing, square, and narrowing to a width whose gradient rows are padded (11 -> 12).
  for (const auto& [in, out] : {std::pair<int64_t, int64_t>{8, 3}, {8, 8}, {16, 11}}) {
    for (const std::string kind : {"gcn", "sage", "gin"}) {
      SCOPED_TRACE(kind + " in " + std::to_string(in) + " out " + std::to_string(out));
      const int64_t k = 3;
      const auto make = [&]() {
        if (kind == "gcn") return make_gcn_layer("l", in, out, 5);
        if (kind == "sage") return make_sage_layer("l", in, out, 5);
        return make_gin_layer("l", in, out, 0.1f, 2, 5);
      };
      auto sparse = make(), dense = make();
      const TestGraph g = random_graph(9, 14, 11);
      const GraphOperand op(g.view(), g.src_ids.data(), g.full_indptr.data());
      const auto xv = random_vector(static_cast<size_t>(g.src * in), 21);
      const ops::Cbsr x_cbsr = ops::maxk(Tensor::from_vector(std::vector<float>(xv.begin(), xv.end()), g.src, in), k);
      Tensor x = Tensor::empty(g.src, in, DType::kF32, Device::cpu());
      ops::cbsr_to_dense(x_cbsr, &x);
      ForwardContext with_cbsr{true, kLayerKey};
      with_cbsr.maxk_input = &x_cbsr;
      EXPECT_EQ(sparse->reads_dense_maxk_input(), out < in);
      const Tensor ys = sparse->forward(op, sparse->reads_dense_maxk_input() ? x : Tensor(), with_cbsr);
      const Tensor yd = dense->forward(op, x, ForwardContext{true, kLayerKey});
      ASSERT_EQ(ys.numel(), yd.numel());
      for (int64_t i = 0; i < ys.numel(); ++i) EXPECT_NEAR(ys.f32()[i], yd.f32()[i], 1e-5) << "output " << i;
      const auto rv = random_vector(static_cast<size_t>(g.dst * out), 22);
      const std::vector<float> r(rv.begin(), rv.end());
      const Tensor gs = sparse->backward(op, Tensor::from_vector(r, g.dst, out), true);
      const Tensor gd = dense->backward(op, Tensor::from_vector(r, g.dst, out), true);
      const auto ps = sparse->parameters(), pd = dense->parameters();
      ASSERT_EQ(ps.size(), pd.size());
      for (size_t q = 0; q < ps.size(); ++q) {
        const auto a = ps[q]->grad.to_vector(), b = pd[q]->grad.to_vector();
        for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << ps[q]->name << "[" << i << "]";
      }
      ASSERT_EQ(gs.rows(), g.src);
      int64_t kept = 0;
      for (int64_t i = 0; i < gs.numel(); ++i) {
        const bool is_kept = x.f32()[i] != 0.0f;  // the random inputs are never exactly 0
        kept += is_kept;
        EXPECT_NEAR(gs.f32()[i], is_kept ? gd.f32()[i] : 0.0f, 1e-5) << "input gradient " << i;
      }
      EXPECT_EQ(kept, g.src * k);
    }
  }
}

// Every parameter gradient of a 2-layer model, with feature and attention dropout off and on. ELU
// between the layers: it is smooth, so no hidden unit sits on a kink.
TEST(Model, TwoLayerTrainingBackwardMatchesFiniteDifferencesOfADoubleReference) {
  for (const std::string kind : {"gcn", "sage", "gin", "gat"}) {
    for (float dropout : {0.0f, 0.3f}) {
      check_model_gradients(small_config(kind, dropout), 5, random_graph(10, 10, 8), 99, 50,
                            kind + " dropout " + std::to_string(dropout));
    }
  }
}

// MaxK between the layers (MaxK-GNN): the next layer aggregates the CBSR form (SpGEMM forward, SSpMM
// backward, MaxK's mask folded in), with dropout off and on (dropout then acts on both forms with
// the same masks). Three layers, so a MaxK input meets a layer that also needs its input gradient.
TEST(Model, MaxKTrainingBackwardMatchesFiniteDifferencesOfADoubleReference) {
  for (const std::string kind : {"gcn", "sage", "gin"}) {
    for (float dropout : {0.0f, 0.3f}) {
      ModelConfig cfg = small_config(kind, dropout);
      cfg.layers = 3;
      cfg.hidden = 7;
      cfg.activation = Activation::kMaxK;
      cfg.maxk = 3;
      check_model_gradients(cfg, 6, random_graph(12, 12, 9), 77, 52, kind + " maxk dropout " + std::to_string(dropout));
    }
  }
}

// SAGE's first layer on its kept [A x | x] (one GEMM each way, `--stack-operands`), with ELU, ReLU
// (whose backward also sums its output's columns for the bias gradient) and MaxK between the
// layers; and without the stacked input, three ReLU layers of each kind.
TEST(Model, StackedFirstLayerMatchesFiniteDifferencesOfADoubleReference) {
  for (const Activation a : {Activation::kElu, Activation::kRelu, Activation::kMaxK}) {
    ModelConfig cfg = small_config("sage", 0.0f);
    cfg.layers = 3;
    cfg.activation = a;
    cfg.maxk = 2;
    check_model_gradients(cfg, 8, random_graph(12, 12, 10), 78, 53, "stacked sage " + activation_name(cfg), true);
  }
  for (const std::string kind : {"gcn", "sage", "gin"}) {
    ModelConfig cfg = small_config(kind, 0.0f);
    cfg.layers = 3;
    cfg.activation = Activation::kRelu;
    check_model_gradients(cfg, 9, random_graph(12, 12, 11), 79, 54, kind + " relu");
  }
}

// Batch normalisation after each hidden layer (training: the batch's statistics), with ELU, ReLU
// (which then runs after the normalisation instead of inside the layer) and MaxK, dropout off and
// on: every parameter gradient, gamma's and beta's included.
TEST(Model, BatchNormTrainingBackwardMatchesFiniteDifferencesOfADoubleReference) {
  for (const std::string kind : {"gcn", "sage", "gin", "gat"}) {
    for (const Activation a : {Activation::kElu, Activation::kRelu, Activation::kMaxK}) {
      if (kind == "gat" && a == Activation::kMaxK) continue;
      for (float dropout : {0.0f, 0.3f}) {
        ModelConfig cfg = small_config(kind, dropout);
        cfg.layers = 3;
        cfg.hidden = 5;
        cfg.activation = a;
        cfg.maxk = 3;
        cfg.norm = Norm::kBatch;
        check_model_gradients(cfg, 7, random_graph(12, 12, 12), 80, 55,
                              kind + " batch norm " + activation_name(cfg) + " dropout " + std::to_string(dropout));
      }
    }
  }
}

// Evaluation normalises by the running statistics, which each training forward moves by 0.1 towards
// the batch's mean and unbiased variance; they are buffers (not parameters) with stable names.
TEST(Model, BatchNormEvaluatesWithRunningStatistics) {
  ModelConfig cfg = small_config("gcn", 0.0f);
  cfg.layers = 2;
  cfg.activation = Activation::kRelu;
  cfg.norm = Norm::kBatch;
  Model model(cfg, 3);
  const std::vector<Buffer*> buffers = model.buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0]->name, "layers.0.norm.running_mean");
  EXPECT_EQ(buffers[1]->name, "layers.0.norm.running_var");
  for (Parameter* q : model.parameters()) EXPECT_EQ(q->name.find("running"), std::string::npos) << q->name;
  const TestGraph g = random_graph(10, 10, 4);
  const GraphOperand op(g.view());
  const std::vector<const GraphOperand*> graphs(2, &op);
  const auto xv = random_vector(static_cast<size_t>(g.src * cfg.in_dim), 60);
  const Tensor x = Tensor::from_vector(std::vector<float>(xv.begin(), xv.end()), g.src, cfg.in_dim);
  const Tensor before = model.forward(graphs, x, false, 0);
  model.forward(graphs, x, true, 1);
  const Tensor after = model.forward(graphs, x, false, 0);
  // The first layer's output on this input (a one-layer model of the same seed has its weights).
  ModelConfig plain = cfg;
  plain.layers = 1;
  plain.out_dim = cfg.hidden;
  plain.norm = Norm::kNone;
  Model first(plain, 3);
  const std::vector<const GraphOperand*> one(1, &op);
  const Tensor h = first.forward(one, x, false, 0);
  const auto hv = h.to_vector();
  const auto rm = buffers[0]->value.to_vector(), rv = buffers[1]->value.to_vector();
  for (int64_t c = 0; c < h.cols(); ++c) {
    double mean = 0, var = 0;
    for (int64_t r = 0; r < h.rows(); ++r) mean += hv[r * h.cols() + c];
    mean /= static_cast<double>(h.rows());
    for (int64_t r = 0; r < h.rows(); ++r) var += (hv[r * h.cols() + c] - mean) * (hv[r * h.cols() + c] - mean);
    EXPECT_NEAR(rm[c], 0.1 * mean, 1e-5) << c;
    EXPECT_NEAR(rv[c], 0.9 + 0.1 * var / static_cast<double>(h.rows() - 1), 1e-5) << c;
  }
  // The running statistics moved, so evaluation changed.
  double moved = 0;
  for (int64_t i = 0; i < after.numel(); ++i) moved += std::abs(after.f32()[i] - before.f32()[i]);
  EXPECT_GT(moved, 1e-3);
}

TEST(Model, MaxKIsRefusedForGatAndOutOfRangeK) {
  ModelConfig cfg = small_config("gat", 0.0f);
  cfg.activation = Activation::kMaxK;
  cfg.maxk = 2;
  EXPECT_THROW(Model(cfg, 1), InputError);
  cfg = small_config("sage", 0.0f);
  cfg.activation = Activation::kMaxK;
  cfg.maxk = cfg.hidden + 1;
  EXPECT_THROW(Model(cfg, 1), InputError);
  EXPECT_THROW(parse_activation("maxk:0", &cfg), InputError);
  EXPECT_THROW(parse_activation("maxk:", &cfg), InputError);
  parse_activation("maxk:2", &cfg);
  EXPECT_EQ(activation_name(cfg), "maxk:2");
}

TEST(Model, EdgeWeightsAreRefusedForGat) {
  ModelConfig cfg = small_config("gat", 0.0f);
  cfg.edge_weights = true;
  EXPECT_THROW(Model(cfg, 1), InputError);
  cfg = small_config("gcn", 0.0f);
  cfg.edge_weights = true;
  EXPECT_NO_THROW(Model(cfg, 1));
}

// Evaluation forwards apply no dropout of either kind.
TEST(Model, EvaluationForwardIsDeterministicAndDropoutFree) {
  for (const std::string kind : {"gcn", "sage", "gin", "gat"}) {
    const ModelConfig cfg = small_config(kind, 0.5f);
    Model model(cfg, 3);
    const TestGraph g = random_graph(10, 10, 2);
    const GraphOperand op(g.view());
    const auto x = random_vector(40, 60);
    const Tensor y = model.forward({&op, &op}, Tensor::from_vector(std::vector<float>(x.begin(), x.end()), 10, 4), false, 1);
    const auto y_ref = model_ref(cfg, g, x, read_params(model), false, 0);
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.f32()[i], y_ref[i], 1e-4 * (1 + std::abs(y_ref[i]))) << kind;
  }
}

// Checkpoints and the PyG comparison key on parameter names; initialisation is a pure function
// of the seed.
TEST(Model, SameSeedGivesTheSameParametersUnderStableNames) {
  const std::map<std::string, std::vector<std::string>> expected = {
      {"gcn", {"layers.0.lin.weight", "layers.0.bias", "layers.1.lin.weight", "layers.1.bias"}},
      {"sage", {"layers.0.neigh.lin.weight", "layers.0.neigh.bias", "layers.0.root.weight",
                "layers.1.neigh.lin.weight", "layers.1.neigh.bias", "layers.1.root.weight"}},
      {"gin", {"layers.0.mlp.0.lin.weight", "layers.0.mlp.0.bias", "layers.0.mlp.2.weight", "layers.0.mlp.2.bias",
               "layers.1.mlp.0.lin.weight", "layers.1.mlp.0.bias", "layers.1.mlp.2.weight", "layers.1.mlp.2.bias"}},
      {"gat", {"layers.0.lin.weight", "layers.0.att_src", "layers.0.att_dst", "layers.0.bias", "layers.1.lin.weight",
               "layers.1.att_src", "layers.1.att_dst", "layers.1.bias"}},
  };
  for (const auto& [kind, names] : expected) {
    const ModelConfig cfg = small_config(kind, 0.5f);
    Model a(cfg, 11), b(cfg, 11), c(cfg, 12);
    std::vector<std::string> got;
    for (Parameter* p : a.parameters()) got.push_back(p->name);
    EXPECT_EQ(got, names) << kind;
    const auto pa = a.parameters(), pb = b.parameters(), pc = c.parameters();
    bool any_differs = false;
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(pa[i]->value.to_vector(), pb[i]->value.to_vector()) << pa[i]->name;
      any_differs |= pa[i]->value.to_vector() != pc[i]->value.to_vector();
    }
    EXPECT_TRUE(any_differs) << kind << ": seeds 11 and 12 gave the same model";
  }
}

// Glorot-uniform weights (PyG's default for GCNConv / GATConv): bounded by sqrt(6 / (fan_in +
// fan_out)) and spread over that range; biases start at zero.
TEST(Model, WeightsAreGlorotUniformAndBiasesZero) {
  ModelConfig cfg = small_config("gcn", 0.5f);
  cfg.in_dim = 300;
  cfg.hidden = 200;
  Model model(cfg, 1);
  Parameter* w = model.parameters()[0];
  const double bound = std::sqrt(6.0 / (300 + 200));
  double sum_sq = 0;
  for (float v : w->value.to_vector()) {
    ASSERT_LE(std::abs(v), bound);
    sum_sq += static_cast<double>(v) * v;
  }
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(w->value.numel())), bound / std::sqrt(3.0), 0.01 * bound);
  for (float v : model.parameters()[1]->value.to_vector()) EXPECT_EQ(v, 0.0f);
}

// A training step's gradients are the same bits whether TBB runs on one thread or several.
TEST(Model, TrainingStepIsBitIdenticalForAnyThreadCount) {
  const TestGraph g = random_graph(700, 700, 12);
  const GraphOperand op(g.view());
  const auto x = random_vector(700 * 19, 70);
  for (const std::string kind : {"gcn", "sage", "gin", "gat"}) {
    ModelConfig cfg = small_config(kind, 0.5f);
    cfg.in_dim = 19;
    cfg.hidden = 33;
    cfg.activation = Activation::kRelu;
    auto run = [&]() {
      Model model(cfg, 4);
      model.zero_grad();
      const Tensor y = model.forward({&op, &op}, Tensor::from_vector(std::vector<float>(x.begin(), x.end()), 700, 19), true, 8);
      model.backward(y);
      std::vector<std::vector<float>> out{y.to_vector()};
      for (Parameter* p : model.parameters()) out.push_back(p->grad.to_vector());
      return out;
    };
    std::vector<std::vector<float>> one, many;
    tbb::task_arena(1).execute([&] { one = run(); });
    tbb::task_arena().execute([&] { many = run(); });
    ASSERT_EQ(one.size(), many.size());
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_EQ(0, std::memcmp(one[i].data(), many[i].data(), one[i].size() * sizeof(float))) << kind << " " << i;
  }
}

// A constant input lets the first layer keep A x between steps (Model::set_constant_input): the
// same logits and gradients, bit for bit, step after step, with weights updated in between; a
// different input tensor is aggregated afresh, never served the kept one.
TEST(Model, ConstantInputKeepsTheFirstAggregationWithoutChangingABit) {
  const TestGraph g = random_graph(500, 500, 21);
  const GraphOperand op(g.view());
  const auto xv = random_vector(500 * 23, 71);
  const Tensor x = Tensor::from_vector(std::vector<float>(xv.begin(), xv.end()), 500, 23);
  const auto ov = random_vector(500 * 23, 72);
  const Tensor other = Tensor::from_vector(std::vector<float>(ov.begin(), ov.end()), 500, 23);
  for (const std::string kind : {"gcn", "sage", "gin"}) {
    ModelConfig cfg = small_config(kind, 0.0f);
    cfg.in_dim = 23;
    cfg.hidden = 64;  // the first layer aggregates first (23 < 64), the next ones transform first
    cfg.activation = Activation::kRelu;
    auto run = [&](bool constant) {
      Model model(cfg, 5);
      model.set_constant_input(constant);
      Adam adam(model.parameters(), 0.01f, 0.0f);
      std::vector<std::vector<float>> out;
      for (int step = 0; step < 4; ++step) {
        model.zero_grad();
        const Tensor y = model.forward({&op, &op}, step == 3 ? other : x, true, 8);
        out.push_back(y.to_vector());
        model.backward(y);
        for (Parameter* p : model.parameters()) out.push_back(p->grad.to_vector());
        adam.step();
      }
      out.push_back(model.forward({&op, &op}, x, false, 0).to_vector());
      return out;
    };
    const auto plain = run(false), kept = run(true);
    ASSERT_EQ(plain.size(), kept.size());
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_EQ(0, std::memcmp(plain[i].data(), kept[i].data(), plain[i].size() * sizeof(float))) << kind << " " << i;
  }
}

// ReLU's backward folded into the next layer's (Layer::fold_input_relu): a layer whose backward
// ends in the aggregation that writes its input gradient (GCN and GIN aggregating first, at equal
// widths) takes the mask, and returns exactly the gradient it returns without it, masked by
// relu_backward_mask afterwards; a layer whose input gradient comes from a GEMM (SAGE, and any
// narrowing layer) declines, and is unchanged.
TEST(Layers, AggregateFirstLayersFoldTheInputRelu) {
  const TestGraph g = random_graph(40, 40, 31);
  const GraphOperand op(g.view());
  for (const std::string kind : {"gcn", "sage", "gin"}) {
    for (const int64_t out : {int64_t{33}, int64_t{5}}) {
      SCOPED_TRACE(kind + " out " + std::to_string(out));
      const int64_t in = 33;
      const auto make = [&]() {
        if (kind == "gcn") return make_gcn_layer("l", in, out, 5);
        if (kind == "sage") return make_sage_layer("l", in, out, 5);
        return make_gin_layer("l", in, out, 0.1f, 2, 5);
      };
      const auto xv = random_vector(static_cast<size_t>(g.src * in), 41);
      const Tensor x = Tensor::from_vector(std::vector<float>(xv.begin(), xv.end()), g.src, in);
      // The mask of a ReLU output below: the positive entries of another random matrix.
      const auto hv = random_vector(static_cast<size_t>(g.src * in), 42);
      const Tensor mask = ops::relu_mask(Tensor::from_vector(std::vector<float>(hv.begin(), hv.end()), g.src, in));
      const auto rv = random_vector(static_cast<size_t>(g.dst * out), 43);
      // A tensor each: GIN's backward writes its input gradient over the gradient it is given.
      const auto r = [&] { return Tensor::from_vector(std::vector<float>(rv.begin(), rv.end()), g.dst, out); };
      ForwardContext ctx{true, kLayerKey};
      auto folding = make(), plain = make();
      folding->forward(op, x, ctx);
      plain->forward(op, x, ctx);
      const bool folds = folding->fold_input_relu(op, mask);
      EXPECT_EQ(folds, kind != "sage" && out == in);
      const Tensor got = folding->backward(op, r(), true);
      Tensor want = plain->backward(op, r(), true);
      if (folds) ops::relu_backward_mask(want, mask, &want);
      ASSERT_EQ(got.numel(), want.numel());
      EXPECT_EQ(0, std::memcmp(got.f32(), want.f32(), static_cast<size_t>(got.numel()) * sizeof(float)));
      const auto pf = folding->parameters(), pp = plain->parameters();
      for (size_t q = 0; q < pf.size(); ++q) {
        const auto a = pf[q]->grad.to_vector(), b = pp[q]->grad.to_vector();
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << pf[q]->name;
      }
    }
  }
}

// Full-graph training with ReLU between the layers gives the same logits, gradients and weights,
// bit for bit, with ReLU's backward folded into the next layer's and as a pass of its own
// (Model::set_fold_relu): four layers (a widening first one, hidden ones of 33 columns, a
// narrowing last one), GIN with one and two MLP layers, dropout off and on (whose backward then
// follows ReLU's instead of preceding it), several Adam steps.
TEST(Model, FoldedReluBackwardTrainsTheSameBitsAsItsOwnPass) {
  const TestGraph g = random_graph(300, 300, 23);
  const GraphOperand op(g.view());
  const auto xv = random_vector(300 * 19, 73);
  const Tensor x = Tensor::from_vector(std::vector<float>(xv.begin(), xv.end()), 300, 19);
  for (const std::string kind : {"gcn", "sage", "gin"}) {
    for (const int mlp : {1, 2}) {
      if (kind != "gin" && mlp == 1) continue;
      for (const float dropout : {0.0f, 0.3f}) {
        ModelConfig cfg = small_config(kind, dropout);
        cfg.layers = 4;
        cfg.in_dim = 19;
        cfg.hidden = 33;
        cfg.out_dim = 5;
        cfg.gin_mlp_layers = mlp;
        cfg.activation = Activation::kRelu;
        auto run = [&](bool fold) {
          Model model(cfg, 6);
          model.set_fold_relu(fold);
          model.set_constant_input(true);
          Adam adam(model.parameters(), 0.01f, 0.0f);
          std::vector<std::vector<float>> out;
          const std::vector<const GraphOperand*> graphs(4, &op);
          for (int step = 0; step < 3; ++step) {
            model.zero_grad();
            const Tensor y = model.forward(graphs, x, true, 9 + static_cast<uint64_t>(step));
            out.push_back(y.to_vector());
            model.backward(y);
            for (Parameter* p : model.parameters()) out.push_back(p->grad.to_vector());
            adam.step();
          }
          for (Parameter* p : model.parameters()) out.push_back(p->value.to_vector());
          return out;
        };
        const auto own = run(false), folded = run(true);
        ASSERT_EQ(own.size(), folded.size());
        for (size_t i = 0; i < own.size(); ++i)
          EXPECT_EQ(0, std::memcmp(own[i].data(), folded[i].data(), own[i].size() * sizeof(float)))
              << kind << " mlp " << mlp << " dropout " << dropout << " item " << i;
      }
    }
  }
}

// The transpose, GCN norms (full-graph degree for sources that are not destinations) and SAGE's
// mean factors of a block.
TEST(GraphOperand, TransposeAndNormsFollowTheBlock) {
  const TestGraph g = random_graph(9, 14, 3);
  std::vector<float> weights(g.indices.size());
  for (size_t e = 0; e < weights.size(); ++e) weights[e] = static_cast<float>(e) + 0.5f;
  kernels::CsrView csr = g.view();
  csr.weights = weights.data();
  std::vector<float> full_degree(14);
  for (int64_t j = 0; j < 14; ++j) full_degree[j] = 0.75f * static_cast<float>(j);
  const GraphOperand op(csr, g.src_ids.data(), g.full_indptr.data(), /*with_transpose=*/true, full_degree.data());
  EXPECT_TRUE(op.weighted());
  EXPECT_EQ(op.num_dst(), 9);
  EXPECT_EQ(op.num_src(), 14);
  const kernels::CsrView csc = op.csc();
  ASSERT_EQ(csc.rows, 14);
  ASSERT_EQ(csc.nnz(), static_cast<int64_t>(g.indices.size()));
  for (int64_t j = 0; j < 14; ++j) {
    for (int64_t k = csc.indptr[j]; k < csc.indptr[j + 1]; ++k) {
      const int64_t e = op.csc_edge()[k];
      EXPECT_EQ(g.indices[e], j);
      EXPECT_TRUE(e >= g.indptr[csc.indices[k]] && e < g.indptr[csc.indices[k] + 1]);
      EXPECT_EQ(csc.weights[k], weights[e]);
    }
  }
  // GCN's degrees are the weighted ones (the row's weights; an outer source's from full_degree),
  // SAGE's mean still divides by the entry count.
  for (int64_t i = 0; i < 9; ++i) {
    const int64_t deg = g.indptr[i + 1] - g.indptr[i];
    float wdeg = 0;
    for (int64_t e = g.indptr[i]; e < g.indptr[i + 1]; ++e) wdeg += weights[e];
    EXPECT_FLOAT_EQ(op.dst_norm()[i], 1.0f / std::sqrt(wdeg + 1));
    EXPECT_FLOAT_EQ(op.self_norm()[i], 1.0f / (wdeg + 1));
    EXPECT_FLOAT_EQ(op.inv_degree()[i], deg == 0 ? 0.0f : 1.0f / static_cast<float>(deg));
    EXPECT_EQ(op.src_norm()[i], op.dst_norm()[i]);
  }
  for (int64_t j = 9; j < 14; ++j) EXPECT_FLOAT_EQ(op.src_norm()[j], 1.0f / std::sqrt(full_degree[j] + 1));
  // Without weights, the plain degrees.
  const GraphOperand plain(g.view(), g.src_ids.data(), g.full_indptr.data());
  EXPECT_FALSE(plain.weighted());
  for (int64_t i = 0; i < 9; ++i)
    EXPECT_FLOAT_EQ(plain.dst_norm()[i], 1.0f / std::sqrt(static_cast<float>(g.indptr[i + 1] - g.indptr[i] + 1)));
  for (int64_t j = 9; j < 14; ++j)
    EXPECT_FLOAT_EQ(plain.src_norm()[j], 1.0f / std::sqrt(static_cast<float>(g.src_degree[j] + 1)));
}

TEST(SoftmaxCrossEntropy, MatchesHandComputation) {
  const Tensor logits = Tensor::from_vector({1.0f, 2.0f, 0.5f, -1.0f, 0.0f, 3.0f}, 2, 3);
  const int32_t labels[] = {1, 0};
  Tensor grad = Tensor::zeros(2, 3);
  int64_t correct = 0;
  const double loss = softmax_cross_entropy(logits, labels, {0, 1}, &grad, &correct);
  auto lse = [](double a, double b, double c) { return std::log(std::exp(a) + std::exp(b) + std::exp(c)); };
  const double expect = 0.5 * ((lse(1, 2, 0.5) - 2) + (lse(-1, 0, 3) + 1));
  EXPECT_NEAR(loss, expect, 1e-6);
  EXPECT_EQ(correct, 1);
  EXPECT_NEAR(grad.f32()[1], 0.5 * (std::exp(2 - lse(1, 2, 0.5)) - 1), 1e-6);
}

// A data-parallel worker's share of a step (grad_over rows in all): the gradient of the sum over
// its rows divided by grad_over, i.e. its own mean's gradient times listed / grad_over; the loss it
// reports stays its own rows' mean.
TEST(SoftmaxCrossEntropy, AShareOfAStepsMeanScalesTheGradientNotTheLoss) {
  const int64_t rows = 6, classes = 5;
  const auto v = random_vector(static_cast<size_t>(rows * classes), 81);
  const std::vector<float> z(v.begin(), v.end());
  const int32_t labels[] = {0, 4, 2, 3, 1, 1};
  const std::vector<int64_t> listed = {0, 2, 3, 5};
  std::vector<float> own(static_cast<size_t>(rows * classes)), share(own.size());
  const kernels::ConstMatrixView logits{z.data(), rows, classes, classes};
  const double own_loss = kernels::softmax_cross_entropy_cpu(logits, labels, listed.data(), 4,
                                                             kernels::MatrixView{own.data(), rows, classes, classes}, nullptr);
  const double share_loss = kernels::softmax_cross_entropy_cpu(
      logits, labels, listed.data(), 4, kernels::MatrixView{share.data(), rows, classes, classes}, nullptr, 10);
  EXPECT_EQ(share_loss, own_loss);
  for (size_t i = 0; i < own.size(); ++i) EXPECT_NEAR(share[i], own[i] * 0.4f, 1e-7f) << i;
  for (int64_t c = 0; c < classes; ++c) EXPECT_EQ(share[1 * classes + c], 0.0f);  // row 1 is not listed
}

// A step's seeds form: every logits row listed once, its label read through an id into the whole
// graph's labels; the same values as the listing form over the gathered labels, also through ops.
TEST(SoftmaxCrossEntropy, TheSeedsFormReadsLabelsThroughTheSeedsIds) {
  const int64_t rows = 4, classes = 5;
  const auto v = random_vector(static_cast<size_t>(rows * classes), 82);
  const std::vector<float> z(v.begin(), v.end());
  const std::vector<int32_t> all = {3, 0, 4, 2, 1, 1, 0, 2, 4};
  const std::vector<int64_t> ids = {7, 2, 2, 0};
  const int32_t gathered[] = {2, 4, 4, 3};
  const int64_t listed[] = {0, 1, 2, 3};
  const kernels::ConstMatrixView logits{z.data(), rows, classes, classes};
  std::vector<float> want(static_cast<size_t>(rows * classes)), got(want.size(), 9.0f);
  int64_t want_correct = 0, got_correct = -1;
  const double want_loss = kernels::softmax_cross_entropy_cpu(
      logits, gathered, listed, rows, kernels::MatrixView{want.data(), rows, classes, classes}, &want_correct, 7);
  const double got_loss = kernels::softmax_cross_entropy_seeds_cpu(
      logits, all.data(), ids.data(), kernels::MatrixView{got.data(), rows, classes, classes}, &got_correct, 7);
  EXPECT_EQ(got_loss, want_loss);
  EXPECT_EQ(got_correct, want_correct);
  EXPECT_EQ(got, want);

  Tensor grad = Tensor::zeros(rows, classes);
  Tensor results = Tensor::empty(32, 1, DType::kU8);
  ops::softmax_cross_entropy_seeds_async(Tensor::from_vector(z, rows, classes),
                                         Tensor::from_host(all.data(), 9, 1, DType::kI32, Device::cpu()),
                                         Tensor::from_host(ids.data(), rows, 1, DType::kI64, Device::cpu()), &grad,
                                         &results, 1, 7);
  double ops_loss = 0;
  int64_t ops_correct = -1;
  std::memcpy(&ops_loss, results.data<unsigned char>() + 16, 8);
  std::memcpy(&ops_correct, results.data<unsigned char>() + 24, 8);
  EXPECT_EQ(ops_loss, want_loss);
  EXPECT_EQ(ops_correct, want_correct);
  EXPECT_EQ(std::vector<float>(grad.f32(), grad.f32() + rows * classes), want);
}

// Rows not listed get a zero gradient even in a dirty buffer; huge logits stay finite; the
// gradient is the derivative of the returned loss.
TEST(SoftmaxCrossEntropy, GradientIsTheLossDerivativeAndUnlistedRowsAreZero) {
  const int64_t rows = 5, classes = 7;
  const auto v = random_vector(static_cast<size_t>(rows * classes), 80);
  std::vector<float> z(v.begin(), v.end());
  for (auto& t : z) t *= 4.0f;
  z[2 * classes + 3] = 1e4f;  // would overflow a naive exp
  const int32_t labels[] = {0, 6, 2, 3, 1};
  const std::vector<int64_t> listed = {1, 2, 4, 4};  // row 4 listed twice counts twice
  Tensor grad = Tensor::from_vector(std::vector<float>(rows * classes, 123.0f), rows, classes);
  int64_t correct = -1;
  const double loss = softmax_cross_entropy(Tensor::from_vector(z, rows, classes), labels, listed, &grad, &correct);
  ASSERT_TRUE(std::isfinite(loss));
  for (int64_t c = 0; c < classes; ++c) {
    EXPECT_EQ(grad.f32()[0 * classes + c], 0.0f);
    EXPECT_EQ(grad.f32()[3 * classes + c], 0.0f);
  }
  auto loss_at = [&](const std::vector<float>& logits) {
    return softmax_cross_entropy(Tensor::from_vector(logits, rows, classes), labels, listed, nullptr, nullptr);
  };
  for (int64_t i : {1 * classes + 0, 1 * classes + 6, 2 * classes + 2, 4 * classes + 1, 4 * classes + 5}) {
    auto up = z, down = z;
    up[i] += 1e-2f;
    down[i] -= 1e-2f;
    EXPECT_NEAR(grad.f32()[i], (loss_at(up) - loss_at(down)) / 2e-2, 1e-3) << i;
  }
  // Row 2's label is 2 but logit 3 dominates: loss 1e4 - z[2] over 4 listed rows, about 2500.
  EXPECT_NEAR(loss, 2500.0, 10.0);
}

TEST(Adam, StepMatchesTorchFormula) {
  Parameter p;
  p.name = "w";
  p.value = Tensor::from_vector({1.0f, -2.0f}, 1, 2);
  p.grad = Tensor::from_vector({0.5f, 0.25f}, 1, 2);
  Adam adam({&p}, 0.1f, 0.01f);
  adam.step();
  adam.step();
  // Two steps by hand, torch.optim.Adam with weight_decay=0.01.
  double w[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
  const double g0[2] = {0.5, 0.25};
  for (int t = 1; t <= 2; ++t) {
    for (int i = 0; i < 2; ++i) {
      const double g = g0[i] + 0.01 * w[i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.999, t));
      w[i] -= 0.1 * mh / (std::sqrt(vh) + 1e-8);
    }
  }
  EXPECT_NEAR(p.value.f32()[0], w[0], 1e-5);
  EXPECT_NEAR(p.value.f32()[1], w[1], 1e-5);
}

}  // namespace
}  // namespace gale::engine
