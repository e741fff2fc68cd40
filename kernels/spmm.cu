// kernels/spmm.cu — the CUDA SpMM family of spmm.hpp: fuseGNN's GAR and GAS aggregation models
// (ICCAD'20, Sec. 4-6) over a destination-major CSR, plus cuSPARSE as the baseline.
//
// GAR (gather-apply-reduce, fuseGNN Sec. 4 Fig. 3 and Sec. 6 Alg. 3): a group of G lanes owns one
// destination row. The group stages G column indices and coefficients (col_scale * weight) with
// one coalesced load, broadcasts them by shuffle, gathers the source rows with 16-byte loads and
// reduces in registers; the row scale, self term, bias and ReLU are applied before the single
// store (the fused epilogue of Sec. 5). G is sized by the width, so short feature rows put several
// rows in one warp (fuseGNN's "process T/m edges at once", Sec. 6 and Table 4), and each lane owns
// up to 4 float4 (16 columns); wider rows loop over 512-column tiles. No atomics: every output
// element has one writer and a fixed summation order, so results are deterministic.
//
// Power-law rows: on R-MAT a few rows have tens of thousands of entries. One group walking such a
// row would run for milliseconds and become the kernel's tail, so rows above kLongRow entries are
// taken by whole blocks instead: the grid's first blocks (scheduled first) each scan a span of
// rows for long ones, split every long row's entries over all the block's groups and reduce the
// partial sums through shared memory in group order, which keeps the result deterministic.
//
// GAS (gather-apply-scatter, fuseGNN Sec. 4 Fig. 2 and Sec. 6 Alg. 1): edge-parallel. Each group
// takes a contiguous chunk of entries (binary-searching the row of its first entry in indptr, then
// walking indptr), keeps a register sum while consecutive entries share a row and scatters it with
// one atomicAdd (16-byte vector atomics on sm_90) when the row changes. A pre-pass writes
// out = (accumulate ? out : 0) + self term + bias; a post-pass applies ReLU, which cannot be fused
// into an atomic scatter. The order of the atomic additions varies, so GAS is not deterministic.
//
// kAuto: GAR when nnz / rows >= kSpmmGarMinDegree (4), else GAS. fuseGNN (Sec. 7, Fig. 9-11)
// finds GAS faster on low-degree graphs (Cora, avg. degree ~4) and GAR on high-degree ones
// (Reddit): with only a few entries per row, GAR's row groups spend most of their time on the
// per-row prologue and epilogue and leave lanes idle, while GAS's fixed-size edge chunks keep
// every lane busy and scatter rarely enough that atomics stay cheap.
#include <cuda_runtime.h>
#include <cusparse.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/error.hpp"
#include "kernels/spmm.hpp"

namespace gale::kernels {

namespace {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;
// 8 warps per block: the long-row path splits a row over the block's groups, and 256 threads x
// 16 floats of partial sums (16 KiB) fit the shared memory of several resident blocks per SM.
constexpr int kBlock = 256;
// Rows above this many entries go to the block-wide path. A group keeps ~8 gathers in flight per
// lane, so 1024 entries take it ~100 us: short against a multi-millisecond pass, so a row that
// starts last does not stretch the tail much, while rows this long are rare enough (a few
// thousand on R-MAT scale 21) that a handful of blocks can scan for them.
constexpr int64_t kLongRow = 1024;
// Blocks per SM that scan for long rows (they are launched, and so scheduled, first).
constexpr int kLongBlocksPerSm = 4;
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
};

// ---- element helpers: one float or one float4 -----------------------------------------------

__device__ __forceinline__ void set_zero(float& a) { a = 0.0f; }
__device__ __forceinline__ void set_zero(float4& a) { a = make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// Read-only data (x, bias) goes through the non-coherent cache.
__device__ __forceinline__ void load_ro(float& v, const float* p) { v = __ldg(p); }
__device__ __forceinline__ void load_ro(float4& v, const float* p) {
  v = __ldg(reinterpret_cast<const float4*>(p));
}
// out may be read (accumulate) and written by the same launch: plain loads.
__device__ __forceinline__ void load_rw(float& v, const float* p) { v = *p; }
__device__ __forceinline__ void load_rw(float4& v, const float* p) { v = *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void store(float* p, const float& v) { *p = v; }
__device__ __forceinline__ void store(float* p, const float4& v) { *reinterpret_cast<float4*>(p) = v; }
// Output rows are written once and not read again by this launch: evict-first stores keep them
// from pushing the hot (high-degree) source rows of x out of L2, which is where a power-law
// graph's gathers hit.
__device__ __forceinline__ void store_streaming(float* p, const float& v) { __stcs(p, v); }
__device__ __forceinline__ void store_streaming(float* p, const float4& v) { __stcs(reinterpret_cast<float4*>(p), v); }

__device__ __forceinline__ void fma_to(float& a, float w, const float& v) { a = fmaf(w, v, a); }
__device__ __forceinline__ void fma_to(float4& a, float w, const float4& v) {
  a.x = fmaf(w, v.x, a.x);
  a.y = fmaf(w, v.y, a.y);
  a.z = fmaf(w, v.z, a.z);
  a.w = fmaf(w, v.w, a.w);
}
__device__ __forceinline__ void scale(float& a, float s) { a *= s; }
__device__ __forceinline__ void scale(float4& a, float s) {
  a.x *= s;
  a.y *= s;
  a.z *= s;
  a.w *= s;
}
__device__ __forceinline__ void add_to(float& a, const float& b) { a += b; }
__device__ __forceinline__ void add_to(float4& a, const float4& b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}
__device__ __forceinline__ void relu_in_place(float& a) { a = fmaxf(a, 0.0f); }
__device__ __forceinline__ void relu_in_place(float4& a) {
  a.x = fmaxf(a.x, 0.0f);
  a.y = fmaxf(a.y, 0.0f);
  a.z = fmaxf(a.z, 0.0f);
  a.w = fmaxf(a.w, 0.0f);
}
__device__ __forceinline__ void atomic_add(float* p, const float& v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(float* p, const float4& v) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(p), v);  // one 16-byte atomic (sm_90)
#else
  atomicAdd(p, v.x);
  atomicAdd(p + 1, v.y);
  atomicAdd(p + 2, v.z);
  atomicAdd(p + 3, v.w);
#endif
}

__device__ __forceinline__ int warp_max(int v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFull, v);
#else
  for (int o = kWarp / 2; o > 0; o /= 2) v = max(v, __shfl_xor_sync(kFull, v, o));
  return v;
#endif
}

// The epilogue of spmm.hpp for one element (or four): out = relu?(rs * sum + self * x[r] +
// (accumulate ? out : 0) + bias), in the CPU reference's order of additions.
template <typename T>
__device__ __forceinline__ void finish(const Params& p, int64_t r, int64_t col, T v) {
  const float rs = p.row_scale ? p.row_scale[r] : 1.0f;
  scale(v, rs);
  if (r < p.self_rows) {
    const float self = p.self_scale + (p.self_coefs ? p.self_coefs[r] : 0.0f);
    if (self != 0.0f) {
      T xs;
      load_ro(xs, p.x + r * p.x_ld + col);
      fma_to(v, self, xs);
    }
  }
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
  store_streaming(o, v);
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
  constexpr int K = sizeof(T) / sizeof(float);
  constexpr int by_registers = 64 / (VPT * K) < 16 ? 64 / (VPT * K) : 16;
  return G < by_registers ? G : by_registers;
}

// Gathers entries [begin, end) of one row into acc, for the tile of columns starting at col0.
// The entries are cut into pieces of G; this group takes pieces first, first + step, ... (the
// short path: first 0, step 1; the long path: one residue class per group of the block). Lane g
// owns elements (k * G + g) of the tile, k < VPT, each K floats wide, so a group's loads of one
// source row are contiguous and coalesced.
//
// Every lane of the warp must call this together: the loop runs to the warp's largest trip count
// and the shuffles use the full mask, while groups whose rows are done only skip their gathers.
template <typename T, int G, int VPT>
__device__ __forceinline__ void gather(const Params& p, int64_t begin, int64_t end, int64_t first, int64_t step,
                                       int g, int64_t col0, T (&acc)[VPT]) {
  constexpr int K = sizeof(T) / sizeof(float);
  constexpr int kUnroll = unroll<T, G, VPT>();
  const int64_t pieces = (end - begin + G - 1) / G;
  const int mine = pieces > first ? static_cast<int>((pieces - first + step - 1) / step) : 0;
  const int trips = warp_max(mine);
  int64_t lane_off[VPT];
  bool lane_cols[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    lane_off[k] = col0 + static_cast<int64_t>(k * G + g) * K;
    lane_cols[k] = lane_off[k] < p.width;
    if (!lane_cols[k]) lane_off[k] = 0;  // loads stay in bounds; the sum ignores them
  }
  for (int t = 0; t < trips; ++t) {
    const int64_t s = begin + (first + static_cast<int64_t>(t) * step) * G;
    const int n = t < mine ? static_cast<int>(min(static_cast<int64_t>(G), end - s)) : 0;
    int32_t c = 0;
    float w = 0.0f;
    if (g < n) {
      c = __ldcs(p.indices + s + g);
      w = coefficient(p, s + g, c);
    }
    const int nmax = warp_max(n);
    for (int j0 = 0; j0 < nmax; j0 += kUnroll) {
      // Three phases so that all kUnroll x VPT loads are in flight before the first FMA: the
      // broadcasts, the gathers (unconditional: past a group's last entry the index is 0, a
      // valid row), then the predicated sums (a NaN in row 0 cannot leak into other rows).
      int cs[kUnroll];
      float ws[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        cs[u] = __shfl_sync(kFull, c, (j0 + u) & (G - 1), G);
        ws[u] = __shfl_sync(kFull, w, (j0 + u) & (G - 1), G);
      }
      T v[kUnroll][VPT];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float* xr = p.x + static_cast<int64_t>(cs[u]) * p.x_ld;
#pragma unroll
        for (int k = 0; k < VPT; ++k) load_ro(v[u][k], xr + lane_off[k]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j0 + u < n) {
#pragma unroll
          for (int k = 0; k < VPT; ++k)
            if (lane_cols[k]) fma_to(acc[k], ws[u], v[u][k]);
        }
      }
    }
  }
}

// One long row by the whole block: every group gathers its share of the entries, the partial sums
// meet in shared memory and are added in group order (deterministic), then the epilogue.
template <typename T, int G, int VPT>
__device__ void long_row(const Params& p, int64_t r, float* partial) {
  constexpr int K = sizeof(T) / sizeof(float);
  constexpr int kTile = G * VPT * K;
  constexpr int kGroups = kBlock / G;
  const int g = threadIdx.x & (G - 1);
  const int group = threadIdx.x / G;
  const int64_t begin = p.indptr[r];
  const int64_t end = p.indptr[r + 1];
  for (int64_t col0 = 0; col0 < p.width; col0 += kTile) {
    T acc[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) set_zero(acc[k]);
    gather<T, G, VPT>(p, begin, end, group, kGroups, g, col0, acc);
#pragma unroll
    for (int k = 0; k < VPT; ++k) store(partial + group * kTile + (k * G + g) * K, acc[k]);
    __syncthreads();
    for (int i = threadIdx.x; i < kTile && col0 + i < p.width; i += kBlock) {
      float sum = 0.0f;
      for (int q = 0; q < kGroups; ++q) sum += partial[q * kTile + i];
      finish<float>(p, r, col0 + i, sum);
    }
    __syncthreads();  // partial is reused by the next tile or row
  }
}

// GAR. Blocks [0, long_blocks) each scan rows [b * long_span, (b + 1) * long_span) for rows with
// more than kLongRow entries and process them block-wide; the other blocks give each group one
// row and skip the long ones.
template <typename T, int G, int VPT>
__global__ void __launch_bounds__(kBlock) gar_kernel(Params p, int64_t long_blocks, int64_t long_span) {
  constexpr int K = sizeof(T) / sizeof(float);
  constexpr int kTile = G * VPT * K;
  constexpr int kGroups = kBlock / G;
  const int g = threadIdx.x & (G - 1);
  if (blockIdx.x < long_blocks) {
    __shared__ __align__(16) float partial[kGroups * kTile];
    __shared__ unsigned long_mask[kBlock / kWarp];
    const int64_t lo = static_cast<int64_t>(blockIdx.x) * long_span;
    const int64_t hi = min(p.rows, lo + long_span);
    for (int64_t base = lo; base < hi; base += kBlock) {
      const int64_t r = base + threadIdx.x;
      const bool is_long = r < hi && p.indptr[r + 1] - p.indptr[r] > kLongRow;
      const unsigned mask = __ballot_sync(kFull, is_long);
      if ((threadIdx.x & (kWarp - 1)) == 0) long_mask[threadIdx.x / kWarp] = mask;
      __syncthreads();
      for (int w = 0; w < kBlock / kWarp; ++w) {
        for (unsigned m = long_mask[w]; m != 0; m &= m - 1) {
          long_row<T, G, VPT>(p, base + w * kWarp + __ffs(m) - 1, partial);
        }
      }
      __syncthreads();  // long_mask is rewritten next round
    }
    return;
  }
  const int64_t r = (static_cast<int64_t>(blockIdx.x) - long_blocks) * kGroups + threadIdx.x / G;
  int64_t begin = 0, end = 0;
  bool active = r < p.rows;
  if (active) {
    begin = p.indptr[r];
    end = p.indptr[r + 1];
    if (end - begin > kLongRow) active = false;  // a long-row block takes it
  }
  if (!active) begin = end = 0;
  if (!__any_sync(kFull, active)) return;  // whole warp idle: no shuffle partner is left behind
  for (int64_t col0 = 0; col0 < p.width; col0 += kTile) {
    T acc[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) set_zero(acc[k]);
    gather<T, G, VPT>(p, begin, end, 0, 1, g, col0, acc);
    if (active) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int64_t col = col0 + static_cast<int64_t>(k * G + g) * K;
        if (col < p.width) finish<T>(p, r, col, acc[k]);
      }
    }
  }
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
  constexpr int K = sizeof(T) / sizeof(float);
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
  constexpr int K = sizeof(T) / sizeof(float);
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
  return p;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// float4 loads need every row start (and the bias) 16-byte aligned.
bool can_vectorise(const SpmmArgs& a) {
  return a.out.cols % 4 == 0 && a.x.ld % 4 == 0 && a.out.ld % 4 == 0 && aligned16(a.x.data) &&
         aligned16(a.out.data) && (a.bias == nullptr || aligned16(a.bias));
}

// Lanes per row group (G) and elements per lane (VPT) for a width of `units` elements (floats or
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

int multiprocessors() {
  int device = 0, sms = 0;
  GALE_CHECK_CUDA(cudaGetDevice(&device));
  GALE_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
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

struct GarLaunch {
  const Params& p;
  cudaStream_t stream;
  template <typename T, int G, int VPT>
  void operator()() const {
    constexpr int64_t kGroups = kBlock / G;
    const int64_t long_blocks =
        std::min<int64_t>(int64_t{kLongBlocksPerSm} * multiprocessors(), (p.rows + kBlock - 1) / kBlock);
    const int64_t long_span = (p.rows + long_blocks - 1) / long_blocks;
    const int64_t blocks = long_blocks + (p.rows + kGroups - 1) / kGroups;
    gar_kernel<T, G, VPT><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(p, long_blocks, long_span);
    GALE_CHECK_CUDA(cudaGetLastError());
  }
};

struct GasLaunch {
  const Params& p;
  int64_t nnz_bound;  // an upper bound on the entries, for the grid size
  cudaStream_t stream;
  template <typename T, int G, int VPT>
  void operator()() const {
    constexpr int64_t kGroups = kBlock / G;
    const int64_t chunks = (nnz_bound + kGasChunk - 1) / kGasChunk;
    // Persistent grid: 8 blocks of 256 threads fill an SM's 2048 threads; more chunks loop.
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(int64_t{8} * multiprocessors(),
                                                                  (chunks + kGroups - 1) / kGroups));
    gas_kernel<T, G, VPT><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(p);
    GALE_CHECK_CUDA(cudaGetLastError());
  }
};

unsigned elementwise_blocks(int64_t total) {
  return static_cast<unsigned>(std::clamp<int64_t>((total + kBlock - 1) / kBlock, 1, 8192));
}

void run_gar(const SpmmArgs& a, cudaStream_t stream) {
  const Params p = make_params(a);
  with_shape(choose_shape(a), GarLaunch{p, stream});
}

void run_gas(const SpmmArgs& a, cudaStream_t stream) {
  const Params p = make_params(a);
  const int64_t total = p.rows * p.width;
  gas_init_kernel<<<elementwise_blocks(total), kBlock, 0, stream>>>(p);
  GALE_CHECK_CUDA(cudaGetLastError());
  // Without the host-side count, size the grid for one SM-filling wave; chunks beyond it loop.
  const int64_t bound = a.nnz >= 0 ? a.nnz : int64_t{8} * multiprocessors() * kBlock * kGasChunk;
  with_shape(choose_shape(a), GasLaunch{p, bound, stream});
  if (p.relu) {
    relu_kernel<<<elementwise_blocks(total), kBlock, 0, stream>>>(p);
    GALE_CHECK_CUDA(cudaGetLastError());
  }
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

const char* spmm_kind_name(SpmmKind kind) {
  switch (kind) {
    case SpmmKind::kAuto: return "auto";
    case SpmmKind::kGar: return "gar";
    case SpmmKind::kGas: return "gas";
    case SpmmKind::kCusparse: return "cusparse";
  }
  return "?";
}

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

void spmm_cuda(SpmmKind kind, const SpmmArgs& a, cudaStream_t stream) {
  const std::string why = spmm_cannot(kind, a);
  if (!why.empty()) throw InputError(std::string("spmm ") + spmm_kind_name(kind) + ": " + why);
  if (a.graph.rows == 0 || a.out.cols == 0) return;
  if (kind == SpmmKind::kAuto) {
    const double degree = static_cast<double>(a.nnz) / static_cast<double>(a.graph.rows);
    kind = degree >= kSpmmGarMinDegree ? SpmmKind::kGar : SpmmKind::kGas;
  }
  switch (kind) {
    case SpmmKind::kGar: run_gar(a, stream); return;
    case SpmmKind::kGas: run_gas(a, stream); return;
    case SpmmKind::kCusparse: run_cusparse(a, stream); return;
    case SpmmKind::kAuto: break;
  }
  throw InternalError("spmm: unhandled kind");
}

}  // namespace gale::kernels
