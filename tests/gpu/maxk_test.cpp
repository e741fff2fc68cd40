// The CUDA MaxK family (kernels/maxk.cu) against its CPU references on fresh random inputs:
// graphs with every fifth row empty, hub rows of thousands of entries (dozens of edge groups,
// merged inside a work item and across work items by atomics), rows of 20-119 and of 100-299
// entries (on both sides of the SpGEMM's split between rows summed whole by one sub-warp and rows
// accumulated over their edge groups, at 128 entries), more sources than destinations; every
// degree from 0 to 300 with edge-group tables of group sizes 5, 64 and 1000; widths 1, 7, 32,
// 100, 256, 257, 1024 (one- and two-byte indices, widths that are not multiples of 32 or 4) and
// the largest, 4096 (shared memory above 48 KiB); k in {1, 8, 16, 32, width} (k not a multiple
// of 4 takes SSpMM's one-column path); padded leading dimensions; every combination of row scale,
// column scale, edge weight, self term and bias. Outputs are poisoned with NaN first, so an
// element a kernel forgets to write fails. Top-k, the scatters and the edge-group table must match
// exactly; the aggregations (atomics reorder their sums) to 1e-5 of the sum of the magnitudes of
// each element's terms. Tests skip with a reason when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/fill.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/dense.hpp"
#include "kernels/error.hpp"
#include "kernels/maxk.hpp"
#include "kernels/random.hpp"
#include "tests/common/aggregation_options.hpp"
#include "tests/gpu/cuda_fixture.hpp"
#include "tests/gpu/random_inputs.hpp"

namespace gale::kernels {
namespace {

using cuda::DeviceBuffer;
using cuda::MemoryPool;
using cuda::Stream;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kWidths[] = {1, 7, 32, 100, 256, 257, 1024};

// k values to try at a width: {1, 8, 16, 32, width}, those not above it.
std::vector<int64_t> ks_for(int64_t width) {
  std::vector<int64_t> ks;
  for (int64_t k : {int64_t{1}, int64_t{8}, int64_t{16}, int64_t{32}, width})
    if (k <= width && std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(k);
  return ks;
}

using testing::Graph;
using testing::random_graph;
using testing::uniform;

// Half the rows drawn from {-2, -1, -0, +0, 1, 2} (ties everywhere), one row all zeros, two rows
// whose first 32 (row 3) or 16 (row 9) columns hold the row's maximum (ties across every lane of
// the top-k warp, or half of them), the rest uniform in [-1, 1]; row stride ld.
std::vector<float> activations(uint64_t key, int64_t rows, int64_t width, int64_t ld) {
  static const float kChoices[] = {-2.0f, -1.0f, -0.0f, 0.0f, 1.0f, 2.0f};
  std::vector<float> x = uniform(key, static_cast<size_t>(rows * ld), -1.0f, 1.0f);
  for (int64_t r = 0; r < rows; r += 2)
    for (int64_t c = 0; c < width; ++c)
      x[r * ld + c] = kChoices[random_below(derive_key(key, 1), static_cast<uint64_t>(r * ld + c), 6)];
  if (rows > 5)
    for (int64_t c = 0; c < width; ++c) x[5 * ld + c] = 0.0f;
  if (rows > 9) {
    for (int64_t c = 0; c < std::min<int64_t>(width, 32); ++c) x[3 * ld + c] = 2.5f;
    for (int64_t c = 0; c < std::min<int64_t>(width, 16); ++c) x[9 * ld + c] = 2.5f;
  }
  return x;
}

// A host CBSR matrix that owns its arrays.
struct Cbsr {
  int64_t rows = 0, width = 0, k = 0;
  std::vector<float> values;
  std::vector<uint8_t> index;
  Cbsr(int64_t r, int64_t w, int64_t kk)
      : rows(r), width(w), k(kk), values(static_cast<size_t>(r * kk), kNaN),
        index(static_cast<size_t>(cbsr_index_size_bytes(r, w, kk)), 0xee) {}
  CbsrView view() { return {rows, width, k, values.data(), index.data()}; }
  ConstCbsrView cview() const { return {rows, width, k, values.data(), index.data()}; }
};

Cbsr random_cbsr(uint64_t key, int64_t rows, int64_t width, int64_t k) {
  const auto x = activations(key, rows, width, width);
  Cbsr c(rows, width, k);
  maxk_forward_cpu(matrix(x.data(), rows, width), c.view());
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// |gpu - cpu| <= rel * magnitude, where magnitude is the same computation over the absolute
// values of every input: the sum of the magnitudes of the element's terms, which bounds what
// reordering a float sum can change. NaN on the GPU side always fails.
void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::vector<float>& magnitude,
                  float rel, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const bool ok = !std::isnan(gpu[i]) && std::fabs(gpu[i] - cpu[i]) <= rel * magnitude[i] + 1e-30f;
    if (!ok && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << gpu.size() << " differ; first at " << first << ": gpu "
                     << (bad ? gpu[first] : 0.0f) << " cpu " << (bad ? cpu[first] : 0.0f) << " magnitude "
                     << (bad ? magnitude[first] : 0.0f);
}

std::vector<float> absolute(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// Which optional inputs a case sets (SSpMM ignores the bias bit).
using Options = gale::testing::AggregationOptions;

// Host-side optional inputs of one case.
struct Inputs {
  std::vector<float> row_scale, col_scale, weight, self_coefs, bias;
  Inputs(const Graph& g, int64_t width, uint64_t key)
      : row_scale(uniform(derive_key(key, 1), static_cast<size_t>(g.rows), 0.1f, 1.0f)),
        col_scale(uniform(derive_key(key, 2), static_cast<size_t>(g.cols), -1.0f, 1.0f)),
        weight(uniform(derive_key(key, 3), static_cast<size_t>(g.nnz()), -1.0f, 1.0f)),
        self_coefs(uniform(derive_key(key, 4), static_cast<size_t>(g.rows), -1.0f, 1.0f)),
        bias(uniform(derive_key(key, 5), static_cast<size_t>(width), -1.0f, 1.0f)) {}
  Inputs absolute_values() const {
    Inputs a = *this;
    a.row_scale = absolute(row_scale);
    a.col_scale = absolute(col_scale);
    a.weight = absolute(weight);
    a.self_coefs = absolute(self_coefs);
    a.bias = absolute(bias);
    return a;
  }
};

class MaxkCudaTest : public gale::testing::CudaFixture<> {
 protected:
  // The graph's edge groups in device memory: built on the GPU (count on the device, capacity the
  // bound) when `on_gpu`, else the CPU table uploaded (count null). Checks the GPU table against
  // the CPU one on the way.
  struct DeviceGroups {
    DeviceBuffer<EdgeGroup> groups;
    DeviceBuffer<int64_t> count;
    EdgeGroupsView view;
  };
  DeviceGroups groups_for(const Graph& g, const DeviceBuffer<int64_t>& indptr, const DeviceBuffer<int32_t>& indices,
                          bool on_gpu, int64_t group_size = kMaxkEdgeGroupSize) {
    DeviceGroups d;
    const std::vector<EdgeGroup> cpu = edge_groups_cpu(g.csr(), group_size);
    if (!on_gpu) {
      d.groups = upload(cpu);
      d.view = {d.groups.data(), static_cast<int64_t>(cpu.size()), nullptr};
      return d;
    }
    const int64_t capacity = edge_groups_capacity(g.rows, g.nnz(), group_size);
    d.groups = DeviceBuffer<EdgeGroup>(*pool_, static_cast<size_t>(capacity), *stream_);
    d.count = DeviceBuffer<int64_t>(*pool_, 1, *stream_);
    const size_t bytes = edge_groups_workspace_bytes(g.rows);
    DeviceBuffer<uint8_t> workspace(*pool_, bytes, *stream_);
    const CsrView dg{g.rows, g.cols, indptr.data(), indices.data(), nullptr};
    edge_groups_cuda(dg, group_size, d.groups.data(), capacity, d.count.data(), workspace.data(), bytes, *stream_);
    const int64_t count = download(d.count)[0];
    EXPECT_EQ(count, static_cast<int64_t>(cpu.size()));
    std::vector<EdgeGroup> gpu = download(d.groups, static_cast<size_t>(std::clamp<int64_t>(count, 0, capacity)));
    EXPECT_EQ(gpu.size(), cpu.size());
    for (size_t i = 0; i < std::min(gpu.size(), cpu.size()); ++i) {
      EXPECT_TRUE(gpu[i].start == cpu[i].start && gpu[i].row == cpu[i].row && gpu[i].count == cpu[i].count)
          << "group " << i;
    }
    d.view = {d.groups.data(), capacity, d.count.data()};
    return d;
  }

  // maxk_forward_cuda against maxk_forward_cpu: same values bit for bit, same index bytes.
  void check_top_k(int64_t rows, int64_t width, int64_t k, int64_t pad, uint64_t key) {
    check_top_k(rows, width, k, width + pad, activations(key, rows, width, width + pad));
  }

  void check_top_k(int64_t rows, int64_t width, int64_t k, int64_t ld, const std::vector<float>& x) {
    const int64_t pad = ld - width;
    Cbsr cpu(rows, width, k);
    maxk_forward_cpu(ConstMatrixView{x.data(), rows, width, ld}, cpu.view());
    auto d_x = upload(x);
    auto d_values = poisoned(cpu.values.size());
    DeviceBuffer<uint8_t> d_index(*pool_, cpu.index.size(), *stream_);
    cuda::fill(d_index.data(), cpu.index.size(), uint8_t{0xee}, *stream_);
    const CbsrView out{rows, width, k, d_values.data(), d_index.data()};
    maxk_forward_cuda(ConstMatrixView{d_x.data(), rows, width, ld}, out, *stream_);
    const std::string what = "top-k width " + std::to_string(width) + " k " + std::to_string(k) + " pad " +
                             std::to_string(pad);
    EXPECT_TRUE(download(d_index) == cpu.index) << what << ": indices differ";
    EXPECT_TRUE(same_bits(download(d_values), cpu.values)) << what << ": values differ";
    // Again with the dense form written over x itself (the model's in-place use): the same CBSR,
    // and x's rows become cbsr_to_dense of it, the padding untouched.
    std::vector<float> want = x;
    std::vector<float> dense(static_cast<size_t>(rows * width));
    cbsr_to_dense_cpu(cpu.cview(), matrix(dense.data(), rows, width));
    for (int64_t r = 0; r < rows; ++r) std::copy_n(dense.begin() + r * width, width, want.begin() + r * ld);
    auto d_values2 = poisoned(cpu.values.size());
    cuda::fill(d_index.data(), cpu.index.size(), uint8_t{0xee}, *stream_);
    maxk_forward_cuda(ConstMatrixView{d_x.data(), rows, width, ld}, CbsrView{rows, width, k, d_values2.data(), d_index.data()},
                      *stream_, MatrixView{d_x.data(), rows, width, ld});
    EXPECT_TRUE(same_bits(download(d_values2), cpu.values)) << what << ": values differ (in place)";
    EXPECT_TRUE(download(d_index) == cpu.index) << what << ": indices differ (in place)";
    EXPECT_TRUE(same_bits(download(d_x), want)) << what << ": the dense form differs";
  }

  // spgemm_cbsr_cuda against spgemm_cbsr_cpu.
  void check_spgemm(const Graph& g, int64_t width, int64_t k, const Options& o, uint64_t key, int64_t pad,
                    bool groups_on_gpu, int64_t group_size = kMaxkEdgeGroupSize) {
    const int64_t ld = width + pad;
    const Cbsr x = random_cbsr(derive_key(key, 20), g.cols, width, k);
    const Inputs in(g, width, derive_key(key, 21));
    const auto run_cpu = [&](const Inputs& v, const Cbsr& xs, float self_scale) {
      std::vector<float> out(static_cast<size_t>(g.rows * ld), kNaN);
      SpgemmCbsrArgs a;
      a.graph = g.csr();
      a.x = xs.cview();
      a.out = MatrixView{out.data(), g.rows, width, ld};
      a.row_scale = o.row_scale ? v.row_scale.data() : nullptr;
      a.col_scale = o.col_scale ? v.col_scale.data() : nullptr;
      a.edge_weight = o.edge_weight ? v.weight.data() : nullptr;
      a.self_coefs = (o.self & 2) ? v.self_coefs.data() : nullptr;
      a.self_scale = self_scale;
      a.bias = o.bias ? v.bias.data() : nullptr;
      spgemm_cbsr_cpu(a);
      return out;
    };
    const float self_scale = (o.self & 1) ? -1.25f : 0.0f;
    const auto cpu = run_cpu(in, x, self_scale);
    Cbsr x_abs = x;
    x_abs.values = absolute(x.values);
    const auto magnitude = run_cpu(in.absolute_values(), x_abs, std::fabs(self_scale));

    auto d_indptr = upload(g.indptr);
    auto d_indices = upload(g.indices);
    auto d_values = upload(x.values);
    auto d_index = upload(x.index);
    auto d_row_scale = upload(in.row_scale);
    auto d_col_scale = upload(in.col_scale);
    auto d_weight = upload(in.weight);
    auto d_self = upload(in.self_coefs);
    auto d_bias = upload(in.bias);
    auto d_out = poisoned(static_cast<size_t>(g.rows * ld));
    DeviceGroups groups = groups_for(g, d_indptr, d_indices, groups_on_gpu, group_size);
    SpgemmCbsrArgs a;
    a.graph = {g.rows, g.cols, d_indptr.data(), d_indices.data(), nullptr};
    a.x = ConstCbsrView{x.rows, width, k, d_values.data(), d_index.data()};
    a.out = MatrixView{d_out.data(), g.rows, width, ld};
    a.row_scale = o.row_scale ? d_row_scale.data() : nullptr;
    a.col_scale = o.col_scale ? d_col_scale.data() : nullptr;
    a.edge_weight = o.edge_weight ? d_weight.data() : nullptr;
    a.self_coefs = (o.self & 2) ? d_self.data() : nullptr;
    a.self_scale = self_scale;
    a.bias = o.bias ? d_bias.data() : nullptr;
    spgemm_cbsr_cuda(a, groups.view, *stream_);
    const auto gpu = download(d_out);
    // Padding columns are written by neither side: compare the matrix proper.
    std::vector<float> gpu_m, cpu_m, mag_m;
    for (int64_t r = 0; r < g.rows; ++r) {
      gpu_m.insert(gpu_m.end(), gpu.begin() + r * ld, gpu.begin() + r * ld + width);
      cpu_m.insert(cpu_m.end(), cpu.begin() + r * ld, cpu.begin() + r * ld + width);
      mag_m.insert(mag_m.end(), magnitude.begin() + r * ld, magnitude.begin() + r * ld + width);
    }
    expect_close(gpu_m, cpu_m, mag_m, 1e-5f,
                 "spgemm width " + std::to_string(width) + " k " + std::to_string(k) + " pad " + std::to_string(pad) +
                     (groups_on_gpu ? " gpu groups " : " cpu groups ") + "of " + std::to_string(group_size) + " " +
                     o.describe());
  }

  // A hub plan built on the device, checked against sspmm_hubs_cpu (ids and mask exactly).
  struct DeviceHubs {
    DeviceBuffer<int32_t> ids;
    DeviceBuffer<uint32_t> mask;
    SspmmHubsView view;
    int planted = 0;  // real hubs in the plan (ids other than kSspmmNoHub)
  };
  DeviceHubs hubs_for(const Graph& g, const DeviceBuffer<int64_t>& indptr, const DeviceBuffer<int32_t>& indices,
                      int capacity, int64_t min_entries) {
    DeviceHubs d;
    const SspmmHubs cpu = sspmm_hubs_cpu(g.csr(), capacity, min_entries);
    d.ids = DeviceBuffer<int32_t>(*pool_, static_cast<size_t>(capacity), *stream_);
    d.mask = DeviceBuffer<uint32_t>(*pool_, std::max<size_t>(cpu.entry_mask.size(), 1), *stream_);
    const size_t bytes = sspmm_hubs_workspace_bytes(g.cols);
    DeviceBuffer<uint8_t> workspace(*pool_, bytes, *stream_);
    const CsrView dg{g.rows, g.cols, indptr.data(), indices.data(), nullptr};
    sspmm_hubs_cuda(dg, capacity, min_entries, d.ids.data(), d.mask.data(), g.nnz(), workspace.data(), bytes, *stream_);
    EXPECT_TRUE(download(d.ids) == cpu.ids) << "hub ids, capacity " << capacity << " min " << min_entries;
    std::vector<uint32_t> mask = download(d.mask);
    mask.resize(cpu.entry_mask.size());
    EXPECT_TRUE(mask == cpu.entry_mask) << "hub mask, capacity " << capacity << " min " << min_entries;
    d.planted = static_cast<int>(std::count_if(cpu.ids.begin(), cpu.ids.end(), [](int32_t v) { return v != kSspmmNoHub; }));
    d.view = {d.ids.data(), d.mask.data(), capacity};
    return d;
  }

  // sspmm_cbsr_cuda against sspmm_cbsr_cpu; the pattern has `extra` rows past the graph's sources.
  // hub_min > 0: with a hub plan of the sources of at least hub_min entries (hub_capacity of them,
  // or sspmm_hub_capacity(k) when 0); returns how many hubs it had.
  int check_sspmm(const Graph& g, int64_t width, int64_t k, const Options& o, uint64_t key, int64_t pad,
                  bool groups_on_gpu, int64_t extra = 3, int64_t group_size = kMaxkEdgeGroupSize, int64_t hub_min = 0,
                  int hub_capacity = 0) {
    const int64_t ld = width + pad;
    const int64_t prow = g.cols + extra;
    const Cbsr pattern = random_cbsr(derive_key(key, 30), prow, width, k);
    const Inputs in(g, width, derive_key(key, 31));
    const auto grad = uniform(derive_key(key, 32), static_cast<size_t>(g.rows * ld), -1.0f, 1.0f);
    const float self_scale = (o.self & 1) ? 0.75f : 0.0f;
    const auto run_cpu = [&](const Inputs& v, const std::vector<float>& gr, float s) {
      std::vector<float> gv(static_cast<size_t>(prow * k), kNaN);
      SspmmCbsrArgs a;
      a.graph = g.csr();
      a.grad_out = ConstMatrixView{gr.data(), g.rows, width, ld};
      a.pattern = pattern.cview();
      a.grad_values = gv.data();
      a.row_scale = o.row_scale ? v.row_scale.data() : nullptr;
      a.col_scale = o.col_scale ? v.col_scale.data() : nullptr;
      a.edge_weight = o.edge_weight ? v.weight.data() : nullptr;
      a.self_coefs = (o.self & 2) ? v.self_coefs.data() : nullptr;
      a.self_scale = s;
      sspmm_cbsr_cpu(a);
      return gv;
    };
    const auto cpu = run_cpu(in, grad, self_scale);
    const auto magnitude = run_cpu(in.absolute_values(), absolute(grad), std::fabs(self_scale));

    auto d_indptr = upload(g.indptr);
    auto d_indices = upload(g.indices);
    auto d_index = upload(pattern.index);
    auto d_grad = upload(grad);
    auto d_row_scale = upload(in.row_scale);
    auto d_col_scale = upload(in.col_scale);
    auto d_weight = upload(in.weight);
    auto d_self = upload(in.self_coefs);
    auto d_gv = poisoned(cpu.size());
    DeviceGroups groups = groups_for(g, d_indptr, d_indices, groups_on_gpu, group_size);
    SspmmCbsrArgs a;
    a.graph = {g.rows, g.cols, d_indptr.data(), d_indices.data(), nullptr};
    a.grad_out = ConstMatrixView{d_grad.data(), g.rows, width, ld};
    a.pattern = ConstCbsrView{prow, width, k, nullptr, d_index.data()};
    a.grad_values = d_gv.data();
    a.row_scale = o.row_scale ? d_row_scale.data() : nullptr;
    a.col_scale = o.col_scale ? d_col_scale.data() : nullptr;
    a.edge_weight = o.edge_weight ? d_weight.data() : nullptr;
    a.self_coefs = (o.self & 2) ? d_self.data() : nullptr;
    a.self_scale = self_scale;
    DeviceHubs hubs;
    if (hub_min > 0) {
      hubs = hubs_for(g, d_indptr, d_indices, hub_capacity > 0 ? hub_capacity : sspmm_hub_capacity(k), hub_min);
      a.hubs = hubs.view;
    }
    sspmm_cbsr_cuda(a, groups.view, *stream_);
    expect_close(download(d_gv), cpu, magnitude, 1e-5f,
                 "sspmm width " + std::to_string(width) + " k " + std::to_string(k) + " pad " + std::to_string(pad) +
                     (groups_on_gpu ? " gpu groups " : " cpu groups ") + "of " + std::to_string(group_size) + " " +
                     (hub_min > 0 ? std::to_string(hubs.planted) + " hubs " : "") + o.describe());
    return hubs.planted;
  }
};

TEST_F(MaxkCudaTest, TopKMatchesCpuExactlyAtEveryWidthAndK) {
  std::vector<int64_t> widths(std::begin(kWidths), std::end(kWidths));
  widths.insert(widths.end(), {128, 384, 512});  // the blocked kernel's 4 / 8 / 16 per lane, and 12 (not blocked)
  for (int64_t width : widths) {
    for (int64_t k : ks_for(width)) {
      check_top_k(301, width, k, 0, derive_key(1, static_cast<uint64_t>(width * 10000 + k)));
      check_top_k(67, width, k, 3, derive_key(2, static_cast<uint64_t>(width * 10000 + k)));
    }
  }
}

TEST_F(MaxkCudaTest, TopKMatchesCpuAtTheWidestRows) {
  for (int64_t width : {int64_t{1500}, int64_t{2048}, kMaxkCudaMaxWidth}) {
    for (int64_t k : {int64_t{1}, int64_t{32}, int64_t{777}, width}) check_top_k(40, width, k, 1, derive_key(3, width + k));
  }
}

// Rows whose values lie within a few dozen ulps of one float (some rows all negative, some with
// repeats): the select must resolve the lowest mantissa bits, after it has narrowed the keys in
// question to a few, and break ties among them by column.
TEST_F(MaxkCudaTest, TopKMatchesCpuWhenValuesDifferInTheLastBits) {
  for (int64_t width : {int64_t{32}, int64_t{100}, int64_t{128}, int64_t{256}, int64_t{512}, int64_t{1024}}) {
    const int64_t rows = 64, ld = width % 128 == 0 ? width : width + 1;  // the blocked kernel takes aligned rows
    const uint64_t key = derive_key(7, static_cast<uint64_t>(width));
    std::vector<float> x(static_cast<size_t>(rows * ld), kNaN);
    for (int64_t r = 0; r < rows; ++r) {
      const float base = (r % 3 == 0 ? -1.0f : 1.0f) * (0.5f + static_cast<float>(random_below(key, r, 1000)) / 1000.0f);
      const uint64_t spread = r % 4 == 1 ? 8 : 100;  // few distinct values: long runs of ties
      for (int64_t c = 0; c < width; ++c) {
        const uint32_t step = static_cast<uint32_t>(random_below(derive_key(key, 1), static_cast<uint64_t>(r * ld + c), spread));
        uint32_t bits;
        std::memcpy(&bits, &base, sizeof bits);
        bits += step;
        std::memcpy(&x[static_cast<size_t>(r * ld + c)], &bits, sizeof bits);
      }
    }
    for (int64_t k : {int64_t{1}, int64_t{16}, int64_t{32}, std::min<int64_t>(width, 33), width - 1, width}) {
      if (k >= 1) check_top_k(rows, width, k, ld, x);
    }
  }
}

TEST_F(MaxkCudaTest, BackwardAndToDenseMatchCpuExactly) {
  for (int64_t width : kWidths) {
    const int64_t rows = 97, k = std::min<int64_t>(width, 16), ld = width + 2;
    const Cbsr pattern = random_cbsr(derive_key(4, width), rows, width, k);
    const auto dense = uniform(derive_key(5, width), static_cast<size_t>(rows * ld), -1.0f, 1.0f);
    const auto sparse = uniform(derive_key(6, width), static_cast<size_t>(rows * k), -1.0f, 1.0f);
    auto d_values = upload(pattern.values);
    auto d_index = upload(pattern.index);
    auto d_dense = upload(dense);
    auto d_sparse = upload(sparse);
    const ConstCbsrView d_pattern{rows, width, k, d_values.data(), d_index.data()};
    for (int use = 0; use < 4; ++use) {
      const bool use_dense = use & 1, use_sparse = use & 2;
      std::vector<float> cpu(static_cast<size_t>(rows * ld), kNaN);
      maxk_backward_cpu(pattern.cview(), use_sparse ? sparse.data() : nullptr,
                        use_dense ? ConstMatrixView{dense.data(), rows, width, ld} : ConstMatrixView{},
                        MatrixView{cpu.data(), rows, width, ld});
      auto d_out = poisoned(cpu.size());
      maxk_backward_cuda(d_pattern, use_sparse ? d_sparse.data() : nullptr,
                         use_dense ? ConstMatrixView{d_dense.data(), rows, width, ld} : ConstMatrixView{},
                         MatrixView{d_out.data(), rows, width, ld}, *stream_);
      // Padding stays NaN on both sides, which memcmp compares like any other bits.
      EXPECT_TRUE(same_bits(download(d_out), cpu)) << "backward width " << width << " use " << use;
    }
    std::vector<float> cpu(static_cast<size_t>(rows * width), kNaN);
    cbsr_to_dense_cpu(pattern.cview(), matrix(cpu.data(), rows, width));
    auto d_out = poisoned(cpu.size());
    cbsr_to_dense_cuda(d_pattern, matrix(d_out.data(), rows, width), *stream_);
    EXPECT_TRUE(same_bits(download(d_out), cpu)) << "to dense width " << width;
    // Into a column block of wider rows (a layer's side-by-side operand): the rest stays NaN.
    const int64_t wide = width + 7, offset = 3;
    std::vector<float> cpu_block(static_cast<size_t>(rows * wide), kNaN);
    cbsr_to_dense_cpu(pattern.cview(), MatrixView{cpu_block.data() + offset, rows, width, wide});
    auto d_block = poisoned(cpu_block.size());
    cbsr_to_dense_cuda(d_pattern, MatrixView{d_block.data() + offset, rows, width, wide}, *stream_);
    EXPECT_TRUE(same_bits(download(d_block), cpu_block)) << "to dense block width " << width;
  }
}

// The column sums the backward kernels make of the gradient they write (kernels/maxk.hpp: per-warp
// rows, then column_sum_cuda over them) against the CPU's column sums of the CPU's gradient, with
// the gradient itself unchanged by asking for them; enough rows that every warp of the capped grid
// takes several.
TEST_F(MaxkCudaTest, BackwardColumnSumsMatchCpu) {
  const int64_t rows = 40009;
  const auto sums_of = [&](DeviceBuffer<float>& partial, int64_t sum_rows, int64_t width) {
    auto d_sums = poisoned(static_cast<size_t>(width));
    const size_t bytes = column_sum_workspace_bytes(sum_rows, width);
    DeviceBuffer<unsigned char> ws(*pool_, bytes, *stream_);
    column_sum_cuda(ConstMatrixView{partial.data(), sum_rows, width, width}, d_sums.data(), false, ws.data(), bytes,
                    *stream_);
    return download(d_sums);
  };
  const auto cpu_sums = [](const std::vector<float>& m, int64_t width, std::vector<float>* mag) {
    std::vector<float> sums(static_cast<size_t>(width));
    column_sum(ConstMatrixView{m.data(), static_cast<int64_t>(m.size()) / width, width, width}, sums.data(), false);
    const auto am = absolute(m);
    mag->assign(static_cast<size_t>(width), 0.0f);
    column_sum(ConstMatrixView{am.data(), static_cast<int64_t>(am.size()) / width, width, width}, mag->data(), false);
    return sums;
  };
  for (int64_t width : {int64_t{7}, int64_t{100}, int64_t{256}, kMaxkSumWidth}) {
    const int64_t k = std::min<int64_t>(width, 32);
    const Cbsr pattern = random_cbsr(derive_key(41, width), rows, width, k);
    const auto dense = uniform(derive_key(42, width), static_cast<size_t>(rows * width), -1.0f, 1.0f);
    const auto sparse = uniform(derive_key(43, width), static_cast<size_t>(rows * k), -1.0f, 1.0f);
    std::vector<float> cpu(static_cast<size_t>(rows * width));
    maxk_backward_cpu(pattern.cview(), sparse.data(), matrix(dense.data(), rows, width), matrix(cpu.data(), rows, width));
    auto d_values = upload(pattern.values);
    auto d_index = upload(pattern.index);
    auto d_dense = upload(dense);
    auto d_sparse = upload(sparse);
    const ConstCbsrView d_pattern{rows, width, k, d_values.data(), d_index.data()};
    const int64_t sum_rows = maxk_backward_sum_rows(rows);
    auto partial = poisoned(static_cast<size_t>(sum_rows * width));
    auto d_out = poisoned(cpu.size());
    maxk_backward_cuda(d_pattern, d_sparse.data(), matrix(d_dense.data(), rows, width),
                       matrix(d_out.data(), rows, width), *stream_, partial.data());
    EXPECT_TRUE(same_bits(download(d_out), cpu)) << "maxk_backward with sums, width " << width;
    std::vector<float> mag;
    const auto want = cpu_sums(cpu, width, &mag);
    expect_close(sums_of(partial, sum_rows, width), want, mag, 1e-5f, "maxk_backward sums width " + std::to_string(width));
  }
  // cbsr_gemm_grad: SAGE's last layer (256 wide, the 96-column pair) and two terms at width 100.
  for (const auto& [width, n, terms] : {std::tuple<int64_t, int64_t, int>{256, 96, 1}, {100, 47, 2}}) {
    const int64_t k = 32;
    const Cbsr x = random_cbsr(derive_key(44, width), rows, width, k);
    const auto g0 = uniform(derive_key(45, width), static_cast<size_t>(rows * n), -1.0f, 1.0f);
    const auto w0 = uniform(derive_key(46, width), static_cast<size_t>(width * n), -1.0f, 1.0f);
    const auto w1 = uniform(derive_key(47, width), static_cast<size_t>(width * n), -1.0f, 1.0f);
    CbsrGemmGradArgs a;
    a.pattern = x.cview();
    a.terms = terms;
    a.grad[0] = a.grad[1] = matrix(g0.data(), rows, n);
    a.w[0] = matrix(w0.data(), width, n);
    a.w[1] = matrix(w1.data(), width, n);
    std::vector<float> cpu(static_cast<size_t>(rows * width));
    a.grad_in = matrix(cpu.data(), rows, width);
    cbsr_gemm_grad_cpu(a);
    auto d_values = upload(x.values);
    auto d_index = upload(x.index);
    auto d_g0 = upload(g0), d_w0 = upload(w0), d_w1 = upload(w1);
    CbsrGemmGradArgs d = a;
    d.pattern = ConstCbsrView{rows, width, k, d_values.data(), d_index.data()};
    d.grad[0].data = d.grad[1].data = d_g0.data();
    d.w[0].data = d_w0.data();
    d.w[1].data = d_w1.data();
    ASSERT_EQ(cbsr_gemm_grad_sums_cannot(d), "") << "width " << width << ", n " << n;
    const int64_t sum_rows = cbsr_gemm_grad_sum_rows(rows);
    auto partial = poisoned(static_cast<size_t>(sum_rows * width));
    d.column_partial = partial.data();
    auto d_out = poisoned(cpu.size());
    d.grad_in = matrix(d_out.data(), rows, width);
    cbsr_gemm_grad_cuda(d, *stream_);
    const auto got = download(d_out);
    std::vector<float> mag;
    const auto want = cpu_sums(cpu, width, &mag);
    // The gradient to the CPU's rounding (fused multiply-adds), its sums to those of the GPU's own
    // gradient and, looser, to the CPU's.
    std::vector<float> got_mag;
    const auto got_want = cpu_sums(got, width, &got_mag);
    const auto got_sums = sums_of(partial, sum_rows, width);
    expect_close(got_sums, got_want, got_mag, 1e-5f, "cbsr_gemm_grad sums width " + std::to_string(width));
    expect_close(got_sums, want, mag, 1e-4f, "cbsr_gemm_grad sums against the CPU, width " + std::to_string(width));
  }
}

// The dense layer on a CBSR input (cbsr_gemm) and its input gradient at the kept positions
// (cbsr_gemm_grad, one and two terms, the second with fewer rows), at every width and k the
// kernels take, output widths 1 to 128, beta 0 and 1.
TEST_F(MaxkCudaTest, DenseLayerOnCbsrAndItsGradientMatchCpu) {
  uint64_t key = 700;
  int grad_cases = 0;
  for (int64_t width : {int64_t{1}, int64_t{7}, int64_t{100}, int64_t{256}, int64_t{257}}) {
    for (int64_t k : ks_for(width)) {
      const int64_t rows = 3001;
      const Cbsr x = random_cbsr(++key, rows, width, k);
      auto d_values = upload(x.values);
      auto d_index = upload(x.index);
      const ConstCbsrView d_x{rows, width, k, d_values.data(), d_index.data()};
      for (int64_t n : {int64_t{1}, int64_t{47}, int64_t{100}, int64_t{128}}) {
        SCOPED_TRACE("width " + std::to_string(width) + ", k " + std::to_string(k) + ", n " + std::to_string(n));
        ASSERT_EQ(cbsr_gemm_cuda_cannot(width, n, 1), "");
        const auto w = uniform(++key, static_cast<size_t>(width * n), -1.0f, 1.0f);
        auto d_w = upload(w);
        for (float beta : {0.0f, 1.0f}) {
          const auto before = uniform(++key, static_cast<size_t>(rows * n), -1.0f, 1.0f);
          std::vector<float> cpu = before, mag = absolute(before);
          cbsr_gemm_cpu({x.cview(), matrix(w.data(), width, n), beta, matrix(cpu.data(), rows, n)});
          Cbsr ax = x;
          ax.values = absolute(ax.values);
          const auto aw = absolute(w);
          cbsr_gemm_cpu({ax.cview(), matrix(aw.data(), width, n), beta, matrix(mag.data(), rows, n)});
          auto d_out = beta == 0.0f ? poisoned(cpu.size()) : upload(before);
          cbsr_gemm_cuda({d_x, matrix(d_w.data(), width, n), beta, matrix(d_out.data(), rows, n)}, *stream_);
          expect_close(download(d_out), cpu, mag, 1e-5f, "cbsr_gemm beta " + std::to_string(beta));
          // With a second product on the leading rows (a SAGE layer's root term): one pass while
          // both fit a row's lanes, two otherwise; the first product is unchanged either way.
          const int64_t n2 = n == 1 ? 5 : 47, rows2 = rows / 3;
          const auto w2 = uniform(++key, static_cast<size_t>(width * n2), -1.0f, 1.0f);
          const auto before2 = uniform(++key, static_cast<size_t>(rows2 * n2), -1.0f, 1.0f);
          std::vector<float> cpu2 = before2, mag2 = absolute(before2);
          ConstCbsrView lead = x.cview(), alead = ax.cview();
          lead.rows = alead.rows = rows2;
          cbsr_gemm_cpu({lead, matrix(w2.data(), width, n2), beta, matrix(cpu2.data(), rows2, n2)});
          const auto aw2 = absolute(w2);
          cbsr_gemm_cpu({alead, matrix(aw2.data(), width, n2), beta, matrix(mag2.data(), rows2, n2)});
          auto d_w2 = upload(w2);
          auto d_both = beta == 0.0f ? poisoned(cpu.size()) : upload(before);
          auto d_out2 = beta == 0.0f ? poisoned(cpu2.size()) : upload(before2);
          CbsrGemmArgs two{d_x, matrix(d_w.data(), width, n), beta, matrix(d_both.data(), rows, n)};
          two.w2 = matrix(d_w2.data(), width, n2);
          two.out2 = matrix(d_out2.data(), rows2, n2);
          cbsr_gemm_cuda(two, *stream_);
          expect_close(download(d_both), cpu, mag, 1e-5f, "cbsr_gemm with W2, out, beta " + std::to_string(beta));
          expect_close(download(d_out2), cpu2, mag2, 1e-5f, "cbsr_gemm with W2, out2, beta " + std::to_string(beta));
        }
        for (int terms : {1, 2}) {
          if (!cbsr_gemm_cuda_cannot(width, n, terms).empty()) {  // two W's of 100+ columns at width 256
            EXPECT_GE(width * n, 100 * 100);
            continue;
          }
          ++grad_cases;
          const int64_t n2 = 3, rows2 = rows / 2;
          const auto g0 = uniform(++key, static_cast<size_t>(rows * n), -1.0f, 1.0f);
          const auto g1 = uniform(++key, static_cast<size_t>(rows2 * n2), -1.0f, 1.0f);
          const auto w1 = uniform(++key, static_cast<size_t>(width * n2), -1.0f, 1.0f);
          CbsrGemmGradArgs a;
          a.pattern = x.cview();
          a.terms = terms;
          a.grad[0] = matrix(g0.data(), rows, n);
          a.w[0] = matrix(w.data(), width, n);
          a.grad[1] = matrix(g1.data(), rows2, n2);
          a.w[1] = matrix(w1.data(), width, n2);
          std::vector<float> cpu(static_cast<size_t>(rows * width), kNaN), mag = cpu;
          a.grad_in = matrix(cpu.data(), rows, width);
          cbsr_gemm_grad_cpu(a);
          const auto ag0 = absolute(g0), ag1 = absolute(g1), aw0 = absolute(w), aw1 = absolute(w1);
          CbsrGemmGradArgs m = a;
          m.grad[0].data = ag0.data();
          m.grad[1].data = ag1.data();
          m.w[0].data = aw0.data();
          m.w[1].data = aw1.data();
          m.grad_in = matrix(mag.data(), rows, width);
          cbsr_gemm_grad_cpu(m);
          auto d_g0 = upload(g0), d_g1 = upload(g1), d_w1 = upload(w1);
          auto d_out = poisoned(cpu.size());
          CbsrGemmGradArgs d = a;
          d.pattern = d_x;
          d.grad[0].data = d_g0.data();
          d.grad[1].data = d_g1.data();
          d.w[0].data = d_w.data();
          d.w[1].data = d_w1.data();
          d.grad_in = matrix(d_out.data(), rows, width);
          cbsr_gemm_grad_cuda(d, *stream_);
          expect_close(download(d_out), cpu, mag, 1e-5f, "cbsr_gemm_grad terms " + std::to_string(terms));
        }
      }
    }
  }
  EXPECT_GE(grad_cases, 40);
  EXPECT_EQ(cbsr_gemm_cuda_cannot(256, 47, 2), "");    // a SAGE layer from hidden 256 to 47 classes
  EXPECT_NE(cbsr_gemm_cuda_cannot(256, 129, 1), "");   // more than 128 output columns
  EXPECT_NE(cbsr_gemm_cuda_cannot(1024, 128, 2), "");  // W does not fit in shared memory
}

TEST_F(MaxkCudaTest, EdgeGroupsBuiltOnGpuMatchCpu) {
  for (int64_t size : {int64_t{5}, kMaxkEdgeGroupSize}) {
    const Graph g = random_graph(7, 3000, 3500, 5000);
    auto d_indptr = upload(g.indptr);
    auto d_indices = upload(g.indices);
    groups_for(g, d_indptr, d_indices, true, size);  // compares inside
  }
  const Graph empty = random_graph(8, 10, 10, 0);  // rows 0 and 5 empty, the rest 1-11 entries
  auto d_indptr = upload(empty.indptr);
  auto d_indices = upload(empty.indices);
  groups_for(empty, d_indptr, d_indices, true);
}

// Every width and k with a rotating quarter of the option combinations; small enough to run under
// compute-sanitizer.
TEST_F(MaxkCudaTest, SmallAggregationsMatchCpuAtEveryWidthAndK) {
  const Graph g = random_graph(11, 300, 350, 1500);
  int n = 0;
  for (int64_t width : kWidths) {
    for (int64_t k : ks_for(width)) {
      for (int combo = n % 16; combo < Options::kCombos; combo += 16) {
        const uint64_t key = derive_key(12, static_cast<uint64_t>(width * 100000 + k * 100 + combo));
        const Options o = Options::from(combo);
        const int64_t pad = combo % 3 == 0 ? 1 : 0;  // pad 1: the scalar flush at widths divisible by 4
        check_spgemm(g, width, k, o, key, pad, combo % 2 == 0);
        check_sspmm(g, width, k, o, key, pad, combo % 2 == 1);
      }
      ++n;
    }
  }
}

TEST_F(MaxkCudaTest, AllOptionCombinationsMatchCpu) {
  const Graph g = random_graph(21, 500, 700, 2500);
  for (int64_t width : {int64_t{100}, int64_t{256}}) {
    for (int64_t k : {int64_t{8}, int64_t{32}}) {
      for (int combo = 0; combo < Options::kCombos; ++combo) {
        const uint64_t key = derive_key(22, static_cast<uint64_t>(width * 100000 + k * 100 + combo));
        check_spgemm(g, width, k, Options::from(combo), key, 0, true);
        check_sspmm(g, width, k, Options::from(combo), key, 0, true);
      }
    }
  }
}

// Many blocks; hub rows span several blocks and merge across them by atomics.
TEST_F(MaxkCudaTest, LargeGraphWithHubsMatchesCpu) {
  const Graph g = random_graph(31, 20000, 25000, 6000);
  for (int64_t width : {int64_t{64}, int64_t{257}}) {
    for (int64_t k : {int64_t{4}, int64_t{16}, int64_t{48}}) {
      const uint64_t key = derive_key(32, static_cast<uint64_t>(width * 100 + k));
      check_spgemm(g, width, k, Options::from(1 + 2 + 4 + 8 + 32), key, 0, true);
      check_sspmm(g, width, k, Options::from(1 + 2 + 4 + 16), key, 0, true);
    }
  }
}

// Every degree from 0 to 300 once (shuffled), around SpGEMM's split between rows summed whole and
// rows accumulated over their edge groups, with tables of small, default and large group sizes (a
// group size above a row's degree makes a long row a single group; a small one cuts short rows).
TEST_F(MaxkCudaTest, EveryDegreeAndGroupSizeMatchesCpu) {
  Graph g;
  g.rows = 301;
  g.cols = 420;
  std::vector<int64_t> degrees(static_cast<size_t>(g.rows));
  for (int64_t r = 0; r < g.rows; ++r) degrees[static_cast<size_t>(r)] = r;
  for (int64_t r = g.rows - 1; r > 0; --r)
    std::swap(degrees[static_cast<size_t>(r)], degrees[random_below(71, static_cast<uint64_t>(r), static_cast<uint64_t>(r + 1))]);
  g.indptr.push_back(0);
  uint64_t counter = 0;
  for (int64_t r = 0; r < g.rows; ++r) {
    for (int64_t e = 0; e < degrees[static_cast<size_t>(r)]; ++e)
      g.indices.push_back(static_cast<int32_t>(random_below(72, counter++, static_cast<uint64_t>(g.cols))));
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  int n = 0;
  for (int64_t group_size : {int64_t{5}, kMaxkEdgeGroupSize, int64_t{1000}}) {
    for (int64_t width : {int64_t{64}, int64_t{257}}) {
      for (int64_t k : {int64_t{6}, int64_t{16}, int64_t{48}}) {
        const uint64_t key = derive_key(73, static_cast<uint64_t>(group_size * 1000000 + width * 1000 + k));
        const int combo = (n++ * 7) % Options::kCombos;
        check_spgemm(g, width, k, Options::from(combo), key, 0, n % 2 == 0, group_size);
        check_sspmm(g, width, k, Options::from(combo), key, 0, n % 2 == 1, 3, group_size);
      }
    }
  }
}

// SSpMM with a hub plan: 40 planted sources take a third of the entries (about 1500 each), so
// the plan holds them when its capacity allows, its top 5 by count when capacity is 5, and every
// source with at least 1 entry competes when min_entries is 1 (capacity binds). The plan built on
// the device must equal the CPU's, and the sums must match the CPU reference as without a plan;
// widths 32 and 257 (float4 and scalar rows), k 7 (the one-column path), 8, 32 and 48.
TEST_F(MaxkCudaTest, SspmmWithAHubPlanMatchesCpu) {
  Graph g = random_graph(61, 4000, 3000, 2500);
  for (size_t e = 0; e < g.indices.size(); ++e)
    if (random_uniform(62, e) < 0.34)
      g.indices[e] = static_cast<int32_t>(75 * random_below(63, e, 40));  // sources 0, 75, ..., 2925
  int n = 0;
  for (int64_t width : {int64_t{32}, int64_t{257}}) {
    for (int64_t k : {int64_t{7}, int64_t{8}, int64_t{32}, int64_t{48}}) {
      if (k > width) continue;
      const uint64_t key = derive_key(64, static_cast<uint64_t>(width * 100 + k));
      const Options o = Options::from((n++ * 5) % Options::kCombos);
      EXPECT_EQ(check_sspmm(g, width, k, o, key, 0, true, 3, kMaxkEdgeGroupSize, 500), 40);
      EXPECT_EQ(check_sspmm(g, width, k, o, derive_key(key, 1), 1, false, 3, kMaxkEdgeGroupSize, 500, 5), 5);
      EXPECT_EQ(check_sspmm(g, width, k, o, derive_key(key, 2), 0, true, 0, kMaxkEdgeGroupSize, 1),
                std::min(sspmm_hub_capacity(k), static_cast<int>(g.cols)));
    }
  }
  // No source has enough entries: an empty plan (all kSspmmNoHub), and the sums as without one.
  const Graph plain = random_graph(65, 300, 350, 1500);
  EXPECT_EQ(check_sspmm(plain, 64, 16, Options::from(3), 66, 0, true, 3, kMaxkEdgeGroupSize, 100000), 0);
}

TEST_F(MaxkCudaTest, SspmmRefusesAHubPlanItCannotHold) {
  const Graph g = random_graph(67, 50, 60, 100);
  auto d_indptr = upload(g.indptr);
  auto d_indices = upload(g.indices);
  DeviceBuffer<int32_t> ids(*pool_, 1024, *stream_);
  DeviceBuffer<uint32_t> mask(*pool_, 64, *stream_);
  DeviceBuffer<float> grad(*pool_, static_cast<size_t>(g.rows * 64), *stream_);
  DeviceBuffer<uint8_t> index(*pool_, static_cast<size_t>(g.cols * 32), *stream_);
  DeviceBuffer<float> gv(*pool_, static_cast<size_t>(g.cols * 32), *stream_);
  SspmmCbsrArgs a;
  a.graph = {g.rows, g.cols, d_indptr.data(), d_indices.data(), nullptr};
  a.grad_out = ConstMatrixView{grad.data(), g.rows, 64, 64};
  a.pattern = ConstCbsrView{g.cols, 64, 32, nullptr, index.data()};
  a.grad_values = gv.data();
  a.hubs = {ids.data(), mask.data(), sspmm_hub_capacity(32) + 1};
  EXPECT_THROW(sspmm_cbsr_cuda(a, EdgeGroupsView{}, *stream_), InputError);
  a.hubs = {nullptr, mask.data(), 4};
  EXPECT_THROW(sspmm_cbsr_cuda(a, EdgeGroupsView{}, *stream_), InputError);
  const CsrView dg{g.rows, g.cols, d_indptr.data(), d_indices.data(), nullptr};
  EXPECT_THROW(sspmm_hubs_cuda(dg, 0, 1, ids.data(), mask.data(), g.nnz(), nullptr, 0, *stream_), InputError);
  EXPECT_THROW(sspmm_hubs_cuda(dg, 8, 1, ids.data(), mask.data(), g.nnz(), nullptr, 0, *stream_), InputError);  // no workspace
}

// The widest rows take 64 KiB of slot buffers per block: above the default limit.
TEST_F(MaxkCudaTest, WidestRowsMatchCpu) {
  const Graph g = random_graph(41, 120, 150, 700);
  for (int64_t k : {int64_t{3}, int64_t{100}, kMaxkCudaMaxWidth}) {
    const uint64_t key = derive_key(42, static_cast<uint64_t>(k));
    check_spgemm(g, kMaxkCudaMaxWidth, k, Options::from(1 + 4 + 8 + 32), key, 0, false);
    check_sspmm(g, kMaxkCudaMaxWidth, k, Options::from(2 + 4 + 24), key, 0, true);
  }
}

// top-k, SpGEMM, SSpMM and the backward scatter chained on the device as a layer runs them.
TEST_F(MaxkCudaTest, ChainedLayerPassMatchesCpu) {
  const Graph g = random_graph(51, 400, 500, 1200);
  const int64_t width = 256, k = 32;
  const auto h = activations(52, g.cols, width, width);
  const auto grad = uniform(53, static_cast<size_t>(g.rows * width), -1.0f, 1.0f);
  // CPU.
  Cbsr x(g.cols, width, k);
  maxk_forward_cpu(matrix(h.data(), g.cols, width), x.view());
  std::vector<float> out(static_cast<size_t>(g.rows * width)), gv(static_cast<size_t>(g.cols * k)),
      dh(static_cast<size_t>(g.cols * width));
  SpgemmCbsrArgs f;
  f.graph = g.csr();
  f.x = x.cview();
  f.out = matrix(out.data(), g.rows, width);
  f.self_scale = 1.0f;
  spgemm_cbsr_cpu(f);
  SspmmCbsrArgs b;
  b.graph = g.csr();
  b.grad_out = matrix(grad.data(), g.rows, width);
  b.pattern = x.cview();
  b.grad_values = gv.data();
  b.self_scale = 1.0f;
  sspmm_cbsr_cpu(b);
  maxk_backward_cpu(x.cview(), gv.data(), ConstMatrixView{}, matrix(dh.data(), g.cols, width));
  // GPU.
  auto d_indptr = upload(g.indptr);
  auto d_indices = upload(g.indices);
  auto d_h = upload(h);
  auto d_grad = upload(grad);
  auto d_values = poisoned(x.values.size());
  DeviceBuffer<uint8_t> d_index(*pool_, x.index.size(), *stream_);
  auto d_out = poisoned(out.size());
  auto d_gv = poisoned(gv.size());
  auto d_dh = poisoned(dh.size());
  DeviceGroups groups = groups_for(g, d_indptr, d_indices, true);
  const CbsrView dx{g.cols, width, k, d_values.data(), d_index.data()};
  maxk_forward_cuda(matrix(d_h.data(), g.cols, width), dx, *stream_);
  SpgemmCbsrArgs df = f;
  df.graph = {g.rows, g.cols, d_indptr.data(), d_indices.data(), nullptr};
  df.x = dx;
  df.out = matrix(d_out.data(), g.rows, width);
  spgemm_cbsr_cuda(df, groups.view, *stream_);
  SspmmCbsrArgs db = b;
  db.graph = df.graph;
  db.grad_out = matrix(d_grad.data(), g.rows, width);
  db.pattern = dx;
  db.grad_values = d_gv.data();
  sspmm_cbsr_cuda(db, groups.view, *stream_);
  maxk_backward_cuda(dx, d_gv.data(), ConstMatrixView{}, matrix(d_dh.data(), g.cols, width), *stream_);
  EXPECT_TRUE(download(d_index) == x.index);
  EXPECT_TRUE(same_bits(download(d_values), x.values));
  // Magnitudes: the same CPU chain over absolute values.
  Cbsr x_abs = x;
  x_abs.values = absolute(x.values);
  const auto grad_abs = absolute(grad);
  std::vector<float> out_mag(out.size()), gv_mag(gv.size()), dh_mag(dh.size());
  f.x = x_abs.cview();
  f.out = matrix(out_mag.data(), g.rows, width);
  spgemm_cbsr_cpu(f);
  b.grad_out = matrix(grad_abs.data(), g.rows, width);
  b.grad_values = gv_mag.data();
  sspmm_cbsr_cpu(b);
  maxk_backward_cpu(x.cview(), gv_mag.data(), ConstMatrixView{}, matrix(dh_mag.data(), g.cols, width));
  expect_close(download(d_out), out, out_mag, 1e-5f, "chained spgemm");
  expect_close(download(d_gv), gv, gv_mag, 1e-5f, "chained sspmm");
  expect_close(download(d_dh), dh, dh_mag, 1e-5f, "chained backward");
}

TEST_F(MaxkCudaTest, SmallEmptyShapesDoNothingWrong) {
  const Graph no_rows = random_graph(61, 0, 10, 0);
  check_spgemm(no_rows, 8, 2, Options::from(32), 62, 0, false);
  check_sspmm(no_rows, 8, 2, Options::from(8), 62, 0, false);
  Graph no_edges;
  no_edges.rows = 6;
  no_edges.cols = 9;
  no_edges.indptr.assign(7, 0);
  check_spgemm(no_edges, 8, 2, Options::from(8 + 32), 63, 0, true);
  check_sspmm(no_edges, 8, 2, Options::from(8), 63, 0, true);
}

// Explains itself without a device.
TEST(MaxkCudaCannot, RefusesRowsWiderThanTheKernelsTake) {
  EXPECT_EQ(maxk_cuda_cannot(kMaxkCudaMaxWidth), "");
  EXPECT_NE(maxk_cuda_cannot(kMaxkCudaMaxWidth + 1).find("width"), std::string::npos);
  std::vector<float> x(static_cast<size_t>(2 * (kMaxkCudaMaxWidth + 1)));
  std::vector<float> values(4);
  std::vector<uint16_t> index(4);
  const CbsrView out{2, kMaxkCudaMaxWidth + 1, 2, values.data(), index.data()};
  EXPECT_THROW(maxk_forward_cuda(matrix(x.data(), 2, kMaxkCudaMaxWidth + 1), out, nullptr), InputError);
  const CbsrView bad_k{2, 10, 11, values.data(), index.data()};
  EXPECT_THROW(maxk_forward_cuda(matrix(x.data(), 2, 10), bad_k, nullptr), InputError);
}

}  // namespace
}  // namespace gale::kernels
