// TC-GNN's sparse graph translation (kernels/spmm_tc_cpu.cpp) and the tensor-core SpMM's CPU twin:
// every entry planned once, in its window and row, under the source its condensed column names;
// windows' columns distinct and sorted; blocks' entry ranges; windows of many blocks cut into items;
// the thread count not mattering; bad graphs refused; and the twin equal to spmm_cpu where TF32 is
// exact and within TF32's rounding elsewhere.
#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "kernels/spmm.hpp"
#include "kernels/spmm_tc.hpp"
#include "tests/gpu/random_inputs.hpp"

namespace gale::kernels {
namespace {

using testing::Graph;
using testing::random_graph;

void expect_valid_plan(const Graph& g, const SpmmTcTranslation& t) {
  const int64_t nnz = g.indptr.back();
  ASSERT_EQ(t.windows, (g.rows + kTcWindowRows - 1) / kTcWindowRows);
  ASSERT_EQ(static_cast<int64_t>(t.entry.size()), nnz);
  const int64_t blocks = t.window_blocks.back();
  ASSERT_EQ(static_cast<int64_t>(t.block_src.size()), blocks * kTcBlockCols);
  ASSERT_EQ(t.block_entries.back(), nnz);
  std::vector<int> seen(static_cast<size_t>(nnz), 0);
  for (int64_t w = 0; w < t.windows; ++w) {
    const int64_t r0 = w * kTcWindowRows, r1 = std::min(g.rows, r0 + kTcWindowRows);
    const int64_t b0 = t.window_blocks[w], b1 = t.window_blocks[w + 1];
    // The window's condensed columns: distinct, increasing, -1 only after the last.
    int64_t used = 0;
    for (int64_t k = b0 * kTcBlockCols; k < b1 * kTcBlockCols; ++k) {
      if (t.block_src[k] < 0) continue;
      ASSERT_EQ(k, b0 * kTcBlockCols + used) << "a padding column before a real one in window " << w;
      if (used > 0) EXPECT_LT(t.block_src[k - 1], t.block_src[k]);
      ++used;
    }
    EXPECT_EQ((used + kTcBlockCols - 1) / kTcBlockCols, b1 - b0);
    for (int64_t i = g.indptr[r0]; i < g.indptr[r1]; ++i) {
      const int32_t e = t.entry[i];
      ASSERT_GE(e, g.indptr[r0]);
      ASSERT_LT(e, g.indptr[r1]);
      ++seen[e];
      const int64_t row = r0 + t.slot[i] % kTcWindowRows, condensed = t.slot[i] / kTcWindowRows;
      EXPECT_TRUE(e >= g.indptr[row] && e < g.indptr[row + 1]) << "entry " << e << " planned in row " << row;
      ASSERT_LT(condensed, used);
      EXPECT_EQ(t.block_src[b0 * kTcBlockCols + condensed], g.indices[e]);
      const int64_t b = b0 + condensed / kTcBlockCols;
      EXPECT_TRUE(i >= t.block_entries[b] && i < t.block_entries[b + 1]) << "entry " << i << " outside block " << b;
    }
  }
  for (int64_t e = 0; e < nnz; ++e) ASSERT_EQ(seen[e], 1) << "entry " << e;
  // Items: every block once, in window order, at most kTcItemBlocks each; split windows listed.
  std::vector<int32_t> split;
  int64_t next_block = 0;
  for (size_t i = 0; i < t.item_window.size(); ++i) {
    const int32_t w = t.item_window[i];
    EXPECT_EQ(t.item_block[i], std::max<int64_t>(next_block, t.window_blocks[w]));
    next_block = std::min<int64_t>(t.item_block[i] + kTcItemBlocks, t.window_blocks[w + 1]);
    if (i + 1 < t.item_window.size()) EXPECT_LE(w, t.item_window[i + 1]);
    if (t.window_blocks[w + 1] - t.window_blocks[w] > kTcItemBlocks && (split.empty() || split.back() != w)) split.push_back(w);
  }
  EXPECT_EQ(next_block, blocks);
  EXPECT_EQ(split, t.split_windows);
}

TEST(SpmmTcTranslate, PlansEveryEntryOnceUnderItsColumn) {
  for (const int64_t rows : {int64_t{1}, int64_t{16}, int64_t{17}, int64_t{301}}) {
    const Graph g = random_graph(static_cast<uint64_t>(rows), rows, 97, 200);
    const SpmmTcTranslation t = spmm_tc_translate(g.csr());
    expect_valid_plan(g, t);
    EXPECT_EQ(t.density() > 0.0, g.nnz() > 0);  // one row (row 0) is empty
    EXPECT_LE(t.density(), 1.0);
  }
}

TEST(SpmmTcTranslate, CutsWindowsOfManyBlocksIntoItems) {
  // Row 40 over 5000 distinct columns: 625 blocks or more in its window, three items; the other
  // windows one each (random_graph's hubs of 0 entries).
  Graph g = random_graph(5, 100, 6000, 0);
  std::vector<int32_t> indices;
  std::vector<int64_t> indptr{0};
  for (int64_t r = 0; r < g.rows; ++r) {
    if (r == 40) {
      for (int32_t c = 4999; c >= 0; --c) indices.push_back(c);
    } else {
      indices.insert(indices.end(), g.indices.begin() + g.indptr[r], g.indices.begin() + g.indptr[r + 1]);
    }
    indptr.push_back(static_cast<int64_t>(indices.size()));
  }
  g.indices = indices;
  g.indptr = indptr;
  const SpmmTcTranslation t = spmm_tc_translate(g.csr());
  expect_valid_plan(g, t);
  ASSERT_EQ(t.split_windows, std::vector<int32_t>{2});
  EXPECT_EQ(static_cast<int64_t>(t.item_window.size()), t.windows + 2);
}

TEST(SpmmTcTranslate, TheThreadCountDoesNotChangeThePlan) {
  const Graph g = random_graph(9, 5000, 3000, 4000);
  const SpmmTcTranslation many = spmm_tc_translate(g.csr());
  tbb::task_arena one(1);
  SpmmTcTranslation single;
  one.execute([&] { single = spmm_tc_translate(g.csr()); });
  EXPECT_EQ(many.window_blocks, single.window_blocks);
  EXPECT_EQ(many.block_entries, single.block_entries);
  EXPECT_EQ(many.block_src, single.block_src);
  EXPECT_EQ(many.entry, single.entry);
  EXPECT_EQ(many.slot, single.slot);
  EXPECT_EQ(many.item_block, single.item_block);
}

TEST(SpmmTcTranslate, RefusesGraphsItCannotPlan) {
  Graph g = random_graph(1, 40, 10, 5);
  g.indices[g.indptr[5]] = 10;
  try {
    spmm_tc_translate(g.csr());
    FAIL() << "a column past the last was planned";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("outside [0, 10)"), std::string::npos) << e.what();
  }
  const std::vector<int64_t> offset_indptr{2, 4};
  const std::vector<int32_t> columns{0, 1, 2, 3};
  EXPECT_THROW(spmm_tc_translate(CsrView{1, 4, offset_indptr.data(), columns.data(), nullptr}), InputError);
  const Graph h = random_graph(1, 40, 10, 5);
  const SpmmTcTranslation empty = spmm_tc_translate(CsrView{0, 5, h.indptr.data(), h.indices.data(), nullptr});
  EXPECT_EQ(empty.windows, 0);
  EXPECT_TRUE(empty.item_window.empty());
}

struct Inputs {
  std::vector<float> x, row_scale, col_scale, weight, bias;
};

Inputs inputs(const Graph& g, int64_t width, bool integers, uint64_t key) {
  Inputs in;
  auto fill = [&](std::vector<float>* v, size_t n, uint64_t k) {
    v->resize(n);
    for (size_t i = 0; i < n; ++i) {
      const float u = random_uniform(derive_key(key, k), i);
      (*v)[i] = integers ? std::floor(8.0f * u) - 4.0f : 2.0f * u - 1.0f;
    }
  };
  fill(&in.x, static_cast<size_t>(g.cols * width), 1);
  fill(&in.row_scale, static_cast<size_t>(g.rows), 2);
  fill(&in.col_scale, static_cast<size_t>(g.cols), 3);
  fill(&in.weight, g.indices.size(), 4);
  fill(&in.bias, static_cast<size_t>(width), 5);
  return in;
}

std::vector<float> run(void (*op)(const SpmmArgs&), const Graph& g, const Inputs& in, int64_t width) {
  std::vector<float> out(static_cast<size_t>(g.rows * width));
  SpmmArgs a;
  a.graph = g.csr();
  a.x = ConstMatrixView{in.x.data(), g.cols, width, width};
  a.out = MatrixView{out.data(), g.rows, width, width};
  a.row_scale = in.row_scale.data();
  a.col_scale = in.col_scale.data();
  a.edge_weight = in.weight.data();
  a.self_scale = 0.5f;
  a.bias = in.bias.data();
  a.relu = true;
  op(a);
  return out;
}

TEST(SpmmTcCpu, EqualsTheExactProductWhereTf32IsExact) {
  // Small integers are exact in TF32 and their sums exact in f32, in any order.
  const Graph g = random_graph(3, 200, 150, 300);
  const Inputs in = inputs(g, 40, /*integers=*/true, 11);
  EXPECT_EQ(run(spmm_tc_cpu, g, in, 40), run(spmm_cpu, g, in, 40));
}

TEST(SpmmTcCpu, StaysWithinTf32RoundingOfTheExactProduct) {
  const Graph g = random_graph(4, 200, 150, 300);
  const int64_t width = 33;
  const Inputs in = inputs(g, width, /*integers=*/false, 12);
  const std::vector<float> tc = run(spmm_tc_cpu, g, in, width), exact = run(spmm_cpu, g, in, width);
  // Each product carries two roundings of at most 2^-11 relative: bound the error by the sum of
  // the terms' magnitudes (with ReLU and the bias between, compare before neither can matter much).
  float worst = 0.0f;
  int differ = 0;
  for (int64_t r = 0; r < g.rows; ++r) {
    float magnitude = 0.0f;
    for (int64_t e = g.indptr[r]; e < g.indptr[r + 1]; ++e) magnitude += std::fabs(in.col_scale[g.indices[e]] * in.weight[e]);
    for (int64_t c = 0; c < width; ++c) {
      const size_t i = static_cast<size_t>(r * width + c);
      const float bound = 2.5e-3f * std::fabs(in.row_scale[r]) * magnitude + 1e-6f;
      worst = std::max(worst, std::fabs(tc[i] - exact[i]) / bound);
      differ += tc[i] != exact[i];
    }
  }
  EXPECT_LE(worst, 1.0f);
  EXPECT_GT(differ, 0) << "TF32 rounding changed nothing: the twin is not rounding";
}

}  // namespace
}  // namespace gale::kernels
