// kernels/maxk.cu — the CUDA twins of the MaxK family (maxk.hpp), after MaxK-GNN (ASPLOS'24):
// the top-k nonlinearity into CBSR (Sec. 5.3, done here as an exact radix select), the forward
// SpGEMM (Sec. 4.1, Alg. 1) and the backward SSpMM (Sec. 4.2, Alg. 2), and the scatter back to
// dense.
//
// The aggregations keep the paper's building blocks (a width-float accumulator or staged gradient
// row in shared memory per sub-warp of L lanes, L = k rounded up to a power of two up to a warp;
// coalesced gathers of each neighbour's k values; edge groups of <= 64 entries to split hub rows)
// but are organised around what costs bytes on a power-law graph:
// - SpGEMM writes the dense output, 4 * width bytes per row, which dominates once the gathers
//   shrink to 5k bytes per entry. The paper's per-group atomic flush into a zeroed output moves
//   each output row three times (zeroing, then read and write back by the atomics) and, on rows
//   with a single group (most rows), for nothing. Here a row of at most kHubDegree entries is
//   summed whole by one sub-warp and written once with plain stores, bias and self term included;
//   only longer rows are set up by a first kernel and accumulated over their edge groups with
//   float4 atomics, consecutive groups of a row merged before their flush.
// - SSpMM walks the edge groups a few at a time per sub-warp, stages the scaled gradient row once
//   per row change, and scatters with four columns per load and one float4 atomic per four values.
// No block barriers: each sub-warp works alone (the digest's early-exit pitfall cannot arise),
// and the non-atomic shared-memory accumulation is fenced by __syncwarp between entries, since
// lanes of a sub-warp need not run in lockstep (two entries can share a column, one entry's
// columns are distinct). Outputs need no zeroing by the caller and the ops stay stream-ordered.
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/error.hpp"
#include "kernels/maxk.hpp"

namespace gale::kernels {

namespace {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;
// Row kernels (top-k, scatter, init): one warp per row, 8 warps per block.
constexpr int kRowWarps = 8;
constexpr int kRowThreads = kRowWarps * kWarp;
constexpr int kDefaultSmemLimit = 48 * 1024;
// Row kernels cap their grid and loop beyond it (a warp takes rows w, w + total, ...).
constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;

// ---- keys and small helpers -----------------------------------------------------------------

// Order-preserving key of a float (maxk_cpu.cpp's order_key): larger floats, larger keys.
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The float a key came from, bit for bit (NaN payloads included).
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

__device__ __forceinline__ unsigned lanemask_lt(int lane) { return (1u << lane) - 1u; }

// Warp reductions: one instruction each on sm_80 and later, shuffles before.
__device__ __forceinline__ uint32_t warp_min(uint32_t v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_min_sync(kFull, v);
#else
  for (int o = kWarp / 2; o > 0; o /= 2) v = min(v, __shfl_xor_sync(kFull, v, o));
  return v;
#endif
}
__device__ __forceinline__ uint32_t warp_max(uint32_t v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFull, v);
#else
  for (int o = kWarp / 2; o > 0; o /= 2) v = max(v, __shfl_xor_sync(kFull, v, o));
  return v;
#endif
}
__device__ __forceinline__ int warp_sum(int v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_add_sync(kFull, v);
#else
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(kFull, v, o);
  return v;
#endif
}

__device__ __forceinline__ void atomic_add4(float* p, float4 v) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(p), v);  // one 16-byte atomic (sm_90)
#else
  atomicAdd(p, v.x);
  atomicAdd(p + 1, v.y);
  atomicAdd(p + 2, v.z);
  atomicAdd(p + 3, v.w);
#endif
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>((rows + kRowWarps - 1) / kRowWarps, 1, kMaxRowBlocks));
}

// ---- top-k ------------------------------------------------------------------------------------

// One warp per row; lane l holds columns j * 32 + l (j < VPT) as keys, so loads are coalesced and
// the ballot over lanes at each j lists columns in increasing order. Invalid columns (past the
// width) hold key 0 and are excluded explicitly where 0 could match.
//
// Radix select: T is built bit by bit from the top, keeping count(key >= T) >= k, and stops as
// soon as count(key >= T) == k. At the end either exactly k keys are >= T, or T is the k-th
// largest key. Either way the kept set is every key > T plus the first k - count(key > T) keys
// equal to T in column order: the CPU reference's set. The bits above the first one where a lower
// bound of the k-th largest key and the row's maximum differ are shared by every candidate, so the
// select starts below them. The bound is the row's minimum, or, when k <= 32 and every lane holds
// a column, the smallest of the maxima of 2^ceil(log2 k) groups of lanes: at least that many keys
// (one per group) are >= it, so it is at most the k-th largest. On 256 random values this skips
// the sign, the exponent and a mantissa bit or two, about half the select's steps.
//
// Each warp takes kRows consecutive rows (narrow rows only) and loads the next row's values while
// it selects in the current one, so the loads of a row overlap the select of the previous.
template <int VPT>
__host__ __device__ constexpr int topk_rows_per_warp() {
  return VPT <= 16 ? 4 : 1;
}

template <int VPT>
__device__ __forceinline__ void load_row(const float* __restrict__ xr, int width, int lane, uint32_t (&raw)[VPT]) {
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int c = j * kWarp + lane;
    raw[j] = c < width ? __float_as_uint(__ldg(xr + c)) : 0u;
  }
}

template <int VPT, typename I>
__global__ void __launch_bounds__(kRowThreads, VPT <= 8 ? 5 : 1)
    maxk_forward_kernel(const float* __restrict__ x, int64_t ld, int64_t rows, int width, int k,
                        float* __restrict__ values, I* __restrict__ index) {
  constexpr int kRows = topk_rows_per_warp<VPT>();
  const int lane = threadIdx.x & (kWarp - 1);
  const bool bounded = k <= kWarp && width >= kWarp;
  int group_lanes = kWarp;  // 32 / (groups), groups = k rounded up to a power of two
  while (group_lanes > 1 && kWarp / group_lanes < k) group_lanes /= 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowWarps * kRows;
  for (int64_t first = (static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp) * kRows; first < rows;
       first += stride) {
    const int64_t last = min(rows, first + kRows);
    uint32_t raw[VPT];
    if constexpr (kRows > 1) load_row<VPT>(x + first * ld, width, lane, raw);
    for (int64_t r = first; r < last; ++r) {
      if constexpr (kRows == 1) load_row<VPT>(x + r * ld, width, lane, raw);
      uint32_t key[VPT];
      uint32_t lo = 0xffffffffu, hi = 0u;
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        const int c = j * kWarp + lane;
        key[j] = 0u;
        if (c < width) {
          key[j] = order_key(__uint_as_float(raw[j]));
          lo = min(lo, key[j]);
          hi = max(hi, key[j]);
        }
      }
      if constexpr (kRows > 1) {
        if (r + 1 < last) load_row<VPT>(x + (r + 1) * ld, width, lane, raw);
      }
      if (bounded) {
        uint32_t group_max = hi;  // every lane holds a column
        for (int o = 1; o < group_lanes; o *= 2) group_max = max(group_max, __shfl_xor_sync(kFull, group_max, o));
        lo = group_max;
      }
      lo = warp_min(lo);
      hi = warp_max(hi);
      const uint32_t diff = lo ^ hi;
      uint32_t t_key = hi;  // lo == hi: at least k keys equal the maximum, T = the maximum
      bool exact = false;   // count(key >= T) == k
      if (diff != 0u) {
        const int top = 31 - __clz(diff);
        t_key = hi & ~((2u << top) - 1u);  // the shared prefix; 2u << 31 wraps to 0, masking all bits
        for (int b = top; b >= 0; --b) {
          const uint32_t cand = t_key | (1u << b);
          int n = 0;
#pragma unroll
          for (int j = 0; j < VPT; ++j) n += key[j] >= cand ? 1 : 0;  // invalid key 0 < cand
          n = warp_sum(n);
          if (n >= k) {
            t_key = cand;
            if (n == k) {
              exact = true;
              break;
            }
          }
        }
      }
      float* vr = values + r * k;
      I* ir = index + r * k;
      int taken = 0;
      if (exact) {  // keep every key >= T (T > 0 here, so never an invalid column)
#pragma unroll
        for (int j = 0; j < VPT; ++j) {
          if (taken < k) {  // warp-uniform
            const bool take = key[j] >= t_key;
            const unsigned take_mask = __ballot_sync(kFull, take);
            if (take) {
              const int pos = taken + __popc(take_mask & lanemask_lt(lane));
              vr[pos] = key_value(key[j]);
              ir[pos] = static_cast<I>(j * kWarp + lane);
            }
            taken += __popc(take_mask);
          }
        }
        continue;
      }
      int gt = 0;
#pragma unroll
      for (int j = 0; j < VPT; ++j) gt += key[j] > t_key ? 1 : 0;
      gt = warp_sum(gt);
      const int need = k - gt;  // keys equal to T to keep, lowest columns first
      int equal_seen = 0;
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        if (taken < k) {  // warp-uniform
          const int c = j * kWarp + lane;
          const bool equal = c < width && key[j] == t_key;
          const unsigned equal_mask = __ballot_sync(kFull, equal);
          const bool take = key[j] > t_key || (equal && equal_seen + __popc(equal_mask & lanemask_lt(lane)) < need);
          const unsigned take_mask = __ballot_sync(kFull, take);
          if (take) {
            const int pos = taken + __popc(take_mask & lanemask_lt(lane));
            vr[pos] = key_value(key[j]);
            ir[pos] = static_cast<I>(c);
          }
          taken += __popc(take_mask);
          equal_seen += __popc(equal_mask);
        }
      }
    }
  }
}

template <typename I>
void launch_maxk_forward(ConstMatrixView x, const CbsrView& out, cudaStream_t stream) {
  const int width = static_cast<int>(out.width), k = static_cast<int>(out.k);
  I* index = static_cast<I*>(out.index);
  const int per_lane = (width + kWarp - 1) / kWarp;
#define GALE_MAXK_TOPK(VPT)                                                                          \
  if (per_lane <= VPT) {                                                                             \
    const int64_t warps = (out.rows + topk_rows_per_warp<VPT>() - 1) / topk_rows_per_warp<VPT>();   \
    maxk_forward_kernel<VPT, I><<<row_blocks(warps), kRowThreads, 0, stream>>>(x.data, x.ld, out.rows, width, k, \
                                                                               out.values, index);  \
    GALE_CHECK_CUDA(cudaGetLastError());                                                             \
    return;                                                                                          \
  }
  GALE_MAXK_TOPK(1)
  GALE_MAXK_TOPK(2)
  GALE_MAXK_TOPK(4)
  GALE_MAXK_TOPK(8)
  GALE_MAXK_TOPK(16)
  GALE_MAXK_TOPK(32)
  GALE_MAXK_TOPK(64)
  GALE_MAXK_TOPK(128)
#undef GALE_MAXK_TOPK
  throw InternalError("maxk_forward: no kernel for width " + std::to_string(width));
}

// ---- scatter to dense (MaxK backward, cbsr_to_dense) -------------------------------------------

// One warp per row: zeros over the row, then (after __syncwarp, which orders the two writes of a
// column made by different lanes) dense + sparse at the kept columns, either alone when the other
// is absent, as scatter_rows in maxk_cpu.cpp.
template <typename I>
__global__ void __launch_bounds__(kRowThreads)
    scatter_kernel(int64_t rows, int width, int k, const I* __restrict__ index, const float* __restrict__ sparse,
                   const float* __restrict__ dense, int64_t dense_ld, float* __restrict__ out, int64_t out_ld) {
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp; r < rows; r += total_warps) {
    float* o = out + r * out_ld;
    for (int c = lane; c < width; c += kWarp) o[c] = 0.0f;
    __syncwarp();
    for (int t = lane; t < k; t += kWarp) {
      const int c = index[r * k + t];
      float v = 0.0f;
      if (dense != nullptr && sparse != nullptr) {
        v = __ldg(dense + r * dense_ld + c) + __ldg(sparse + r * k + t);
      } else if (dense != nullptr) {
        v = __ldg(dense + r * dense_ld + c);
      } else if (sparse != nullptr) {
        v = __ldg(sparse + r * k + t);
      }
      o[c] = v;
    }
    __syncwarp();  // the next row's zeros cannot alias, but keep the warp together per row
  }
}

void launch_scatter(const ConstCbsrView& p, const float* sparse, ConstMatrixView dense, MatrixView out,
                    cudaStream_t stream) {
  const unsigned blocks = row_blocks(p.rows);
  const int width = static_cast<int>(p.width), k = static_cast<int>(p.k);
  if (p.index_bytes() == 1) {
    scatter_kernel<uint8_t><<<blocks, kRowThreads, 0, stream>>>(p.rows, width, k, p.index_u8(), sparse, dense.data,
                                                                dense.ld, out.data, out.ld);
  } else {
    scatter_kernel<uint16_t><<<blocks, kRowThreads, 0, stream>>>(p.rows, width, k, p.index_u16(), sparse,
                                                                 dense.data, dense.ld, out.data, out.ld);
  }
  GALE_CHECK_CUDA(cudaGetLastError());
}

// ---- edge groups ------------------------------------------------------------------------------

__global__ void group_counts_kernel(const int64_t* __restrict__ indptr, int64_t rows, int64_t group_size,
                                    int64_t* __restrict__ counts) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r <= rows; r += stride)
    counts[r] = r < rows ? (indptr[r + 1] - indptr[r] + group_size - 1) / group_size : 0;
}

__global__ void group_fill_kernel(const int64_t* __restrict__ indptr, int64_t rows, int64_t group_size,
                                  const int64_t* __restrict__ offsets, EdgeGroup* __restrict__ groups,
                                  int64_t* __restrict__ count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r <= rows; r += stride) {
    if (r == rows) {
      *count = offsets[rows];
      continue;
    }
    const int64_t begin = indptr[r], end = indptr[r + 1];
    int64_t q = offsets[r];
    for (int64_t s = begin; s < end; s += group_size, ++q) {
      EdgeGroup g;
      g.start = s;
      g.row = static_cast<int32_t>(r);
      g.count = static_cast<int32_t>(min(group_size, end - s));
      groups[q] = g;
    }
  }
}

size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

size_t scan_temp_bytes(int64_t items) {
  size_t bytes = 0;
  GALE_CHECK_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const int64_t*>(nullptr),
                                                static_cast<int64_t*>(nullptr), items));
  return bytes;
}

// ---- aggregations -----------------------------------------------------------------------------
//
// Both aggregations run on sub-warps of L lanes (k rounded up to a power of two, at least
// kMinLanes so that a row of the slot is written in whole 128-byte lines, at most a warp, which
// then loops over the k values). Each sub-warp owns a width-float slot of shared memory and one
// work item, and never waits for another sub-warp: the kernels have no block barriers, only
// __syncwarp over the sub-warp's lanes.

constexpr int kMinLanes = 8;
constexpr int kAggMaxThreads = 256;
// At least 4 full blocks per SM (32 warps): at most 64 registers a thread.
constexpr int kAggMinBlocks = 4;
// Slot memory per block: 16 sub-warps of width 1024, 4 of width 4096 (above the default 48 KiB,
// raised with cudaFuncSetAttribute).
constexpr int64_t kSlotBudget = 64 * 1024;
// SpGEMM: entries whose value and column loads are in flight together (divides kMinLanes).
constexpr int kGather = 8;
// SSpMM: steps (of L / lanes-per-entry entries each) whose column loads are in flight together.
constexpr int kScatter = 4;
// Edge groups per work item of the group walks (at most kMinLanes: one lane loads each).
constexpr int kChunkGroups = 4;
// SpGEMM rows with at most this many entries are summed whole by one sub-warp and written once
// with plain stores (bias and self term included). Longer rows ("hubs": about 7% of an R-MAT
// graph's rows but 80% of its entries) are set to bias + self term by a first kernel and
// accumulated edge group by edge group, each run of a row's groups in a work item adding its sum
// with float4 atomics. The split depends on the degree alone, never on the group table's group
// size, so any table of the graph gives the same result.
constexpr int64_t kHubDegree = 128;

struct AggParams {
  // The graph.
  const int64_t* indptr = nullptr;
  int64_t rows = 0;
  const int32_t* indices = nullptr;
  const float* edge_weight = nullptr;
  const float* row_scale = nullptr;
  const float* col_scale = nullptr;
  // The edge groups.
  const EdgeGroup* groups = nullptr;
  int64_t capacity = 0;
  const int64_t* count = nullptr;
  // The CBSR pattern: columns (uint8_t or uint16_t), width, k.
  const void* index = nullptr;
  int width = 0;
  int k = 0;
  // Work items: SpGEMM's are `tiles` tiles of L rows and the group chunks, interleaved; SSpMM's
  // the group chunks.
  int64_t tiles = 0;
  int64_t items = 0;
  // SSpMM: log2 of the lanes that share one entry.
  int entry_shift = 0;
  // SpGEMM: x's values in, out dense.
  const float* values = nullptr;
  float* out = nullptr;
  int64_t out_ld = 0;
  const float* bias = nullptr;
  const float* self_coefs = nullptr;
  float self_scale = 0.0f;
  int64_t self_rows = 0;
  // SSpMM: the dense gradient in, grad values out.
  const float* grad = nullptr;
  int64_t grad_ld = 0;
  float* grad_values = nullptr;
};

// The lanes of this thread's sub-warp of L lanes.
template <int L>
__device__ __forceinline__ unsigned sub_mask() {
  if constexpr (L == kWarp) {
    return kFull;
  } else {
    return ((1u << L) - 1u) << ((threadIdx.x % kWarp) & ~(L - 1));
  }
}

__device__ __forceinline__ int64_t group_total(const AggParams& p) {
  return p.count != nullptr ? min(*p.count, p.capacity) : p.capacity;
}

// Group g of the table as one 16-byte load: start, then row (low word) and count (high word).
__device__ __forceinline__ EdgeGroup load_group(const EdgeGroup* groups, int64_t g) {
  static_assert(sizeof(EdgeGroup) == 16 && alignof(EdgeGroup) == 8, "EdgeGroup layout");
  const longlong2 v = __ldg(reinterpret_cast<const longlong2*>(groups) + g);
  EdgeGroup e;
  e.start = v.x;
  e.row = static_cast<int32_t>(static_cast<uint64_t>(v.y) & 0xffffffffu);
  e.count = static_cast<int32_t>(static_cast<uint64_t>(v.y) >> 32);
  return e;
}

// Source and coefficient (col_scale[src] * edge_weight[e]) of entry start + base + l, for the
// lanes below m; 0 and 0 for the others.
__device__ __forceinline__ void load_entry(const AggParams& p, int64_t e, bool valid, int32_t* src, float* coef) {
  *src = 0;
  *coef = 0.0f;
  if (valid) {
    *src = __ldg(p.indices + e);
    float c = p.col_scale ? __ldg(p.col_scale + *src) : 1.0f;
    if (p.edge_weight) c *= __ldg(p.edge_weight + e);
    *coef = c;
  }
}

// SpGEMM's inner loop: adds coef_e * x[src_e] for the entries [start, start + count) into the
// slot. Lane l loads entry base + l's source and coefficient; then the sub-warp takes the entries
// kGather at a time, lane t reading value t (and t + L, ... when k > L) of each with all their
// loads in flight, and adds them into the slot one entry after the other. One entry's columns are
// distinct, but two entries can share a column held by different lanes: __syncwarp between.
template <int L, typename I>
__device__ __forceinline__ void spgemm_accumulate(const AggParams& p, int64_t start, int count, float* slot, int l,
                                                  unsigned mask) {
  const I* index = static_cast<const I*>(p.index);
  const int k = p.k;
  for (int base = 0; base < count; base += L) {
    const int m = min(L, count - base);
    int32_t my_src;
    float my_coef;
    load_entry(p, start + base + l, l < m, &my_src, &my_coef);
    for (int u0 = 0; u0 < m; u0 += kGather) {
      for (int t0 = 0; t0 < k; t0 += L) {
        const int t = t0 + l;
        float v[kGather];
        int col[kGather];
#pragma unroll
        for (int u = 0; u < kGather; ++u) {
          const int32_t src = __shfl_sync(mask, my_src, u0 + u, L);
          v[u] = 0.0f;
          col[u] = 0;
          if (u0 + u < m && t < k) {
            const int64_t at = static_cast<int64_t>(src) * k + t;
            v[u] = __ldg(p.values + at);
            col[u] = __ldg(index + at);
          }
        }
#pragma unroll
        for (int u = 0; u < kGather; ++u) {
          const float coef = __shfl_sync(mask, my_coef, u0 + u, L);
          if (u0 + u < m && t < k) slot[col[u]] += coef * v[u];
          __syncwarp(mask);
        }
      }
    }
  }
}

// Writes out row r from the slot (which holds the row's sum and is left zeroed): rs * sum, plus
// self * x[r] at x's kept columns, plus bias, in the CPU reference's order. Plain stores, marked
// streaming: the output is not read again by this op, the gathered x should stay in L2.
template <int L, typename I, bool kVec>
__device__ __forceinline__ void spgemm_write_row(const AggParams& p, int64_t r, float rs, float self, float* slot,
                                                 int l, unsigned mask) {
  const int width = p.width;
  if (self != 0.0f) {
    for (int c = l; c < width; c += L) slot[c] *= rs;
    __syncwarp(mask);
    const I* index = static_cast<const I*>(p.index);
    for (int t = l; t < p.k; t += L) {
      const int64_t at = r * p.k + t;
      slot[__ldg(index + at)] += self * __ldg(p.values + at);
    }
    __syncwarp(mask);
    rs = 1.0f;
  }
  float* o = p.out + r * p.out_ld;
  if constexpr (kVec) {
    float4* s4 = reinterpret_cast<float4*>(slot);
    float4* o4 = reinterpret_cast<float4*>(o);
    const float4* b4 = reinterpret_cast<const float4*>(p.bias);
    for (int c = l; c < width / 4; c += L) {
      float4 v = s4[c];
      s4[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 b = p.bias ? __ldg(b4 + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      v.x = rs * v.x + b.x;
      v.y = rs * v.y + b.y;
      v.z = rs * v.z + b.z;
      v.w = rs * v.w + b.w;
      __stcs(o4 + c, v);
    }
  } else {
    for (int c = l; c < width; c += L) {
      const float v = slot[c];
      slot[c] = 0.0f;
      __stcs(o + c, rs * v + (p.bias ? __ldg(p.bias + c) : 0.0f));
    }
  }
  __syncwarp(mask);
}

// Adds rs[row] times the slot into out[row] with atomics (float4 ones when kVec), skipping columns
// no entry reached, and leaves the slot zeroed.
template <int L, bool kVec>
__device__ __forceinline__ void spgemm_flush(const AggParams& p, int row, float* slot, int l, unsigned mask) {
  __syncwarp(mask);
  const float rs = p.row_scale ? __ldg(p.row_scale + row) : 1.0f;
  float* o = p.out + static_cast<int64_t>(row) * p.out_ld;
  if constexpr (kVec) {
    float4* s4 = reinterpret_cast<float4*>(slot);
    for (int c = l; c < p.width / 4; c += L) {
      const float4 v = s4[c];
      s4[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (v.x != 0.0f || v.y != 0.0f || v.z != 0.0f || v.w != 0.0f)
        atomic_add4(o + 4 * c, make_float4(rs * v.x, rs * v.y, rs * v.z, rs * v.w));
    }
  } else {
    for (int c = l; c < p.width; c += L) {
      const float v = slot[c];
      slot[c] = 0.0f;
      if (v != 0.0f) atomicAdd(o + c, rs * v);
    }
  }
  __syncwarp(mask);
}

// A tile: rows tile * L ... tile * L + L - 1 (lane i loads row i's extent and scales), each row of
// at most kHubDegree entries summed in the slot and written whole.
template <int L, typename I, bool kVec>
__device__ __forceinline__ void spgemm_tile(const AggParams& p, int64_t tile, float* slot, int l, unsigned mask) {
  const int64_t r0 = tile * L;
  const int64_t r = r0 + l;
  int64_t begin = 0, end = 0;
  float rs = 1.0f, self = 0.0f;
  if (r < p.rows) {
    begin = __ldg(p.indptr + r);
    end = __ldg(p.indptr + r + 1);
    if (p.row_scale) rs = __ldg(p.row_scale + r);
    if (r < p.self_rows) self = p.self_scale + (p.self_coefs ? __ldg(p.self_coefs + r) : 0.0f);
  }
  const int n = static_cast<int>(min(static_cast<int64_t>(L), p.rows - r0));
  for (int i = 0; i < n; ++i) {
    const int64_t b = __shfl_sync(mask, begin, i, L);
    const int64_t degree = __shfl_sync(mask, end, i, L) - b;
    const float row_rs = __shfl_sync(mask, rs, i, L);
    const float row_self = __shfl_sync(mask, self, i, L);
    if (degree > kHubDegree) continue;  // the hub kernels' row
    spgemm_accumulate<L, I>(p, b, static_cast<int>(degree), slot, l, mask);
    __syncwarp(mask);
    spgemm_write_row<L, I, kVec>(p, r0 + i, row_rs, row_self, slot, l, mask);
  }
}

// A chunk: edge groups chunk * kChunkGroups ..., those of hub rows only (lane g loads group g and
// its row's degree). Consecutive groups of one row share the slot and one flush.
template <int L, typename I, bool kVec>
__device__ __forceinline__ void spgemm_chunk(const AggParams& p, int64_t chunk, float* slot, int l, unsigned mask) {
  const int64_t n = group_total(p);
  const int64_t g = chunk * kChunkGroups + l;
  int64_t start = 0;
  int row = -1, count = 0;
  if (l < kChunkGroups && g < n) {
    const EdgeGroup eg = load_group(p.groups, g);
    if (__ldg(p.indptr + eg.row + 1) - __ldg(p.indptr + eg.row) > kHubDegree) {
      start = eg.start;
      row = eg.row;
      count = eg.count;
    }
  }
  int current = -1;
  for (int i = 0; i < kChunkGroups; ++i) {
    const int gr = __shfl_sync(mask, row, i, L);
    const int64_t gs = __shfl_sync(mask, start, i, L);
    const int gc = __shfl_sync(mask, count, i, L);
    if (gr < 0) continue;
    if (gr != current) {
      if (current >= 0) spgemm_flush<L, kVec>(p, current, slot, l, mask);
      current = gr;
    }
    spgemm_accumulate<L, I>(p, gs, gc, slot, l, mask);
  }
  if (current >= 0) spgemm_flush<L, kVec>(p, current, slot, l, mask);
}

// Alg. 1 reorganised: item i is a tile or a group chunk (Bresenham-interleaved, so the tiles'
// DRAM-bound row writes and the chunks' L2-bound gathers run side by side).
template <int L, typename I, bool kVec>
__global__ void __launch_bounds__(kAggMaxThreads, kAggMinBlocks) spgemm_kernel(AggParams p) {
  extern __shared__ float4 smem4[];
  const int subs = static_cast<int>(blockDim.x) / L;
  const int sub = static_cast<int>(threadIdx.x) / L, l = static_cast<int>(threadIdx.x) % L;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * subs + sub;
  if (item >= p.items) return;  // no block barrier follows
  const unsigned mask = sub_mask<L>();
  float* slot = reinterpret_cast<float*>(smem4) + static_cast<int64_t>(sub) * p.width;
  for (int c = l; c < p.width; c += L) slot[c] = 0.0f;
  __syncwarp(mask);
  const int64_t tiles_before = item * p.tiles / p.items;
  if ((item + 1) * p.tiles / p.items > tiles_before) {
    spgemm_tile<L, I, kVec>(p, tiles_before, slot, l, mask);
  } else {
    spgemm_chunk<L, I, kVec>(p, item - tiles_before, slot, l, mask);
  }
}

// Hub rows (more than kHubDegree entries): out[r] = bias (or 0) + self_coef(r) * x[r] at x's kept
// columns, before the group chunks add their sums. Lane i of a warp checks row r0 + i, then the
// warp writes the hub rows among its 32 together.
template <typename I>
__global__ void __launch_bounds__(kRowThreads) spgemm_hub_init_kernel(AggParams p) {
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowWarps * kWarp;
  const I* index = static_cast<const I*>(p.index);
  for (int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp) * kWarp; r0 < p.rows;
       r0 += stride) {
    const int64_t r = r0 + lane;
    const bool hub = r < p.rows && __ldg(p.indptr + r + 1) - __ldg(p.indptr + r) > kHubDegree;
    unsigned hubs = __ballot_sync(kFull, hub);
    while (hubs != 0u) {
      const int64_t row = r0 + __ffs(hubs) - 1;
      hubs &= hubs - 1u;
      float* o = p.out + row * p.out_ld;
      for (int c = lane; c < p.width; c += kWarp) o[c] = p.bias ? __ldg(p.bias + c) : 0.0f;
      const float self = row < p.self_rows ? p.self_scale + (p.self_coefs ? __ldg(p.self_coefs + row) : 0.0f) : 0.0f;
      if (self != 0.0f) {  // warp-uniform
        __syncwarp();       // orders the bias stores before the updates of other lanes' columns
        for (int t = lane; t < p.k; t += kWarp) {
          const int64_t at = row * p.k + t;
          o[__ldg(index + at)] += self * __ldg(p.values + at);
        }
      }
      __syncwarp();
    }
  }
}

// SSpMM column loads: V consecutive columns of an entry's k in one load.
template <typename I, int V>
struct Columns;
template <typename I>
struct Columns<I, 1> {
  using Word = I;
  __device__ static int get(Word w, int) { return w; }
};
template <>
struct Columns<uint8_t, 4> {
  using Word = uint32_t;
  __device__ static int get(Word w, int i) { return (w >> (8 * i)) & 0xffu; }
};
template <>
struct Columns<uint16_t, 4> {
  using Word = uint2;
  __device__ static int get(Word w, int i) { return ((i < 2 ? w.x : w.y) >> (16 * (i & 1))) & 0xffffu; }
};

// Stages rs[row] * g[row] in the slot.
template <int L, bool kVec>
__device__ __forceinline__ void sspmm_stage(const AggParams& p, int row, float* slot, int l) {
  const float rs = p.row_scale ? __ldg(p.row_scale + row) : 1.0f;
  const float* g = p.grad + static_cast<int64_t>(row) * p.grad_ld;
  if constexpr (kVec) {
    float4* s4 = reinterpret_cast<float4*>(slot);
    const float4* g4 = reinterpret_cast<const float4*>(g);
    for (int c = l; c < p.width / 4; c += L) {
      const float4 v = __ldg(g4 + c);
      s4[c] = make_float4(rs * v.x, rs * v.y, rs * v.z, rs * v.w);
    }
  } else {
    for (int c = l; c < p.width; c += L) slot[c] = rs * __ldg(g + c);
  }
}

// SSpMM's inner loop over the entries [start, start + count) of a row whose scaled gradient the
// slot holds: entry (i, j) adds coef * slot[idx[j][t]] to grad_values[j][t] for every t. Lanes
// take V consecutive t of an entry (E = 2^entry_shift lanes per entry, so P = L / E entries per
// step); kScatter steps issue their column loads before any of their atomics. The first L
// entries' sources and coefficients come in from the caller, loaded before the slot was staged.
template <int L, typename I, int V>
__device__ __forceinline__ void sspmm_scatter(const AggParams& p, int64_t start, int count, int32_t first_src,
                                              float first_coef, const float* slot, int l, unsigned mask) {
  using Cols = Columns<I, V>;
  const int k = p.k;
  const int pieces = k / V;
  const int lanes_per_entry = 1 << p.entry_shift;
  const int per_step = L >> p.entry_shift;
  const int lane_piece = l & (lanes_per_entry - 1);
  const int lane_entry = l >> p.entry_shift;
  const I* index = static_cast<const I*>(p.index);
  for (int base = 0; base < count; base += L) {
    const int m = min(L, count - base);
    int32_t my_src = first_src;
    float my_coef = first_coef;
    if (base > 0) load_entry(p, start + base + l, l < m, &my_src, &my_coef);
    for (int q0 = 0; q0 < pieces; q0 += lanes_per_entry) {
      const int q = q0 + lane_piece;
      for (int u0 = 0; u0 < m; u0 += per_step * kScatter) {
        int32_t src[kScatter];
        typename Cols::Word cols[kScatter];
#pragma unroll
        for (int s = 0; s < kScatter; ++s) {
          const int u = u0 + s * per_step + lane_entry;
          src[s] = __shfl_sync(mask, my_src, u & (L - 1), L);
          if (u < m && q < pieces) {
            const int64_t at = static_cast<int64_t>(src[s]) * k + static_cast<int64_t>(q) * V;
            cols[s] = __ldg(reinterpret_cast<const typename Cols::Word*>(index + at));
          }
        }
#pragma unroll
        for (int s = 0; s < kScatter; ++s) {
          const int u = u0 + s * per_step + lane_entry;
          const float coef = __shfl_sync(mask, my_coef, u & (L - 1), L);
          if (u >= m || q >= pieces) continue;
          float* gv = p.grad_values + static_cast<int64_t>(src[s]) * k + static_cast<int64_t>(q) * V;
          if constexpr (V == 4) {
            atomic_add4(gv, make_float4(coef * slot[Cols::get(cols[s], 0)], coef * slot[Cols::get(cols[s], 1)],
                                        coef * slot[Cols::get(cols[s], 2)], coef * slot[Cols::get(cols[s], 3)]));
          } else {
            atomicAdd(gv, coef * slot[Cols::get(cols[s], 0)]);
          }
        }
      }
    }
  }
}

// Alg. 2 over chunks of kChunkGroups edge groups per sub-warp: the slot is restaged only when the
// row changes (a hub's consecutive groups share it), and each group's first sources are loaded
// before the staging so the two loads overlap.
template <int L, typename I, int V, bool kVec>
__global__ void __launch_bounds__(kAggMaxThreads, kAggMinBlocks) sspmm_kernel(AggParams p) {
  extern __shared__ float4 smem4[];
  const int subs = static_cast<int>(blockDim.x) / L;
  const int sub = static_cast<int>(threadIdx.x) / L, l = static_cast<int>(threadIdx.x) % L;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * subs + sub;
  if (chunk >= p.items) return;  // no block barrier follows
  const unsigned mask = sub_mask<L>();
  float* slot = reinterpret_cast<float*>(smem4) + static_cast<int64_t>(sub) * p.width;
  const int64_t n = group_total(p);
  const int64_t g = chunk * kChunkGroups + l;
  int64_t start = 0;
  int row = -1, count = 0;
  if (l < kChunkGroups && g < n) {
    const EdgeGroup eg = load_group(p.groups, g);
    start = eg.start;
    row = eg.row;
    count = eg.count;
  }
  int current = -1;
  for (int i = 0; i < kChunkGroups; ++i) {
    const int gr = __shfl_sync(mask, row, i, L);
    const int64_t gs = __shfl_sync(mask, start, i, L);
    const int gc = __shfl_sync(mask, count, i, L);
    if (gr < 0) break;  // past the table's end
    int32_t src;
    float coef;
    load_entry(p, gs + l, l < gc, &src, &coef);
    if (gr != current) {
      __syncwarp(mask);  // the previous row's gathers are done
      sspmm_stage<L, kVec>(p, gr, slot, l);
      __syncwarp(mask);
      current = gr;
    }
    sspmm_scatter<L, I, V>(p, gs, gc, src, coef, slot, l, mask);
  }
}

// grad_values[j][t] = self_coef(j) * g[j][idx[j][t]] (0 past the self rows): SSpMM's part that is
// not a sum over entries.
template <typename I>
__global__ void sspmm_init_kernel(int64_t rows, int k, const I* __restrict__ index, int64_t self_rows, float self_scale,
                                  const float* __restrict__ self_coefs, const float* __restrict__ grad, int64_t grad_ld,
                                  float* __restrict__ grad_values) {
  const int64_t total = rows * k;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t j = i / k;
    const float self = j < self_rows ? self_scale + (self_coefs ? __ldg(self_coefs + j) : 0.0f) : 0.0f;
    grad_values[i] = self != 0.0f ? self * __ldg(grad + j * grad_ld + index[i]) : 0.0f;
  }
}

// k rounded up to a power of two, clamped to [kMinLanes, 32].
int lanes_for(int64_t k) {
  int l = kMinLanes;
  while (l < k && l < kWarp) l *= 2;
  return l;
}

struct AggShape {
  int lanes = kWarp;
  int subs = 1;      // sub-warps (slots) per block
  int threads = kWarp;
  size_t smem = 0;
};

AggShape agg_shape(int64_t width, int64_t k) {
  AggShape s;
  s.lanes = lanes_for(k);
  const int64_t by_smem = std::max<int64_t>(1, kSlotBudget / (width * static_cast<int64_t>(sizeof(float))));
  s.subs = static_cast<int>(std::min<int64_t>(kAggMaxThreads / s.lanes, by_smem));
  s.subs = std::max(s.subs, kWarp / s.lanes);  // whole warps (widths up to 4096 give 4 slots, enough)
  s.threads = s.subs * s.lanes;
  s.smem = static_cast<size_t>(s.subs) * static_cast<size_t>(width) * sizeof(float);
  return s;
}

template <typename Kernel>
void launch_agg(Kernel kernel, const AggShape& s, const AggParams& p, cudaStream_t stream) {
  const int64_t blocks = (p.items + s.subs - 1) / s.subs;
  if (blocks > std::numeric_limits<int32_t>::max())
    throw InputError("maxk aggregation: " + std::to_string(p.items) + " work items need too many blocks");
  if (s.smem > static_cast<size_t>(kDefaultSmemLimit))
    GALE_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(s.smem)));
  kernel<<<static_cast<unsigned>(blocks), s.threads, s.smem, stream>>>(p);
  GALE_CHECK_CUDA(cudaGetLastError());
}

template <typename I, bool kVec>
void dispatch_spgemm(const AggShape& s, const AggParams& p, cudaStream_t stream) {
  switch (s.lanes) {
    case 8: launch_agg(spgemm_kernel<8, I, kVec>, s, p, stream); return;
    case 16: launch_agg(spgemm_kernel<16, I, kVec>, s, p, stream); return;
    case 32: launch_agg(spgemm_kernel<32, I, kVec>, s, p, stream); return;
    default: break;
  }
  throw InternalError("spgemm_cbsr: no kernel for " + std::to_string(s.lanes) + " lanes");
}

template <typename I, int V, bool kVec>
void dispatch_sspmm(const AggShape& s, const AggParams& p, cudaStream_t stream) {
  switch (s.lanes) {
    case 8: launch_agg(sspmm_kernel<8, I, V, kVec>, s, p, stream); return;
    case 16: launch_agg(sspmm_kernel<16, I, V, kVec>, s, p, stream); return;
    case 32: launch_agg(sspmm_kernel<32, I, V, kVec>, s, p, stream); return;
    default: break;
  }
  throw InternalError("sspmm_cbsr: no kernel for " + std::to_string(s.lanes) + " lanes");
}

template <typename I>
void dispatch_sspmm(const AggShape& s, const AggParams& p, bool vec_columns, bool vec_grad, cudaStream_t stream) {
  if (vec_columns) {
    vec_grad ? dispatch_sspmm<I, 4, true>(s, p, stream) : dispatch_sspmm<I, 4, false>(s, p, stream);
  } else {
    vec_grad ? dispatch_sspmm<I, 1, true>(s, p, stream) : dispatch_sspmm<I, 1, false>(s, p, stream);
  }
}

int ceil_log2(int64_t v) {
  int s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return s;
}

std::string groups_cannot(const CsrView& g, const EdgeGroupsView& groups) {
  if (g.rows >= (int64_t{1} << 31)) return "edge groups hold 32-bit rows; the graph has " + std::to_string(g.rows);
  if (groups.capacity < 0) return "the edge group table has a negative capacity";
  if (groups.capacity > 0 && groups.groups == nullptr) return "the edge group table is null";
  return "";
}

void require(const std::string& why, const char* op) {
  if (!why.empty()) throw InputError(std::string(op) + ": " + why);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

// ---- public entry points ------------------------------------------------------------------------

std::string maxk_cuda_cannot(int64_t width) {
  if (width > kMaxkCudaMaxWidth)
    return "width " + std::to_string(width) + " is above the CUDA kernels' " + std::to_string(kMaxkCudaMaxWidth);
  return "";
}

size_t edge_groups_workspace_bytes(int64_t rows) {
  const size_t offsets = align256(static_cast<size_t>(rows + 1) * sizeof(int64_t));
  return 2 * offsets + align256(scan_temp_bytes(rows + 1));
}

void edge_groups_cuda(const CsrView& graph, int64_t group_size, EdgeGroup* groups, int64_t capacity, int64_t* count,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (group_size < 1 || group_size > (int64_t{1} << 30))
    throw InputError("edge groups: group size " + std::to_string(group_size) + " is out of range");
  require(groups_cannot(graph, EdgeGroupsView{groups, capacity, count}), "edge groups");
  if (count == nullptr) throw InputError("edge groups: count is null");
  const size_t need = edge_groups_workspace_bytes(graph.rows);
  if (workspace_bytes < need || workspace == nullptr)
    throw InputError("edge groups: the workspace has " + std::to_string(workspace_bytes) + " bytes, " +
                     std::to_string(need) + " needed");
  const int64_t items = graph.rows + 1;
  const size_t offsets_bytes = align256(static_cast<size_t>(items) * sizeof(int64_t));
  auto* counts = static_cast<int64_t*>(workspace);
  auto* offsets = reinterpret_cast<int64_t*>(static_cast<char*>(workspace) + offsets_bytes);
  void* temp = static_cast<char*>(workspace) + 2 * offsets_bytes;
  size_t temp_bytes = workspace_bytes - 2 * offsets_bytes;
  const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>((items + 255) / 256, 1, 4096));
  group_counts_kernel<<<blocks, 256, 0, stream>>>(graph.indptr, graph.rows, group_size, counts);
  GALE_CHECK_CUDA(cudaGetLastError());
  GALE_CHECK_CUDA(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, counts, offsets, items, stream));
  // The fill writes offsets[rows] groups, which edge_groups_capacity(rows, nnz) bounds; the host
  // cannot check a count that is still on the device.
  group_fill_kernel<<<blocks, 256, 0, stream>>>(graph.indptr, graph.rows, group_size, offsets, groups, count);
  GALE_CHECK_CUDA(cudaGetLastError());
}

void maxk_forward_cuda(ConstMatrixView x, const CbsrView& out, cudaStream_t stream) {
  require(maxk_forward_cannot(x, out), "maxk_forward");
  require(maxk_cuda_cannot(out.width), "maxk_forward");
  if (out.rows == 0) return;
  if (out.index_bytes() == 1) {
    launch_maxk_forward<uint8_t>(x, out, stream);
  } else {
    launch_maxk_forward<uint16_t>(x, out, stream);
  }
}

void maxk_backward_cuda(const ConstCbsrView& pattern, const float* grad_values, ConstMatrixView grad_dense,
                        MatrixView grad_in, cudaStream_t stream) {
  require(maxk_backward_cannot(pattern, grad_dense, grad_in), "maxk_backward");
  require(maxk_cuda_cannot(pattern.width), "maxk_backward");
  if (pattern.rows == 0) return;
  launch_scatter(pattern, grad_values, grad_dense, grad_in, stream);
}

void cbsr_to_dense_cuda(const ConstCbsrView& x, MatrixView out, cudaStream_t stream) {
  require(maxk_backward_cannot(x, ConstMatrixView{}, out), "cbsr_to_dense");
  require(maxk_cuda_cannot(x.width), "cbsr_to_dense");
  if (x.rows == 0) return;
  launch_scatter(x, x.values, ConstMatrixView{}, out, stream);
}

void spgemm_cbsr_cuda(const SpgemmCbsrArgs& a, const EdgeGroupsView& groups, cudaStream_t stream) {
  require(spgemm_cbsr_cannot(a), "spgemm_cbsr");
  require(maxk_cuda_cannot(a.x.width), "spgemm_cbsr");
  require(groups_cannot(a.graph, groups), "spgemm_cbsr");
  const CsrView& g = a.graph;
  if (g.rows == 0) return;
  AggParams p;
  p.indptr = g.indptr;
  p.rows = g.rows;
  p.indices = g.indices;
  p.edge_weight = a.edge_weight;
  p.row_scale = a.row_scale;
  p.col_scale = a.col_scale;
  p.groups = groups.groups;
  p.capacity = groups.capacity;
  p.count = groups.count;
  p.index = a.x.index;
  p.width = static_cast<int>(a.x.width);
  p.k = static_cast<int>(a.x.k);
  p.values = a.x.values;
  p.out = a.out.data;
  p.out_ld = a.out.ld;
  p.bias = a.bias;
  p.self_coefs = a.self_coefs;
  p.self_scale = a.self_scale;
  p.self_rows = std::min(g.rows, a.x.rows);
  const bool u8 = a.x.index_bytes() == 1;

  // Hub rows first get bias + self term (their sums arrive by atomics); every other row is
  // written whole by its tile.
  const unsigned init_blocks = row_blocks((g.rows + kWarp - 1) / kWarp);
  if (u8) {
    spgemm_hub_init_kernel<uint8_t><<<init_blocks, kRowThreads, 0, stream>>>(p);
  } else {
    spgemm_hub_init_kernel<uint16_t><<<init_blocks, kRowThreads, 0, stream>>>(p);
  }
  GALE_CHECK_CUDA(cudaGetLastError());

  const AggShape s = agg_shape(p.width, p.k);
  p.tiles = (g.rows + s.lanes - 1) / s.lanes;
  p.items = p.tiles + (groups.capacity + kChunkGroups - 1) / kChunkGroups;
  const bool vec = p.width % 4 == 0 && a.out.ld % 4 == 0 && aligned16(a.out.data) &&
                   (a.bias == nullptr || aligned16(a.bias));
  if (u8) {
    vec ? dispatch_spgemm<uint8_t, true>(s, p, stream) : dispatch_spgemm<uint8_t, false>(s, p, stream);
  } else {
    vec ? dispatch_spgemm<uint16_t, true>(s, p, stream) : dispatch_spgemm<uint16_t, false>(s, p, stream);
  }
}

void sspmm_cbsr_cuda(const SspmmCbsrArgs& a, const EdgeGroupsView& groups, cudaStream_t stream) {
  require(sspmm_cbsr_cannot(a), "sspmm_cbsr");
  require(maxk_cuda_cannot(a.pattern.width), "sspmm_cbsr");
  require(groups_cannot(a.graph, groups), "sspmm_cbsr");
  const CsrView& g = a.graph;
  const ConstCbsrView& pat = a.pattern;
  if (pat.rows == 0) return;
  const int width = static_cast<int>(pat.width), k = static_cast<int>(pat.k);
  const int64_t self_rows = std::min(g.rows, pat.rows);
  const unsigned init_blocks =
      static_cast<unsigned>(std::clamp<int64_t>((pat.rows * k + kRowThreads - 1) / kRowThreads, 1, kMaxRowBlocks));
  if (pat.index_bytes() == 1) {
    sspmm_init_kernel<uint8_t><<<init_blocks, kRowThreads, 0, stream>>>(pat.rows, k, pat.index_u8(), self_rows,
                                                                        a.self_scale, a.self_coefs, a.grad_out.data,
                                                                        a.grad_out.ld, a.grad_values);
  } else {
    sspmm_init_kernel<uint16_t><<<init_blocks, kRowThreads, 0, stream>>>(pat.rows, k, pat.index_u16(), self_rows,
                                                                         a.self_scale, a.self_coefs, a.grad_out.data,
                                                                         a.grad_out.ld, a.grad_values);
  }
  GALE_CHECK_CUDA(cudaGetLastError());
  if (g.rows == 0 || groups.capacity == 0) return;

  AggParams p;
  p.indptr = g.indptr;
  p.rows = g.rows;
  p.indices = g.indices;
  p.edge_weight = a.edge_weight;
  p.row_scale = a.row_scale;
  p.col_scale = a.col_scale;
  p.groups = groups.groups;
  p.capacity = groups.capacity;
  p.count = groups.count;
  p.index = pat.index;
  p.width = width;
  p.k = k;
  p.grad = a.grad_out.data;
  p.grad_ld = a.grad_out.ld;
  p.grad_values = a.grad_values;
  const AggShape s = agg_shape(width, k);
  p.items = (groups.capacity + kChunkGroups - 1) / kChunkGroups;
  // Four columns per load and one float4 atomic per four values when the rows of k allow it.
  const bool vec_columns = k % 4 == 0 && aligned16(a.grad_values) &&
                           reinterpret_cast<uintptr_t>(pat.index) % (4 * pat.index_bytes()) == 0;
  const int v = vec_columns ? 4 : 1;
  p.entry_shift = std::min(ceil_log2(k / v), ceil_log2(s.lanes));
  const bool vec_grad = width % 4 == 0 && a.grad_out.ld % 4 == 0 && aligned16(a.grad_out.data);
  if (pat.index_bytes() == 1) {
    dispatch_sspmm<uint8_t>(s, p, vec_columns, vec_grad, stream);
  } else {
    dispatch_sspmm<uint16_t>(s, p, vec_columns, vec_grad, stream);
  }
}

}  // namespace gale::kernels
