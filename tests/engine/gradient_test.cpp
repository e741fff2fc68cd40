// Every layer's backward against central finite differences of an independent float64
// reference forward, on small random graphs with empty rows and a hub, as blocks (more sources
// than destinations) and as full graphs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/graph.hpp"
#include "engine/layers/layers.hpp"
#include "engine/model.hpp"
#include "kernels/random.hpp"

namespace gale::engine {
namespace {

using Params = std::map<std::string, std::vector<double>>;

struct TestGraph {
  int64_t dst = 0, src = 0;
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  std::vector<int64_t> src_degree;  // full-graph in-degree of each source
  kernels::CsrView view() const { return {dst, src, indptr.data(), indices.data(), nullptr}; }
};

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
  auto norm = [&](int64_t j, bool as_dst) {
    const int64_t deg = (as_dst || j < g.dst) ? g.indptr[j + 1] - g.indptr[j] : g.src_degree[j];
    return 1.0 / std::sqrt(static_cast<double>(deg + 1));
  };
  std::vector<double> y(static_cast<size_t>(g.dst * out), 0.0);
  for (int64_t i = 0; i < g.dst; ++i) {
    const double di = norm(i, true);
    for (int64_t e = g.indptr[i]; e < g.indptr[i + 1]; ++e)
      for (int64_t c = 0; c < out; ++c) y[i * out + c] += di * norm(g.indices[e], false) * h[g.indices[e] * out + c];
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
      for (int64_t k = 0; k < in; ++k) mean[i * in + k] += x[g.indices[e] * in + k] / static_cast<double>(deg);
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
      for (int64_t k = 0; k < in; ++k) agg[i * in + k] += x[g.indices[e] * in + k];
  }
  auto z = matmul(agg, g.dst, in, p.at(pre + ".mlp.0.lin.weight"), out);
  add_bias(&z, p.at(pre + ".mlp.0.bias"));
  if (!two) return z;
  for (auto& v : z) v = v > 0 ? v : 0;
  auto y = matmul(z, g.dst, out, p.at(pre + ".mlp.2.weight"), out);
  add_bias(&y, p.at(pre + ".mlp.2.bias"));
  return y;
}

std::vector<double> gat_ref(const TestGraph& g, const std::vector<double>& x, const Params& p, int64_t in, int64_t heads,
                            int64_t f, const std::string& pre) {
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
        for (int64_t k = 0; k < f; ++k) y[i * hf + h * f + k] += s[t] / sum * z[srcs[t] * hf + h * f + k];
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

// Compares analytic gradients of L = <layer(x), R> with central differences of the reference.
void check_layer(Layer& layer, const TestGraph& g, const Reference& ref, uint64_t seed) {
  const int64_t in = layer.in_dim(), out = layer.out_dim();
  const GraphOperand op(g.view(), &g.src_degree);
  const std::vector<double> x = random_vector(static_cast<size_t>(g.src * in), seed + 1);
  const std::vector<double> r = random_vector(static_cast<size_t>(g.dst * out), seed + 2);
  Params params = read_params(layer);

  // The f32 layer agrees with the reference forward.
  Tensor xt = Tensor::from_vector(std::vector<float>(x.begin(), x.end()), g.src, in);
  for (Parameter* q : layer.parameters()) q->grad.fill(0.0f);
  const Tensor y = layer.forward(op, xt, ForwardContext{true, 7});
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
// orders of aggregation and transformation run.
struct Case {
  int64_t dst, src, in, out;
};
const Case kCases[] = {{9, 14, 5, 3}, {11, 11, 3, 6}};

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

// The whole model (dropout off): two layers with the activation between them. ELU, because it is
// smooth: with ReLU a hidden pre-activation within a step of zero makes finite differences
// meaningless (ReLU's own backward is checked exactly in the kernel tests).
TEST(Model, TwoLayerBackwardMatchesFiniteDifferences) {
  for (const std::string kind : {"gcn", "sage", "gin", "gat"}) {
    ModelConfig cfg;
    cfg.model = kind;
    cfg.in_dim = 4;
    cfg.hidden = 3;
    cfg.heads = 2;
    cfg.out_dim = 3;
    cfg.dropout = 0.0f;
    cfg.attn_dropout = 0.0f;
    cfg.activation = Activation::kElu;
    Model model(cfg, 5);
    const TestGraph g = random_graph(10, 10, 8);
    const GraphOperand op(g.view());
    const std::vector<const GraphOperand*> graphs = {&op, &op};
    const auto x = random_vector(40, 50);
    const auto r = random_vector(30, 51);
    auto loss = [&](const std::vector<double>& xv, Model& m) {
      const Tensor y = m.forward(graphs, Tensor::from_vector(std::vector<float>(xv.begin(), xv.end()), 10, 4), false, 0);
      double s = 0;
      for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(y.f32()[i]) * r[i];
      return s;
    };
    model.zero_grad();
    model.forward(graphs, Tensor::from_vector(std::vector<float>(x.begin(), x.end()), 10, 4), true, 0);
    model.backward(Tensor::from_vector(std::vector<float>(r.begin(), r.end()), 10, 3));
    // f32 forwards with a larger step: the check here is the chain through activations and layers.
    constexpr double kStep = 1e-3;
    for (Parameter* p : model.parameters()) {
      const auto grad = p->grad.to_vector();
      for (int64_t i = 0; i < p->value.numel(); i += 3) {
        const float keep = p->value.f32()[i];
        p->value.f32()[i] = keep + static_cast<float>(kStep);
        const double up = loss(x, model);
        p->value.f32()[i] = keep - static_cast<float>(kStep);
        const double down = loss(x, model);
        p->value.f32()[i] = keep;
        const double numeric = (up - down) / (2 * kStep);
        EXPECT_NEAR(grad[i], numeric, 2e-2 * std::max(1.0, std::abs(numeric))) << kind << " " << p->name << "[" << i << "]";
      }
    }
  }
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
