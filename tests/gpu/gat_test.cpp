// The CUDA GAT kernels (kernels/gat_cuda.cu) against their CPU twins on fresh random graphs: empty
// rows, a hub row with thousands of in-neighbours, more sources than destinations; heads 1/4/8
// (and ones that do not divide a warp), f 1/7/8/64, attention dropout 0 and 0.6. Every output is
// poisoned with NaN first, so an element a kernel forgets to write fails the comparison.
// Every test skips with a reason when no CUDA device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/fill.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/error.hpp"
#include "kernels/gat.hpp"
#include "kernels/random.hpp"
#include "kernels/spmm.hpp"
#include "tests/gpu/cuda_fixture.hpp"
#include "tests/gpu/expect_close.hpp"
#include "tests/gpu/random_inputs.hpp"

namespace gale::kernels {
namespace {

using cuda::DeviceBuffer;
using cuda::MemoryPool;
using cuda::Stream;
using gale::testing::expect_close;
using gale::testing::expect_close_to_sum;
using testing::uniform;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A destination-major CSR and its transpose (the CSC the backward pass walks).
struct Graph {
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  std::vector<int64_t> csc_indptr, csc_edge;
  std::vector<int32_t> csc_indices;

  int64_t nnz() const { return indptr.back(); }
  CsrView csr() const { return {rows, cols, indptr.data(), indices.data(), nullptr}; }
  CsrView csc() const { return {cols, rows, csc_indptr.data(), csc_indices.data(), nullptr}; }
};

void transpose(Graph* g) {
  g->csc_indptr.assign(static_cast<size_t>(g->cols + 1), 0);
  g->csc_indices.assign(g->indices.size(), 0);
  g->csc_edge.assign(g->indices.size(), 0);
  csr_transpose(g->csr(), g->csc_indptr.data(), g->csc_indices.data(), g->csc_edge.data());
}

// Every fifth row empty, row 7 a hub with `hub_degree` in-neighbours, the rest 1 to 11; sources
// drawn from all `cols` >= rows ids (a sampled block has more sources than destinations). Every
// other entry of the hub is source 3, so the transpose has a hub too. Hubs of more than
// kGatLongRow entries take the CUDA kernels' block-per-row path, the rest a warp per row.
Graph random_graph(uint64_t key, int64_t rows, int64_t cols, int64_t hub_degree) {
  Graph g;
  g.rows = rows;
  g.cols = cols;
  g.indptr.push_back(0);
  uint64_t counter = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t degree = r % 5 == 0 ? 0 : 1 + static_cast<int64_t>(random_below(key, counter++, 11));
    if (r == 7) degree = hub_degree;
    for (int64_t k = 0; k < degree; ++k) {
      const bool to_hub_source = r == 7 && k % 2 == 1 && cols > 3;
      g.indices.push_back(to_hub_source ? 3 : static_cast<int32_t>(random_below(key, counter++, static_cast<uint64_t>(cols))));
    }
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  transpose(&g);
  return g;
}

// One GAT attention problem: the graph, el / er / z / grad_out, and the CPU reference results.
struct Problem {
  Graph g;
  GatShape s;
  float p = 0.0f;
  uint64_t key = 0;
  int64_t z_ld = 0;  // >= heads * f; padding exercises the unaligned (scalar) paths
  std::vector<float> el, er, z, grad_out;
  // CPU results.
  std::vector<float> alpha, alpha_self, out, grad_z, grad_el, grad_er;
  // The scale of each gradient sum's rounding, however much its terms cancel: grad_z's sums over
  // their terms' absolute values (the backward of |grad_out|; the coefficients are not negative),
  // and bounds of grad_el's and grad_er's (below).
  std::vector<float> grad_z_magnitude, grad_el_magnitude, grad_er_magnitude;
  // The scale of each output sum's rounding: the same aggregation over |z| (alpha is not negative).
  std::vector<float> out_magnitude;

  int64_t width() const { return s.heads * s.f; }

  void run_cpu() {
    const int64_t H = s.heads, D = width();
    alpha.assign(static_cast<size_t>(g.nnz() * H), kNaN);
    alpha_self.assign(static_cast<size_t>(g.rows * H), kNaN);
    gat_softmax_cpu(g.csr(), s, el.data(), er.data(), alpha.data(), alpha_self.data());
    out.assign(static_cast<size_t>(g.rows * D), kNaN);
    gat_aggregate_cpu(g.csr(), s, alpha.data(), alpha_self.data(), p, key, {z.data(), g.cols, D, z_ld},
                      matrix(out.data(), g.rows, D));
    std::vector<float> abs_z(z.size());
    for (size_t i = 0; i < z.size(); ++i) abs_z[i] = std::fabs(z[i]);
    out_magnitude.assign(out.size(), kNaN);
    gat_aggregate_cpu(g.csr(), s, alpha.data(), alpha_self.data(), p, key, {abs_z.data(), g.cols, D, z_ld},
                      matrix(out_magnitude.data(), g.rows, D));
    grad_z.assign(static_cast<size_t>(g.cols * D), kNaN);
    grad_el.assign(static_cast<size_t>(g.cols * H), kNaN);
    grad_er.assign(static_cast<size_t>(g.rows * H), kNaN);
    gat_backward_cpu(g.csr(), g.csc(), g.csc_edge.data(), s, el.data(), er.data(), alpha.data(), alpha_self.data(),
                     p, key, {z.data(), g.cols, D, z_ld}, matrix(grad_out.data(), g.rows, D),
                     matrix(grad_z.data(), g.cols, D), grad_el.data(), grad_er.data());
    std::vector<float> abs_grad_out(grad_out.size()), unused_el(grad_el.size()), unused_er(grad_er.size());
    for (size_t i = 0; i < grad_out.size(); ++i) abs_grad_out[i] = std::fabs(grad_out[i]);
    grad_z_magnitude.assign(grad_z.size(), kNaN);
    gat_backward_cpu(g.csr(), g.csc(), g.csc_edge.data(), s, el.data(), er.data(), alpha.data(), alpha_self.data(),
                     p, key, {z.data(), g.cols, D, z_ld}, matrix(abs_grad_out.data(), g.rows, D),
                     matrix(grad_z_magnitude.data(), g.cols, D), unused_el.data(), unused_er.data());
    score_gradient_magnitudes();
  }

  // An entry's score gradient is alpha * (ga - w) (times LeakyReLU's slope, at most 1), with ga
  // the dot product of grad_out's and z's rows through dropout and w the row's alpha-weighted sum
  // of them; both may cancel. Its scale: alpha * (A + W), A = sum_k |grad_out_k z_k| / (1 - p) (every
  // entry kept, a bound) and W = the row's alpha-weighted sum of A. grad_er sums a row's, grad_el a
  // source's (its self loop included).
  void score_gradient_magnitudes() {
    const int64_t H = s.heads, F = s.f;
    const float keep_scale = 1.0f / (1.0f - p);
    grad_el_magnitude.assign(static_cast<size_t>(g.cols * H), 0.0f);
    grad_er_magnitude.assign(static_cast<size_t>(g.rows * H), 0.0f);
    auto a_of = [&](int64_t i, int64_t j, int64_t h) {
      float d = 0.0f;
      for (int64_t k = 0; k < F; ++k) d += std::fabs(grad_out[i * width() + h * F + k] * z[j * z_ld + h * F + k]);
      return d * keep_scale;
    };
    std::vector<float> a;  // a row's A per entry
    for (int64_t i = 0; i < g.rows; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t b = g.indptr[i], n = g.indptr[i + 1] - b;
        const float a_self = a_of(i, i, h);
        float w = alpha_self[i * H + h] * a_self;
        a.resize(static_cast<size_t>(n));
        for (int64_t k = 0; k < n; ++k) {
          a[k] = a_of(i, g.indices[b + k], h);
          w += alpha[(b + k) * H + h] * a[k];
        }
        const float t_self = alpha_self[i * H + h] * (a_self + w);
        grad_er_magnitude[i * H + h] += t_self;
        grad_el_magnitude[i * H + h] += t_self;
        for (int64_t k = 0; k < n; ++k) {
          const float t = alpha[(b + k) * H + h] * (a[k] + w);
          grad_er_magnitude[i * H + h] += t;
          grad_el_magnitude[g.indices[b + k] * H + h] += t;
        }
      }
  }
};

Problem make_problem(uint64_t key, Graph g, int64_t heads, int64_t f, float p, int64_t z_pad = 0) {
  Problem pr;
  pr.g = std::move(g);
  pr.s = GatShape{heads, f, 0.2f};
  pr.p = p;
  pr.key = derive_key(key, 100);
  pr.z_ld = heads * f + z_pad;
  const size_t H = static_cast<size_t>(heads), D = static_cast<size_t>(heads * f);
  pr.el = uniform(derive_key(key, 1), static_cast<size_t>(pr.g.cols) * H, -2.0f, 2.0f);
  pr.er = uniform(derive_key(key, 2), static_cast<size_t>(pr.g.rows) * H, -2.0f, 2.0f);
  pr.z = uniform(derive_key(key, 3), static_cast<size_t>(pr.g.cols * pr.z_ld), -1.0f, 1.0f);
  pr.grad_out = uniform(derive_key(key, 4), static_cast<size_t>(pr.g.rows) * D, -1.0f, 1.0f);
  pr.run_cpu();
  return pr;
}

class GatCudaTest : public gale::testing::CudaFixture<> {
 protected:
  // The problem's inputs on the device.
  struct Device {
    DeviceBuffer<int64_t> indptr, csc_indptr, csc_edge;
    DeviceBuffer<int32_t> indices, csc_indices;
    DeviceBuffer<float> el, er, z, grad_out;
    CsrView csr, csc;
  };

  Device to_device(const Problem& pr) {
    Device d;
    d.indptr = upload(pr.g.indptr);
    d.indices = upload(pr.g.indices);
    d.csc_indptr = upload(pr.g.csc_indptr);
    d.csc_indices = upload(pr.g.csc_indices);
    d.csc_edge = upload(pr.g.csc_edge);
    d.el = upload(pr.el);
    d.er = upload(pr.er);
    d.z = upload(pr.z);
    d.grad_out = upload(pr.grad_out);
    d.csr = {pr.g.rows, pr.g.cols, d.indptr.data(), d.indices.data(), nullptr};
    d.csc = {pr.g.cols, pr.g.rows, d.csc_indptr.data(), d.csc_indices.data(), nullptr};
    return d;
  }

  // gat_softmax_cuda, gat_aggregate_cuda (fed the CPU's alpha, so it is tested on its own) and
  // gat_forward_cuda, each against the CPU.
  void check_forward(const Problem& pr) {
    const int64_t H = pr.s.heads, D = pr.width(), E = pr.g.nnz();
    Device d = to_device(pr);
    const ConstMatrixView z{d.z.data(), pr.g.cols, D, pr.z_ld};

    DeviceBuffer<float> alpha = poisoned(E * H), alpha_self = poisoned(pr.g.rows * H);
    gat_softmax_cuda(d.csr, pr.s, d.el.data(), d.er.data(), alpha.data(), alpha_self.data(), *stream_);
    expect_close(download(alpha), pr.alpha, 1e-4f, "softmax alpha");
    expect_close(download(alpha_self), pr.alpha_self, 1e-4f, "softmax alpha_self");

    DeviceBuffer<float> cpu_alpha = upload(pr.alpha), cpu_alpha_self = upload(pr.alpha_self);
    DeviceBuffer<float> out = poisoned(pr.g.rows * D);
    gat_aggregate_cuda(d.csr, pr.s, cpu_alpha.data(), cpu_alpha_self.data(), pr.p, pr.key, z,
                       {out.data(), pr.g.rows, D, D}, *stream_);
    expect_close_to_sum(download(out), pr.out, pr.out_magnitude, 1e-4f, "aggregate out");

    DeviceBuffer<float> f_alpha = poisoned(E * H), f_alpha_self = poisoned(pr.g.rows * H);
    DeviceBuffer<float> f_out = poisoned(pr.g.rows * D);
    gat_forward_cuda(d.csr, pr.s, d.el.data(), d.er.data(), pr.p, pr.key, z, f_alpha.data(), f_alpha_self.data(),
                     {f_out.data(), pr.g.rows, D, D}, *stream_);
    expect_close(download(f_alpha), pr.alpha, 1e-4f, "fused alpha");
    expect_close(download(f_alpha_self), pr.alpha_self, 1e-4f, "fused alpha_self");
    expect_close_to_sum(download(f_out), pr.out, pr.out_magnitude, 1e-4f, "fused out");
  }

  // gat_backward_cuda against the CPU, fed the CPU's alpha; the workspace comes from the pool and
  // is poisoned too.
  void check_backward(const Problem& pr) {
    const int64_t H = pr.s.heads, D = pr.width(), E = pr.g.nnz();
    Device d = to_device(pr);
    DeviceBuffer<float> alpha = upload(pr.alpha), alpha_self = upload(pr.alpha_self);
    DeviceBuffer<float> grad_z = poisoned(pr.g.cols * D), grad_el = poisoned(pr.g.cols * H);
    DeviceBuffer<float> grad_er = poisoned(pr.g.rows * H);
    const size_t ws_bytes = gat_backward_workspace_bytes(E, pr.g.rows, pr.s);
    DeviceBuffer<float> workspace = poisoned(ws_bytes / sizeof(float));
    gat_backward_cuda(d.csr, d.csc, d.csc_edge.data(), pr.s, d.el.data(), d.er.data(), alpha.data(),
                      alpha_self.data(), pr.p, pr.key, {d.z.data(), pr.g.cols, D, pr.z_ld},
                      {d.grad_out.data(), pr.g.rows, D, D}, {grad_z.data(), pr.g.cols, D, D}, grad_el.data(),
                      grad_er.data(), workspace.data(), ws_bytes, *stream_);
    expect_close_to_sum(download(grad_z), pr.grad_z, pr.grad_z_magnitude, 1e-3f, "grad_z");
    expect_close_to_sum(download(grad_el), pr.grad_el, pr.grad_el_magnitude, 1e-3f, "grad_el");
    expect_close_to_sum(download(grad_er), pr.grad_er, pr.grad_er_magnitude, 1e-3f, "grad_er");
  }
};

// (heads, f, attention dropout)
class GatCudaMatchesCpu : public GatCudaTest, public ::testing::WithParamInterface<std::tuple<int, int, float>> {
 protected:
  Problem problem() {
    const auto [heads, f, p] = GetParam();
    const uint64_t key = std::random_device{}();
    trace_ = "random key " + std::to_string(key);
    // 400 destinations, 1000 sources, hub of 3000 in-neighbours.
    return make_problem(key, random_graph(derive_key(key, 0), 400, 1000, 3000), heads, f, p);
  }
  std::string trace_;
};

TEST_P(GatCudaMatchesCpu, SoftmaxAggregateAndFusedForward) {
  const Problem pr = problem();
  SCOPED_TRACE(trace_);
  check_forward(pr);
}

TEST_P(GatCudaMatchesCpu, Backward) {
  const Problem pr = problem();
  SCOPED_TRACE(trace_);
  check_backward(pr);
}

INSTANTIATE_TEST_SUITE_P(HeadsFeaturesDropout, GatCudaMatchesCpu,
                         ::testing::Combine(::testing::Values(1, 4, 8), ::testing::Values(1, 7, 8, 64),
                                            ::testing::Values(0.0f, 0.6f)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int, float>>& info) {
                           std::ostringstream name;
                           name << "h" << std::get<0>(info.param) << "_f" << std::get<1>(info.param) << "_p"
                                << static_cast<int>(std::get<2>(info.param) * 10);
                           return name.str();
                         });

// Heads that do not divide a warp (one head per sweep), more than 32 heads (fewer entries staged
// per chunk), and a padded z whose rows are not 16-byte aligned (scalar loads).
TEST_F(GatCudaTest, HeadsThatDoNotDivideAWarpAndPaddedRows) {
  const uint64_t key = std::random_device{}();
  SCOPED_TRACE("random key " + std::to_string(key));
  const Problem three = make_problem(key, random_graph(derive_key(key, 0), 200, 500, 2000), 3, 5, 0.6f, 1);
  check_forward(three);
  check_backward(three);
  const Problem many = make_problem(key + 1, random_graph(derive_key(key, 1), 100, 300, 1500), 40, 4, 0.6f, 1);
  check_forward(many);
  check_backward(many);
  const Problem wide = make_problem(key + 2, random_graph(derive_key(key, 2), 100, 300, 1200), 2, 300, 0.6f, 4);
  check_forward(wide);  // 600 floats per row: several 128-vector tiles
  check_backward(wide);
}

// With one-hot z rows (z[j, h, :] = e_j) out[i, h, j] is the dropped-out coefficient of entry
// (i, j), so the zero pattern of out is the dropout mask: it must equal the CPU's exactly. Rows of
// ~38 entries (a warp each) and, with 1500 sources at density 0.4, of ~600 (a block each).
class GatCudaDropout : public GatCudaTest, public ::testing::WithParamInterface<std::tuple<int, float>> {};

TEST_P(GatCudaDropout, MasksMatchTheCpuBitForBit) {
  const uint64_t key = std::random_device{}();
  SCOPED_TRACE("random key " + std::to_string(key));
  const int64_t kRows = 100, kCols = std::get<0>(GetParam()), kHeads = 4;  // self loops need rows <= cols
  const float density = std::get<1>(GetParam());
  Graph g;
  g.rows = kRows;
  g.cols = kCols;
  g.indptr.push_back(0);
  uint64_t counter = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    // Distinct sources other than r itself, so every (row, source) holds one coefficient.
    for (int64_t j = 0; j < kCols; ++j) {
      if (j != r && random_uniform(key, counter++) < density) g.indices.push_back(static_cast<int32_t>(j));
    }
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  transpose(&g);
  Problem pr = make_problem(key, std::move(g), kHeads, kCols, 0.6f);
  std::fill(pr.z.begin(), pr.z.end(), 0.0f);
  for (int64_t j = 0; j < kCols; ++j) {
    for (int64_t h = 0; h < kHeads; ++h) pr.z[static_cast<size_t>(j * pr.z_ld + h * kCols + j)] = 1.0f;
  }
  pr.run_cpu();
  check_forward(pr);

  Device d = to_device(pr);
  DeviceBuffer<float> alpha = upload(pr.alpha), alpha_self = upload(pr.alpha_self);
  DeviceBuffer<float> out = poisoned(kRows * kHeads * kCols);
  gat_aggregate_cuda(d.csr, pr.s, alpha.data(), alpha_self.data(), pr.p, pr.key,
                     {d.z.data(), kCols, kHeads * kCols, pr.z_ld}, {out.data(), kRows, kHeads * kCols, kHeads * kCols},
                     *stream_);
  // The fused forward (a block per long row) must drop the same entries.
  DeviceBuffer<float> f_alpha = poisoned(pr.g.nnz() * kHeads), f_alpha_self = poisoned(kRows * kHeads);
  DeviceBuffer<float> f_out = poisoned(kRows * kHeads * kCols);
  gat_forward_cuda(d.csr, pr.s, d.el.data(), d.er.data(), pr.p, pr.key, {d.z.data(), kCols, kHeads * kCols, pr.z_ld},
                   f_alpha.data(), f_alpha_self.data(), {f_out.data(), kRows, kHeads * kCols, kHeads * kCols},
                   *stream_);
  for (const std::vector<float>& gpu : {download(out), download(f_out)}) {
    size_t dropped = 0, differ = 0;
    for (size_t i = 0; i < gpu.size(); ++i) {
      dropped += pr.out[i] == 0.0f;
      differ += (gpu[i] == 0.0f) != (pr.out[i] == 0.0f);
    }
    EXPECT_EQ(differ, 0u);
    EXPECT_GT(dropped, gpu.size() / 2);  // p = 0.6 over a row of at most 40% of the sources: most positions are 0
  }
}

INSTANTIATE_TEST_SUITE_P(WarpAndBlockRows, GatCudaDropout,
                         ::testing::Values(std::make_tuple(128, 0.3f), std::make_tuple(1500, 0.4f)),
                         [](const ::testing::TestParamInfo<std::tuple<int, float>>& info) {
                           return "sources" + std::to_string(std::get<0>(info.param));
                         });

// A block with no destinations: every source's gradients are zero and nothing reads the (empty)
// destination arrays.
TEST_F(GatCudaTest, NoDestinationsGiveZeroSourceGradients) {
  const uint64_t key = std::random_device{}();
  SCOPED_TRACE("random key " + std::to_string(key));
  const Problem pr = make_problem(key, random_graph(key, 0, 50, 0), 4, 8, 0.6f);
  check_forward(pr);
  check_backward(pr);
  for (float v : pr.grad_z) ASSERT_EQ(v, 0.0f);
}

TEST_F(GatCudaTest, TooManyHeadsOrASmallWorkspaceIsAnInputError) {
  const GatShape wide{kGatCudaMaxHeads + 1, 1, 0.2f};
  EXPECT_THROW(gat_softmax_cuda({}, wide, nullptr, nullptr, nullptr, nullptr, *stream_), InputError);
  const Graph g = random_graph(1, 10, 10, 5);
  Device d = to_device(make_problem(1, g, 2, 2, 0.0f));
  const GatShape s{2, 2, 0.2f};
  DeviceBuffer<float> small(*pool_, 4, *stream_);
  EXPECT_THROW(gat_backward_cuda(d.csr, d.csc, nullptr, s, nullptr, nullptr, nullptr, nullptr, 0.0f, 0, {}, {}, {},
                                 nullptr, nullptr, small.data(), small.bytes(), *stream_),
               InputError);
}

// gat_scores_cuda / gat_scores_backward_cuda (cuBLAS strided GEMVs and rank-1 updates) against the
// CPU twins: heads 1, 3, 8, f 1, 7, 64, padded z rows, fewer score rows than z rows.
TEST_F(GatCudaTest, ScoresAndTheirBackwardMatchTheCpu) {
  cuda::CublasHandle blas(*stream_, *pool_);
  for (const auto& [heads, f] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {8, 64}, {4, 16}}) {
    for (int64_t pad : {0, 3}) {
      const uint64_t key = std::random_device{}();
      SCOPED_TRACE("heads " + std::to_string(heads) + " f " + std::to_string(f) + " pad " + std::to_string(pad) +
                   " key " + std::to_string(key));
      const GatShape s{heads, f, 0.2f};
      const int64_t rows = 517, score_rows = 301, ld = heads * f + pad;
      const std::vector<float> z = uniform(derive_key(key, 1), static_cast<size_t>(rows * ld), -1.0f, 1.0f);
      const std::vector<float> att = uniform(derive_key(key, 2), static_cast<size_t>(heads * f), -1.0f, 1.0f);
      const std::vector<float> gs = uniform(derive_key(key, 3), static_cast<size_t>(score_rows * heads), -1.0f, 1.0f);
      std::vector<float> gz = uniform(derive_key(key, 4), static_cast<size_t>(rows * ld), -1.0f, 1.0f);
      std::vector<float> gatt = uniform(derive_key(key, 5), static_cast<size_t>(heads * f), -1.0f, 1.0f);
      DeviceBuffer<float> z_d = upload(z), att_d = upload(att), gs_d = upload(gs), gz_d = upload(gz), gatt_d = upload(gatt);
      DeviceBuffer<float> scores_d = poisoned(static_cast<size_t>(score_rows * heads));
      std::vector<float> scores(static_cast<size_t>(score_rows * heads), kNaN);
      const ConstMatrixView zv{z.data(), rows, heads * f, ld};
      const ConstMatrixView zdv{z_d.data(), rows, heads * f, ld};
      gat_scores_cpu(zv, s, att.data(), score_rows, scores.data());
      gat_scores_cuda(blas, zdv, s, att_d.data(), score_rows, scores_d.data());
      gat_scores_backward_cpu(zv, s, att.data(), score_rows, gs.data(), {gz.data(), rows, heads * f, ld}, gatt.data());
      gat_scores_backward_cuda(blas, zdv, s, att_d.data(), score_rows, gs_d.data(), {gz_d.data(), rows, heads * f, ld},
                               gatt_d.data());
      auto expect_close = [](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-4 * (1.0 + std::abs(want[i]))) << what << " at " << i;
      };
      expect_close(download(scores_d), scores, "scores");
      expect_close(download(gz_d), gz, "grad_z");  // padding untouched on both sides
      expect_close(download(gatt_d), gatt, "grad_att");
    }
  }
}

}  // namespace
}  // namespace gale::kernels
