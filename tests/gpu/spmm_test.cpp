// The CUDA SpMM family (kernels/spmm.cu: GAR, GAS, auto, cuSPARSE) against spmm_cpu on fresh
// random graphs: every fifth row empty, hub rows with thousands of entries (GAR's long-row
// blocks), rows of 20-120 entries (several gather pieces), a skewed graph whose rows cross many of
// a GAR block's group ranges (also with its rows in degree order), more sources than destinations;
// widths 1, 3, 32, 33, 64, 100, 128, 256, 257 (scalar and float4 paths, partial groups, several
// column tiles; 40 and 47 on the skewed graph, 41-48 in GAR's 48-float tile), padded leading
// dimensions, and every combination of row scale, column scale, edge weight, self term,
// accumulate, bias and ReLU; GAR's output mask (ReLU's backward folded in) against the CPU product
// masked afterwards. Outputs are poisoned with NaN first, so an element a kernel forgets to write
// fails. Tests skip with a reason when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/fill.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/cuda/tc_plan.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "tests/gpu/cuda_fixture.hpp"
#include "tests/gpu/expect_close.hpp"
#include "tests/gpu/random_inputs.hpp"
#include "kernels/spmm.hpp"
#include "kernels/spmm_tc.hpp"

namespace gale::kernels {
namespace {

using cuda::DeviceBuffer;
using cuda::MemoryPool;
using cuda::Stream;
using gale::testing::expect_close;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kWidths[] = {1, 3, 32, 33, 64, 100, 128, 256, 257};

using testing::Graph;
using testing::random_graph;
using testing::uniform;

// Which optional inputs a case sets; `combo` in [0, kCombos) enumerates all of them.
struct Options {
  bool row_scale = false, col_scale = false, edge_weight = false;
  int self = 0;  // 0 none, 1 self_scale, 2 self_coefs, 3 both
  bool accumulate = false, bias = false, relu = false;

  static constexpr int kCombos = 2 * 2 * 2 * 4 * 2 * 2 * 2;
  static Options from(int combo) {
    Options o;
    o.row_scale = combo & 1;
    o.col_scale = combo & 2;
    o.edge_weight = combo & 4;
    o.self = (combo >> 3) & 3;
    o.accumulate = combo & 32;
    o.bias = combo & 64;
    o.relu = combo & 128;
    return o;
  }
  std::string describe() const {
    return std::string("row_scale=") + (row_scale ? "1" : "0") + " col_scale=" + (col_scale ? "1" : "0") +
           " weight=" + (edge_weight ? "1" : "0") + " self=" + std::to_string(self) +
           " accumulate=" + (accumulate ? "1" : "0") + " bias=" + (bias ? "1" : "0") + " relu=" + (relu ? "1" : "0");
  }
};

class SpmmCudaTest : public gale::testing::CudaFixture<> {
 protected:
  // Runs `kind` and spmm_cpu on the same fresh inputs and compares. x and out have leading
  // dimensions width + pad (pad 1 forces the scalar path on a width divisible by 4); out_pad >= 0
  // gives out its own (x padded to 16-byte rows, out dense: GAR's float4 gathers, float stores).
  void check(SpmmKind kind, const Graph& g, int64_t width, const Options& o, uint64_t key, int64_t pad = 0,
             int64_t out_pad = -1) {
    const int64_t x_ld = width + pad, out_ld = width + (out_pad >= 0 ? out_pad : pad);
    const auto x = uniform(derive_key(key, 1), static_cast<size_t>(g.cols * x_ld), -1.0f, 1.0f);
    const auto row_scale = uniform(derive_key(key, 2), static_cast<size_t>(g.rows), 0.1f, 1.0f);
    const auto col_scale = uniform(derive_key(key, 3), static_cast<size_t>(g.cols), 0.1f, 1.0f);
    const auto weight = uniform(derive_key(key, 4), static_cast<size_t>(g.nnz()), -1.0f, 1.0f);
    const auto self_coefs = uniform(derive_key(key, 5), static_cast<size_t>(g.rows), -1.0f, 1.0f);
    const auto bias = uniform(derive_key(key, 6), static_cast<size_t>(width), -1.0f, 1.0f);
    const auto previous = uniform(derive_key(key, 7), static_cast<size_t>(g.rows * out_ld), -1.0f, 1.0f);

    SpmmArgs a;
    a.self_scale = (o.self & 1) ? 1.25f : 0.0f;
    a.accumulate = o.accumulate;
    a.relu = o.relu;
    a.nnz = g.nnz();
    a.sample_width = sample_width_;
    a.sampling = sampling_;

    // CPU reference: out starts as `previous` when accumulating, else NaN (it must be overwritten).
    std::vector<float> cpu = o.accumulate ? previous : std::vector<float>(previous.size(), kNaN);
    SpmmArgs c = a;
    c.graph = g.csr();
    c.x = ConstMatrixView{x.data(), g.cols, width, x_ld};
    c.out = MatrixView{cpu.data(), g.rows, width, out_ld};
    c.row_scale = o.row_scale ? row_scale.data() : nullptr;
    c.col_scale = o.col_scale ? col_scale.data() : nullptr;
    c.edge_weight = o.edge_weight ? weight.data() : nullptr;
    c.self_coefs = (o.self & 2) ? self_coefs.data() : nullptr;
    c.bias = o.bias ? bias.data() : nullptr;
    if (kind == SpmmKind::kSampled) {
      spmm_sampled_cpu(c);
    } else if (kind == SpmmKind::kTensorCore) {
      spmm_tc_cpu(c);
    } else {
      spmm_cpu(c);
    }
    // An output mask (mask_words_ > 0): random bits, and the reference is the unmasked product with
    // ReLU's backward applied afterwards (a cleared bit gives 0, a set one keeps the value).
    std::vector<uint32_t> mask;
    if (mask_words_ > 0) {
      mask.resize(static_cast<size_t>(g.rows * mask_words_));
      for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<uint32_t>(random_bits(derive_key(key, 8), i));
      for (int64_t r = 0; r < g.rows; ++r)
        for (int64_t k = 0; k < width; ++k)
          if (!((mask[static_cast<size_t>(r * mask_words_ + k / 32)] >> (k % 32)) & 1u)) cpu[r * out_ld + k] = 0.0f;
    }

    auto d_indptr = upload(g.indptr);
    auto d_indices = upload(g.indices);
    auto d_x = upload(x);
    auto d_row_scale = upload(row_scale);
    auto d_col_scale = upload(col_scale);
    auto d_weight = upload(weight);
    auto d_self = upload(self_coefs);
    auto d_bias = upload(bias);
    auto d_mask = upload(mask.empty() ? std::vector<uint32_t>{0} : mask);
    if (mask_words_ > 0) {
      a.out_mask = d_mask.data();
      a.out_mask_words = mask_words_;
    }
    DeviceBuffer<float> d_out(*pool_, previous.size(), *stream_);
    if (o.accumulate) {
      cuda::copy_to_device(d_out.data(), previous.data(), previous.size(), *stream_);
    } else if (!previous.empty()) {
      cuda::fill(d_out.data(), previous.size(), kNaN, *stream_);
    }
    a.graph = {g.rows, g.cols, d_indptr.data(), d_indices.data(), nullptr};
    a.x = ConstMatrixView{d_x.data(), g.cols, width, x_ld};
    a.out = MatrixView{d_out.data(), g.rows, width, out_ld};
    a.row_scale = o.row_scale ? d_row_scale.data() : nullptr;
    a.col_scale = o.col_scale ? d_col_scale.data() : nullptr;
    a.edge_weight = o.edge_weight ? d_weight.data() : nullptr;
    a.self_coefs = (o.self & 2) ? d_self.data() : nullptr;
    a.bias = o.bias ? d_bias.data() : nullptr;
    const int64_t long_capacity = gar_long_rows_capacity(g.rows, g.nnz());
    DeviceBuffer<int64_t> d_long(*pool_, static_cast<size_t>(std::max<int64_t>(long_capacity, 1)), *stream_);
    DeviceBuffer<int64_t> d_long_count(*pool_, 1, *stream_);
    if (listed_) {
      gar_long_rows_cuda(a.graph, d_long.data(), long_capacity, d_long_count.data(), *stream_);
      a.long_rows = {d_long.data(), d_long_count.data(), long_capacity};
    }
    a.gar_chunk_rows = chunk_rows_;
    cuda::DeviceTcPlan plan;
    if (kind == SpmmKind::kTensorCore) {
      plan = cuda::DeviceTcPlan(*pool_, spmm_tc_translate(g.csr()), *stream_);
      a.tc = plan.plan();
    }
    spmm_cuda(kind, a, *stream_);
    std::vector<float> gpu = cuda::to_host_and_wait(d_out.view(), *stream_);
    // Padding columns are never written by either side: compare the matrix proper.
    std::vector<float> gpu_m, cpu_m;
    for (int64_t r = 0; r < g.rows; ++r) {
      gpu_m.insert(gpu_m.end(), gpu.begin() + r * out_ld, gpu.begin() + r * out_ld + width);
      cpu_m.insert(cpu_m.end(), cpu.begin() + r * out_ld, cpu.begin() + r * out_ld + width);
    }
    // The tensor cores' sums are not IEEE f32 sums (each MMA adds its 8 products and the accumulator
    // with truncation), which over a hub row's 6000 entries measured 2e-4 relative.
    expect_close(gpu_m, cpu_m, kind == SpmmKind::kTensorCore ? 1e-3f : 1e-4f,
                 std::string(spmm_kind_name(kind)) + " width " + std::to_string(width) + " ld " +
                     std::to_string(x_ld) + " / " + std::to_string(out_ld) + " " + o.describe() +
                     (listed_ ? " (long rows listed)" : "") + " chunks " + std::to_string(chunk_rows_) +
                     (mask_words_ > 0 ? " masked, " + std::to_string(mask_words_) + " words a row" : ""));
  }

  int64_t chunk_rows_ = 0;  // check() passes GAR these chunk rows (0: 16)
  int64_t mask_words_ = 0;  // check() passes an output mask of this many words a row (0: none)
  bool listed_ = false;  // check() passes GAR the graph's long-row list, built on the device
  int64_t sample_width_ = 0;  // kSampled's S and strategy (the reference is then spmm_sampled_cpu)
  SpmmSampling sampling_ = SpmmSampling::kFastRand;
};

// Every width with a rotating eighth of the option combinations, each kind, padded and not; small
// enough to run under compute-sanitizer.
TEST_F(SpmmCudaTest, SmallGraphsMatchCpuAtEveryWidth) {
  const Graph g = random_graph(11, 300, 350, 1500);
  int w = 0;
  for (int64_t width : kWidths) {
    for (int combo = w % 24; combo < Options::kCombos; combo += 24) {
      const uint64_t key = derive_key(12, static_cast<uint64_t>(width * 1000 + combo));
      for (SpmmKind kind : {SpmmKind::kGar, SpmmKind::kGas, SpmmKind::kMemoryAware}) {
        check(kind, g, width, Options::from(combo), key);
        check(kind, g, width, Options::from(combo), key, combo % 2 ? 1 : 4);
      }
    }
    check(SpmmKind::kAuto, g, width, Options::from(w * 21 % Options::kCombos), derive_key(13, width));
    ++w;
  }
}

TEST_F(SpmmCudaTest, AllOptionCombinationsMatchCpu) {
  const Graph g = random_graph(21, 700, 900, 2500);
  for (int64_t width : {int64_t{33}, int64_t{128}}) {
    for (int combo = 0; combo < Options::kCombos; ++combo) {
      const uint64_t key = derive_key(22, static_cast<uint64_t>(width * 1000 + combo));
      check(SpmmKind::kGar, g, width, Options::from(combo), key);
      check(SpmmKind::kGas, g, width, Options::from(combo), key);
      check(SpmmKind::kMemoryAware, g, width, Options::from(combo), key);
    }
  }
}

// Many blocks scan for long rows; hubs land in different long-row blocks.
TEST_F(SpmmCudaTest, LargeGraphWithHubsMatchesCpu) {
  const Graph g = random_graph(31, 20000, 25000, 6000);
  for (int64_t width : {int64_t{1}, int64_t{64}, int64_t{257}}) {
    const uint64_t key = derive_key(32, static_cast<uint64_t>(width));
    check(SpmmKind::kGar, g, width, Options::from(4 + 1 + 8 + 64), key);
    check(SpmmKind::kGas, g, width, Options::from(4 + 2 + 32 + 128), key);
    check(SpmmKind::kMemoryAware, g, width, Options::from(4 + 1 + 16 + 64), key);
  }
}

// Power-law-like degrees in one graph: most rows empty or short, rows of 300 to 4000 entries that
// cross many of a GAR block's group ranges, and hubs of 9000 entries (above GAR's long-row
// threshold) in different row spans, some in the first and last block. Widths that need several
// 32-column tiles (scalar and float4, partial last tiles), every GAR epilogue option once.
Graph skewed_graph(uint64_t key, int64_t rows, int64_t cols) {
  Graph g;
  g.rows = rows;
  g.cols = cols;
  g.indptr.push_back(0);
  uint64_t counter = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t degree = random_below(key, counter++, 3) == 0 ? 1 + static_cast<int64_t>(random_below(key, counter++, 40)) : 0;
    if (r % 97 == 5) degree = 300 + static_cast<int64_t>(random_below(key, counter++, 3700));
    if (r == 0 || r == rows - 1 || r % 4999 == 17) degree = 9000;
    for (int64_t k = 0; k < degree; ++k)
      g.indices.push_back(static_cast<int32_t>(random_below(key, counter++, static_cast<uint64_t>(cols))));
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  return g;
}

TEST_F(SpmmCudaTest, SkewedGraphAcrossTilesMatchesCpu) {
  const Graph g = skewed_graph(81, 20011, 15000);
  int combo = 0;
  for (int64_t width : {int64_t{5}, int64_t{32}, int64_t{100}, int64_t{256}, int64_t{257}}) {
    for (int64_t pad : {int64_t{0}, int64_t{3}}) {
      const uint64_t key = derive_key(82, static_cast<uint64_t>(width * 10 + pad));
      check(SpmmKind::kGar, g, width, Options::from(combo), key, pad);
      combo = (combo + 37) % Options::kCombos;
    }
  }
  // Partial last tiles of float4 gathers in the tiles' launch: 40, and 47 gathered from rows padded
  // to 48 but written a float at a time.
  for (const auto& [width, pad] : {std::pair<int64_t, int64_t>{40, 0}, {47, 1}}) {
    check(SpmmKind::kGar, g, width, Options::from(combo), derive_key(85, static_cast<uint64_t>(width)), pad);
    combo = (combo + 37) % Options::kCombos;
  }
  check(SpmmKind::kGas, g, 100, Options::from(4 + 64), derive_key(83, 1));
  // Tiles whose entries outnumber the memory-aware staging buffer many times, widths in one and
  // in several partial-sum passes.
  for (int64_t width : {int64_t{7}, int64_t{256}, int64_t{300}, int64_t{516}})
    check(SpmmKind::kMemoryAware, g, width, Options::from(combo = (combo + 53) % Options::kCombos),
          derive_key(84, static_cast<uint64_t>(width)), width % 4 ? 2 : 0);
}

// The skewed graph's rows reordered by degree, largest first (what `gale preprocess --relabel
// degree` makes): every long row and the rows of hundreds to thousands of entries at the start,
// where GAR's interleaved row chunks and long-row scans must still find and write each of them.
Graph degree_ordered(const Graph& g) {
  std::vector<int64_t> order(static_cast<size_t>(g.rows));
  for (int64_t r = 0; r < g.rows; ++r) order[static_cast<size_t>(r)] = r;
  const auto degree = [&](int64_t r) { return g.indptr[static_cast<size_t>(r + 1)] - g.indptr[static_cast<size_t>(r)]; };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return degree(a) > degree(b); });
  Graph o;
  o.rows = g.rows;
  o.cols = g.cols;
  o.indptr.push_back(0);
  for (int64_t r : order) {
    o.indices.insert(o.indices.end(), g.indices.begin() + g.indptr[static_cast<size_t>(r)],
                     g.indices.begin() + g.indptr[static_cast<size_t>(r + 1)]);
    o.indptr.push_back(static_cast<int64_t>(o.indices.size()));
  }
  return o;
}

TEST_F(SpmmCudaTest, DegreeOrderedGraphMatchesCpu) {
  const Graph g = degree_ordered(skewed_graph(85, 20011, 15000));
  ASSERT_GT(g.indptr[1] - g.indptr[0], 4096);  // long rows first
  int combo = 11;
  for (int64_t width : {int64_t{1}, int64_t{32}, int64_t{100}, int64_t{256}}) {
    for (int64_t pad : {int64_t{0}, int64_t{3}}) {
      check(SpmmKind::kGar, g, width, Options::from(combo = (combo + 41) % Options::kCombos),
            derive_key(86, static_cast<uint64_t>(width * 10 + pad)), pad);
    }
  }
  check(SpmmKind::kGas, g, 64, Options::from(2 + 8 + 128), derive_key(87, 1));
  check(SpmmKind::kMemoryAware, g, 64, Options::from(1 + 4 + 64), derive_key(87, 2));
}

// GAR given the graph's long-row list (what training passes) instead of scanning for the rows: the
// list built on the device holds exactly the CPU's rows, the output is the scan's bit for bit, and
// the CPU's under rotating options.
TEST_F(SpmmCudaTest, GarWithTheLongRowListMatchesTheScanBitForBit) {
  for (const Graph& g : {skewed_graph(95, 20011, 15000), degree_ordered(skewed_graph(96, 20011, 15000))}) {
    const auto d_indptr = upload(g.indptr);
    const auto d_indices = upload(g.indices);
    const CsrView dg{g.rows, g.cols, d_indptr.data(), d_indices.data(), nullptr};
    const int64_t capacity = gar_long_rows_capacity(g.rows, g.nnz());
    DeviceBuffer<int64_t> list(*pool_, static_cast<size_t>(std::max<int64_t>(capacity, 1)), *stream_);
    DeviceBuffer<int64_t> count(*pool_, 1, *stream_);
    gar_long_rows_cuda(dg, list.data(), capacity, count.data(), *stream_);
    const int64_t listed = download(count)[0];
    ASSERT_LE(listed, capacity);
    std::vector<int64_t> got = download(list, static_cast<size_t>(listed));
    std::sort(got.begin(), got.end());
    const std::vector<int64_t> want = gar_long_rows_cpu(g.csr());
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(got, want);
    for (int64_t width : {int64_t{32}, int64_t{100}, int64_t{256}}) {
      const auto d_x = upload(uniform(derive_key(95, static_cast<uint64_t>(width)), static_cast<size_t>(g.cols * width),
                                      -1.0f, 1.0f));
      SpmmArgs a;
      a.graph = dg;
      a.nnz = g.nnz();
      a.x = ConstMatrixView{d_x.data(), g.cols, width, width};
      auto scanned = poisoned(static_cast<size_t>(g.rows * width));
      a.out = MatrixView{scanned.data(), g.rows, width, width};
      spmm_cuda(SpmmKind::kGar, a, *stream_);
      auto with_list = poisoned(static_cast<size_t>(g.rows * width));
      a.out = MatrixView{with_list.data(), g.rows, width, width};
      a.long_rows = {list.data(), count.data(), capacity};
      spmm_cuda(SpmmKind::kGar, a, *stream_);
      const std::vector<float> s1 = download(scanned), s2 = download(with_list);
      EXPECT_EQ(std::memcmp(s1.data(), s2.data(), s1.size() * sizeof(float)), 0) << "width " << width;
    }
  }
  listed_ = true;
  const Graph g = degree_ordered(skewed_graph(97, 20011, 15000));
  int combo = 3;
  for (int64_t width : {int64_t{1}, int64_t{32}, int64_t{100}, int64_t{256}}) {
    check(SpmmKind::kGar, g, width, Options::from(combo = (combo + 41) % Options::kCombos),
          derive_key(98, static_cast<uint64_t>(width)), width % 2 == 0 ? 3 : 0);
  }
  listed_ = false;
}

// x in rows padded to 16 bytes, out dense of an odd width (what ops::spmm hands GAR for a 47-class
// layer): float4 gathers that read the padding columns, float stores that must not write them;
// widths with whole 32-column tiles and a partial last tile (two launches), and narrower ones.
TEST_F(SpmmCudaTest, GarGathersPaddedRowsIntoADenseOutput) {
  const Graph small = random_graph(91, 400, 450, 1800);
  const Graph skewed = skewed_graph(92, 20011, 15000);
  int combo = 5;
  for (int64_t width : {int64_t{3}, int64_t{15}, int64_t{47}, int64_t{101}, int64_t{257}}) {
    const int64_t pad = (width + 3) / 4 * 4 - width;
    for (const Graph* g : {&small, &skewed}) {
      combo = (combo + 29) % Options::kCombos;
      check(SpmmKind::kGar, *g, width, Options::from(combo), derive_key(93, static_cast<uint64_t>(width * 7 + combo)),
            pad, /*out_pad=*/0);
    }
  }
  // Partial last tiles with every buffer aligned: 4 columns in the tiles' launch (100 = 3 tiles
  // and 4), 8 and 16 columns in a launch of their own.
  for (int64_t width : {int64_t{36}, int64_t{40}, int64_t{100}, int64_t{208}})
    check(SpmmKind::kGar, small, width, Options::from(combo = (combo + 31) % Options::kCombos),
          derive_key(94, static_cast<uint64_t>(width)));
}

// GAR's 48-float tile (a float4 and a float2 a lane: widths 41-48), every width of its
// range on a small graph and the skewed one (long rows, rows across group ranges): x in rows padded
// to 16 bytes, out padded the same (float4 stores when the width is a multiple of 4) and dense
// (float stores); the long-row list too.
TEST_F(SpmmCudaTest, GarFortyEightColumnTileMatchesCpu) {
  const Graph small = random_graph(96, 400, 450, 1800);
  const Graph skewed = skewed_graph(97, 20011, 15000);
  int combo = 11;
  for (int64_t width = 41; width <= 48; ++width) {
    const int64_t pad = (width + 3) / 4 * 4 - width;
    for (const Graph* g : {&small, &skewed}) {
      for (int64_t out_pad : {pad, int64_t{0}}) {
        combo = (combo + 29) % Options::kCombos;
        listed_ = combo % 2;
        check(SpmmKind::kGar, *g, width, Options::from(combo),
              derive_key(98, static_cast<uint64_t>(width * 7 + combo)), pad, out_pad);
      }
    }
  }
  listed_ = false;
}

// GAR's output mask (SpmmArgs::out_mask: ReLU's backward folded into the aggregation that writes the
// gradient) is the unmasked product masked afterwards, at the widths of full-graph training (1, 47
// classes, 96, 100, 256 hidden): a small graph and the skewed one (long rows, rows across group
// ranges), x's rows dense and padded (47 dense: whole tiles and a tail in two launches, whose bits
// start at column 32; 47 in rows of 48: float4 gathers and float stores; 100 in rows of 103: scalar),
// with and without the long-row list, under rotating options (accumulate, self term, bias, ReLU),
// rows of the exact number of words and of one more.
TEST_F(SpmmCudaTest, GarOutputMaskIsReluBackwardAfterTheProduct) {
  const Graph small = random_graph(101, 400, 450, 1800);
  const Graph skewed = skewed_graph(102, 20011, 15000);
  int combo = 3;
  for (int64_t width : {int64_t{1}, int64_t{47}, int64_t{96}, int64_t{100}, int64_t{256}}) {
    for (int64_t pad : {int64_t{0}, width == 47 ? int64_t{1} : int64_t{3}}) {
      for (const Graph* g : {&small, &skewed}) {
        combo = (combo + 37) % Options::kCombos;
        listed_ = combo % 2;
        mask_words_ = (width + 31) / 32 + (combo % 3 == 0 ? 1 : 0);
        check(SpmmKind::kGar, *g, width, Options::from(combo),
              derive_key(103, static_cast<uint64_t>(width * 11 + pad * 3 + combo)), pad,
              width == 47 && pad == 1 ? 0 : -1);
      }
    }
  }
  // What the engine's backward passes: x dense, no epilogue but the mask (GCN's row and column
  // scales and self coefficients; GIN's self scale).
  for (int64_t width : {int64_t{96}, int64_t{256}}) {
    mask_words_ = (width + 31) / 32;
    check(SpmmKind::kGar, skewed, width, Options::from(1 + 2 + 4 + 16), derive_key(104, static_cast<uint64_t>(width)));
    check(SpmmKind::kGar, skewed, width, Options::from(8), derive_key(105, static_cast<uint64_t>(width)));
  }
  mask_words_ = 0;
  listed_ = false;
}

// spmm_entry_scale copies col_scale into entry order, and an aggregation given it as edge weights
// equals the one given the column scale.
TEST_F(SpmmCudaTest, EntryScaleMatchesCpuAndStandsForTheColumnScale) {
  const Graph g = random_graph(95, 3000, 3000, 2500);
  const auto col_scale = uniform(96, static_cast<size_t>(g.cols), 0.1f, 1.0f);
  std::vector<float> cpu(static_cast<size_t>(g.nnz()));
  spmm_entry_scale(g.csr(), col_scale.data(), cpu.data());
  for (int64_t e = 0; e < g.nnz(); ++e) ASSERT_EQ(cpu[static_cast<size_t>(e)], col_scale[static_cast<size_t>(g.indices[static_cast<size_t>(e)])]);
  auto d_indptr = upload(g.indptr);
  auto d_indices = upload(g.indices);
  auto d_scale = upload(col_scale);
  DeviceBuffer<float> d_out(*pool_, cpu.size(), *stream_);
  spmm_entry_scale_cuda({g.rows, g.cols, d_indptr.data(), d_indices.data(), nullptr}, g.nnz(), d_scale.data(),
                        d_out.data(), *stream_);
  EXPECT_EQ(cuda::to_host_and_wait(d_out.view(), *stream_), cpu);
  // With edge weights each entry's copy is scale times weight, bit for bit as on the CPU.
  {
    const auto w = uniform(98, static_cast<size_t>(g.nnz()), 0.1f, 3.0f);
    CsrView hw = g.csr();
    hw.weights = w.data();
    std::vector<float> cpu_w(cpu.size());
    spmm_entry_scale(hw, col_scale.data(), cpu_w.data());
    auto d_w = upload(w);
    spmm_entry_scale_cuda({g.rows, g.cols, d_indptr.data(), d_indices.data(), d_w.data()}, g.nnz(), d_scale.data(),
                          d_out.data(), *stream_);
    EXPECT_EQ(cuda::to_host_and_wait(d_out.view(), *stream_), cpu_w);
    EXPECT_NE(cpu_w, cpu);
  }

  const int64_t width = 40;
  const auto x = uniform(97, static_cast<size_t>(g.cols * width), -1.0f, 1.0f);
  std::vector<float> by_column(static_cast<size_t>(g.rows * width)), by_entry(by_column.size());
  SpmmArgs a;
  a.graph = g.csr();
  a.x = ConstMatrixView{x.data(), g.cols, width, width};
  a.out = MatrixView{by_column.data(), g.rows, width, width};
  a.col_scale = col_scale.data();
  spmm_cpu(a);
  a.col_scale = nullptr;
  a.edge_weight = cpu.data();
  a.out.data = by_entry.data();
  spmm_cpu(a);
  EXPECT_EQ(by_entry, by_column);
}

// A low-degree graph (auto picks GAS) and a high-degree one (auto picks GAR) both match.
TEST_F(SpmmCudaTest, AutoMatchesCpuOnLowAndHighDegree) {
  Graph low;
  low.rows = 5000;
  low.cols = 5000;
  low.indptr.push_back(0);
  for (int64_t r = 0; r < low.rows; ++r) {
    if (r % 2) low.indices.push_back(static_cast<int32_t>(random_below(41, static_cast<uint64_t>(r), 5000)));
    low.indptr.push_back(static_cast<int64_t>(low.indices.size()));
  }
  check(SpmmKind::kAuto, low, 64, Options::from(4 + 64), 42);
  check(SpmmKind::kAuto, random_graph(43, 3000, 3000, 2000), 64, Options::from(4 + 64), 44);
}

// ES-SpMM's sampled kernel against spmm_sampled_cpu: rows shorter and longer than S (and hubs of
// 2 x 577 entries, which FastRand walks with 587), both strategies, S from 1 to the maximum,
// scalar and float4 widths, every option in turn.
TEST_F(SpmmCudaTest, SampledMatchesItsCpuReference) {
  const Graph g = random_graph(61, 3000, 3500, 2 * 577);
  int combo = 0;
  for (const SpmmSampling sampling : {SpmmSampling::kFastRand, SpmmSampling::kBucket}) {
    sampling_ = sampling;
    for (const int64_t s : {int64_t{1}, int64_t{16}, int64_t{577}, kSpmmMaxSample}) {
      sample_width_ = s;
      for (const int64_t width : {int64_t{1}, int64_t{3}, int64_t{64}, int64_t{100}, int64_t{257}}) {
        check(SpmmKind::kSampled, g, width, Options::from(combo), derive_key(62, static_cast<uint64_t>(combo)));
        combo = (combo + 37) % Options::kCombos;
      }
      check(SpmmKind::kSampled, g, 64, Options::from(combo), derive_key(63, static_cast<uint64_t>(s)), /*pad=*/1);
    }
  }
  sample_width_ = 0;
  SpmmArgs a;
  a.graph = g.csr();
  a.x = ConstMatrixView{nullptr, g.cols, 8, 8};
  a.out = MatrixView{nullptr, g.rows, 8, 8};
  EXPECT_NE(spmm_cannot(SpmmKind::kSampled, a).find("sample width"), std::string::npos);
  a.sample_width = kSpmmMaxSample + 1;
  EXPECT_NE(spmm_cannot(SpmmKind::kSampled, a).find("sample width"), std::string::npos);
}

// TC-GNN's tensor-core SpMM against its TF32 twin: windows of empty rows, hubs of 6000 entries
// (windows cut into several items, their rows summed by atomics), duplicate entries, a last window
// of fewer than 16 rows, more sources than destinations; widths of one slice, several, partial ones
// (scalar gathers) and both slice widths, padded rows, and rotating option combinations.
TEST_F(SpmmCudaTest, TensorCoreMatchesItsTf32Twin) {
  const Graph g = random_graph(71, 3001, 3500, 6000);
  int combo = 0;
  for (const int64_t width : {int64_t{1}, int64_t{3}, int64_t{32}, int64_t{47}, int64_t{64}, int64_t{128},
                              int64_t{256}, int64_t{257}}) {
    for (int i = 0; i < 4; ++i) {
      check(SpmmKind::kTensorCore, g, width, Options::from(combo), derive_key(72, static_cast<uint64_t>(combo)));
      combo = (combo + 37) % Options::kCombos;
    }
  }
  check(SpmmKind::kTensorCore, g, 64, Options::from(4 + 2 + 1 + 8 + 32 + 64 + 128), derive_key(73, 1), /*pad=*/1);
  check(SpmmKind::kTensorCore, g, 256, Options::from(4 + 1 + 16 + 64 + 128), derive_key(73, 2), /*pad=*/4);
  const Graph skewed = skewed_graph(74, 2000, 2000);
  check(SpmmKind::kTensorCore, skewed, 256, Options::from(4 + 2 + 1 + 32 + 128), derive_key(75, 1));
  check(SpmmKind::kTensorCore, skewed, 100, Options::from(1 + 8 + 64), derive_key(75, 2));

  SpmmArgs a;
  a.graph = g.csr();
  a.x = ConstMatrixView{nullptr, g.cols, 8, 8};
  a.out = MatrixView{nullptr, g.rows, 8, 8};
  EXPECT_NE(spmm_cannot(SpmmKind::kTensorCore, a).find("translation"), std::string::npos);
  const Graph other = random_graph(76, 40, 3500, 10);
  const SpmmTcTranslation t = spmm_tc_translate(other.csr());
  a.tc = t.view();
  EXPECT_NE(spmm_cannot(SpmmKind::kTensorCore, a).find("row windows"), std::string::npos);
}

// GAR dealing 256 consecutive rows to a block at a time (gar_chunk_rows_for's choice for graphs
// without heavy spans): the hub graph, the skewed one across tiles, both with and without the
// long-row list, scalar and float4 paths, every epilogue option once.
TEST_F(SpmmCudaTest, GarInChunksOf256RowsMatchesCpu) {
  chunk_rows_ = 256;
  const Graph g = random_graph(81, 20000, 25000, 6000);
  const Graph skewed = skewed_graph(82, 3000, 2000);
  int combo = 0;
  for (const bool listed : {false, true}) {
    listed_ = listed;
    for (const int64_t width : {int64_t{1}, int64_t{33}, int64_t{48}, int64_t{64}, int64_t{257}}) {
      check(SpmmKind::kGar, g, width, Options::from(combo), derive_key(83, static_cast<uint64_t>(combo)));
      check(SpmmKind::kGar, skewed, width, Options::from(combo + 1), derive_key(84, static_cast<uint64_t>(combo)));
      combo = (combo + 29) % (Options::kCombos - 1);
    }
  }
  listed_ = false;
  chunk_rows_ = 0;
  SpmmArgs a;
  a.graph = g.csr();
  a.x = ConstMatrixView{nullptr, g.cols, 8, 8};
  a.out = MatrixView{nullptr, g.rows, 8, 8};
  a.gar_chunk_rows = 64;
  EXPECT_NE(spmm_cannot(SpmmKind::kGar, a).find("16 or 256"), std::string::npos);
}

TEST_F(SpmmCudaTest, CusparseMatchesCpu) {
  const Graph g = random_graph(51, 500, 600, 2000);
  for (int64_t width : kWidths) {
    check(SpmmKind::kCusparse, g, width, Options::from(4), derive_key(52, width));
    check(SpmmKind::kCusparse, g, width, Options::from(4 + 32), derive_key(53, width));
  }
}

TEST_F(SpmmCudaTest, SmallGarIsDeterministic) {
  const Graph g = skewed_graph(61, 3000, 2000);
  const int64_t width = 64;
  const auto x = uniform(62, static_cast<size_t>(g.cols * width), -1.0f, 1.0f);
  auto d_indptr = upload(g.indptr);
  auto d_indices = upload(g.indices);
  auto d_x = upload(x);
  DeviceBuffer<float> out1(*pool_, static_cast<size_t>(g.rows * width), *stream_);
  DeviceBuffer<float> out2(*pool_, static_cast<size_t>(g.rows * width), *stream_);
  SpmmArgs a;
  a.graph = {g.rows, g.cols, d_indptr.data(), d_indices.data(), nullptr};
  a.x = matrix(d_x.data(), g.cols, width);
  a.out = matrix(out1.data(), g.rows, width);
  spmm_cuda(SpmmKind::kGar, a, *stream_);
  a.out = matrix(out2.data(), g.rows, width);
  spmm_cuda(SpmmKind::kGar, a, *stream_);
  EXPECT_EQ(cuda::to_host_and_wait(out1.view(), *stream_), cuda::to_host_and_wait(out2.view(), *stream_));
}

TEST_F(SpmmCudaTest, SmallEmptyShapesDoNothing) {
  const Graph empty = random_graph(71, 0, 10, 0);
  check(SpmmKind::kGar, empty, 8, Options::from(1 + 64), 72);
  check(SpmmKind::kGas, empty, 8, Options::from(1 + 64), 72);
  const Graph no_edges = random_graph(73, 10, 10, 0);  // rows 0 and 5 empty, the rest 1-11
  check(SpmmKind::kGas, no_edges, 16, Options::from(8 + 64 + 128), 74);
}

// Explains itself without a device.
TEST(SpmmCannot, NamesWhatAKindCannotTake) {
  SpmmArgs a;
  int64_t indptr[3] = {0, 1, 2};
  int32_t indices[2] = {0, 1};
  float x[8] = {}, out[8] = {}, w[2] = {1, 1};
  a.graph = {2, 2, indptr, indices, nullptr};
  a.x = matrix(x, 2, 4);
  a.out = matrix(out, 2, 4);
  EXPECT_EQ(spmm_cannot(SpmmKind::kGar, a), "");
  EXPECT_EQ(spmm_cannot(SpmmKind::kGas, a), "");
  EXPECT_NE(spmm_cannot(SpmmKind::kAuto, a).find("nnz"), std::string::npos);
  a.nnz = 2;
  EXPECT_NE(spmm_cannot(SpmmKind::kCusparse, a).find("edge_weight"), std::string::npos);
  a.edge_weight = w;
  EXPECT_EQ(spmm_cannot(SpmmKind::kCusparse, a), "");
  a.relu = true;
  EXPECT_NE(spmm_cannot(SpmmKind::kCusparse, a).find("epilogue"), std::string::npos);
  a.relu = false;
  a.self_scale = 1.0f;
  EXPECT_NE(spmm_cannot(SpmmKind::kCusparse, a).find("self"), std::string::npos);
  a.self_scale = 0.0f;
  int64_t listed[1] = {0};
  a.long_rows = {listed, nullptr, 1};
  EXPECT_NE(spmm_cannot(SpmmKind::kGar, a).find("long_rows"), std::string::npos);
  a.long_rows = {};
  a.out = matrix(out, 1, 4);
  EXPECT_NE(spmm_cannot(SpmmKind::kGar, a).find("rows"), std::string::npos);
  EXPECT_THROW(spmm_cuda(SpmmKind::kGar, a, nullptr), InputError);
  // An output mask: GAR only (auto when it resolves to GAR), with a whole word a row at least.
  a.out = matrix(out, 2, 4);
  a.edge_weight = nullptr;
  const uint32_t mask[4] = {5, 5, 5, 5};
  a.out_mask = mask;
  a.out_mask_words = 1;
  EXPECT_EQ(spmm_cannot(SpmmKind::kGar, a), "");
  for (SpmmKind kind : {SpmmKind::kGas, SpmmKind::kMemoryAware, SpmmKind::kCusparse, SpmmKind::kSampled})
    EXPECT_NE(spmm_cannot(kind, a).find("only GAR applies an output mask"), std::string::npos) << spmm_kind_name(kind);
  a.nnz = 8;  // average degree 4: auto resolves to GAR
  EXPECT_EQ(spmm_cannot(SpmmKind::kAuto, a), "");
  a.nnz = 2;  // degree 1: GAS
  EXPECT_NE(spmm_cannot(SpmmKind::kAuto, a).find("not gas"), std::string::npos);
  a.out_mask_words = 0;
  EXPECT_NE(spmm_cannot(SpmmKind::kGar, a).find("words a row"), std::string::npos);
}

}  // namespace
}  // namespace gale::kernels
