// kernels/spmm.cu — the CUDA SpMM family of spmm.hpp: fuseGNN's GAR and GAS aggregation models
// (ICCAD'20, Sec. 4-6) over a destination-major CSR, plus cuSPARSE as the baseline.
//
// GAR (gather-apply-reduce, fuseGNN Sec. 4 Fig. 3 and Sec. 6 Alg. 3): row-parallel, reduction in
// registers, no atomics. Groups of G lanes gather source rows with 16-byte loads (column indices
// and coefficients, col_scale * weight, read with one coalesced load and broadcast by shuffle);
// the row scale, self term, bias and ReLU are applied before the single store of each output
// element (the fused epilogue of Sec. 5). Four things make it fast on power-law graphs (see the
// GAR section below):
//   - column tiles of 32 floats, tile-major over the grid: the L2 holds the hot source rows'
//     128-byte slices instead of whole rows (on R-MAT scale 21 at width 256, DRAM reads drop from
//     37 to ~20 GB per product); widths of 41-48 take one tile of 48 (a float4 and a float2 a
//     lane: Float6) instead of a 32-float tile and a partial one, which read and shuffle every
//     entry twice;
//   - a block splits its 256 rows' entries evenly over its groups (merge-path inside the block),
//     so a block no longer lasts as long as its longest row;
//   - rows above kLongRow entries go to the grid's first blocks, cut over a whole block each,
//     from the graph's list of them when the caller passes one (SpmmArgs::long_rows);
//   - rows are dealt to blocks interleaved (a regular block takes every nb-th chunk of 16 rows, a
//     long-row block every LB-th long row), so a store whose ids follow the degree (`--relabel
//     degree`) spreads its heavy rows over many blocks instead of piling them on the first few.
// Every output element has one writer and a fixed order of additions: GAR is deterministic.
//
// GAS (gather-apply-scatter, fuseGNN Sec. 4 Fig. 2 and Sec. 6 Alg. 1): edge-parallel. Each group
// takes a contiguous chunk of entries (binary-searching the row of its first entry in indptr, then
// walking indptr), keeps a register sum while consecutive entries share a row and scatters it with
// one atomicAdd (16-byte vector atomics on sm_90) when the row changes. A pre-pass writes
// out = (accumulate ? out : 0) + self term + bias; a post-pass applies ReLU, which cannot be fused
// into an atomic scatter. The order of the atomic additions varies, so GAS is not deterministic.
//
// Memory-aware (FastGL, ASPLOS'24, Sec. 4.2 Fig. 7): for sampled blocks. A thread block owns a tile
// of kMaRows destination rows; it stages the tile's entries (column ids and coefficients,
// col_scale * weight) in shared memory with one coalesced pass, and keeps the rows' partial sums
// in shared memory too, so the data every lane reads again and again (a coefficient once per
// feature column, a partial sum once per entry) comes from on-chip memory and only the source
// rows, each read once, come from global memory. Each warp owns two of the tile's rows and adds
// their entries in CSR order: one writer per partial sum, a fixed order of additions,
// deterministic. Tiles whose entries exceed the staging buffer take it in turns; widths above
// kMaCols take the partial-sum buffer in column passes.
//
// kAuto: memory-aware for a sampled block or its transpose (rows != cols; measured on R-MAT 21
// mini-batch SAGE 3x256 [15,10,5]: 0.298 s per epoch against 0.318 s with GAR everywhere and 0.331
// s with the degree rule); else GAR when nnz / rows >= kSpmmGarMinDegree (4), else GAS. fuseGNN (Sec. 7, Fig. 9-11)
// finds GAS faster on low-degree graphs (Cora, avg. degree ~4) and GAR on high-degree ones
// (Reddit): with only a few entries per row, GAR's row groups spend most of their time on the
// per-row prologue and epilogue and leave lanes idle, while GAS's fixed-size edge chunks keep
// every lane busy and scatter rarely enough that atomics stay cheap.
#include <cuda_runtime.h>
#include <cusparse.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/warp.cuh"
#include "kernels/cuda/runtime.hpp"
#include "kernels/error.hpp"
#include "kernels/spmm.hpp"

namespace gale::kernels {

namespace {

// 8 warps per block. A GAR block takes 256 rows (one counting thread per row) and keeps a 256 x 32
// float row buffer (40 KB of shared memory with its row table), four blocks per SM.
constexpr int kBlock = 256;
// GAR rows above this many entries go to the long-row blocks. A regular block spreads its rows'
// entries over all its lanes, so a row of a few thousand entries only lengthens its block a little
// (a block averages ~5K entries on R-MAT scale 21); much longer rows would make their block the
// grid's tail if it started late. Measured on R-MAT scale 21: 4096 slightly ahead of 16384 and
// 65536, well ahead of 1024 (which sends a third of the entries through the long-row blocks).
constexpr int64_t kLongRow = kGarLongRow;  // 4096
// Long-row blocks per SM (launched first, so scheduled first); block b of LB takes entries b, b +
// LB, b + 2 LB, ... of the graph's long-row list, or without one scans rows b, b + LB, ... for long
// rows (spans of consecutive rows gave a degree-ordered store's 1562 long rows, 12M entries, all
// to the first block). The heaviest of them should not outlast its tile: on R-MAT 21 in Graph500
// order, GAR scanning at width 256 took 11.05 / 10.99 / 10.77 / 10.70 ms with 4 / 6 / 10 / 16 per
// SM (H100; spans of 2 per SM, before: 10.45). With the list instead of the scan, same run (H100):
// 1.307 / 2.603 / 5.330 / 10.794 ms against 1.348 / 2.741 / 5.491 / 11.100 at widths 32 / 64 /
// 128 / 256 (a rerun in the other order: 5.380 / 10.873 against 5.367 / 11.076 at 128 / 256).
#ifndef GALE_GAR_LONG_PER_SM
#define GALE_GAR_LONG_PER_SM 16
#endif
constexpr int kLongBlocksPerSm = GALE_GAR_LONG_PER_SM;
// A regular GAR block's rows: chunks of kChunkRows consecutive rows, block j of nb taking chunks j,
// j + nb, j + 2 nb, ... Contiguous spans of kBlock rows give the first blocks all the heavy rows of
// a degree-ordered store (R-MAT 21 relabelled by degree: 526K entries in the heaviest block against
// 6.3K on average; with the long rows, GAR took 46.8 ms there at width 256, 3.5x cuSPARSE's time,
// and 10.5 ms interleaved). Interleaved by 16 rows the heaviest block holds 36K entries on that
// store and 17K on the Graph500-ordered one, as contiguous spans do; chunks of 16 rows keep the
// indptr and index reads of short rows contiguous. Measured at width 256 (H100), 6 long-row blocks
// per SM: 256 / 16 rows 10.84 / 10.99 ms on the Graph500 order, 13.26 / 10.50 on the degree order;
// 2 per SM, Graph500 order: 256 / 8 / 4 / 1 rows 10.78 / 11.07 / 11.18 / 11.48.
//
// A graph whose 256-row spans are all light enough (gar_chunk_rows_for: none above 16 times the
// mean) takes chunks of 256 instead (SpmmArgs::gar_chunk_rows), so a block's rows are consecutive
// and share their sources in L1 where the graph's order puts neighbours together. Same run (H100,
// ms at width 64 / 128 / 256, chunks of 16 -> 256): a 500K-node SBM numbered class by class 0.662 /
// 1.293 / 2.543 -> 0.600 / 1.180 / 2.319, the 2M-node one 2.881 / 5.739 / 11.535 -> 2.563 / 5.169 /
// 10.385, R-MAT 21 in the Graph500 order 2.613 / 5.259 / 10.727 -> 2.568 / 5.126 / 10.566; R-MAT 21
// in degree order (where the rule keeps 16) 2.594 / 5.248 / 10.606 -> 3.961 / 6.981 / 13.283.
constexpr int kChunkRows = 16;     // the default chunk
constexpr int kSpanRows = kBlock;  // the chunk of graphs without heavy spans
static_assert(kBlock % kChunkRows == 0 && kBlock % kSpanRows == 0, "a block's row table holds whole chunks");
// Entries per GAS chunk: enough that the binary search for the chunk's first row (log2(rows)
// dependent loads) is amortised over many gathers, small enough for ~16 chunks per SM lane group
// on a graph of a million entries.
constexpr int64_t kGasChunk = 128;

struct Params {
  int64_t rows = 0;
  int64_t width = 0;
  const int64_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  const float* x = nullptr;
  int64_t x_ld = 0;
  float* out = nullptr;
  int64_t out_ld = 0;
  const float* row_scale = nullptr;
  const float* col_scale = nullptr;
  const float* edge_weight = nullptr;
  const float* self_coefs = nullptr;
  float self_scale = 0.0f;
  int64_t self_rows = 0;  // rows that have a self term: min(rows, x.rows)
  const float* bias = nullptr;
  bool accumulate = false;
  bool relu = false;
  // SpmmArgs::out_mask (GAR only). A launch over a column range starts the rows' words at the
  // range's first column, a multiple of 32 (launch_gar_columns).
  const uint32_t* out_mask = nullptr;
  int64_t mask_words = 0;
  const int64_t* long_list = nullptr;  // GAR's long rows, listed (SpmmArgs::long_rows), or null
  const int64_t* long_count = nullptr;
  int64_t long_capacity = 0;
  int chunk_shift = 4;  // log2 of GAR's chunk rows (SpmmArgs::gar_chunk_rows)
};

// ---- element helpers: one float or one float4 (the rest in cuda/warp.cuh) -------------------

// The float and float4 ones of cuda/warp.cuh, overloaded below for GAR's wider lanes.
using kernels::fma_to;
using kernels::load_ro;
using kernels::load_rw;
using kernels::set_zero;
using kernels::store;

// Output rows are written once and not read again by this launch: evict-first stores keep them
// from pushing the hot (high-degree) source rows of x out of L2, which is where a power-law
// graph's gathers hit.
__device__ __forceinline__ void store_streaming(float* p, const float& v) { __stcs(p, v); }
__device__ __forceinline__ void store_streaming(float* p, const float4& v) { __stcs(reinterpret_cast<float4*>(p), v); }

__device__ __forceinline__ void scale(float& a, float s) { a *= s; }
__device__ __forceinline__ void scale(float4& a, float s) {
  a.x *= s;
  a.y *= s;
  a.z *= s;
  a.w *= s;
}
__device__ __forceinline__ void relu_in_place(float& a) { a = fmaxf(a, 0.0f); }
__device__ __forceinline__ void relu_in_place(float4& a) {
  a.x = fmaxf(a.x, 0.0f);
  a.y = fmaxf(a.y, 0.0f);
  a.z = fmaxf(a.z, 0.0f);
  a.w = fmaxf(a.w, 0.0f);
}
// Floats a lane holds of a GAR tile: one, four, or a wide type's (below).
template <typename T>
__host__ __device__ constexpr int lane_floats() {
  return sizeof(T) / sizeof(float);
}

// The lanes of GAR's 48-float tile for widths of 41-48 (the narrowing layers' 47 classes in rows
// padded to 48), which 32-float tiles took in two passes over the entries, each reading every index
// and coefficient and shuffling them to its lanes: a float4 and a float2 a lane, eight lanes a
// group, lane g holding columns 4g .. 4g + 3 (one 128-byte request for the group) and 32 + 2g,
// 33 + 2g (one of 64 bytes). Three float4 a lane 16 floats apart, four lanes a group (three 64-byte
// requests), measured slower: see gar_blocks_per_sm.
struct Float6 {
  float4 a;
  float2 b;
};
template <>
__host__ __device__ constexpr int lane_floats<Float6>() {
  return 6;
}
__device__ __forceinline__ void set_zero(float2& a) { a = make_float2(0.0f, 0.0f); }
__device__ __forceinline__ void fma_to(float2& a, float w, const float2& v) {
  a.x = fmaf(w, v.x, a.x);
  a.y = fmaf(w, v.y, a.y);
}
__device__ __forceinline__ void load_ro(float2& v, const float* p) { v = __ldg(reinterpret_cast<const float2*>(p)); }
__device__ __forceinline__ void store(float* p, const float2& v) { *reinterpret_cast<float2*>(p) = v; }
__device__ __forceinline__ void set_zero(Float6& a) {
  set_zero(a.a);
  set_zero(a.b);
}
__device__ __forceinline__ void fma_to(Float6& a, float w, const Float6& v) {
  fma_to(a.a, w, v.a);
  fma_to(a.b, w, v.b);
}

// Where lane g's values of a tile sit: kParts pieces, piece j at tile column at(j, g). The shared
// row buffers keep the tile's columns in order, so the epilogue reads them the same way whatever
// the layout.
template <typename T>
struct Layout {
  static constexpr int kParts = 1;
  static constexpr __device__ int at(int, int g) { return g * lane_floats<T>(); }
};
template <>
struct Layout<Float6> {
  static constexpr int kParts = 2;
  static constexpr __device__ int at(int j, int g) { return j == 0 ? 4 * g : 32 + 2 * g; }
};
// Lane g's source columns for one tile, each piece past the width moved to the tile's first column
// (its loads repeat lane 0's within the same request: no extra sectors, no branch, and a sum that
// is never stored).
template <typename T>
struct LaneCols {
  int64_t at[Layout<T>::kParts];
};
template <typename T>
__device__ __forceinline__ LaneCols<T> lane_cols(int64_t col0, int g, int64_t width) {
  LaneCols<T> c;
#pragma unroll
  for (int j = 0; j < Layout<T>::kParts; ++j) {
    const int64_t col = col0 + Layout<T>::at(j, g);
    c.at[j] = col < width ? col : col0;
  }
  return c;
}
// Gathers lane's pieces of the source row at `row`.
template <typename T>
__device__ __forceinline__ void gather(T& v, const float* row, const LaneCols<T>& c) {
  load_ro(v, row + c.at[0]);
}
__device__ __forceinline__ void gather(Float6& v, const float* row, const LaneCols<Float6>& c) {
  load_ro(v.a, row + c.at[0]);
  load_ro(v.b, row + c.at[1]);
}
// Stores lane g's sums into a shared row of the tile (columns in order).
template <typename T>
__device__ __forceinline__ void store_lane(float* tile, int g, const T& v) {
  store(tile + Layout<T>::at(0, g), v);
}
__device__ __forceinline__ void store_lane(float* tile, int g, const Float6& v) {
  store(tile + Layout<Float6>::at(0, g), v.a);
  store(tile + Layout<Float6>::at(1, g), v.b);
}

// The epilogue's first terms for one element (or four) of row r: rs * sum + self * x[r].
template <typename T>
__device__ __forceinline__ void scale_and_add_self(const Params& p, int64_t r, int64_t col, T& v) {
  scale(v, p.row_scale ? p.row_scale[r] : 1.0f);
  if (r < p.self_rows) {
    const float self = p.self_scale + (p.self_coefs ? p.self_coefs[r] : 0.0f);
    if (self != 0.0f) {
      T xs;
      load_ro(xs, p.x + r * p.x_ld + col);
      fma_to(v, self, xs);
    }
  }
}

// The output mask's bits of row r from column col up, bit 0 first (SpmmArgs::out_mask): all set
// without a mask. A float4's four columns start at a multiple of 4, so they sit in one word.
__device__ __forceinline__ uint32_t mask_bits(const Params& p, int64_t r, int64_t col) {
  if (p.out_mask == nullptr) return ~0u;
  return __ldg(p.out_mask + r * p.mask_words + col / 32) >> (col % 32);
}
// ReLU's backward by the mask's bits: a selection, not a product, so a cleared bit gives 0 whatever
// the value (as relu_backward_mask does).
__device__ __forceinline__ void apply_mask(float& a, uint32_t bits) { a = bits & 1u ? a : 0.0f; }
__device__ __forceinline__ void apply_mask(float4& a, uint32_t bits) {
  a.x = bits & 1u ? a.x : 0.0f;
  a.y = bits & 2u ? a.y : 0.0f;
  a.z = bits & 4u ? a.z : 0.0f;
  a.w = bits & 8u ? a.w : 0.0f;
}

// The epilogue of spmm.hpp for one element (or four): out = relu?(rs * sum + self * x[r] +
// (accumulate ? out : 0) + bias), in the CPU reference's order of additions, then the output mask.
template <typename T>
__device__ __forceinline__ void finish(const Params& p, int64_t r, int64_t col, T v) {
  scale_and_add_self(p, r, col, v);
  float* o = p.out + r * p.out_ld + col;
  if (p.accumulate) {
    T prev;
    load_rw(prev, o);
    add_to(v, prev);
  }
  if (p.bias) {
    T b;
    load_ro(b, p.bias + col);
    add_to(v, b);
  }
  if (p.relu) relu_in_place(v);
  if (p.out_mask) apply_mask(v, mask_bits(p, r, col));
  store_streaming(o, v);
}

// The epilogue for four columns from col whose output rows are not 16-byte aligned (a dense output
// of odd width gathered from x in 16-byte rows): the row scale and the self term on the four at
// once (x's rows are aligned), then the accumulated value, the bias, ReLU and the store one column
// at a time, dropping the columns past the width. The same additions in the same order as finish.
__device__ __forceinline__ void finish_scalar_stores(const Params& p, int64_t r, int64_t col, float4 v) {
  scale_and_add_self(p, r, col, v);
  float* o = p.out + r * p.out_ld + col;
  const float e[4] = {v.x, v.y, v.z, v.w};
  const uint32_t bits = mask_bits(p, r, col);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (col + j >= p.width) break;
    float a = e[j];
    if (p.accumulate) a += o[j];
    if (p.bias) a += __ldg(p.bias + col + j);
    if (p.relu) a = fmaxf(a, 0.0f);
    apply_mask(a, bits >> j);
    store_streaming(o + j, a);
  }
}

// Coefficient of entry e (column c): col_scale[c] * edge_weight[e], either optional.
__device__ __forceinline__ float coefficient(const Params& p, int64_t e, int32_t c) {
  float w = p.edge_weight ? __ldcs(p.edge_weight + e) : 1.0f;
  if (p.col_scale) w *= __ldg(p.col_scale + c);
  return w;
}

// Gathers issued back to back before the first FMA needs one: up to 64 registers of loads in
// flight per lane (16 float4, or 16 floats per column slot), which memory-bound gathers need to
// cover DRAM latency, within a group's G entries per piece.
template <typename T, int G, int VPT>
__host__ __device__ constexpr int unroll() {
  constexpr int K = lane_floats<T>();
  constexpr int by_registers = 64 / (VPT * K) < 16 ? 64 / (VPT * K) : 16;
  return G < by_registers ? G : by_registers;
}

// ---- GAR ------------------------------------------------------------------------------------
//
// A regular GAR block takes kBlock rows (chunks of kChunkRows, interleaved) and one column tile of
// kTile = G * K floats (G lanes per group, K floats per lane: 8 lanes of float4 for the 32-float
// tile). One group per row wastes most of a block on power-law rows, since the block lasts as long
// as its longest row: on R-MAT scale 21 that ran the gathers at ~2.2 TB/s. So the block first
// counts its rows' entries (one thread per row, a block-wide prefix sum into vstart), then cuts the
// concatenated entries into equal ranges, one per group (merge-path inside the block). A group
// walks its range in pieces (piece_entries) with one running sum and, when the row changes, stores
// the sum into the block's shared row buffer: one shared store, cheap even when every entry ends a
// row, where a direct epilogue there would run once per group, divergent. The row that a group's
// range starts in the middle of goes to the group's slot instead. After a barrier the block writes
// its rows: buffer row plus the slots of the later groups the row ran into, in group order, then
// the epilogue, with coalesced stores.
//
// Rows above kLongRow entries (hubs: up to 1e5 entries on R-MAT scale 21) would still make their
// block a straggler; the grid's first blocks (dispatched first) each take every LB-th of them
// (from the graph's list, or scanning every LB-th row) and cut every long row over all their
// groups, reducing the group sums in shared memory in a fixed order. (Cutting a long row over
// several blocks by 8-float sub-tiles was tried and lost: 32-byte gathers of the same lines at
// different times doubled DRAM reads on the hubs.)

// Per-lane entries of one piece: a piece is piece_entries consecutive entries of a group's range;
// lane g holds entries g, g + G, ... (H of them). row = index in the block's row table, -1 past
// the range (then col = 0, a valid row to load, and w = 0).
template <int H>
struct Held {
  int32_t col[H];
  float w[H];
  int32_t row[H];
};

// Entries per piece: 32 floats of gathered values in flight per lane (8 float4 or 32 floats),
// at least one entry per lane and at most four (each lane holds its entries' index, weight and row
// for this piece and the next).
template <typename T, int G>
__host__ __device__ constexpr int piece_entries() {
  constexpr int by_registers = 32 / lane_floats<T>();
  constexpr int p = G > by_registers ? G : by_registers;
  return p < 4 * G ? p : 4 * G;
}

// Loads the lane's entries of the piece starting at virtual entry s of a range ending at ve.
// Virtual entry v of the block is entry rbeg[i] + (v - vstart[i]) of row i, where i is the last
// row with vstart[i] <= v (rows without entries share their successor's vstart and are skipped).
// `lo` is the lane's search hint: a row with vstart[lo] <= every later v.
template <int G, int H>
__device__ __forceinline__ void load_piece(const Params& p, const int32_t* vstart, const int64_t* rbeg, int rows,
                                           int64_t s, int64_t ve, int g, int& lo, Held<H>& h) {
#pragma unroll
  for (int k = 0; k < H; ++k) {
    const int64_t v = s + g + static_cast<int64_t>(k) * G;
    h.col[k] = 0;
    h.w[k] = 0.0f;
    h.row[k] = -1;
    if (v < ve) {
      if (vstart[lo + 1] <= v) {  // not in the row of the lane's previous entry: search
        int b = rows;             // invariant: vstart[lo] <= v < vstart[b]
        ++lo;
        while (b - lo > 1) {
          const int m = (lo + b) >> 1;
          if (vstart[m] <= v) lo = m; else b = m;
        }
      }
      const int i = lo;
      const int64_t e = rbeg[i] + (v - vstart[i]);
      h.col[k] = __ldcs(p.indices + e);
      h.w[k] = coefficient(p, e, h.col[k]);
      h.row[k] = i;
    }
  }
}

// Walks the group's virtual range [vb, ve) for lane g's columns `lc` of the tile (lane_cols). Calls
// flush(row, acc) whenever a row's entries in this range are summed up (row changes, or the range
// ends). Every lane of the warp must call this together (full-mask shuffles): the loop runs
// to the warp's largest piece count; groups past their range load row 0 and add nothing.
template <typename T, int G, typename Flush>
__device__ __forceinline__ void walk(const Params& p, const int32_t* vstart, const int64_t* rbeg, int rows,
                                     int64_t vb, int64_t ve, int g, const LaneCols<T>& lc, Flush&& flush) {
  constexpr int P = piece_entries<T, G>();
  constexpr int H = P / G;
  const int64_t trips = warp_max(static_cast<int>((ve - vb + P - 1) / P));
  int lo = 0;
  Held<H> cur;
  load_piece<G, H>(p, vstart, rbeg, rows, vb, ve, g, lo, cur);
  int row = -1;
  T acc;
  set_zero(acc);
  for (int64_t t = 0; t < trips; ++t) {
    // All P gathers go out before the first one is needed.
    T v[P];
#pragma unroll
    for (int u = 0; u < P; ++u) {
      const int c = __shfl_sync(kFull, cur.col[u / G], u % G, G);
      gather(v[u], p.x + static_cast<int64_t>(c) * p.x_ld, lc);
    }
    // The next piece's indices and weights are read while the gathers are in flight.
    Held<H> next;
    load_piece<G, H>(p, vstart, rbeg, rows, vb + (t + 1) * P, ve, g, lo, next);
#pragma unroll
    for (int u = 0; u < P; ++u) {
      const float w = __shfl_sync(kFull, cur.w[u / G], u % G, G);
      const int r = __shfl_sync(kFull, cur.row[u / G], u % G, G);
      if (r != row) {  // uniform within the group
        if (row >= 0) flush(row, acc);
        row = r;
        set_zero(acc);
      }
      if (r >= 0) fma_to(acc, w, v[u]);  // predicated: a NaN in row 0 cannot leak into other rows
    }
    cur = next;
  }
  if (row >= 0) flush(row, acc);
}

// GAR blocks resident per SM: the register cap of 64 per thread keeps four blocks of 256 threads,
// 128 KB of gathers in flight per SM (8 pieces of 16 bytes per lane), for the L2's latency under
// load; measured 7% faster than three blocks at ~75 registers (a 16-byte spill is the price).
// The 48-float tile (Float6) keeps 8 gathers of 24 bytes in flight a lane and a 58 KB block: two
// blocks an SM (112 registers). Measured on R-MAT scale 21 (H100, two runs, `gale bench spmm --dims
// 48`, x and out in rows of 48, against 2.845 ms for the 32-float tile and its partial one):
// 2.385-2.389 ms with two blocks, 2.659-2.666 with three (80 registers, a 32-byte spill); three
// float4 a lane, four lanes a group, 2.681-2.688 with two blocks and 3.340-3.353 with three. In
// training (dense 47-wide outputs, finish_scalar_stores) two blocks too: SAGE 3x256's two width-47
// calls 2.79-2.80 + 2.71-2.72 ms an epoch against 2.91 + 2.94 with three.
template <typename T>
constexpr int gar_blocks_per_sm() {
  return lane_floats<T>() > 4 ? 2 : 4;
}

// Shared memory of a GAR block. The regular path keeps its row table (vstart, rbeg; rbeg = -1 marks
// a long row) and, in buf, each row's sum from the group its entries start in (kBlock rows x kTile
// floats) followed by one slot per group for the partial sum of a row that began in an earlier
// group's range. The long path reuses buf for its per-group sums.
template <typename T, int G>
struct GarShared {
  static constexpr int K = lane_floats<T>();
  static constexpr int kTile = G * K;
  int32_t vstart[kBlock + 1];
  int64_t rbeg[kBlock];
  __align__(16) float buf[kBlock * kTile + kBlock * K];
};

// Sums entries [vb, ve) of one row (entry numbers relative to `begin`) for lane g's columns lc, in
// pieces of P entries as walk() does, without rows to track. Every lane of the warp calls
// this together; past ve a lane loads row 0 and adds nothing.
template <typename T, int G>
__device__ __forceinline__ T sum_range(const Params& p, int64_t begin, int64_t vb, int64_t ve, int g,
                                       const LaneCols<T>& lc) {
  constexpr int P = piece_entries<T, G>();
  constexpr int H = P / G;
  const int64_t trips = warp_max(static_cast<int>((ve - vb + P - 1) / P));
  int32_t next[H];
#pragma unroll
  for (int k = 0; k < H; ++k) {
    const int64_t v = vb + g + k * G;
    next[k] = v < ve ? __ldcs(p.indices + begin + v) : 0;
  }
  T acc;
  set_zero(acc);
  for (int64_t t = 0; t < trips; ++t) {
    const int64_t s = vb + t * P;
    int32_t cols[H];
#pragma unroll
    for (int k = 0; k < H; ++k) cols[k] = next[k];
    T v[P];
#pragma unroll
    for (int u = 0; u < P; ++u) {
      const int c = __shfl_sync(kFull, cols[u / G], u % G, G);
      gather(v[u], p.x + static_cast<int64_t>(c) * p.x_ld, lc);
    }
    float w[H];
#pragma unroll
    for (int k = 0; k < H; ++k) {
      const int64_t e = s + g + k * G;
      w[k] = e < ve ? coefficient(p, begin + e, cols[k]) : 0.0f;
      next[k] = e + P < ve ? __ldcs(p.indices + begin + e + P) : 0;
    }
#pragma unroll
    for (int u = 0; u < P; ++u) {
      const float wu = __shfl_sync(kFull, w[u / G], u % G, G);
      if (s + u < ve) fma_to(acc, wu, v[u]);  // uniform within the group
    }
  }
  return acc;
}

// One long row r for the tile at col0: entries split evenly over the block's groups, the group
// sums reduced in two fixed-order passes, then the epilogue.
template <typename T, int G>
__device__ void long_row(const Params& p, int64_t r, int64_t col0, GarShared<T, G>& sh) {
  constexpr int K = lane_floats<T>();
  constexpr int kTile = G * K;
  constexpr int kGroups = kBlock / G;
  constexpr int kParts = kBlock / kTile;  // first-pass partial sums per column
  const int g = threadIdx.x & (G - 1);
  const int q = threadIdx.x / G;
  const int64_t begin = p.indptr[r];
  const int64_t n = p.indptr[r + 1] - begin;
  float* part = sh.buf;
  const T sum = sum_range<T, G>(p, begin, n * q / kGroups, n * (q + 1) / kGroups, g, lane_cols<T>(col0, g, p.width));
  store_lane(part + q * kTile, g, sum);
  __syncthreads();
  {
    const int i = threadIdx.x % kTile, j = threadIdx.x / kTile;
    if (j < kParts) {  // a tile of 48 leaves the last 16 threads out
      float s = 0.0f;
      for (int qq = j; qq < kGroups; qq += kParts) s += part[qq * kTile + i];
      part[kGroups * kTile + j * kTile + i] = s;
    }
  }
  __syncthreads();
  if (threadIdx.x < kTile && col0 + threadIdx.x < p.width) {
    float s = 0.0f;
    for (int j = 0; j < kParts; ++j) s += part[kGroups * kTile + j * kTile + threadIdx.x];
    finish<float>(p, r, col0 + threadIdx.x, s);
  }
  __syncthreads();  // part is reused by the next long row
}

// Largest group q of n over `total` entries whose range [total * q / n, ...) starts at or before v.
__device__ __forceinline__ int group_of(int64_t v, int64_t total, int n) {
  return static_cast<int>(((v + 1) * n + total - 1) / total) - 1;
}

// Row i of regular block j of `blocks` in chunks of 2^shift rows (see kChunkRows); past p.rows for
// the last chunks' tails.
__device__ __forceinline__ int64_t block_row(int64_t j, int64_t blocks, int i, int shift) {
  return ((j + blocks * (i >> shift)) << shift) + (i & ((1 << shift) - 1));
}

// The regular path for regular block j's rows (block_row) and the tile at col0.
template <typename T, int G, bool kVecOut>
__device__ void span_rows(const Params& p, int64_t j, int64_t blocks, int64_t col0, GarShared<T, G>& sh) {
  constexpr int K = lane_floats<T>();
  constexpr int kTile = G * K;
  constexpr int kGroups = kBlock / G;
  const int g = threadIdx.x & (G - 1);
  const int q = threadIdx.x / G;
  float* rowbuf = sh.buf;
  float* slots = sh.buf + kBlock * kTile;
  // Count: one thread per row; long rows count as empty here (their blocks write them), and so do
  // the rows past p.rows that end the table (rbeg -1: the epilogue skips both).
  const int64_t r = block_row(j, blocks, threadIdx.x, p.chunk_shift);
  int32_t count = 0;
  sh.rbeg[threadIdx.x] = -1;
  if (r < p.rows) {
    const int64_t b = p.indptr[r], e = p.indptr[r + 1];
    const bool is_long = e - b > kLongRow;
    if (!is_long) {
      sh.rbeg[threadIdx.x] = b;
      count = static_cast<int32_t>(e - b);
    }
  }
  // Block-wide exclusive prefix sum of the counts into vstart.
  __shared__ int32_t warp_total[kBlock / kWarp];
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  int32_t incl = count;
#pragma unroll
  for (int o = 1; o < kWarp; o *= 2) {
    const int32_t y = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == kWarp - 1) warp_total[warp] = incl;
  __syncthreads();
  int32_t before = 0, total = 0;
  for (int w = 0; w < kBlock / kWarp; ++w) {
    if (w < warp) before += warp_total[w];
    total += warp_total[w];
  }
  sh.vstart[threadIdx.x] = before + incl - count;
  if (threadIdx.x == 0) sh.vstart[kBlock] = total;
  __syncthreads();
  // Rows past p.rows have count 0 and vstart == total: a search below total never lands on them.
  constexpr int rows = kBlock;
  const int64_t vb = static_cast<int64_t>(total) * q / kGroups;
  const int64_t ve = static_cast<int64_t>(total) * (q + 1) / kGroups;
  // The row holding the group's first entry, when it began in an earlier group's range: its sum
  // goes to the group's slot; every other row's to its row of the buffer. (The search is the
  // same for every lane of the group.)
  int straddler = -1;
  if (vb < ve) {
    int lo = 0, hi = rows;
    while (hi - lo > 1) {
      const int m = (lo + hi) >> 1;
      if (sh.vstart[m] <= vb) lo = m; else hi = m;
    }
    if (sh.vstart[lo] < vb) straddler = lo;
  }
  walk<T, G>(p, sh.vstart, sh.rbeg, rows, vb, ve, g, lane_cols<T>(col0, g, p.width), [&](int i, const T& acc) {
    store_lane(i == straddler ? slots + q * kTile : rowbuf + i * kTile, g, acc);
  });
  __syncthreads();
  // The epilogue over the block's rows, KO floats a thread (four with float4 gathers, stored one
  // at a time when the output rows are not 16-byte aligned: a padded x into a dense output of odd
  // width; else one): a row's sum is its buffer row plus the slots of the later groups its entries
  // run into, added in group order (deterministic, and the same additions whatever KO is).
  using TO = std::conditional_t<(lane_floats<T>() >= 4), float4, float>;
  constexpr int KO = sizeof(TO) / sizeof(float);
  constexpr int kVectors = kTile / KO;
  for (int it = threadIdx.x; it < rows * kVectors; it += kBlock) {
    const int i = it / kVectors;
    const int64_t col = col0 + static_cast<int64_t>(it % kVectors) * KO;
    if (col >= p.width || sh.rbeg[i] < 0) continue;  // past the width, or a long row
    const int32_t a = sh.vstart[i], b = sh.vstart[i + 1];
    TO sum;
    set_zero(sum);
    if (b > a) {
      load_rw(sum, rowbuf + i * kTile + (it % kVectors) * KO);
      for (int qq = group_of(a, total, kGroups) + 1; qq < kGroups; ++qq) {
        const int64_t qb = static_cast<int64_t>(total) * qq / kGroups;
        if (qb >= b) break;
        if (static_cast<int64_t>(total) * (qq + 1) / kGroups == qb) continue;  // an empty range
        TO y;
        load_rw(y, slots + qq * kTile + (it % kVectors) * KO);
        add_to(sum, y);
      }
    }
    if constexpr (kVecOut || KO == 1) {
      finish<TO>(p, block_row(j, blocks, i, p.chunk_shift), col, sum);
    } else {
      finish_scalar_stores(p, block_row(j, blocks, i, p.chunk_shift), col, sum);
    }
  }
  __syncthreads();  // shared memory is reused by the next tile
}

// The long-row blocks' part of gar_kernel. With the graph's list (SpmmArgs::long_rows) block b of
// `scanners` takes its entries b, b + scanners, ...; without, it scans rows b, b + scanners, ...
// for rows above the threshold. Either way it writes them for the tiles at col0, col0 + tile_step,
// ... (Spans of consecutive rows gave a degree-ordered store's 1562 long rows, 12M entries, all to
// the first block.)
template <typename T, int G>
__device__ __forceinline__ void long_rows(const Params& p, int64_t b, int64_t scanners, int64_t col0, int64_t tile_step,
                                          GarShared<T, G>& sh) {
  if (p.long_list != nullptr) {
    const int64_t listed = min(*p.long_count, p.long_capacity);
    for (; col0 < p.width; col0 += tile_step)
      for (int64_t i = b; i < listed; i += scanners) long_row<T, G>(p, p.long_list[i], col0, sh);
    return;
  }
  __shared__ unsigned long_mask[kBlock / kWarp];
  const int64_t mine = (p.rows - b + scanners - 1) / scanners;  // rows b + m * scanners, m < mine
  for (; col0 < p.width; col0 += tile_step) {
    for (int64_t base = 0; base < mine; base += kBlock) {
      const int64_t m = base + threadIdx.x;
      const int64_t r = b + m * scanners;
      const bool is_long = m < mine && p.indptr[r + 1] - p.indptr[r] > kLongRow;
      const unsigned mask = __ballot_sync(kFull, is_long);
      if ((threadIdx.x & (kWarp - 1)) == 0) long_mask[threadIdx.x / kWarp] = mask;
      __syncthreads();
      for (int w = 0; w < kBlock / kWarp; ++w) {
        for (unsigned bits = long_mask[w]; bits != 0; bits &= bits - 1)
          long_row<T, G>(p, b + (base + w * kWarp + __ffs(bits) - 1) * scanners, col0, sh);
      }
      __syncthreads();  // long_mask is rewritten next round
    }
  }
}

// GAR. The grid is (blocks, column tiles): blockIdx.y picks the tile of kTile columns, and since
// blocks are dispatched x-fastest, one tile of every row is done before the next tile starts.
// While a tile is in flight the L2 only has to hold the hot source rows' kTile-column slices
// (128 bytes at kTile = 32), so far more of them stay resident than whole rows would, and each
// DRAM fetch of a source slice is reused more. Blocks [0, scanners) take the long rows (long_rows;
// starting every tile's long rows with the kernel instead measured 13% slower on R-MAT 21 at width
// 256: the L2 then holds all tiles' slices at once); the others take kBlock rows each, interleaved
// by chunks (block_row, span_rows).
template <typename T, int G, bool kVecOut>
__global__ void __launch_bounds__(kBlock, gar_blocks_per_sm<T>()) gar_kernel(Params p, int64_t scanners) {
  constexpr int kTile = G * lane_floats<T>();
  // Dynamic: the 48-float tile's buffers pass the 48 KB of static shared memory.
  extern __shared__ __align__(16) unsigned char gar_shared[];
  GarShared<T, G>& sh = *reinterpret_cast<GarShared<T, G>*>(gar_shared);
  const int64_t tile_step = static_cast<int64_t>(gridDim.y) * kTile;
  if (blockIdx.x < scanners) {
    long_rows<T, G>(p, blockIdx.x, scanners, blockIdx.y * int64_t{kTile}, tile_step, sh);
    return;
  }
  const int64_t j = static_cast<int64_t>(blockIdx.x) - scanners, blocks = gridDim.x - scanners;
  for (int64_t col0 = blockIdx.y * int64_t{kTile}; col0 < p.width; col0 += tile_step)
    span_rows<T, G, kVecOut>(p, j, blocks, col0, sh);
}

// GAS pre-pass: out = (accumulate ? out : 0) + self term + bias; the scatter adds the rest.
__global__ void gas_init_kernel(Params p) {
  const int64_t total = p.rows * p.width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / p.width;
    const int64_t col = i - r * p.width;
    float* o = p.out + r * p.out_ld + col;
    float v = p.accumulate ? *o : 0.0f;
    if (r < p.self_rows) {
      const float self = p.self_scale + (p.self_coefs ? p.self_coefs[r] : 0.0f);
      if (self != 0.0f) v = fmaf(self, p.x[r * p.x_ld + col], v);
    }
    if (p.bias) v += p.bias[col];
    *o = v;
  }
}

__global__ void relu_kernel(Params p) {
  const int64_t total = p.rows * p.width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / p.width;
    float* o = p.out + r * p.out_ld + (i - r * p.width);
    *o = fmaxf(*o, 0.0f);
  }
}

// Row r with indptr[r] <= e < indptr[r + 1] (the last of equal offsets, so empty rows are skipped).
__device__ __forceinline__ int64_t row_of(const int64_t* indptr, int64_t rows, int64_t e) {
  int64_t lo = 0, hi = rows;  // invariant: indptr[lo] <= e < indptr[hi]
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (indptr[mid] <= e) lo = mid; else hi = mid;
  }
  return lo;
}

// Adds rs * acc into out[r] with atomics and clears acc.
template <typename T, int G, int VPT>
__device__ __forceinline__ void scatter(const Params& p, int64_t r, int64_t col0, int g, T (&acc)[VPT]) {
  constexpr int K = lane_floats<T>();
  const float rs = p.row_scale ? p.row_scale[r] : 1.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t col = col0 + static_cast<int64_t>(k * G + g) * K;
    if (col < p.width) {
      scale(acc[k], rs);
      atomic_add(p.out + r * p.out_ld + col, acc[k]);
    }
    set_zero(acc[k]);
  }
}

// GAS scatter: a persistent grid; group q takes chunks q, q + groups, ... of kGasChunk entries.
template <typename T, int G, int VPT>
__global__ void __launch_bounds__(kBlock) gas_kernel(Params p) {
  constexpr int K = lane_floats<T>();
  constexpr int kTile = G * VPT * K;
  constexpr int kGroups = kBlock / G;
  constexpr int kUnroll = unroll<T, G, VPT>();
  const int g = threadIdx.x & (G - 1);
  const int64_t group = static_cast<int64_t>(blockIdx.x) * kGroups + threadIdx.x / G;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kGroups;
  const int64_t e_begin = p.indptr[0];
  const int64_t e_end = p.indptr[p.rows];
  const int64_t chunks = (e_end - e_begin + kGasChunk - 1) / kGasChunk;
  const int64_t warp_first = group - threadIdx.x % kWarp / G;  // the warp's first group
  for (int64_t col0 = 0; col0 < p.width; col0 += kTile) {
    int64_t lane_off[VPT];
    bool lane_cols[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      lane_off[k] = col0 + static_cast<int64_t>(k * G + g) * K;
      lane_cols[k] = lane_off[k] < p.width;
      if (!lane_cols[k]) lane_off[k] = 0;
    }
    // Every lane of a warp loops while any group of the warp has a chunk (shuffle convergence).
    for (int64_t q = group, qw = warp_first; qw < chunks; q += groups, qw += groups) {
      const int64_t cb = q < chunks ? e_begin + q * kGasChunk : e_end;
      const int64_t ce = q < chunks ? min(e_end, cb + kGasChunk) : e_end;
      int64_t r = 0, next = 0;
      if (cb < ce) {
        r = row_of(p.indptr, p.rows, cb);
        next = p.indptr[r + 1];
      }
      T acc[VPT];
#pragma unroll
      for (int k = 0; k < VPT; ++k) set_zero(acc[k]);
      for (int64_t s = cb; warp_max(static_cast<int>(ce - s > 0 ? 1 : 0)) != 0; s += G) {
        const int n = static_cast<int>(max(int64_t{0}, min(static_cast<int64_t>(G), ce - s)));
        int32_t c = 0;
        float w = 0.0f;
        if (g < n) {
          c = __ldcs(p.indices + s + g);
          w = coefficient(p, s + g, c);
        }
        const int nmax = warp_max(n);
        for (int j0 = 0; j0 < nmax; j0 += kUnroll) {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            const int j = j0 + u;
            const int cj = __shfl_sync(kFull, c, j & (G - 1), G);
            const float wj = __shfl_sync(kFull, w, j & (G - 1), G);
            // Unconditional loads, predicated sums: as in gather().
            const float* xr = p.x + static_cast<int64_t>(cj) * p.x_ld;
            T v[VPT];
#pragma unroll
            for (int k = 0; k < VPT; ++k) load_ro(v[k], xr + lane_off[k]);
            if (j < n) {
              const int64_t e = s + j;
              if (e >= next) {  // the row ended: scatter its sum, move to the row holding e
                scatter<T, G, VPT>(p, r, col0, g, acc);
                do {
                  ++r;
                  next = p.indptr[r + 1];
                } while (e >= next);
              }
#pragma unroll
              for (int k = 0; k < VPT; ++k)
                if (lane_cols[k]) fma_to(acc[k], wj, v[k]);
            }
          }
        }
      }
      if (cb < ce) scatter<T, G, VPT>(p, r, col0, g, acc);
    }
  }
}

// ---- memory-aware (FastGL) ----------------------------------------------------------------------

constexpr int kMaRows = 16;                   // destination rows per block: two per warp
constexpr int kMaEntries = 1024;              // entries staged at once (8 KB)
constexpr int kMaCols = 256;                  // partial-sum columns per pass (16 KB)

template <typename T>
__global__ void __launch_bounds__(kBlock) memory_aware_kernel(Params p) {
  constexpr int K = lane_floats<T>();
  __shared__ int32_t s_col[kMaEntries];
  __shared__ float s_coef[kMaEntries];
  __shared__ __align__(16) float s_sum[kMaRows * kMaCols];
  __shared__ int64_t s_ptr[kMaRows + 1];
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kMaRows;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kMaRows), p.rows - row0));
  if (threadIdx.x <= rows) s_ptr[threadIdx.x] = p.indptr[row0 + threadIdx.x];
  __syncthreads();
  const int64_t first = s_ptr[0], last = s_ptr[rows];
  for (int64_t col0 = 0; col0 < p.width; col0 += kMaCols) {
    const int cols = static_cast<int>(min(static_cast<int64_t>(kMaCols), p.width - col0));
    for (int r = warp; r < rows; r += kBlock / kWarp)
      for (int c = lane * K; c < cols; c += kWarp * K) set_zero(*reinterpret_cast<T*>(&s_sum[r * kMaCols + c]));
    for (int64_t chunk = first; chunk < last; chunk += kMaEntries) {
      const int n = static_cast<int>(min(static_cast<int64_t>(kMaEntries), last - chunk));
      __syncthreads();  // the previous chunk is consumed
      for (int i = static_cast<int>(threadIdx.x); i < n; i += kBlock) {
        const int32_t c = p.indices[chunk + i];
        float w = p.col_scale ? p.col_scale[c] : 1.0f;
        if (p.edge_weight) w *= p.edge_weight[chunk + i];
        s_col[i] = c;
        s_coef[i] = w;
      }
      __syncthreads();
      for (int r = warp; r < rows; r += kBlock / kWarp) {
        const int lo = static_cast<int>(max(s_ptr[r], chunk) - chunk);
        const int hi = static_cast<int>(min(s_ptr[r + 1], chunk + n) - chunk);
        if (lo >= hi) continue;
        for (int c = lane * K; c < cols; c += kWarp * K) {
          T* partial = reinterpret_cast<T*>(&s_sum[r * kMaCols + c]);
          T acc = *partial;
          for (int i = lo; i < hi; ++i) {
            T v;
            load_ro(v, p.x + static_cast<int64_t>(s_col[i]) * p.x_ld + col0 + c);
            fma_to(acc, s_coef[i], v);
          }
          *partial = acc;
        }
      }
    }
    // Epilogue (the warp wrote these partial sums itself: no barrier needed).
    for (int r = warp; r < rows; r += kBlock / kWarp) {
      const int64_t row = row0 + r;
      const float rs = p.row_scale ? p.row_scale[row] : 1.0f;
      float self = 0.0f;
      if (row < p.self_rows) self = p.self_scale + (p.self_coefs ? p.self_coefs[row] : 0.0f);
      for (int c = lane * K; c < cols; c += kWarp * K) {
        T v = *reinterpret_cast<const T*>(&s_sum[r * kMaCols + c]);
        scale(v, rs);
        if (self != 0.0f) {
          T xs;
          load_ro(xs, p.x + row * p.x_ld + col0 + c);
          fma_to(v, self, xs);
        }
        float* o = p.out + row * p.out_ld + col0 + c;
        if (p.accumulate) {
          T prev;
          load_rw(prev, o);
          add_to(v, prev);
        }
        if (p.bias) {
          T b;
          load_ro(b, p.bias + col0 + c);
          add_to(v, b);
        }
        if (p.relu) relu_in_place(v);
        store(o, v);
      }
    }
  }
}

// ---- host side ------------------------------------------------------------------------------

Params make_params(const SpmmArgs& a) {
  Params p;
  p.rows = a.graph.rows;
  p.width = a.out.cols;
  p.indptr = a.graph.indptr;
  p.indices = a.graph.indices;
  p.x = a.x.data;
  p.x_ld = a.x.ld;
  p.out = a.out.data;
  p.out_ld = a.out.ld;
  p.row_scale = a.row_scale;
  p.col_scale = a.col_scale;
  p.edge_weight = a.edge_weight;
  p.self_coefs = a.self_coefs;
  p.self_scale = a.self_scale;
  p.self_rows = std::min(a.graph.rows, a.x.rows);
  p.bias = a.bias;
  p.accumulate = a.accumulate;
  p.relu = a.relu;
  p.out_mask = a.out_mask;
  p.mask_words = a.out_mask_words;
  p.long_list = a.long_rows.rows;
  p.long_count = a.long_rows.count;
  p.long_capacity = a.long_rows.capacity;
  p.chunk_shift = a.gar_chunk_rows == kSpanRows ? 8 : 4;
  static_assert(kChunkRows == 1 << 4 && kSpanRows == 1 << 8, "chunk_shift");
  return p;
}

// float4 gathers need x's rows 16-byte aligned; float4 stores (and bias loads) the output's too,
// with a width that is a multiple of 4. GAR's gathers may read past the width up to the next
// multiple of 4 (never past x.ld): the extra columns are summed in registers and never stored.
bool vector_loads(const SpmmArgs& a) { return float4_rows(a.x.data, a.x.ld); }
bool vector_stores(const SpmmArgs& a) {
  return a.out.cols % 4 == 0 && float4_rows(a.out.data, a.out.ld) && (a.bias == nullptr || aligned16(a.bias));
}
// GAS and the memory-aware kernel vectorise loads and stores together.
bool can_vectorise(const SpmmArgs& a) { return vector_loads(a) && vector_stores(a); }

// GAS: lanes per row group (G) and elements per lane (VPT) for a width of `units` elements (floats or
// float4s): up to 32 units one unit per lane, with the group shrunk to the next power of two so
// short rows share a warp; wider rows use the whole warp with 2, 4 (or, for floats, 8) units per
// lane; wider still loop over tiles of that size.
struct Shape {
  bool vec = false;
  int g = 32;
  int vpt = 1;
};

Shape choose_shape(const SpmmArgs& a) {
  Shape s;
  s.vec = can_vectorise(a);
  const int64_t units = s.vec ? a.out.cols / 4 : a.out.cols;
  if (units <= kWarp) {
    s.g = 1;
    while (s.g < units) s.g *= 2;
    s.vpt = 1;
  } else {
    s.g = kWarp;
    s.vpt = units <= 2 * kWarp ? 2 : units <= 4 * kWarp || s.vec ? 4 : 8;
  }
  return s;
}

// Calls f.template operator()<T, G, VPT>() for the shape's instantiation.
template <typename F>
void with_shape(const Shape& s, F&& f) {
#define GALE_SPMM_SHAPE(T, G, VPT)                                                  \
  if (s.vec == (sizeof(T) == 16) && s.g == G && s.vpt == VPT) {                     \
    f.template operator()<T, G, VPT>();                                             \
    return;                                                                         \
  }
  GALE_SPMM_SHAPE(float4, 1, 1)
  GALE_SPMM_SHAPE(float4, 2, 1)
  GALE_SPMM_SHAPE(float4, 4, 1)
  GALE_SPMM_SHAPE(float4, 8, 1)
  GALE_SPMM_SHAPE(float4, 16, 1)
  GALE_SPMM_SHAPE(float4, 32, 1)
  GALE_SPMM_SHAPE(float4, 32, 2)
  GALE_SPMM_SHAPE(float4, 32, 4)
  GALE_SPMM_SHAPE(float, 1, 1)
  GALE_SPMM_SHAPE(float, 2, 1)
  GALE_SPMM_SHAPE(float, 4, 1)
  GALE_SPMM_SHAPE(float, 8, 1)
  GALE_SPMM_SHAPE(float, 16, 1)
  GALE_SPMM_SHAPE(float, 32, 1)
  GALE_SPMM_SHAPE(float, 32, 2)
  GALE_SPMM_SHAPE(float, 32, 4)
  GALE_SPMM_SHAPE(float, 32, 8)
#undef GALE_SPMM_SHAPE
  throw InternalError("spmm: no kernel for group " + std::to_string(s.g) + " x " + std::to_string(s.vpt));
}

template <typename T, int G, bool kVecOut>
void launch_gar(const Params& p, cudaStream_t stream) {
  constexpr int64_t kTile = G * lane_floats<T>();
  const int64_t row_blocks = (p.rows + kBlock - 1) / kBlock;
  const int64_t sms = cuda::current_multiprocessors();
  // With a list, no more long-row blocks than it can hold rows (none for a graph too small for any).
  const int64_t scanners = std::min<int64_t>(kLongBlocksPerSm * sms, p.long_list ? p.long_capacity : row_blocks);
  const int64_t tiles = std::min<int64_t>((p.width + kTile - 1) / kTile, 65535);  // more tiles loop
  const dim3 grid(static_cast<unsigned>(scanners + row_blocks), static_cast<unsigned>(tiles));
  constexpr size_t kShared = sizeof(GarShared<T, G>);
  if constexpr (kShared > 48 * 1024)  // per device; cheap enough to repeat
    GALE_CHECK_CUDA(cudaFuncSetAttribute(gar_kernel<T, G, kVecOut>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kShared)));
  gar_kernel<T, G, kVecOut><<<grid, kBlock, kShared, stream>>>(p, scanners);
  GALE_CHECK_CUDA(cudaGetLastError());
}

struct GasLaunch {
  const Params& p;
  int64_t nnz_bound;  // an upper bound on the entries, for the grid size
  cudaStream_t stream;
  template <typename T, int G, int VPT>
  void operator()() const {
    constexpr int64_t kGroups = kBlock / G;
    const int64_t chunks = (nnz_bound + kGasChunk - 1) / kGasChunk;
    // Persistent grid: 8 blocks of 256 threads fill an SM's 2048 threads; more chunks loop.
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(int64_t{8} * cuda::current_multiprocessors(),
                                                                  (chunks + kGroups - 1) / kGroups));
    gas_kernel<T, G, VPT><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(p);
    GALE_CHECK_CUDA(cudaGetLastError());
  }
};

unsigned elementwise_blocks(int64_t total) {
  return static_cast<unsigned>(std::clamp<int64_t>((total + kBlock - 1) / kBlock, 1, 8192));
}

// GAR's column tile: 32 floats, 128 bytes of each source row (see gar_kernel for why), or the width
// rounded up to a power of two of lanes when it is narrower; 48 floats for widths of 41-48 with
// float4 gathers (Float6).
constexpr int64_t kGarTile = 32;

// One GAR launch over the columns [col0, col0 + width) of a: groups sized for that width.
void launch_gar_columns(const SpmmArgs& a, int64_t col0, int64_t width, cudaStream_t stream) {
  SpmmArgs part = a;
  part.x.data += col0;
  part.out.data += col0;
  part.out.cols = width;
  if (part.bias) part.bias += col0;
  if (part.out_mask) part.out_mask += col0 / 32;  // col0 is a multiple of 32 (run_gar)
  const Params p = make_params(part);
  const bool vec = vector_loads(part);
  const bool vec_out = vec && vector_stores(part);
  // One 48-float tile for widths of 41-48 (Float6).
  if (vec && width > 40 && width <= 48)
    return vec_out ? launch_gar<Float6, 8, true>(p, stream) : launch_gar<Float6, 8, false>(p, stream);
  const int64_t k = vec ? 4 : 1;
  const int64_t lanes = std::min((width + k - 1) / k, kGarTile / k);
  int g = 1;
  while (g < lanes) g *= 2;
#define GALE_GAR_GROUP(T, G, VEC_OUT)                                         \
  if (vec == (sizeof(T) == 16) && g == G && (vec_out == VEC_OUT || !vec)) \
    return launch_gar<T, G, VEC_OUT>(p, stream);
  GALE_GAR_GROUP(float4, 1, true)
  GALE_GAR_GROUP(float4, 2, true)
  GALE_GAR_GROUP(float4, 4, true)
  GALE_GAR_GROUP(float4, 8, true)
  GALE_GAR_GROUP(float4, 1, false)
  GALE_GAR_GROUP(float4, 2, false)
  GALE_GAR_GROUP(float4, 4, false)
  GALE_GAR_GROUP(float4, 8, false)
  GALE_GAR_GROUP(float, 1, false)
  GALE_GAR_GROUP(float, 2, false)
  GALE_GAR_GROUP(float, 4, false)
  GALE_GAR_GROUP(float, 8, false)
  GALE_GAR_GROUP(float, 16, false)
  GALE_GAR_GROUP(float, 32, false)
#undef GALE_GAR_GROUP
  throw InternalError("spmm gar: no kernel for a group of " + std::to_string(g));
}

// Float4 gathers: every tile in one launch, a partial last one included (its lanes past the width
// gather the tile's first columns again: no extra sectors). Scalar gathers: whole 32-float tiles
// in one launch, and a partial last tile of at least 8 columns (e.g. the last 15 of a width of 47)
// in a second launch whose groups are only as wide as that tail. Measured on R-MAT scale 21 (H100,
// two runs): one launch against two at width 40 / 48 / 56 with float4 gathers 3.11 / 2.85 / 3.54
// ms against 4.18 / 3.14 / 3.56 (a tail of 8 columns takes a launch of 2-lane groups), while at 47
// with scalar gathers 4.50 against 4.02; in training, a width of 47 gathered from rows padded to 48
// took 3.00 against 3.24 ms (SAGE's backward) and 4.25 against 4.41 (GCN's), 3.75 against 3.65
// for SAGE's forward (accumulating, with the bias). A narrower scalar tail stays the tiles'
// launch's last tile: a launch of 1-lane groups reads each lane's own entries' indices
// uncoalesced, and took 3.4 ms for 4 columns.
void run_gar(const SpmmArgs& a, cudaStream_t stream) {
  const int64_t width = a.out.cols;
  const int64_t whole = width / kGarTile * kGarTile;
  if (whole == 0 || width - whole < 8 || vector_loads(a)) return launch_gar_columns(a, 0, width, stream);
  launch_gar_columns(a, 0, whole, stream);
  launch_gar_columns(a, whole, width - whole, stream);
}

void run_gas(const SpmmArgs& a, cudaStream_t stream) {
  const Params p = make_params(a);
  const int64_t total = p.rows * p.width;
  gas_init_kernel<<<elementwise_blocks(total), kBlock, 0, stream>>>(p);
  GALE_CHECK_CUDA(cudaGetLastError());
  // Without the host-side count, size the grid for one SM-filling wave; chunks beyond it loop.
  const int64_t bound = a.nnz >= 0 ? a.nnz : int64_t{8} * cuda::current_multiprocessors() * kBlock * kGasChunk;
  with_shape(choose_shape(a), GasLaunch{p, bound, stream});
  if (p.relu) {
    relu_kernel<<<elementwise_blocks(total), kBlock, 0, stream>>>(p);
    GALE_CHECK_CUDA(cudaGetLastError());
  }
}

void run_memory_aware(const SpmmArgs& a, cudaStream_t stream) {
  const Params p = make_params(a);
  const int64_t blocks = (p.rows + kMaRows - 1) / kMaRows;
  if (blocks >= (int64_t{1} << 31)) throw InputError("spmm memory-aware: too many rows for one grid");
  if (can_vectorise(a)) {
    memory_aware_kernel<float4><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(p);
  } else {
    memory_aware_kernel<float><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(p);
  }
  GALE_CHECK_CUDA(cudaGetLastError());
}

// ---- cuSPARSE baseline ----------------------------------------------------------------------

#define GALE_CHECK_CUSPARSE(call)                                                                   \
  do {                                                                                              \
    const cusparseStatus_t gale_cusparse_status_ = (call);                                          \
    if (gale_cusparse_status_ != CUSPARSE_STATUS_SUCCESS)                                           \
      throw DeviceError(cuda::call_name(#call) + " failed: " + cusparseGetErrorString(gale_cusparse_status_) + \
                        " at " + __FILE__ + ":" + std::to_string(__LINE__));                        \
  } while (0)

__global__ void narrow_indptr_kernel(const int64_t* in, int32_t* out, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    out[i] = static_cast<int32_t>(in[i]);
}

// A per-thread handle, workspace and int32 row-offset buffer for the current device. cuSPARSE's
// CSR SpMM wants offsets and indices of one index type, and 32-bit ones are its fast path, so
// the int64 indptr is narrowed on every call (rows x 12 bytes of traffic, well under 1% of a
// SpMM). Kept outside the memory pool on purpose: this is the benchmark's baseline.
class CusparseState {
 public:
  CusparseState() = default;
  CusparseState(const CusparseState&) = delete;
  CusparseState& operator=(const CusparseState&) = delete;
  ~CusparseState() { release(); }

  cusparseHandle_t handle() {
    int device = 0;
    GALE_CHECK_CUDA(cudaGetDevice(&device));
    if (device != device_) {
      release();
      GALE_CHECK_CUSPARSE(cusparseCreate(&handle_));
      device_ = device;
    }
    return handle_;
  }
  void* workspace(size_t bytes) { return grow(&workspace_, &workspace_bytes_, bytes); }
  int32_t* indptr(size_t count) {
    return static_cast<int32_t*>(grow(reinterpret_cast<void**>(&indptr_), &indptr_bytes_, count * sizeof(int32_t)));
  }

 private:
  static void* grow(void** ptr, size_t* have, size_t bytes) {
    if (bytes > *have) {
      if (*ptr != nullptr) GALE_CHECK_CUDA(cudaFree(*ptr));
      *ptr = nullptr;
      *have = 0;
      GALE_CHECK_CUDA(cudaMalloc(ptr, bytes));
      *have = bytes;
    }
    return *ptr;
  }
  void release() noexcept {
    // Errors are ignored: at thread exit the CUDA context may already be gone.
    if (handle_ != nullptr) (void)cusparseDestroy(handle_);
    if (workspace_ != nullptr) (void)cudaFree(workspace_);
    if (indptr_ != nullptr) (void)cudaFree(indptr_);
    handle_ = nullptr;
    workspace_ = nullptr;
    indptr_ = nullptr;
    workspace_bytes_ = indptr_bytes_ = 0;
    device_ = -1;
  }

  int device_ = -1;
  cusparseHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int32_t* indptr_ = nullptr;
  size_t indptr_bytes_ = 0;
};

// Descriptors destroyed on every path out, a throw included.
struct CusparseDescriptors {
  cusparseSpMatDescr_t a = nullptr;
  cusparseDnMatDescr_t b = nullptr;
  cusparseDnMatDescr_t c = nullptr;
  ~CusparseDescriptors() {
    if (a) (void)cusparseDestroySpMat(a);
    if (b) (void)cusparseDestroyDnMat(b);
    if (c) (void)cusparseDestroyDnMat(c);
  }
};

void run_cusparse(const SpmmArgs& a, cudaStream_t stream) {
  thread_local CusparseState state;
  cusparseHandle_t handle = state.handle();
  GALE_CHECK_CUSPARSE(cusparseSetStream(handle, stream));
  const CsrView& g = a.graph;
  int32_t* indptr = state.indptr(static_cast<size_t>(g.rows + 1));
  narrow_indptr_kernel<<<elementwise_blocks(g.rows + 1), kBlock, 0, stream>>>(g.indptr, indptr, g.rows + 1);
  GALE_CHECK_CUDA(cudaGetLastError());
  CusparseDescriptors d;
  GALE_CHECK_CUSPARSE(cusparseCreateCsr(&d.a, g.rows, g.cols, a.nnz, indptr, const_cast<int32_t*>(g.indices),
                                        const_cast<float*>(a.edge_weight), CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                                        CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
  GALE_CHECK_CUSPARSE(cusparseCreateDnMat(&d.b, g.cols, a.x.cols, a.x.ld, const_cast<float*>(a.x.data), CUDA_R_32F,
                                          CUSPARSE_ORDER_ROW));
  GALE_CHECK_CUSPARSE(
      cusparseCreateDnMat(&d.c, g.rows, a.out.cols, a.out.ld, a.out.data, CUDA_R_32F, CUSPARSE_ORDER_ROW));
  const float alpha = 1.0f;
  const float beta = a.accumulate ? 1.0f : 0.0f;
  // ALG2: cuSPARSE's CSR algorithm for row-major dense operands, the layout Gale uses.
  constexpr cusparseSpMMAlg_t kAlg = CUSPARSE_SPMM_CSR_ALG2;
  size_t bytes = 0;
  GALE_CHECK_CUSPARSE(cusparseSpMM_bufferSize(handle, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                              CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, d.a, d.b, &beta, d.c,
                                              CUDA_R_32F, kAlg, &bytes));
  void* workspace = state.workspace(bytes);
  GALE_CHECK_CUSPARSE(cusparseSpMM(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                   &alpha, d.a, d.b, &beta, d.c, CUDA_R_32F, kAlg, workspace));
}

}  // namespace

std::string spmm_cannot(SpmmKind kind, const SpmmArgs& a) {
  const CsrView& g = a.graph;
  if (g.rows < 0 || g.cols < 0) return "the graph has a negative size";
  if (a.out.rows != g.rows)
    return "out has " + std::to_string(a.out.rows) + " rows, the graph " + std::to_string(g.rows);
  if (a.x.cols != a.out.cols)
    return "x has " + std::to_string(a.x.cols) + " columns, out " + std::to_string(a.out.cols);
  if (a.x.rows < g.cols)
    return "x has " + std::to_string(a.x.rows) + " rows, the graph " + std::to_string(g.cols) + " columns";
  if (a.x.ld < a.x.cols || a.out.ld < a.out.cols) return "a leading dimension is below the width";
  if (kind == SpmmKind::kAuto && a.nnz < 0) return "auto needs SpmmArgs::nnz to pick by average degree";
  if (a.long_rows.rows != nullptr && (a.long_rows.count == nullptr || a.long_rows.capacity < 0))
    return "long_rows lists rows without a count or with a negative capacity";
  if (a.gar_chunk_rows != 0 && a.gar_chunk_rows != 16 && a.gar_chunk_rows != 256)
    return "GAR's chunks are 16 or 256 rows, not " + std::to_string(a.gar_chunk_rows);
  if (a.out_mask != nullptr) {
    if (a.out_mask_words < (a.out.cols + 31) / 32)
      return "out_mask has " + std::to_string(a.out_mask_words) + " words a row, " +
             std::to_string(a.out.cols) + " columns need " + std::to_string((a.out.cols + 31) / 32);
    const SpmmKind k = spmm_resolve(kind, a);
    if (k != SpmmKind::kGar)
      return std::string("only GAR applies an output mask (SpmmArgs::out_mask), not ") + spmm_kind_name(k);
  }
  if (kind == SpmmKind::kSampled) return spmm_sample_width_cannot(a.sample_width);
  if (kind == SpmmKind::kTensorCore) {
    if (a.tc.item_window == nullptr) return "the tensor-core SpMM needs the graph's translation (SpmmArgs::tc)";
    if (a.tc_slice != 0 && a.tc_slice != 32 && a.tc_slice != 64)
      return "the tensor-core SpMM's slices are 32 or 64 columns, not " + std::to_string(a.tc_slice);
    if (a.tc.windows != (g.rows + kTcWindowRows - 1) / kTcWindowRows || a.tc.items < a.tc.windows)
      return "the translation has " + std::to_string(a.tc.windows) + " row windows, the graph " +
             std::to_string((g.rows + kTcWindowRows - 1) / kTcWindowRows);
    return "";
  }
  if (kind != SpmmKind::kCusparse) return "";
  if (a.nnz < 0) return "cuSPARSE needs SpmmArgs::nnz for its descriptor";
  if (a.nnz >= (int64_t{1} << 31) || g.rows >= (int64_t{1} << 31) || g.cols >= (int64_t{1} << 31))
    return "cuSPARSE's 32-bit path takes fewer than 2^31 rows, columns and entries";
  if (a.edge_weight == nullptr) return "cuSPARSE reads the matrix values from edge_weight, which is null";
  if (a.row_scale || a.col_scale) return "cuSPARSE has no row or column scale";
  if (a.self_coefs || a.self_scale != 0.0f) return "cuSPARSE has no self term";
  if (a.bias || a.relu) return "cuSPARSE has no fused bias or ReLU epilogue";
  return "";
}

SpmmKind spmm_resolve(SpmmKind kind, const SpmmArgs& a) {
  if (kind != SpmmKind::kAuto) return kind;
  if (a.graph.rows != a.graph.cols) return SpmmKind::kMemoryAware;
  const double degree = a.graph.rows == 0 ? 0.0 : static_cast<double>(a.nnz) / static_cast<double>(a.graph.rows);
  return degree >= kSpmmGarMinDegree ? SpmmKind::kGar : SpmmKind::kGas;
}

int64_t spmm_gar_padded_ld(const SpmmArgs& a) {
  const int64_t width = a.x.cols;
  if (width < 8) return 0;
  const int64_t align = spmm_gar_row_align(width);  // floats
  const bool fine = a.x.ld % align == 0 && reinterpret_cast<uintptr_t>(a.x.data) % (align * sizeof(float)) == 0;
  return fine ? 0 : spmm_gar_row_floats(width);
}

namespace {
__global__ void entry_scale_kernel(const int32_t* indices, const float* weights, int64_t nnz, const float* col_scale,
                                   float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < nnz; k += stride) {
    const float s = __ldg(col_scale + __ldcs(indices + k));
    out[k] = weights ? __fmul_rn(s, __ldcs(weights + k)) : s;
  }
}

__global__ void long_rows_kernel(const int64_t* indptr, int64_t rows, int64_t* list, int64_t capacity,
                                 unsigned long long* count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride) {
    if (indptr[r + 1] - indptr[r] <= kLongRow) continue;
    const unsigned long long at = atomicAdd(count, 1ull);
    if (at < static_cast<unsigned long long>(capacity)) list[at] = r;
  }
}
}  // namespace

void gar_long_rows_cuda(const CsrView& graph, int64_t* rows, int64_t capacity, int64_t* count, cudaStream_t stream) {
  if (graph.rows < 0 || capacity < 0) throw InputError("gar_long_rows: negative rows or capacity");
  GALE_CHECK_CUDA(cudaMemsetAsync(count, 0, sizeof(int64_t), stream));
  if (graph.rows == 0 || capacity == 0) return;
  static_assert(sizeof(int64_t) == sizeof(unsigned long long), "the count is a 64-bit atomic");
  long_rows_kernel<<<elementwise_blocks(graph.rows), kBlock, 0, stream>>>(graph.indptr, graph.rows, rows, capacity,
                                                                          reinterpret_cast<unsigned long long*>(count));
  GALE_CHECK_CUDA(cudaGetLastError());
}

void spmm_entry_scale_cuda(const CsrView& graph, int64_t nnz, const float* col_scale, float* out, cudaStream_t stream) {
  if (nnz <= 0) return;  // indptr[0] == 0 is the caller's promise: the host cannot read it here
  entry_scale_kernel<<<elementwise_blocks(nnz), kBlock, 0, stream>>>(graph.indices, graph.weights, nnz, col_scale, out);
  GALE_CHECK_CUDA(cudaGetLastError());
}

void spmm_cuda(SpmmKind kind, const SpmmArgs& a, cudaStream_t stream) {
  const std::string why = spmm_cannot(kind, a);
  if (!why.empty()) throw InputError(std::string("spmm ") + spmm_kind_name(kind) + ": " + why);
  if (a.graph.rows == 0 || a.out.cols == 0) return;
  switch (spmm_resolve(kind, a)) {
    case SpmmKind::kGar: run_gar(a, stream); return;
    case SpmmKind::kGas: run_gas(a, stream); return;
    case SpmmKind::kCusparse: run_cusparse(a, stream); return;
    case SpmmKind::kMemoryAware: run_memory_aware(a, stream); return;
    case SpmmKind::kSampled: spmm_sampled_cuda(a, stream); return;
    case SpmmKind::kTensorCore: spmm_tc_cuda(a, stream); return;
    case SpmmKind::kAuto: break;
  }
  throw InternalError("spmm: unhandled kind");
}

}  // namespace gale::kernels
