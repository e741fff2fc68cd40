#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "kernels/error.hpp"
#include "kernels/spmm.hpp"
#include "kernels/spmm_tc.hpp"

namespace gale::kernels {

void spmm_entry_scale(const CsrView& graph, const float* col_scale, float* out) {
  if (graph.rows == 0) return;
  if (graph.indptr[0] != 0) throw InputError("spmm_entry_scale: the graph's entries must start at 0");
  const int64_t nnz = graph.indptr[graph.rows];
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, nnz, 1 << 16), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t e = r.begin(); e < r.end(); ++e)
      out[e] = graph.weights ? col_scale[graph.indices[e]] * graph.weights[e] : col_scale[graph.indices[e]];
  });
}

namespace {

// The general form (spmm.hpp) over each row's first min(n, cap) picks: a row of n entries walks
// them with stride(n) (spmm_sample_entry; 1 = in order). A row that takes fewer than its n
// entries has its sum scaled by n / taken. `round` is applied to each gathered x value (the
// identity, or TF32's rounding for the tensor-core twin).
template <typename Stride, typename Round>
void spmm_rows(const SpmmArgs& a, int64_t cap, Stride stride, Round round) {
  const CsrView& g = a.graph;
  const int64_t width = a.out.cols;
  const int64_t self_rows = std::min(g.rows, a.x.rows);
  // Rows are independent: each task owns its output rows, so no atomics and a fixed summation
  // order (the picks' order) whatever the thread count. Grain by rows; hub rows are rare enough on
  // the CPU that TBB's work stealing evens them out.
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.rows, 64), [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<float> acc(static_cast<size_t>(width));
    for (int64_t r = range.begin(); r < range.end(); ++r) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      const int64_t begin = g.indptr[r], n = g.indptr[r + 1] - begin, taken = std::min(n, cap), step = stride(n);
      for (int64_t j = 0; j < taken; ++j) {
        const int64_t e = begin + spmm_sample_entry(j, n, step);
        const int32_t c = g.indices[e];
        float coef = a.col_scale ? a.col_scale[c] : 1.0f;
        if (a.edge_weight) coef *= a.edge_weight[e];
        const float* xr = a.x.row(c);
        for (int64_t k = 0; k < width; ++k) acc[k] += coef * round(xr[k]);
      }
      float rs = a.row_scale ? a.row_scale[r] : 1.0f;
      if (n > taken) rs *= static_cast<float>(n) / static_cast<float>(taken);
      float* o = a.out.row(r);
      float self = 0.0f;
      if (r < self_rows) self = a.self_scale + (a.self_coefs ? a.self_coefs[r] : 0.0f);
      const float* xs = self != 0.0f ? a.x.row(r) : nullptr;
      const uint32_t* mask = a.out_mask ? a.out_mask + r * a.out_mask_words : nullptr;
      for (int64_t k = 0; k < width; ++k) {
        float v = rs * acc[k];
        if (xs) v += self * xs[k];
        if (a.accumulate) v += o[k];
        if (a.bias) v += a.bias[k];
        if (a.relu) v = std::max(v, 0.0f);
        o[k] = mask && !((mask[k / 32] >> (k % 32)) & 1u) ? 0.0f : v;
      }
    }
  });
}

}  // namespace

namespace {
float identity(float v) { return v; }
int64_t in_order(int64_t) { return 1; }
}  // namespace

void spmm_cpu(const SpmmArgs& a) { spmm_rows(a, std::numeric_limits<int64_t>::max(), in_order, identity); }

// A TC block's tile holds one coefficient per row and column, the sum of that pair's entries, and
// the MMA takes it rounded: so the twin merges each row's entries of one column (their sum in entry
// order, then rounded) and aggregates the merged graph with x's values rounded.
void spmm_tc_cpu(const SpmmArgs& a) {
  const CsrView& g = a.graph;
  std::vector<int64_t> indptr(static_cast<size_t>(g.rows) + 1, 0);
  std::vector<std::vector<std::pair<int32_t, float>>> merged(static_cast<size_t>(g.rows));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.rows, 256), [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<std::pair<int32_t, int64_t>> order;
    for (int64_t r = range.begin(); r < range.end(); ++r) {
      order.clear();
      for (int64_t e = g.indptr[r]; e < g.indptr[r + 1]; ++e) order.emplace_back(g.indices[e], e);
      std::sort(order.begin(), order.end());
      auto& row = merged[static_cast<size_t>(r)];
      for (size_t i = 0; i < order.size(); ++i) {
        const auto [c, e] = order[i];
        float coef = a.col_scale ? a.col_scale[c] : 1.0f;
        if (a.edge_weight) coef *= a.edge_weight[e];
        if (i > 0 && order[i - 1].first == c) {
          row.back().second += coef;
        } else {
          row.emplace_back(c, coef);
        }
      }
      for (auto& entry : row) entry.second = round_to_tf32(entry.second);
    }
  });
  for (int64_t r = 0; r < g.rows; ++r) indptr[static_cast<size_t>(r) + 1] = indptr[static_cast<size_t>(r)] + static_cast<int64_t>(merged[static_cast<size_t>(r)].size());
  std::vector<int32_t> indices(static_cast<size_t>(indptr.back()));
  std::vector<float> coefs(indices.size());
  for (int64_t r = 0; r < g.rows; ++r) {
    size_t k = static_cast<size_t>(indptr[static_cast<size_t>(r)]);
    for (const auto& [c, coef] : merged[static_cast<size_t>(r)]) {
      indices[k] = c;
      coefs[k++] = coef;
    }
  }
  SpmmArgs m = a;
  m.graph = CsrView{g.rows, g.cols, indptr.data(), indices.data(), nullptr};
  m.col_scale = nullptr;
  m.edge_weight = coefs.data();
  spmm_rows(m, std::numeric_limits<int64_t>::max(), in_order, round_to_tf32);
}

int64_t gar_chunk_rows_for(const CsrView& g) {
  constexpr int64_t kSpan = 256, kHeavy = 16;
  int64_t total = 0, heaviest = 0;
  for (int64_t r0 = 0; r0 < g.rows; r0 += kSpan) {
    int64_t entries = 0;
    for (int64_t r = r0; r < std::min(g.rows, r0 + kSpan); ++r) {
      const int64_t n = g.indptr[r + 1] - g.indptr[r];
      if (n <= kGarLongRow) entries += n;
    }
    total += entries;
    heaviest = std::max(heaviest, entries);
  }
  const int64_t spans = (g.rows + kSpan - 1) / kSpan;
  return spans > 0 && heaviest * spans <= kHeavy * total ? kSpan : 16;
}

std::string spmm_sample_width_cannot(int64_t s) {
  if (s >= 1 && s <= kSpmmMaxSample) return "";
  return "the sample width must be 1 to " + std::to_string(kSpmmMaxSample) + ", not " + std::to_string(s);
}

void spmm_sampled_cpu(const SpmmArgs& a) {
  const std::string why = spmm_sample_width_cannot(a.sample_width);
  if (!why.empty()) throw InputError("spmm sampled: " + why);
  spmm_rows(a, a.sample_width, [&](int64_t n) { return spmm_sample_stride(n, a.sample_width, a.sampling); }, identity);
}

namespace {

// csr_transpose's one-thread loop.
void csr_transpose_serial(const CsrView& csr, int64_t* indptr_out, int32_t* indices_out, int64_t* perm_out) {
  const int64_t base = csr.rows == 0 ? 0 : csr.indptr[0];
  const int64_t nnz = csr.nnz();
  for (int64_t e = 0; e < nnz; ++e) indptr_out[csr.indices[base + e] + 1]++;
  for (int64_t c = 0; c < csr.cols; ++c) indptr_out[c + 1] += indptr_out[c];
  std::vector<int64_t> next(indptr_out, indptr_out + csr.cols);
  for (int64_t r = 0; r < csr.rows; ++r) {
    for (int64_t e = csr.indptr[r]; e < csr.indptr[r + 1]; ++e) {
      const int64_t k = next[csr.indices[e]]++;
      indices_out[k] = static_cast<int32_t>(r);
      perm_out[k] = e;
    }
  }
}

// The same result in two parallel passes without atomics (hub columns would make every thread
// fight over the same counters), given 12 bytes an entry of scratch. 1: chunks of rows deal their
// entries into buckets of columns, each chunk into its own slots of each bucket, so a bucket holds
// its entries in row order. 2: each bucket transposes its own columns as the one-thread loop
// does. 2.9 s -> 0.5 s for 63M entries on 16 cores.
void csr_transpose_parallel(const CsrView& csr, int64_t* indptr_out, int32_t* indices_out, int64_t* perm_out,
                            int32_t* dealt_row, int64_t* dealt_entry) {
  constexpr int kBuckets = 256;
  int shift = 0;
  while ((csr.cols - 1) >> shift >= kBuckets) ++shift;
  const int64_t chunk_rows = std::max<int64_t>(1024, csr.rows / 256);
  const int64_t chunks = (csr.rows + chunk_rows - 1) / chunk_rows;
  auto chunk_end = [&](int64_t ch) { return std::min(csr.rows, (ch + 1) * chunk_rows); };
  // counts[chunk * kBuckets + b], then (scanned bucket-major) where the chunk's entries of b start.
  std::vector<int64_t> counts(static_cast<size_t>(chunks * kBuckets), 0);
  tbb::parallel_for(int64_t{0}, chunks, [&](int64_t ch) {
    int64_t* n = counts.data() + ch * kBuckets;
    for (int64_t e = csr.indptr[ch * chunk_rows]; e < csr.indptr[chunk_end(ch)]; ++e) ++n[csr.indices[e] >> shift];
  });
  std::vector<int64_t> bucket_start(kBuckets + 1, 0);
  int64_t at = 0;
  for (int b = 0; b < kBuckets; ++b) {
    bucket_start[static_cast<size_t>(b)] = at;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      int64_t& n = counts[static_cast<size_t>(ch * kBuckets + b)];
      const int64_t here = n;
      n = at;
      at += here;
    }
  }
  bucket_start[kBuckets] = at;
  tbb::parallel_for(int64_t{0}, chunks, [&](int64_t ch) {
    int64_t* next = counts.data() + ch * kBuckets;
    for (int64_t r = ch * chunk_rows; r < chunk_end(ch); ++r) {
      for (int64_t e = csr.indptr[r]; e < csr.indptr[r + 1]; ++e) {
        const int64_t k = next[csr.indices[e] >> shift]++;
        dealt_row[k] = static_cast<int32_t>(r);
        dealt_entry[k] = e;
      }
    }
  });
  // Each bucket counts its own columns (disjoint ranges), one scan, then each bucket scatters.
  tbb::parallel_for(0, kBuckets, [&](int b) {
    for (int64_t k = bucket_start[static_cast<size_t>(b)]; k < bucket_start[static_cast<size_t>(b) + 1]; ++k)
      ++indptr_out[csr.indices[dealt_entry[k]] + 1];
  });
  for (int64_t c = 0; c < csr.cols; ++c) indptr_out[c + 1] += indptr_out[c];
  tbb::parallel_for(0, kBuckets, [&](int b) {
    const int64_t c0 = std::min(csr.cols, int64_t{b} << shift), c1 = std::min(csr.cols, int64_t{b + 1} << shift);
    std::vector<int64_t> next(indptr_out + c0, indptr_out + c1);
    for (int64_t k = bucket_start[static_cast<size_t>(b)]; k < bucket_start[static_cast<size_t>(b) + 1]; ++k) {
      const int64_t e = dealt_entry[k];
      const int64_t slot = next[static_cast<size_t>(csr.indices[e] - c0)]++;
      indices_out[slot] = dealt_row[k];
      perm_out[slot] = e;
    }
  });
}

}  // namespace

void csr_transpose(const CsrView& csr, int64_t* indptr_out, int32_t* indices_out, int64_t* perm_out) {
  std::fill(indptr_out, indptr_out + csr.cols + 1, 0);
  const int64_t nnz = csr.nnz();
  // A whole graph with threads to spare takes the parallel passes, when their scratch can be had;
  // a sampled block, a small graph or a machine of few cores the one-thread loop (on 2 cores the
  // passes' extra traffic costs more than they share out).
  if (nnz >= (int64_t{1} << 20) && csr.indptr[0] == 0 && tbb::this_task_arena::max_concurrency() >= 4) {
    std::unique_ptr<int32_t[]> dealt_row;
    std::unique_ptr<int64_t[]> dealt_entry;
    try {
      // Left uninitialised (every slot is written): zero-filling them first would cost as much again.
      dealt_row.reset(new int32_t[static_cast<size_t>(nnz)]);
      dealt_entry.reset(new int64_t[static_cast<size_t>(nnz)]);
    } catch (const std::bad_alloc&) {
      dealt_row.reset();
    }
    if (dealt_row && dealt_entry) {
      csr_transpose_parallel(csr, indptr_out, indices_out, perm_out, dealt_row.get(), dealt_entry.get());
      return;
    }
  }
  csr_transpose_serial(csr, indptr_out, indices_out, perm_out);
}

int64_t gar_long_rows_capacity(int64_t rows, int64_t nnz) {
  return std::max<int64_t>(0, std::min(rows, nnz / (kGarLongRow + 1)));
}

std::vector<int64_t> gar_long_rows_cpu(const CsrView& graph) {
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < graph.rows; ++r)
    if (graph.indptr[r + 1] - graph.indptr[r] > kGarLongRow) rows.push_back(r);
  return rows;
}

int64_t spmm_gar_row_align(int64_t width) {
  // Whole lines from 64 floats up; below, whole 64-byte halves (a width of 47 is padded to 48, not
  // 64: a third less to copy and hold, for tiles of which half straddle two lines).
  return width >= 64 ? 32 : width > 8 ? 16 : 8;
}

int64_t spmm_gar_row_floats(int64_t width) {
  if (width < 8) return width;
  const int64_t align = spmm_gar_row_align(width);
  return (width + align - 1) / align * align;
}

const char* spmm_kind_name(SpmmKind kind) {
  switch (kind) {
    case SpmmKind::kAuto: return "auto";
    case SpmmKind::kGar: return "gar";
    case SpmmKind::kGas: return "gas";
    case SpmmKind::kCusparse: return "cusparse";
    case SpmmKind::kMemoryAware: return "memory-aware";
    case SpmmKind::kSampled: return "sampled";
    case SpmmKind::kTensorCore: return "tc";
  }
  return "?";
}

}  // namespace gale::kernels
