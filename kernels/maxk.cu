// kernels/maxk.cu — the CUDA twins of the MaxK family (maxk.hpp), after MaxK-GNN (ASPLOS'24):
// the top-k nonlinearity into CBSR (Sec. 5.3, done here as an exact select by bisection), the forward
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

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/warp/warp_scan.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/warp.cuh"
#include "kernels/cuda/runtime.hpp"
#include "kernels/error.hpp"
#include "kernels/maxk.hpp"

namespace gale::kernels {

namespace {

// Row kernels (top-k, scatter, init): one warp per row, 8 warps per block.
constexpr int kRowWarps = 8;
constexpr int kRowThreads = kRowWarps * kWarp;
constexpr int kDefaultSmemLimit = 48 * 1024;
// Row kernels cap their grid and loop beyond it (a warp takes rows w, w + total, ...).
constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;
// A scatter that makes column sums runs this many blocks per SM (four waves of 256 threads; each
// warp leaves one row of partial sums). Measured in SAGE maxk:32's epoch (R-MAT 21, H100, two
// runs): 8 / 16 / 32 / 64 per SM 1.80-1.81 / 1.70 / 1.68 / 1.69-1.70 ms, against 1.50 for the
// scatter without sums on a grid of a warp per row.
constexpr int64_t kScatterSumBlocksPerSm = 32;

// ---- keys and small helpers -----------------------------------------------------------------

// Order-preserving key of a float's bits (maxk_cpu.cpp's order_key): larger floats, larger keys.
// Negative: all bits flipped; positive: the sign bit set. One shift and one xor.
__device__ __forceinline__ uint32_t order_key_bits(uint32_t b) {
  return b ^ (static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) | 0x80000000u);
}

// The float a key came from, bit for bit (NaN payloads included).
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float(key ^ (~static_cast<uint32_t>(static_cast<int32_t>(key) >> 31) | 0x80000000u));
}

// x + y + (a >= b) for b > 0, in two instructions: a + (2^32 - b) carries out exactly when a >= b
// (b == 0, passed as minus_b == 0, never carries).
__device__ __forceinline__ uint32_t add_carry_if_at_least(uint32_t x, uint32_t y, uint32_t a, uint32_t minus_b) {
  uint32_t r;
  asm("{\n\t.reg .u32 d;\n\tadd.cc.u32 d, %1, %2;\n\taddc.u32 %0, %3, %4;\n\t}"
      : "=r"(r)
      : "r"(a), "r"(minus_b), "r"(x), "r"(y));
  return r;
}
// n + (a >= b), a count.
__device__ __forceinline__ int add_if_at_least(int n, uint32_t a, uint32_t minus_b) {
  return static_cast<int>(add_carry_if_at_least(static_cast<uint32_t>(n), 0u, a, minus_b));
}
// (bits << 1) | (a >= b), a mask built from its top bit down.
__device__ __forceinline__ uint32_t shift_in_at_least(uint32_t bits, uint32_t a, uint32_t minus_b) {
  return add_carry_if_at_least(bits, bits, a, minus_b);
}

// SSpMM's L2 policy. Its atomics read-modify-write grad_values (rows x k floats: 268 MB at R-MAT
// 21, k = 32), far more than the L2 holds, so every other stream it reads must make room for them:
// half of the atomics' lines are marked evict-last (GALE_MAXK_RED_FRACTION; 0.25 / 0.75 / 1.0
// measured 0.5% slower), and the CBSR index rows (GALE_MAXK_INDEX_ONCE) and the staged gradient
// rows (GALE_MAXK_G_ONCE) are loaded evict-first. Measured on an H100 at R-MAT 21, width 256,
// k = 32: 5.02 ms before, 4.77 ms with all three (index rows alone 4.99, the atomics' hint alone
// 4.96, both 4.83).
#ifndef GALE_MAXK_RED_HINT
#define GALE_MAXK_RED_HINT 1
#endif
#ifndef GALE_MAXK_RED_FRACTION
#define GALE_MAXK_RED_FRACTION 0.5
#endif
#ifndef GALE_MAXK_INDEX_ONCE
#define GALE_MAXK_INDEX_ONCE 1
#endif
#ifndef GALE_MAXK_G_ONCE
#define GALE_MAXK_G_ONCE 1
#endif

#if GALE_MAXK_RED_HINT && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint64_t evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, %1;"
               : "=l"(policy)
               : "f"(static_cast<float>(GALE_MAXK_RED_FRACTION)));
  return policy;
}
// A 16-byte RED with an L2 cache policy (the address is global: no generic ATOM).
__device__ __forceinline__ void red_add4(float* p, float4 v, uint64_t policy) {
  asm volatile("red.global.add.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w), "l"(policy)
               : "memory");
}
#else
__device__ __forceinline__ uint64_t evict_last_policy() { return 0; }
__device__ __forceinline__ void red_add4(float* p, float4 v, uint64_t) { atomic_add(p, v); }
#endif

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>((rows + kRowWarps - 1) / kRowWarps, 1, kMaxRowBlocks));
}

// ---- top-k ------------------------------------------------------------------------------------

// One warp per row; lane l holds columns j * 32 + l (j < VPT) as keys, so loads are coalesced and
// the ballot over lanes at each j lists columns in increasing order. Invalid columns (past the
// width) hold key 0 and are excluded explicitly where 0 could match.
//
// The select bisects the keys between a lower bound of the k-th largest key and the row's maximum:
// T is kept with count(key >= T) >= k and L with count(key > L) < k, the middle of [T, L]
// counted at each step, until T == L (T is then the k-th largest key) or exactly k
// keys are >= T. Either way the kept set is every key > T plus the first k - count(key > T) keys
// equal to T in column order: the CPU reference's set. The lower bound is the row's minimum, or,
// when k <= 32 and every lane holds a column, the smallest of the maxima of 2^ceil(log2 k) groups
// of lanes: at least that many keys (one per group) are >= it, so it is at most the k-th largest.
// Halving the interval of keys, rather than fixing T's bits from the top (a radix select, which
// bisects only at prefixes of the maximum), takes 8.0 steps instead of 13.7 on average for k = 32
// of 256 normal values, and 5.6 instead of 12.9 for k = 16 (counted on the host); at most 32 plus
// one either way. A step is a count over the row's keys and a warp reduction, and the select is
// bound by issued instructions, so the steps are what it costs.
//
// Each warp takes kRows consecutive rows (narrow rows only) and loads the next row's values while
// it selects in the current one, so the loads of a row overlap the select of the previous.
template <int VPT>
__host__ __device__ constexpr int topk_rows_per_warp() {
  return VPT <= 16 ? 4 : 1;
}

// The row's values at columns j * 32 + lane (immediate offsets from one per-lane address).
template <int VPT>
__device__ __forceinline__ void load_row(const float* __restrict__ xr, int width, int lane, uint32_t (&raw)[VPT]) {
  const float* xl = xr + lane;
#pragma unroll
  for (int j = 0; j < VPT; ++j) raw[j] = j * kWarp + lane < width ? __float_as_uint(__ldg(xl + j * kWarp)) : 0u;
}

// The lanes of each group whose maxima bound the select from below (32 / k rounded up to a power of
// two, so one group per kept key at most): used when k <= 32 and every lane holds a column (rows of
// at least 32); 0 otherwise, and the bound is then the row's minimum.
__device__ __forceinline__ int bound_group_lanes(int k, int width) {
  if (k > kWarp || width < kWarp) return 0;
  int group_lanes = kWarp;
  while (group_lanes > 1 && kWarp / group_lanes < k) group_lanes /= 2;
  return group_lanes;
}

// The select of both top-k kernels, given the lane's keys (invalid columns 0) and its smallest
// and largest valid key: the threshold T (returned) and whether exactly k keys are >= T. With
// group_lanes > 0 (bound_group_lanes) the lower bound is the smallest of the maxima of groups of
// that many lanes, else the row's minimum.
template <int VPT>
__device__ __forceinline__ uint32_t select_threshold(const uint32_t (&key)[VPT], uint32_t lo, uint32_t hi, int k,
                                                     int group_lanes, bool* exact) {
  if (group_lanes > 0) {
    uint32_t group_max = hi;
    for (int o = 1; o < group_lanes; o *= 2) group_max = max(group_max, __shfl_xor_sync(kFull, group_max, o));
    lo = group_max;
  }
  lo = warp_min(lo);
  hi = warp_max(hi);
  // count(key >= T) >= k and count(key > t_last) < k throughout; each step halves [T, t_last].
  uint32_t t_key = lo, t_last = hi;
  *exact = false;
  while (t_key < t_last) {
    const uint32_t cand = t_key + ((t_last - t_key) >> 1) + 1u;  // in (T, t_last], no overflow
    int n = 0;
#pragma unroll
    for (int j = 0; j < VPT; ++j) n = add_if_at_least(n, key[j], 0u - cand);  // invalid key 0 < cand
    n = warp_sum(n);
    if (n >= k) {
      t_key = cand;
      if (n == k) {
        *exact = true;
        break;
      }
    } else {
      t_last = cand - 1u;
    }
  }
  return t_key;
}

// Exclusive prefix sum of v over the warp's lanes (CUB's shuffle scan: no shared memory).
__device__ __forceinline__ int warp_exclusive_sum(int v) {
  using Scan = cub::WarpScan<int>;
  typename Scan::TempStorage unused;
  int sum;
  Scan(unused).ExclusiveSum(v, sum);
  return sum;
}

template <int VPT, typename I, bool kDense>
__global__ void __launch_bounds__(kRowThreads, VPT <= 8 ? 5 : 1)
    maxk_forward_kernel(const float* x, int64_t ld, int64_t rows, int width, int k, float* __restrict__ values,
                        I* __restrict__ index, float* dense, int64_t dense_ld) {
  constexpr int kRows = topk_rows_per_warp<VPT>();
  const int lane = threadIdx.x & (kWarp - 1);
  const int bound_lanes = bound_group_lanes(k, width);
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
          key[j] = order_key_bits(raw[j]);
          lo = min(lo, key[j]);
          hi = max(hi, key[j]);
        }
      }
      if constexpr (kRows > 1) {
        if (r + 1 < last) load_row<VPT>(x + (r + 1) * ld, width, lane, raw);
      }
      bool exact;
      const uint32_t t_key = select_threshold<VPT>(key, lo, hi, k, bound_lanes, &exact);
      float* vr = values + r * k;
      I* ir = index + r * k;
      float* dr = kDense ? dense + r * dense_ld : nullptr;  // may be x's row: read above
      int taken = 0;
      if (exact) {  // keep every key >= T (T > 0 here, so never an invalid column): exactly k of them
        const unsigned below = lanemask_lt(lane);
#pragma unroll
        for (int j = 0; j < VPT; ++j) {
          const bool take = key[j] >= t_key;
          const unsigned take_mask = __ballot_sync(kFull, take);
          if (take) {
            const int pos = taken + __popc(take_mask & below);
            vr[pos] = key_value(key[j]);
            ir[pos] = static_cast<I>(j * kWarp + lane);
          }
          if (kDense && j * kWarp + lane < width) dr[j * kWarp + lane] = take ? key_value(key[j]) : 0.0f;
          taken += __popc(take_mask);
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
        const int c = j * kWarp + lane;
        bool take = false;
        if (taken < k) {  // warp-uniform
          const bool equal = c < width && key[j] == t_key;
          const unsigned equal_mask = __ballot_sync(kFull, equal);
          take = key[j] > t_key || (equal && equal_seen + __popc(equal_mask & lanemask_lt(lane)) < need);
          const unsigned take_mask = __ballot_sync(kFull, take);
          if (take) {
            const int pos = taken + __popc(take_mask & lanemask_lt(lane));
            vr[pos] = key_value(key[j]);
            ir[pos] = static_cast<I>(c);
          }
          taken += __popc(take_mask);
          equal_seen += __popc(equal_mask);
        }
        if (kDense && c < width) dr[c] = take ? key_value(key[j]) : 0.0f;
      }
    }
  }
}

// Rows of exactly 32 * VPT columns (VPT a multiple of 4), 16-byte aligned: lane l holds columns
// l * VPT ... l * VPT + VPT - 1, so a row is VPT / 4 float4 loads a lane, the dense form as many
// float4 stores, and the kept columns in lane order are in column order: each lane finds its kept
// keys' places from one exclusive sum of its count over the warp, instead of a ballot and popcount
// per column group. The select is the same. Ties at T go to the lowest columns as before: each
// lane's first equal keys are ranked by an exclusive sum of the equal counts.
template <int VPT, typename I, bool kDense>
__global__ void __launch_bounds__(kRowThreads, VPT <= 8 ? 5 : 1)
    maxk_forward_blocked_kernel(const float* x, int64_t ld, int64_t rows, int /*width: VPT * 32*/, int k,
                                float* __restrict__ values, I* __restrict__ index, float* dense, int64_t dense_ld) {
  static_assert(VPT % 4 == 0 && VPT <= 32, "float4 units, one 32-bit mask a lane");
  constexpr int kRows = topk_rows_per_warp<VPT>();
  constexpr int kUnits = VPT / 4;
  const int lane = threadIdx.x & (kWarp - 1);
  const int bound_lanes = bound_group_lanes(k, VPT * kWarp);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowWarps * kRows;
  auto load = [&](int64_t r, float4 (&raw)[kUnits]) {
    const float4* xr = reinterpret_cast<const float4*>(x + r * ld) + lane * kUnits;
#pragma unroll
    for (int q = 0; q < kUnits; ++q) raw[q] = __ldg(xr + q);
  };
  for (int64_t first = (static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp) * kRows; first < rows;
       first += stride) {
    const int64_t end = min(rows, first + kRows);
    float4 raw[kUnits];
    if constexpr (kRows > 1) load(first, raw);
    for (int64_t r = first; r < end; ++r) {
      if constexpr (kRows == 1) load(r, raw);
      uint32_t key[VPT];
      uint32_t lo = 0xffffffffu, hi = 0u;
#pragma unroll
      for (int q = 0; q < kUnits; ++q) {
        key[4 * q] = order_key_bits(__float_as_uint(raw[q].x));
        key[4 * q + 1] = order_key_bits(__float_as_uint(raw[q].y));
        key[4 * q + 2] = order_key_bits(__float_as_uint(raw[q].z));
        key[4 * q + 3] = order_key_bits(__float_as_uint(raw[q].w));
      }
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        lo = min(lo, key[j]);
        hi = max(hi, key[j]);
      }
      if constexpr (kRows > 1) {
        if (r + 1 < end) load(r + 1, raw);
      }
      bool exact;
      const uint32_t t_key = select_threshold<VPT>(key, lo, hi, k, bound_lanes, &exact);
      // Bit j: column lane * VPT + j is kept: key >= T when exact, else key > T (key >= T + 1,
      // which wraps to 0 and keeps nothing when T is the largest key there is).
      uint32_t keep = 0;
      const uint32_t minus_bound = 0u - (exact ? t_key : t_key + 1u);
#pragma unroll
      for (int j = VPT - 1; j >= 0; --j) keep = shift_in_at_least(keep, key[j], minus_bound);
      if (!exact) {  // every key > T, then the first k - count(key > T) keys equal to T
        uint32_t equal = 0;
#pragma unroll
        for (int j = 0; j < VPT; ++j) equal |= key[j] == t_key ? 1u << j : 0u;
        const int need = k - warp_sum(__popc(keep));
        const int before = warp_exclusive_sum(__popc(equal));
        if (before < need) {  // this lane's first need - before equal keys
          uint32_t e = equal;
          for (int n = min(need - before, __popc(equal)); n > 0; --n) {
            keep |= e & (0u - e);  // the lowest equal column left
            e &= e - 1u;
          }
        }
      }
      const int64_t pos = r * k + warp_exclusive_sum(__popc(keep));
      float* vp = values + pos;
      I* ip = index + pos;
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        if (keep & (1u << j)) {
          *vp++ = key_value(key[j]);
          *ip++ = static_cast<I>(lane * VPT + j);
        }
      }
      if constexpr (kDense) {  // may be x's row: read above
        float4* dr = reinterpret_cast<float4*>(dense + r * dense_ld) + lane * kUnits;
        auto kept = [&](int j) { return keep & (1u << j) ? key_value(key[j]) : 0.0f; };
#pragma unroll
        for (int q = 0; q < kUnits; ++q) dr[q] = make_float4(kept(4 * q), kept(4 * q + 1), kept(4 * q + 2), kept(4 * q + 3));
      }
    }
  }
}

template <typename I>
void launch_maxk_forward(ConstMatrixView x, const CbsrView& out, MatrixView dense, cudaStream_t stream) {
  const int width = static_cast<int>(out.width), k = static_cast<int>(out.k);
  I* index = static_cast<I*>(out.index);
  const int per_lane = (width + kWarp - 1) / kWarp;
#define GALE_MAXK_TOPK(KERNEL, VPT, WHEN)                                                            \
  if (WHEN) {                                                                                        \
    const int64_t warps = (out.rows + topk_rows_per_warp<VPT>() - 1) / topk_rows_per_warp<VPT>();   \
    if (dense.data != nullptr) {                                                                     \
      KERNEL<VPT, I, true><<<row_blocks(warps), kRowThreads, 0, stream>>>(                           \
          x.data, x.ld, out.rows, width, k, out.values, index, dense.data, dense.ld);                \
    } else {                                                                                         \
      KERNEL<VPT, I, false><<<row_blocks(warps), kRowThreads, 0, stream>>>(                          \
          x.data, x.ld, out.rows, width, k, out.values, index, nullptr, 0);                          \
    }                                                                                                \
    GALE_CHECK_CUDA(cudaGetLastError());                                                             \
    return;                                                                                          \
  }
  if (width % kWarp == 0 && float4_rows(x.data, x.ld) && (dense.data == nullptr || float4_rows(dense.data, dense.ld))) {
    GALE_MAXK_TOPK(maxk_forward_blocked_kernel, 4, per_lane == 4)
    GALE_MAXK_TOPK(maxk_forward_blocked_kernel, 8, per_lane == 8)
    GALE_MAXK_TOPK(maxk_forward_blocked_kernel, 16, per_lane == 16)
  }
  GALE_MAXK_TOPK(maxk_forward_kernel, 1, per_lane <= 1)
  GALE_MAXK_TOPK(maxk_forward_kernel, 2, per_lane <= 2)
  GALE_MAXK_TOPK(maxk_forward_kernel, 4, per_lane <= 4)
  GALE_MAXK_TOPK(maxk_forward_kernel, 8, per_lane <= 8)
  GALE_MAXK_TOPK(maxk_forward_kernel, 16, per_lane <= 16)
  GALE_MAXK_TOPK(maxk_forward_kernel, 32, per_lane <= 32)
  GALE_MAXK_TOPK(maxk_forward_kernel, 64, per_lane <= 64)
  GALE_MAXK_TOPK(maxk_forward_kernel, 128, per_lane <= 128)
#undef GALE_MAXK_TOPK
  throw InternalError("maxk_forward: no kernel for width " + std::to_string(width));
}

// ---- scatter to dense (MaxK backward, cbsr_to_dense) -------------------------------------------

// One warp per row: zeros over the row, then (after __syncwarp, which orders the two writes of a
// column made by different lanes) dense + sparse at the kept columns, either alone when the other
// is absent, as scatter_rows in maxk_cpu.cpp. With `partial` (maxk.hpp's column sums) each warp
// also adds the values it writes into its own row of width floats in shared memory, in row order
// (a row's kept columns are distinct, so no two lanes add into one slot), and ends by writing
// that row to partial's row of the warp.
template <typename I>
__global__ void __launch_bounds__(kRowThreads)
    scatter_kernel(int64_t rows, int width, int k, const I* __restrict__ index, const float* __restrict__ sparse,
                   const float* __restrict__ dense, int64_t dense_ld, float* __restrict__ out, int64_t out_ld,
                   float* __restrict__ partial) {
  extern __shared__ float4 smem4[];
  const int lane = threadIdx.x & (kWarp - 1);
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  float* acc = partial != nullptr ? reinterpret_cast<float*>(smem4) + warp * width : nullptr;
  if (acc != nullptr) {
    for (int c = lane; c < width; c += kWarp) acc[c] = 0.0f;
    __syncwarp();
  }
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  // Slot t's column and value (dense + sparse, either alone when the other is absent).
  const auto slot = [&](int64_t r, int t, int* c) {
    *c = index[r * k + t];
    if (dense != nullptr && sparse != nullptr) return __ldg(dense + r * dense_ld + *c) + __ldg(sparse + r * k + t);
    if (dense != nullptr) return __ldg(dense + r * dense_ld + *c);
    return sparse != nullptr ? __ldg(sparse + r * k + t) : 0.0f;
  };
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp; r < rows; r += total_warps) {
    // The first 32 slots are read before the zeros go out, so their loads overlap the stores.
    int c = 0;
    float v = lane < k ? slot(r, lane, &c) : 0.0f;
    float* o = out + r * out_ld;
    for (int j = lane; j < width; j += kWarp) o[j] = 0.0f;
    __syncwarp();
    for (int t = lane; t < k; t += kWarp) {
      if (t != lane) v = slot(r, t, &c);
      o[c] = v;
      if (acc != nullptr) acc[c] += v;
    }
    __syncwarp();  // the next row's zeros cannot alias, but keep the warp together per row
  }
  if (acc != nullptr) {
    float* pr = partial + (static_cast<int64_t>(blockIdx.x) * kRowWarps + warp) * width;
    for (int c = lane; c < width; c += kWarp) pr[c] = acc[c];
  }
}

// Blocks of a scatter that makes column sums: a few waves, so partial stays small (warps x width).
unsigned scatter_sum_blocks(int64_t rows) {
  const int64_t most = static_cast<int64_t>(cuda::current_multiprocessors()) * kScatterSumBlocksPerSm;
  return static_cast<unsigned>(std::clamp<int64_t>((rows + kRowWarps - 1) / kRowWarps, 1, most));
}

void launch_scatter(const ConstCbsrView& p, const float* sparse, ConstMatrixView dense, MatrixView out,
                    float* partial, cudaStream_t stream) {
  const unsigned blocks = partial != nullptr ? scatter_sum_blocks(p.rows) : row_blocks(p.rows);
  const int width = static_cast<int>(p.width), k = static_cast<int>(p.k);
  const size_t smem = partial != nullptr ? static_cast<size_t>(kRowWarps) * static_cast<size_t>(width) * sizeof(float) : 0;
  if (p.index_bytes() == 1) {
    scatter_kernel<uint8_t><<<blocks, kRowThreads, smem, stream>>>(p.rows, width, k, p.index_u8(), sparse,
                                                                   dense.data, dense.ld, out.data, out.ld, partial);
  } else {
    scatter_kernel<uint16_t><<<blocks, kRowThreads, smem, stream>>>(p.rows, width, k, p.index_u16(), sparse,
                                                                    dense.data, dense.ld, out.data, out.ld, partial);
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

// ---- SSpMM's hub plan ------------------------------------------------------------------------

size_t sort_temp_bytes(int64_t items) {
  size_t bytes = 0;
  GALE_CHECK_CUDA(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(std::max<int64_t>(items, 1))));
  return bytes;
}

// The place of src among the first `capacity` ids (ascending), or -1 when it is not there.
__device__ __forceinline__ int find_hub(const int32_t* ids, int capacity, int32_t src) {
  int lo = 0, hi = capacity;  // the first place whose id is not below src
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (ids[mid] < src) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < capacity && ids[lo] == src ? lo : -1;
}

// counts[j] = entries of source j (counts zeroed before), and order[j] = j for the sort.
__global__ void __launch_bounds__(kRowThreads)
    hub_count_kernel(const int64_t* __restrict__ indptr, int64_t rows, const int32_t* __restrict__ indices,
                     uint32_t* __restrict__ counts, int32_t* __restrict__ order, int64_t sources) {
  const int64_t begin = __ldg(indptr), end = __ldg(indptr + rows);
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t e = begin + t0; e < end; e += threads) atomicAdd(counts + __ldg(indices + e), 1u);
  for (int64_t j = t0; j < sources; j += threads) order[j] = static_cast<int32_t>(j);
}

// One block of kSspmmMaxHubs threads: the first `capacity` sources by count that have at least
// min_entries, sorted by id (rank by comparison), then kSspmmNoHub.
__global__ void __launch_bounds__(kSspmmMaxHubs)
    hub_pick_kernel(const uint32_t* __restrict__ sorted_counts, const int32_t* __restrict__ sorted, int64_t sources,
                    int capacity, uint32_t min_entries, int32_t* __restrict__ ids) {
  __shared__ int32_t pick[kSspmmMaxHubs];
  const int t = static_cast<int>(threadIdx.x);
  int32_t id = kSspmmNoHub;
  if (t < capacity && t < sources && sorted_counts[t] >= min_entries) id = sorted[t];
  if (t < capacity) pick[t] = id;
  __syncthreads();
  if (t >= capacity) return;
  int rank = 0;
  for (int u = 0; u < capacity; ++u) rank += pick[u] < id || (pick[u] == id && u < t) ? 1 : 0;
  ids[rank] = id;
}

// One warp per mask word: lane l looks entry 32 w + l's source up among the ids (binary search),
// the ballot is the word. Entries before indptr[0] are never flagged.
__global__ void __launch_bounds__(kRowThreads)
    hub_mask_kernel(const int64_t* __restrict__ indptr, int64_t rows, const int32_t* __restrict__ indices, int64_t nnz,
                    const int32_t* __restrict__ ids, int capacity, uint32_t* __restrict__ mask) {
  __shared__ int32_t hub[kSspmmMaxHubs];
  for (int i = static_cast<int>(threadIdx.x); i < capacity; i += static_cast<int>(blockDim.x)) hub[i] = ids[i];
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t begin = rows > 0 ? __ldg(indptr) : 0;
  const int64_t words = (nnz + kWarp - 1) / kWarp;
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp; w < words; w += total_warps) {
    const int64_t e = w * kWarp + lane;
    const bool flagged = e >= begin && e < nnz && find_hub(hub, capacity, __ldg(indices + e)) >= 0;
    const uint32_t word = __ballot_sync(kFull, flagged);
    if (lane == 0) mask[w] = word;
  }
}

// ---- aggregations -----------------------------------------------------------------------------
//
// Both aggregations give each warp one work item at a time and a persistent grid (warps loop over
// the items, so no block idles behind its slowest warp). All 32 lanes of a warp always work on the
// same item: shuffles and __syncwarp are full-warp, and no instruction is issued once per part of
// a warp. Sources are 32-bit, so every gather address is one wide multiply-add of the source by
// the row's byte size onto a per-lane base.

// The tuning constants below; a benchmarking build may override them (-DGALE_MAXK_HUB_DEGREE=...).
#ifndef GALE_MAXK_GATHER
#define GALE_MAXK_GATHER 8
#endif
#ifndef GALE_MAXK_SCATTER
#define GALE_MAXK_SCATTER 4
#endif
#ifndef GALE_MAXK_CHUNK_GROUPS
#define GALE_MAXK_CHUNK_GROUPS 4
#endif
#ifndef GALE_MAXK_HUB_DEGREE
#define GALE_MAXK_HUB_DEGREE 128
#endif
#ifndef GALE_MAXK_STREAMING
#define GALE_MAXK_STREAMING 1
#endif

// A load of data read once: evict-first in L1 and L2 (GALE_MAXK_STREAMING), else a plain
// read-only load.
template <typename T>
__device__ __forceinline__ T load_once(const T* p) {
#if GALE_MAXK_STREAMING
  return __ldcs(p);
#else
  return __ldg(p);
#endif
}

constexpr int kAggThreads = 256;
constexpr int kAggWarps = kAggThreads / kWarp;
// At least 4 blocks of 8 warps per SM: at most 64 registers a thread.
constexpr int kAggMinBlocks = 4;
// Slot memory per block, at most: wide rows get fewer warps per block (1 KiB a slot at width 256,
// 16 KiB at 4096; the limit is raised above the default 48 KiB with cudaFuncSetAttribute).
constexpr int64_t kSlotBudget = 64 * 1024;
// SpGEMM: steps (one entry per lane group each) whose value and column loads are in flight together
// (8 measured 8-12% faster than 4 once the loads are unconditional; 4 was faster while they were
// predicated).
constexpr int kGather = GALE_MAXK_GATHER;
// SSpMM: steps (32 / lanes-per-entry entries each) whose column loads are in flight together.
constexpr int kScatter = GALE_MAXK_SCATTER;
// Edge groups per work item of the group walks (lane g < kChunkGroups loads group g).
constexpr int kChunkGroups = GALE_MAXK_CHUNK_GROUPS;
// SpGEMM rows with at most this many entries are summed whole by one warp and written once with
// plain stores (bias and self term included). Longer rows ("hubs": on R-MAT scale 21, 4% of the
// rows but 77% of the entries) are set to bias + self term by a first kernel and accumulated edge
// group by edge group, each run of a row's groups in a work item adding its sum with float4
// atomics. The split depends on the degree alone, never on the group table's group size, so any
// table of the graph gives the same result.
constexpr int64_t kHubDegree = GALE_MAXK_HUB_DEGREE;

// Floats before SSpMM's hub sums in a block's shared memory: the warps' slots, rounded up to 16
// bytes so that the sums can be read as float4.
__host__ __device__ constexpr int64_t hub_sums_offset(int warps, int width) {
  return (static_cast<int64_t>(warps) * width + 3) / 4 * 4;
}

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
  // Work items: SpGEMM's are `tiles` tiles of 32 rows and the group chunks, interleaved; SSpMM's
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
  // SSpMM's hub plan (kernels/maxk.hpp), when the kernel is built for one.
  const int32_t* hub_ids = nullptr;
  const uint32_t* hub_mask = nullptr;
  int hub_capacity = 0;
};

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

// Source and coefficient (col_scale[src] * edge_weight[e]) of entry e when valid, else 0 and 0.
__device__ __forceinline__ void load_entry(const AggParams& p, int64_t e, bool valid, int32_t* src, float* coef) {
  *src = 0;
  *coef = 0.0f;
  if (valid) {  // read once: evict-first, so they do not push gathered rows or atomics' lines out of L2
    *src = load_once(p.indices + e);
    float c = p.col_scale ? __ldg(p.col_scale + *src) : 1.0f;
    if (p.edge_weight) c *= load_once(p.edge_weight + e);
    *coef = c;
  }
}

// The place of entry e's source among the block's hubs (ids: the plan's, in shared memory) when
// the plan's mask flags the entry, else -1. A flagged source missing from ids (a plan that does
// not fit its graph) also gives -1: its entry then takes the global atomic like any other.
__device__ __forceinline__ int hub_slot(const AggParams& p, const int32_t* ids, int64_t e, bool valid, int32_t src) {
  if (!valid || ((__ldg(p.hub_mask + (e >> 5)) >> (e & 31)) & 1u) == 0) return -1;
  return find_hub(ids, p.hub_capacity, src);
}

// Element `src` of rows of `row_bytes` bytes from a per-lane base: one wide multiply-add (written
// out, since the compiler otherwise re-associates it into three 64-bit adds around the base). For
// loads only (they say .global themselves); an atomic's address must stay visibly global.
template <typename T>
__device__ __forceinline__ const T* row_at(const T* base, uint32_t src, uint32_t row_bytes) {
  uint64_t at;
  asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(at) : "r"(src), "r"(row_bytes), "l"(reinterpret_cast<uint64_t>(base)));
  return reinterpret_cast<const T*>(at);
}

// SpGEMM's inner loop: adds coef_e * x[src_e] for the entries [start, start + count) into the
// warp's slots. The warp is P = 32 / L lane groups of L lanes, group h with its own slot: lane l
// loads entry base + l's source and coefficient, then step s gives entry u0 + s * P + h to group
// h, whose lane t reads value t (and t + L, ... when k > L) of it. kGather steps have all their
// loads in flight before the adds, which go one step after the other: one entry's columns are
// distinct, but two entries of a group can share a column held by different lanes. The loads are
// unconditional (a step past the entries reads source 0, a lane past k value k - 1: both exist
// whenever there is an entry) and only the adds are predicated.
template <int L, typename I>
__device__ __forceinline__ void spgemm_accumulate(const AggParams& p, int64_t start, int count, float* slots,
                                                  int lane) {
  constexpr int P = kWarp / L;
  const int h = lane / L;
  const uint32_t tl = lane % L, k = p.k;
  float* slot = slots + h * p.width;
  const uint32_t value_bytes = k * sizeof(float), index_bytes = k * sizeof(I);
  for (int base = 0; base < count; base += kWarp) {
    const int m = min(kWarp, count - base);
    int32_t my_src;
    float my_coef;
    load_entry(p, start + base + lane, lane < m, &my_src, &my_coef);
    for (int u0 = 0; u0 < m; u0 += P * kGather) {
      for (uint32_t t = tl; t - tl < k; t += L) {
        const uint32_t tc = min(t, k - 1);
        const float* values = p.values + tc;
        const I* index = static_cast<const I*>(p.index) + tc;
        float v[kGather];
        int col[kGather];
#pragma unroll
        for (int s = 0; s < kGather; ++s) {
          const int u = u0 + s * P + h;
          const uint32_t src = static_cast<uint32_t>(__shfl_sync(kFull, my_src, u & (kWarp - 1)));
          v[s] = __ldg(row_at(values, src, value_bytes));
          col[s] = __ldg(row_at(index, src, index_bytes));
        }
#pragma unroll
        for (int s = 0; s < kGather; ++s) {
          const int u = u0 + s * P + h;
          const float coef = __shfl_sync(kFull, my_coef, u & (kWarp - 1));
          if (u < m && t < k) slot[col[s]] += coef * v[s];
          __syncwarp();
        }
      }
    }
  }
}

// Column c of the warp's P slots summed over the parts (part q at q * stride, in T units), parts
// added in order (the CPU reference's), every part left zeroed for the next row.
template <int P, typename T>
__device__ __forceinline__ T take_parts(T* slots, int stride, int c) {
  const T zero{};
  T v = slots[c];
  slots[c] = zero;
#pragma unroll
  for (int q = 1; q < P; ++q) {
    add_to(v, slots[q * stride + c]);
    slots[q * stride + c] = zero;
  }
  return v;
}

// Writes out row r from the warp's P slots (which hold the row's sum in parts, and are left
// zeroed): rs * sum, plus self * x[r] at x's kept columns, plus bias, in the CPU reference's
// order. Plain stores, marked streaming: the output is not read again by this op, and the
// gathered x should keep its place in L2.
template <int L, typename I, bool kVec>
__device__ __forceinline__ void spgemm_write_row(const AggParams& p, int64_t r, float rs, float self, float* slots,
                                                 int lane) {
  constexpr int P = kWarp / L;
  const int width = p.width;
  if (self != 0.0f) {  // warp-uniform: gather the parts into slot 0, scaled, and add the self term there
    for (int c = lane; c < width; c += kWarp) slots[c] = rs * take_parts<P>(slots, width, c);
    __syncwarp();
    const I* index = static_cast<const I*>(p.index);
    for (int t = lane; t < p.k; t += kWarp) {
      const int64_t at = r * p.k + t;
      slots[__ldg(index + at)] += self * __ldg(p.values + at);
    }
    __syncwarp();
    rs = 1.0f;
  }
  float* o = p.out + r * p.out_ld;
  if constexpr (kVec) {
    float4* s4 = reinterpret_cast<float4*>(slots);
    float4* o4 = reinterpret_cast<float4*>(o);
    const float4* b4 = reinterpret_cast<const float4*>(p.bias);
    const int w4 = width / 4;
#pragma unroll 1
    for (int c = lane; c < w4; c += kWarp) {
      float4 v = take_parts<P>(s4, w4, c);
      const float4 b = p.bias ? __ldg(b4 + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      v.x = rs * v.x + b.x;
      v.y = rs * v.y + b.y;
      v.z = rs * v.z + b.z;
      v.w = rs * v.w + b.w;
      __stcs(o4 + c, v);
    }
  } else {
    for (int c = lane; c < width; c += kWarp) {
      const float v = take_parts<P>(slots, width, c);
      __stcs(o + c, rs * v + (p.bias ? __ldg(p.bias + c) : 0.0f));
    }
  }
  __syncwarp();
}

// Adds rs[row] times the sum of the warp's slots into out[row] with atomics (float4 ones when
// kVec), skipping columns no entry reached, and leaves the slots zeroed.
template <int L, bool kVec>
__device__ __forceinline__ void spgemm_flush(const AggParams& p, int row, float* slots, int lane) {
  constexpr int P = kWarp / L;
  __syncwarp();
  const float rs = p.row_scale ? __ldg(p.row_scale + row) : 1.0f;
  float* o = p.out + static_cast<int64_t>(row) * p.out_ld;
  if constexpr (kVec) {
    float4* s4 = reinterpret_cast<float4*>(slots);
    const int w4 = p.width / 4;
#pragma unroll 1
    for (int c = lane; c < w4; c += kWarp) {
      const float4 v = take_parts<P>(s4, w4, c);
      if (v.x != 0.0f || v.y != 0.0f || v.z != 0.0f || v.w != 0.0f)
        atomic_add(o + 4 * c, make_float4(rs * v.x, rs * v.y, rs * v.z, rs * v.w));
    }
  } else {
    for (int c = lane; c < p.width; c += kWarp) {
      const float v = take_parts<P>(slots, p.width, c);
      if (v != 0.0f) atomicAdd(o + c, rs * v);
    }
  }
  __syncwarp();
}

// A tile: rows tile * 32 ... tile * 32 + 31 (lane i loads row i's extent and scales), each row of
// at most kHubDegree entries summed in the slots and written whole.
template <int L, typename I, bool kVec>
__device__ __forceinline__ void spgemm_tile(const AggParams& p, int64_t tile, float* slots, int lane) {
  const int64_t r0 = tile * kWarp;
  const int64_t r = r0 + lane;
  int64_t begin = 0;
  int degree = 0;  // capped at kHubDegree + 1: only whether a row is a hub matters beyond
  float rs = 1.0f, self = 0.0f;
  if (r < p.rows) {
    begin = __ldg(p.indptr + r);
    degree = static_cast<int>(min(__ldg(p.indptr + r + 1) - begin, kHubDegree + 1));
    if (p.row_scale) rs = __ldg(p.row_scale + r);
    if (r < p.self_rows) self = p.self_scale + (p.self_coefs ? __ldg(p.self_coefs + r) : 0.0f);
  }
  const int n = static_cast<int>(min(static_cast<int64_t>(kWarp), p.rows - r0));
  for (int i = 0; i < n; ++i) {
    const int row_degree = __shfl_sync(kFull, degree, i);
    if (row_degree > kHubDegree) continue;  // a hub: the init kernel and the group chunks write it
    const int64_t b = __shfl_sync(kFull, begin, i);
    const float row_rs = __shfl_sync(kFull, rs, i);
    const float row_self = __shfl_sync(kFull, self, i);
    spgemm_accumulate<L, I>(p, b, row_degree, slots, lane);
    __syncwarp();
    spgemm_write_row<L, I, kVec>(p, r0 + i, row_rs, row_self, slots, lane);
  }
}

// A chunk: edge groups chunk * kChunkGroups ..., those of hub rows only (lane g loads group g and
// its row's degree). Consecutive groups of one row share the slots and one flush.
template <int L, typename I, bool kVec>
__device__ __forceinline__ void spgemm_chunk(const AggParams& p, int64_t chunk, float* slots, int lane) {
  const int64_t n = group_total(p);
  const int64_t g = chunk * kChunkGroups + lane;
  int64_t start = 0;
  int row = -1, count = 0;
  if (lane < kChunkGroups && g < n) {
    const EdgeGroup eg = load_group(p.groups, g);
    if (__ldg(p.indptr + eg.row + 1) - __ldg(p.indptr + eg.row) > kHubDegree) {
      start = eg.start;
      row = eg.row;
      count = eg.count;
    }
  }
  int current = -1;
  for (int i = 0; i < kChunkGroups; ++i) {
    const int gr = __shfl_sync(kFull, row, i);
    const int64_t gs = __shfl_sync(kFull, start, i);
    const int gc = __shfl_sync(kFull, count, i);
    if (gr < 0) continue;
    if (gr != current) {
      if (current >= 0) spgemm_flush<L, kVec>(p, current, slots, lane);
      current = gr;
    }
    spgemm_accumulate<L, I>(p, gs, gc, slots, lane);
  }
  if (current >= 0) spgemm_flush<L, kVec>(p, current, slots, lane);
}

// Alg. 1 reorganised: item i is a tile or a group chunk (Bresenham-interleaved, so the tiles'
// DRAM-bound row writes and the chunks' L2-bound gathers run side by side).
template <int L, typename I, bool kVec>
__global__ void __launch_bounds__(kAggThreads, kAggMinBlocks) spgemm_kernel(AggParams p) {
  extern __shared__ float4 smem4[];
  constexpr int P = kWarp / L;
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  float* slots = reinterpret_cast<float*>(smem4) + static_cast<int64_t>(warp) * P * p.width;
  for (int c = lane; c < P * p.width; c += kWarp) slots[c] = 0.0f;
  __syncwarp();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * warps + warp; item < p.items; item += stride) {
    const int64_t tiles_before = item * p.tiles / p.items;
    if ((item + 1) * p.tiles / p.items > tiles_before) {
      spgemm_tile<L, I, kVec>(p, tiles_before, slots, lane);
    } else {
      spgemm_chunk<L, I, kVec>(p, item - tiles_before, slots, lane);
    }
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

// Stages rs[row] * g[row] in the slot. With `once` the row is loaded evict-first, keeping L2 for
// grad_values' lines, which the atomics otherwise push out and fetch again: always with
// GALE_MAXK_G_ONCE (a hub row staged again by the work items of its other groups then comes from
// DRAM, which measured cheaper than the lines it would keep out), else for a row of one group.
template <bool kVec>
__device__ __forceinline__ void sspmm_stage(const AggParams& p, int row, bool once, float* slot, int lane) {
  const float rs = p.row_scale ? __ldg(p.row_scale + row) : 1.0f;
  const float* g = p.grad + static_cast<int64_t>(row) * p.grad_ld;
  if constexpr (kVec) {
    float4* s4 = reinterpret_cast<float4*>(slot);
    const float4* g4 = reinterpret_cast<const float4*>(g);
#pragma unroll 2
    for (int c = lane; c < p.width / 4; c += kWarp) {
      const float4 v = once ? load_once(g4 + c) : __ldg(g4 + c);
      s4[c] = make_float4(rs * v.x, rs * v.y, rs * v.z, rs * v.w);
    }
  } else {
    for (int c = lane; c < p.width; c += kWarp) slot[c] = rs * (once ? load_once(g + c) : __ldg(g + c));
  }
}

// SSpMM's inner loop over the entries [start, start + count) of a row whose scaled gradient the
// slot holds: entry (i, j) adds coef * slot[idx[j][t]] to grad_values[j][t] for every t. Lanes
// take V consecutive t of an entry (E = 2^entry_shift lanes per entry, so 32 / E entries per
// step); kScatter steps issue their column loads before any of their atomics. The first 32
// entries' sources and coefficients come in from the caller, loaded before the slot was staged.
//
// With kHubs, an entry whose source is one of the block's hubs (first_hub, or hub_slot for the
// later entries: its place, else -1) adds into that hub's sums in shared memory instead.
template <typename I, int V, bool kHubs>
__device__ __forceinline__ void sspmm_scatter(const AggParams& p, int64_t start, int count, int32_t first_src,
                                              float first_coef, int first_hub, const float* slot,
                                              const int32_t* hub_ids, float* hub_sums, int lane) {
  using Cols = Columns<I, V>;
  const uint32_t k = p.k;
  const int pieces = static_cast<int>(k) / V;
  const int lanes_per_entry = 1 << p.entry_shift;
  const int per_step = kWarp >> p.entry_shift;
  const int lane_piece = lane & (lanes_per_entry - 1);
  const int lane_entry = lane >> p.entry_shift;
  const uint32_t index_bytes = k * sizeof(I);
  const uint64_t policy = evict_last_policy();
  (void)policy;  // the one-column form has no hinted atomic
  for (int base = 0; base < count; base += kWarp) {
    const int m = min(kWarp, count - base);
    int32_t my_src = first_src;
    float my_coef = first_coef;
    int my_hub = first_hub;
    if (base > 0) {
      load_entry(p, start + base + lane, lane < m, &my_src, &my_coef);
      if constexpr (kHubs) my_hub = hub_slot(p, hub_ids, start + base + lane, lane < m, my_src);
    }
    for (int q = lane_piece; q - lane_piece < pieces; q += lanes_per_entry) {
      const auto* index = reinterpret_cast<const typename Cols::Word*>(static_cast<const I*>(p.index) + q * V);
      float* gv = p.grad_values + q * V;
      for (int u0 = 0; u0 < m; u0 += per_step * kScatter) {
        uint32_t src[kScatter];
        typename Cols::Word cols[kScatter];
#pragma unroll
        for (int s = 0; s < kScatter; ++s) {
          const int u = u0 + s * per_step + lane_entry;
          src[s] = static_cast<uint32_t>(__shfl_sync(kFull, my_src, u & (kWarp - 1)));
#if GALE_MAXK_INDEX_ONCE
          if (u < m && q < pieces) cols[s] = __ldcs(row_at(index, src[s], index_bytes));
#else
          if (u < m && q < pieces) cols[s] = __ldg(row_at(index, src[s], index_bytes));
#endif
        }
#pragma unroll
        for (int s = 0; s < kScatter; ++s) {
          const int u = u0 + s * per_step + lane_entry;
          const float coef = __shfl_sync(kFull, my_coef, u & (kWarp - 1));
          const int hub = kHubs ? __shfl_sync(kFull, my_hub, u & (kWarp - 1)) : -1;
          if (u >= m || q >= pieces) continue;
          if (kHubs && hub >= 0) {
            float* h = hub_sums + hub * static_cast<int>(k) + q * V;
#pragma unroll
            for (int v = 0; v < V; ++v) atomicAdd(h + v, coef * slot[Cols::get(cols[s], v)]);
            continue;
          }
          // Plain arithmetic, not row_at: from an asm-made address the compiler cannot tell the
          // atomic is global and emits a generic ATOM with a return (measured 7% slower) for RED.
          float* dst = gv + static_cast<uint64_t>(src[s]) * k;
          if constexpr (V == 4) {
            red_add4(dst,
                     make_float4(coef * slot[Cols::get(cols[s], 0)], coef * slot[Cols::get(cols[s], 1)],
                                 coef * slot[Cols::get(cols[s], 2)], coef * slot[Cols::get(cols[s], 3)]),
                     policy);
          } else {
            atomicAdd(dst, coef * slot[Cols::get(cols[s], 0)]);
          }
        }
      }
    }
  }
}

// Alg. 2 over chunks of kChunkGroups edge groups per warp: the slot is restaged only when the row
// changes (a hub's consecutive groups share it), and each group's first sources are loaded before
// the staging so that the two loads overlap.
//
// With kHubs the block also holds the plan's hubs (ids) and a k-float sum per hub after the warps'
// slots (sspmm_smem_bytes): zeroed first, filled by the hubs' entries, added to grad_values once
// every warp of the block is done.
template <typename I, int V, bool kVec, bool kHubs>
__global__ void __launch_bounds__(kAggThreads, kAggMinBlocks) sspmm_kernel(AggParams p) {
  extern __shared__ float4 smem4[];
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  float* slot = reinterpret_cast<float*>(smem4) + static_cast<int64_t>(warp) * p.width;
  float* hub_sums = reinterpret_cast<float*>(smem4) + hub_sums_offset(warps, p.width);
  int32_t* hub_ids = reinterpret_cast<int32_t*>(hub_sums + p.hub_capacity * p.k);
  if constexpr (kHubs) {
    for (int i = static_cast<int>(threadIdx.x); i < p.hub_capacity * p.k; i += static_cast<int>(blockDim.x))
      hub_sums[i] = 0.0f;
    for (int i = static_cast<int>(threadIdx.x); i < p.hub_capacity; i += static_cast<int>(blockDim.x))
      hub_ids[i] = __ldg(p.hub_ids + i);
    __syncthreads();
  }
  const int64_t n = group_total(p);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps;
  for (int64_t chunk = static_cast<int64_t>(blockIdx.x) * warps + warp; chunk < p.items; chunk += stride) {
    const int64_t g = chunk * kChunkGroups + lane;
    int64_t start = 0;
    int row = -1, count = 0;
    if (lane < kChunkGroups && g < n) {
      const EdgeGroup eg = load_group(p.groups, g);
      start = eg.start;
      row = eg.row;
      count = eg.count;
    }
    int current = -1;
    for (int i = 0; i < kChunkGroups; ++i) {
      const int gr = __shfl_sync(kFull, row, i);
      const int64_t gs = __shfl_sync(kFull, start, i);
      const int gc = __shfl_sync(kFull, count, i);
      if (gr < 0) break;  // past the table's end
      int32_t src;
      float coef;
      load_entry(p, gs + lane, lane < gc, &src, &coef);
      const int hub = kHubs ? hub_slot(p, hub_ids, gs + lane, lane < gc, src) : -1;
      if (gr != current) {
        __syncwarp();  // the previous row's gathers are done
        sspmm_stage<kVec>(p, gr, GALE_MAXK_G_ONCE || gc < kMaxkEdgeGroupSize, slot, lane);
        __syncwarp();
        current = gr;
      }
      sspmm_scatter<I, V, kHubs>(p, gs, gc, src, coef, hub, slot, hub_ids, hub_sums, lane);
    }
  }
  if constexpr (kHubs) {
    __syncthreads();  // every warp's entries are in the sums
    const int pieces = p.k / V;
    const uint64_t policy = evict_last_policy();
    (void)policy;
    for (int i = static_cast<int>(threadIdx.x); i < p.hub_capacity * pieces; i += static_cast<int>(blockDim.x)) {
      const int h = i / pieces, c = (i - h * pieces) * V;
      const int32_t id = hub_ids[h];
      if (id == kSspmmNoHub) continue;
      const float* sum = hub_sums + h * p.k + c;
      float* dst = p.grad_values + static_cast<int64_t>(id) * p.k + c;
      if constexpr (V == 4) {
        const float4 v = make_float4(sum[0], sum[1], sum[2], sum[3]);
        if (v.x != 0.0f || v.y != 0.0f || v.z != 0.0f || v.w != 0.0f) red_add4(dst, v, policy);
      } else {
        if (sum[0] != 0.0f) atomicAdd(dst, sum[0]);
      }
    }
  }
}

// grad_values[j][t] = self_coef(j) * g[j][idx[j][t]] for j below the self rows (0 beyond): SSpMM's
// part that is not a sum over entries. One warp per row (no division per element); without a
// self term the op clears grad_values with a memset instead.
template <typename I>
__global__ void __launch_bounds__(kRowThreads)
    sspmm_init_kernel(int64_t rows, int k, const I* __restrict__ index, int64_t self_rows, float self_scale,
                      const float* __restrict__ self_coefs, const float* __restrict__ grad, int64_t grad_ld,
                      float* __restrict__ grad_values) {
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp; j < rows; j += total_warps) {
    const float self = j < self_rows ? self_scale + (self_coefs ? __ldg(self_coefs + j) : 0.0f) : 0.0f;
    for (int t = lane; t < k; t += kWarp) {
      const int64_t at = j * k + t;
      grad_values[at] = self != 0.0f ? self * __ldg(grad + j * grad_ld + index[at]) : 0.0f;
    }
  }
}

// k rounded up to a power of two, clamped to [8, 32]: SpGEMM's lanes per entry.
int lanes_for(int64_t k) {
  int l = 8;
  while (l < k && l < kWarp) l *= 2;
  return l;
}

struct AggShape {
  int warps = kAggWarps;  // per block
  int threads = kAggThreads;
  size_t smem = 0;
};

// Blocks of up to 8 warps, each with `slots` width-float slots, within kSlotBudget.
AggShape agg_shape(int64_t width, int slots) {
  AggShape s;
  const int64_t warp_bytes = static_cast<int64_t>(slots) * width * static_cast<int64_t>(sizeof(float));
  s.warps = static_cast<int>(std::clamp<int64_t>(kSlotBudget / warp_bytes, 1, kAggWarps));
  s.threads = s.warps * kWarp;
  s.smem = static_cast<size_t>(s.warps) * static_cast<size_t>(warp_bytes);
  return s;
}

// A persistent grid: as many blocks as the device holds at once (the warps loop over the items),
// fewer when there are fewer items.
template <typename Kernel>
void launch_agg(Kernel kernel, const AggShape& s, const AggParams& p, cudaStream_t stream) {
  if (p.items == 0) return;
  if (s.smem > static_cast<size_t>(kDefaultSmemLimit))
    GALE_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(s.smem)));
  int per_sm = 0;
  const int sms = cuda::current_multiprocessors();
  GALE_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, s.threads, s.smem));
  const int64_t needed = (p.items + s.warps - 1) / s.warps;
  const int64_t blocks = std::clamp<int64_t>(int64_t{sms} * std::max(per_sm, 1), 1, needed);
  kernel<<<static_cast<unsigned>(blocks), s.threads, s.smem, stream>>>(p);
  GALE_CHECK_CUDA(cudaGetLastError());
}

template <typename I, bool kVec>
void dispatch_spgemm(int lanes, const AggShape& s, const AggParams& p, cudaStream_t stream) {
  switch (lanes) {
    case 8: launch_agg(spgemm_kernel<8, I, kVec>, s, p, stream); return;
    case 16: launch_agg(spgemm_kernel<16, I, kVec>, s, p, stream); return;
    case 32: launch_agg(spgemm_kernel<32, I, kVec>, s, p, stream); return;
    default: break;
  }
  throw InternalError("spgemm_cbsr: no kernel for " + std::to_string(lanes) + " lanes");
}

template <typename I, bool kHubs>
void dispatch_sspmm(const AggShape& s, const AggParams& p, bool vec_columns, bool vec_grad, cudaStream_t stream) {
  if (vec_columns) {
    vec_grad ? launch_agg(sspmm_kernel<I, 4, true, kHubs>, s, p, stream)
             : launch_agg(sspmm_kernel<I, 4, false, kHubs>, s, p, stream);
  } else {
    vec_grad ? launch_agg(sspmm_kernel<I, 1, true, kHubs>, s, p, stream)
             : launch_agg(sspmm_kernel<I, 1, false, kHubs>, s, p, stream);
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

// What both aggregations take alike: the graph, its scales and weights, the edge groups and the
// CBSR pattern's columns (Args: SpgemmCbsrArgs or SspmmCbsrArgs).
template <typename Args>
AggParams agg_params(const Args& a, const ConstCbsrView& cbsr, const EdgeGroupsView& groups) {
  AggParams p;
  p.indptr = a.graph.indptr;
  p.rows = a.graph.rows;
  p.indices = a.graph.indices;
  p.edge_weight = a.edge_weight;
  p.row_scale = a.row_scale;
  p.col_scale = a.col_scale;
  p.groups = groups.groups;
  p.capacity = groups.capacity;
  p.count = groups.count;
  p.index = cbsr.index;
  p.width = static_cast<int>(cbsr.width);
  p.k = static_cast<int>(cbsr.k);
  return p;
}

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

void maxk_forward_cuda(ConstMatrixView x, const CbsrView& out, cudaStream_t stream, MatrixView dense) {
  require(maxk_forward_cannot(x, out), "maxk_forward");
  require(maxk_cuda_cannot(out.width), "maxk_forward");
  if (dense.data != nullptr && (dense.rows != x.rows || dense.cols != x.cols || dense.ld < dense.cols))
    throw InputError("maxk_forward: the dense output is " + std::to_string(dense.rows) + " x " +
                     std::to_string(dense.cols) + ", expected " + std::to_string(x.rows) + " x " + std::to_string(x.cols));
  if (out.rows == 0) return;
  if (out.index_bytes() == 1) {
    launch_maxk_forward<uint8_t>(x, out, dense, stream);
  } else {
    launch_maxk_forward<uint16_t>(x, out, dense, stream);
  }
}

int64_t maxk_backward_sum_rows(int64_t rows) {
  return rows == 0 ? 0 : static_cast<int64_t>(scatter_sum_blocks(rows)) * kRowWarps;
}

void maxk_backward_cuda(const ConstCbsrView& pattern, const float* grad_values, ConstMatrixView grad_dense,
                        MatrixView grad_in, cudaStream_t stream, float* column_partial) {
  require(maxk_backward_cannot(pattern, grad_dense, grad_in), "maxk_backward");
  require(maxk_cuda_cannot(pattern.width), "maxk_backward");
  if (column_partial != nullptr && pattern.width > kMaxkSumWidth)
    throw InputError("maxk_backward: column sums take widths up to " + std::to_string(kMaxkSumWidth) + ", not " +
                     std::to_string(pattern.width));
  if (pattern.rows == 0) return;
  launch_scatter(pattern, grad_values, grad_dense, grad_in, column_partial, stream);
}

void cbsr_to_dense_cuda(const ConstCbsrView& x, MatrixView out, cudaStream_t stream) {
  require(maxk_backward_cannot(x, ConstMatrixView{}, out), "cbsr_to_dense");
  require(maxk_cuda_cannot(x.width), "cbsr_to_dense");
  if (x.rows == 0) return;
  launch_scatter(x, x.values, ConstMatrixView{}, out, nullptr, stream);
}

void spgemm_cbsr_cuda(const SpgemmCbsrArgs& a, const EdgeGroupsView& groups, cudaStream_t stream) {
  require(spgemm_cbsr_cannot(a), "spgemm_cbsr");
  require(maxk_cuda_cannot(a.x.width), "spgemm_cbsr");
  require(groups_cannot(a.graph, groups), "spgemm_cbsr");
  const CsrView& g = a.graph;
  if (g.rows == 0) return;
  AggParams p = agg_params(a, a.x, groups);
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

  const int lanes = lanes_for(p.k);
  const AggShape s = agg_shape(p.width, kWarp / lanes);
  p.tiles = (g.rows + kWarp - 1) / kWarp;
  p.items = p.tiles + (groups.capacity + kChunkGroups - 1) / kChunkGroups;
  const bool vec = p.width % 4 == 0 && float4_rows(a.out.data, a.out.ld) &&
                   (a.bias == nullptr || aligned16(a.bias));
  if (u8) {
    vec ? dispatch_spgemm<uint8_t, true>(lanes, s, p, stream) : dispatch_spgemm<uint8_t, false>(lanes, s, p, stream);
  } else {
    vec ? dispatch_spgemm<uint16_t, true>(lanes, s, p, stream) : dispatch_spgemm<uint16_t, false>(lanes, s, p, stream);
  }
}

void sspmm_cbsr_cuda(const SspmmCbsrArgs& a, const EdgeGroupsView& groups, cudaStream_t stream) {
  require(sspmm_cbsr_cannot(a), "sspmm_cbsr");
  require(maxk_cuda_cannot(a.pattern.width), "sspmm_cbsr");
  require(groups_cannot(a.graph, groups), "sspmm_cbsr");
  if (a.hubs.capacity < 0 || a.hubs.capacity > sspmm_hub_capacity(a.pattern.k))
    throw InputError("sspmm_cbsr: a hub plan of capacity " + std::to_string(a.hubs.capacity) + " for k = " +
                     std::to_string(a.pattern.k) + ", at most " + std::to_string(sspmm_hub_capacity(a.pattern.k)));
  if (a.hubs.capacity > 0 && (a.hubs.ids == nullptr || a.hubs.entry_mask == nullptr))
    throw InputError("sspmm_cbsr: the hub plan's ids or entry mask is null");
  const CsrView& g = a.graph;
  const ConstCbsrView& pat = a.pattern;
  if (pat.rows == 0) return;
  const int width = static_cast<int>(pat.width), k = static_cast<int>(pat.k);
  const int64_t self_rows = std::min(g.rows, pat.rows);
  if ((a.self_scale == 0.0f && a.self_coefs == nullptr) || self_rows == 0) {
    GALE_CHECK_CUDA(cudaMemsetAsync(a.grad_values, 0, static_cast<size_t>(pat.rows * k) * sizeof(float), stream));
  } else if (pat.index_bytes() == 1) {
    sspmm_init_kernel<uint8_t><<<row_blocks(pat.rows), kRowThreads, 0, stream>>>(
        pat.rows, k, pat.index_u8(), self_rows, a.self_scale, a.self_coefs, a.grad_out.data, a.grad_out.ld,
        a.grad_values);
  } else {
    sspmm_init_kernel<uint16_t><<<row_blocks(pat.rows), kRowThreads, 0, stream>>>(
        pat.rows, k, pat.index_u16(), self_rows, a.self_scale, a.self_coefs, a.grad_out.data, a.grad_out.ld,
        a.grad_values);
  }
  GALE_CHECK_CUDA(cudaGetLastError());
  if (g.rows == 0 || groups.capacity == 0) return;

  AggParams p = agg_params(a, pat, groups);
  p.grad = a.grad_out.data;
  p.grad_ld = a.grad_out.ld;
  p.grad_values = a.grad_values;
  AggShape s = agg_shape(width, 1);
  p.items = (groups.capacity + kChunkGroups - 1) / kChunkGroups;
  const bool hubs = a.hubs.capacity > 0;
  if (hubs) {
    p.hub_ids = a.hubs.ids;
    p.hub_mask = a.hubs.entry_mask;
    p.hub_capacity = a.hubs.capacity;
    s.smem = static_cast<size_t>(hub_sums_offset(s.warps, width) + int64_t{p.hub_capacity} * (k + 1)) * sizeof(float);
  }
  // Four columns per load and one float4 atomic per four values when the rows of k allow it.
  const bool vec_columns = k % 4 == 0 && aligned16(a.grad_values) &&
                           reinterpret_cast<uintptr_t>(pat.index) % (4 * pat.index_bytes()) == 0;
  const int v = vec_columns ? 4 : 1;
  p.entry_shift = std::min(ceil_log2(k / v), ceil_log2(kWarp));
  const bool vec_grad = width % 4 == 0 && float4_rows(a.grad_out.data, a.grad_out.ld);
  if (pat.index_bytes() == 1) {
    hubs ? dispatch_sspmm<uint8_t, true>(s, p, vec_columns, vec_grad, stream)
         : dispatch_sspmm<uint8_t, false>(s, p, vec_columns, vec_grad, stream);
  } else {
    hubs ? dispatch_sspmm<uint16_t, true>(s, p, vec_columns, vec_grad, stream)
         : dispatch_sspmm<uint16_t, false>(s, p, vec_columns, vec_grad, stream);
  }
}

size_t sspmm_hubs_workspace_bytes(int64_t sources) {
  const size_t column = align256(static_cast<size_t>(std::max<int64_t>(sources, 1)) * sizeof(uint32_t));
  return 4 * column + align256(sort_temp_bytes(sources));
}

void sspmm_hubs_cuda(const CsrView& graph, int capacity, int64_t min_entries, int32_t* ids, uint32_t* entry_mask,
                     int64_t nnz, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  require(sspmm_hubs_cannot(graph, capacity), "sspmm hubs");
  if (capacity < 1) throw InputError("sspmm hubs: capacity 0 (the CUDA builder needs at least one place)");
  if (ids == nullptr || (entry_mask == nullptr && nnz > 0)) throw InputError("sspmm hubs: ids or entry_mask is null");
  if (nnz < 0) throw InputError("sspmm hubs: negative entry count");
  const size_t need = sspmm_hubs_workspace_bytes(graph.cols);
  if (workspace_bytes < need || workspace == nullptr)
    throw InputError("sspmm hubs: the workspace has " + std::to_string(workspace_bytes) + " bytes, " +
                     std::to_string(need) + " needed");
  const int64_t sources = graph.cols;
  const size_t column = align256(static_cast<size_t>(std::max<int64_t>(sources, 1)) * sizeof(uint32_t));
  char* w = static_cast<char*>(workspace);
  auto* counts = reinterpret_cast<uint32_t*>(w);
  auto* sorted_counts = reinterpret_cast<uint32_t*>(w + column);
  auto* order = reinterpret_cast<int32_t*>(w + 2 * column);
  auto* sorted = reinterpret_cast<int32_t*>(w + 3 * column);
  void* temp = w + 4 * column;
  size_t temp_bytes = workspace_bytes - 4 * column;
  if (sources > 0) {
    GALE_CHECK_CUDA(cudaMemsetAsync(counts, 0, static_cast<size_t>(sources) * sizeof(uint32_t), stream));
    hub_count_kernel<<<row_blocks(graph.rows), kRowThreads, 0, stream>>>(graph.indptr, graph.rows, graph.indices, counts,
                                                                         order, sources);
    GALE_CHECK_CUDA(cudaGetLastError());
    // Stable: among equal counts the lower id stays first.
    GALE_CHECK_CUDA(cub::DeviceRadixSort::SortPairsDescending(temp, temp_bytes, counts, sorted_counts, order, sorted,
                                                              static_cast<int>(sources), 0, 32, stream));
  }
  hub_pick_kernel<<<1, kSspmmMaxHubs, 0, stream>>>(sorted_counts, sorted, sources, capacity,
                                               static_cast<uint32_t>(std::clamp<int64_t>(min_entries, 1, UINT32_MAX)), ids);
  GALE_CHECK_CUDA(cudaGetLastError());
  const int64_t words = sspmm_hub_mask_words(nnz);
  if (words > 0) {
    const unsigned mask_blocks = static_cast<unsigned>(std::clamp<int64_t>((words + kRowWarps - 1) / kRowWarps, 1, kMaxRowBlocks));
    hub_mask_kernel<<<mask_blocks, kRowThreads, 0, stream>>>(graph.indptr, graph.rows, graph.indices, nnz, ids,
                                                              capacity, entry_mask);
    GALE_CHECK_CUDA(cudaGetLastError());
  }
}

}  // namespace gale::kernels
