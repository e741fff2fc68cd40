// kernels/maxk.cu — the CUDA twins of the MaxK family (maxk.hpp), after MaxK-GNN (ASPLOS'24):
// the top-k nonlinearity into CBSR (Sec. 5.3, done here as an exact radix select), the forward
// SpGEMM (Sec. 4.1, Alg. 1) and the backward SSpMM (Sec. 4.2, Alg. 2) over a table of edge
// groups, and the scatter back to dense.
//
// Both aggregations run one edge group (<= 64 entries of one row) per "slot": a width-float
// buffer in shared memory and a sub-warp of L lanes, L = k rounded up to a power of two when
// k < 32 (so 32 / L groups share a warp, the paper's Case 1) and L = 32 looping over the k values
// when k >= 32 (Case 2). A block has 8 warps and as many slots as fit 48 KiB of shared memory
// (at least 4, at most one per sub-warp), so 4 blocks share an SM's 228 KiB. The digest's pitfalls
// are avoided: no thread leaves before a barrier (a block whose groups all lie past the table's
// end leaves as a whole, before the first one), and the non-atomic shared-memory accumulation is
// fenced by __syncwarp between entries, since lanes of a sub-warp need not run in lockstep
// (two entries can share a column, one entry's columns are distinct).
//
// Consecutive slots of one row (a hub row cut into groups) are merged inside the block: SpGEMM
// flushes their sum with one set of atomics, SSpMM prefetches the gradient row once for all of
// them. Outputs are first set by small per-row kernels (bias and self term), so the op needs no
// zeroed output and stays stream-ordered.
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
// Aggregation blocks: 8 warps, so up to 256 sub-warps (L = 1) and as many slots.
constexpr int kAggWarps = 8;
constexpr int kAggThreads = kAggWarps * kWarp;
constexpr int kMaxSlots = kAggThreads;
// Shared memory the slot buffers aim for: 4 blocks (with their 4.6 KiB static slot tables) fill
// an SM's 228 KiB; wide rows still get kMinSlots slots (64 KiB at width 4096). Above the default
// 48 KiB per block the limit is raised with cudaFuncSetAttribute.
constexpr int kSlotBytes = 48 * 1024;
constexpr int kMinSlots = 4;
constexpr int kDefaultSmemLimit = 48 * 1024;
// Entries whose loads are issued together before their shared-memory updates.
constexpr int kBatch = 4;
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
// Radix select: T is built bit by bit from the top, keeping count(key >= T) >= k. It starts from
// the bits every key of the row shares (the common prefix of the row's min and max key, above
// which nothing needs deciding) and stops as soon as count(key >= T) == k. At the end either
// exactly k keys are >= T, or T is the k-th largest key. Either way the kept set is every key > T
// plus the first k - count(key > T) keys equal to T in column order: the CPU reference's set.
template <int VPT, typename I>
__global__ void __launch_bounds__(kRowThreads)
    maxk_forward_kernel(const float* __restrict__ x, int64_t ld, int64_t rows, int width, int k,
                        float* __restrict__ values, I* __restrict__ index) {
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp; r < rows; r += total_warps) {
    const float* xr = x + r * ld;
    uint32_t key[VPT];
    uint32_t lo = 0xffffffffu, hi = 0u;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int c = j * kWarp + lane;
      key[j] = 0u;
      if (c < width) {
        key[j] = order_key(__ldg(xr + c));
        lo = min(lo, key[j]);
        hi = max(hi, key[j]);
      }
    }
    lo = warp_min(lo);
    hi = warp_max(hi);
    const uint32_t diff = lo ^ hi;
    uint32_t t_key = hi;  // all keys equal: T = that key, count(key >= T) = width >= k
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
          if (n == k) break;
        }
      }
    }
    int gt = 0;
#pragma unroll
    for (int j = 0; j < VPT; ++j) gt += key[j] > t_key ? 1 : 0;
    gt = warp_sum(gt);
    const int need = k - gt;  // keys equal to T to keep, lowest columns first
    int taken = 0, equal_seen = 0;
    float* vr = values + r * k;
    I* ir = index + r * k;
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

template <typename I>
void launch_maxk_forward(ConstMatrixView x, const CbsrView& out, cudaStream_t stream) {
  const int width = static_cast<int>(out.width), k = static_cast<int>(out.k);
  I* index = static_cast<I*>(out.index);
  const unsigned blocks = row_blocks(out.rows);
  const int per_lane = (width + kWarp - 1) / kWarp;
#define GALE_MAXK_TOPK(VPT)                                                                          \
  if (per_lane <= VPT) {                                                                             \
    maxk_forward_kernel<VPT, I><<<blocks, kRowThreads, 0, stream>>>(x.data, x.ld, out.rows, width, k, \
                                                                    out.values, index);              \
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

struct AggParams {
  const EdgeGroup* groups = nullptr;
  int64_t capacity = 0;
  const int64_t* count = nullptr;
  const int32_t* indices = nullptr;
  const float* edge_weight = nullptr;
  const float* row_scale = nullptr;
  const float* col_scale = nullptr;
  const void* index = nullptr;   // CBSR columns, uint8_t or uint16_t
  int width = 0;
  int k = 0;
  int slots = 0;
  // SpGEMM: x's values in, out dense.
  const float* values = nullptr;
  float* out = nullptr;
  int64_t out_ld = 0;
  // SSpMM: the dense gradient in, grad values out.
  const float* grad = nullptr;
  int64_t grad_ld = 0;
  float* grad_values = nullptr;
};

// The slot table of one block: which groups it runs, and for each slot the first slot of its run
// (consecutive slots of the same row). Returns the number of slots, 0 when the block has none
// (then it must leave: the caller returns before any barrier, which is block-uniform).
struct SlotTable {
  int64_t start[kMaxSlots];
  int32_t row[kMaxSlots];
  int32_t count[kMaxSlots];
  int16_t run[kMaxSlots];  // first slot of the run this slot belongs to
};

__device__ __forceinline__ int block_slots(const AggParams& p, int64_t* first_out) {
  const int64_t n = p.count != nullptr ? *p.count : p.capacity;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * p.slots;
  *first_out = first;
  if (first >= n) return 0;
  return static_cast<int>(min(static_cast<int64_t>(p.slots), n - first));
}

// Loads the table (threads < slots), then a barrier, then each thread < slots finds its run start.
// Ends with a barrier, so the table is ready for every thread.
__device__ __forceinline__ void load_slots(const AggParams& p, int64_t first, int slots, SlotTable& t) {
  if (threadIdx.x < slots) {
    const EdgeGroup g = p.groups[first + threadIdx.x];
    t.start[threadIdx.x] = g.start;
    t.row[threadIdx.x] = g.row;
    t.count[threadIdx.x] = g.count;
  }
  __syncthreads();
  if (threadIdx.x < slots) {
    int s = threadIdx.x;
    while (s > 0 && t.row[s - 1] == t.row[threadIdx.x]) --s;
    t.run[threadIdx.x] = static_cast<int16_t>(s);
  }
  __syncthreads();
}

// Alg. 1: stage 0 zeroes the slot buffers, stage 1 accumulates each group's entries into its
// buffer (sub-warp of L lanes; lane l takes values l, l + L, ... of each neighbour's k), stage 2
// flushes every run of slots of one row with coalesced atomics (float4 ones when kVec).
template <int L, typename I, bool kVec>
__global__ void __launch_bounds__(kAggThreads) spgemm_kernel(AggParams p) {
  extern __shared__ float4 smem4[];
  float* buf = reinterpret_cast<float*>(smem4);
  __shared__ SlotTable table;
  int64_t first = 0;
  const int slots = block_slots(p, &first);
  if (slots == 0) return;  // the whole block, before any barrier
  const int width = p.width, k = p.k;
  for (int i = threadIdx.x; i < slots * width; i += kAggThreads) buf[i] = 0.0f;
  load_slots(p, first, slots, table);  // its barriers also order the zeroing before stage 1

  const int sub = threadIdx.x / L;
  const int l = threadIdx.x % L;
  if (sub < slots) {
    const unsigned mask = L == kWarp ? kFull : (((1u << L) - 1u) << ((threadIdx.x % kWarp) / L * L));
    const I* index = static_cast<const I*>(p.index);
    float* b = buf + sub * width;
    const int64_t start = table.start[sub];
    const int count = table.count[sub];
    for (int q = 0; q < count; q += kBatch) {
      int32_t src[kBatch];
      float coef[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        src[u] = -1;
        coef[u] = 0.0f;
        if (q + u < count) {
          const int64_t e = start + q + u;
          src[u] = __ldg(p.indices + e);
          float c = p.col_scale ? __ldg(p.col_scale + src[u]) : 1.0f;
          if (p.edge_weight) c *= __ldg(p.edge_weight + e);
          coef[u] = c;
        }
      }
      for (int t0 = 0; t0 < k; t0 += L) {
        const int t = t0 + l;
        float v[kBatch];
        int col[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          v[u] = 0.0f;
          col[u] = 0;
          if (src[u] >= 0 && t < k) {
            const int64_t at = static_cast<int64_t>(src[u]) * k + t;
            v[u] = __ldg(p.values + at);
            col[u] = index[at];
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (src[u] >= 0 && t < k) b[col[u]] += coef[u] * v[u];
          __syncwarp(mask);  // the next entry may hit a column another lane just updated
        }
      }
    }
  }
  __syncthreads();

  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int s = warp; s < slots; s += kAggWarps) {
    if (table.run[s] != s) continue;  // flushed by its run's first slot
    int end = s + 1;
    while (end < slots && table.run[end] == s) ++end;
    const int row = table.row[s];
    const float rs = p.row_scale ? __ldg(p.row_scale + row) : 1.0f;
    float* o = p.out + static_cast<int64_t>(row) * p.out_ld;
    if constexpr (kVec) {
      for (int c = lane * 4; c < width; c += kWarp * 4) {
        float4 v = *reinterpret_cast<const float4*>(buf + s * width + c);
        for (int q = s + 1; q < end; ++q) {
          const float4 w = *reinterpret_cast<const float4*>(buf + q * width + c);
          v.x += w.x;
          v.y += w.y;
          v.z += w.z;
          v.w += w.w;
        }
        // A column no entry reached stays 0 in every buffer: skip it (low-degree rows at small k
        // touch few of the width columns, and the flush is the kernel's bottleneck).
        if (v.x != 0.0f || v.y != 0.0f || v.z != 0.0f || v.w != 0.0f)
          atomic_add4(o + c, make_float4(rs * v.x, rs * v.y, rs * v.z, rs * v.w));
      }
    } else {
      for (int c = lane; c < width; c += kWarp) {
        float v = buf[s * width + c];
        for (int q = s + 1; q < end; ++q) v += buf[q * width + c];
        if (v != 0.0f) atomicAdd(o + c, rs * v);
      }
    }
  }
}

// Alg. 2: stage 1 stages row_scale[i] * g[i] once per run of slots of row i, stage 2 has each
// group's sub-warp gather it at every neighbour's k columns and add into the neighbour's gradient
// values with coalesced atomics. Shared memory is only read after the barrier: no fences needed.
template <int L, typename I>
__global__ void __launch_bounds__(kAggThreads) sspmm_kernel(AggParams p) {
  extern __shared__ float4 smem4[];
  float* buf = reinterpret_cast<float*>(smem4);
  __shared__ SlotTable table;
  int64_t first = 0;
  const int slots = block_slots(p, &first);
  if (slots == 0) return;  // the whole block, before any barrier
  const int width = p.width, k = p.k;
  load_slots(p, first, slots, table);

  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  for (int s = warp; s < slots; s += kAggWarps) {
    if (table.run[s] != s) continue;
    const int row = table.row[s];
    const float rs = p.row_scale ? __ldg(p.row_scale + row) : 1.0f;
    const float* g = p.grad + static_cast<int64_t>(row) * p.grad_ld;
    for (int c = lane; c < width; c += kWarp) buf[s * width + c] = rs * __ldg(g + c);
  }
  __syncthreads();

  const int sub = threadIdx.x / L;
  const int l = threadIdx.x % L;
  if (sub >= slots) return;  // no barrier follows
  const I* index = static_cast<const I*>(p.index);
  const float* b = buf + table.run[sub] * width;
  const int64_t start = table.start[sub];
  const int count = table.count[sub];
  for (int q = 0; q < count; q += kBatch) {
    int32_t src[kBatch];
    float coef[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      src[u] = -1;
      coef[u] = 0.0f;
      if (q + u < count) {
        const int64_t e = start + q + u;
        src[u] = __ldg(p.indices + e);
        float c = p.col_scale ? __ldg(p.col_scale + src[u]) : 1.0f;
        if (p.edge_weight) c *= __ldg(p.edge_weight + e);
        coef[u] = c;
      }
    }
    for (int t0 = 0; t0 < k; t0 += L) {
      const int t = t0 + l;
      if (t >= k) continue;
      int col[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) col[u] = src[u] >= 0 ? index[static_cast<int64_t>(src[u]) * k + t] : 0;
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (src[u] >= 0) atomicAdd(p.grad_values + static_cast<int64_t>(src[u]) * k + t, coef[u] * b[col[u]]);
    }
  }
}

// out[r] = bias (or 0), plus self_coef(r) * x[r] at x's kept columns: the part of SpGEMM's output
// that is not a sum over entries, written before the atomics land.
template <typename I>
__global__ void __launch_bounds__(kRowThreads)
    spgemm_init_kernel(int64_t rows, int width, int k, const float* __restrict__ bias, const float* __restrict__ values,
                       const I* __restrict__ index, int64_t self_rows, float self_scale,
                       const float* __restrict__ self_coefs, float* __restrict__ out, int64_t out_ld) {
  const int lane = threadIdx.x & (kWarp - 1);
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp; r < rows; r += total_warps) {
    float* o = out + r * out_ld;
    for (int c = lane; c < width; c += kWarp) o[c] = bias ? __ldg(bias + c) : 0.0f;
    const float self = r < self_rows ? self_scale + (self_coefs ? __ldg(self_coefs + r) : 0.0f) : 0.0f;
    if (self != 0.0f) {  // uniform across the warp
      __syncwarp();
      for (int t = lane; t < k; t += kWarp) o[index[r * k + t]] += self * __ldg(values + r * k + t);
    }
    __syncwarp();
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

// Sub-warp lanes for k values: k rounded up to a power of two below 32, else the whole warp.
int lanes_for(int64_t k) {
  int l = 1;
  while (l < k && l < kWarp) l *= 2;
  return l;
}

struct AggShape {
  int lanes = 32;
  int slots = 1;
  size_t smem = 0;
};

AggShape agg_shape(int64_t width, int64_t k) {
  AggShape s;
  s.lanes = lanes_for(k);
  const int64_t sub_warps = kAggThreads / s.lanes;
  const int64_t by_smem = std::max<int64_t>(kMinSlots, kSlotBytes / (width * static_cast<int64_t>(sizeof(float))));
  s.slots = static_cast<int>(std::min(sub_warps, by_smem));
  s.smem = static_cast<size_t>(s.slots) * static_cast<size_t>(width) * sizeof(float);
  return s;
}

unsigned agg_blocks(int64_t capacity, int slots) {
  const int64_t blocks = (capacity + slots - 1) / slots;
  if (blocks > std::numeric_limits<int32_t>::max())
    throw InputError("maxk aggregation: " + std::to_string(capacity) + " edge groups need too many blocks");
  return static_cast<unsigned>(blocks);
}

template <typename Kernel>
void launch_agg(Kernel kernel, const AggShape& s, int64_t capacity, const AggParams& p, cudaStream_t stream) {
  // The default limit counts the static slot table too.
  if (s.smem + sizeof(SlotTable) > static_cast<size_t>(kDefaultSmemLimit))
    GALE_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(s.smem)));
  kernel<<<agg_blocks(capacity, s.slots), kAggThreads, s.smem, stream>>>(p);
  GALE_CHECK_CUDA(cudaGetLastError());
}

template <typename I, bool kVec>
void dispatch_spgemm(const AggShape& s, int64_t capacity, const AggParams& p, cudaStream_t stream) {
  switch (s.lanes) {
    case 1: launch_agg(spgemm_kernel<1, I, kVec>, s, capacity, p, stream); return;
    case 2: launch_agg(spgemm_kernel<2, I, kVec>, s, capacity, p, stream); return;
    case 4: launch_agg(spgemm_kernel<4, I, kVec>, s, capacity, p, stream); return;
    case 8: launch_agg(spgemm_kernel<8, I, kVec>, s, capacity, p, stream); return;
    case 16: launch_agg(spgemm_kernel<16, I, kVec>, s, capacity, p, stream); return;
    case 32: launch_agg(spgemm_kernel<32, I, kVec>, s, capacity, p, stream); return;
    default: break;
  }
  throw InternalError("spgemm_cbsr: no kernel for " + std::to_string(s.lanes) + " lanes");
}

template <typename I>
void dispatch_sspmm(const AggShape& s, int64_t capacity, const AggParams& p, cudaStream_t stream) {
  switch (s.lanes) {
    case 1: launch_agg(sspmm_kernel<1, I>, s, capacity, p, stream); return;
    case 2: launch_agg(sspmm_kernel<2, I>, s, capacity, p, stream); return;
    case 4: launch_agg(sspmm_kernel<4, I>, s, capacity, p, stream); return;
    case 8: launch_agg(sspmm_kernel<8, I>, s, capacity, p, stream); return;
    case 16: launch_agg(sspmm_kernel<16, I>, s, capacity, p, stream); return;
    case 32: launch_agg(sspmm_kernel<32, I>, s, capacity, p, stream); return;
    default: break;
  }
  throw InternalError("sspmm_cbsr: no kernel for " + std::to_string(s.lanes) + " lanes");
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
  const int width = static_cast<int>(a.x.width), k = static_cast<int>(a.x.k);
  const int64_t self_rows = std::min(g.rows, a.x.rows);
  const unsigned blocks = row_blocks(g.rows);
  if (a.x.index_bytes() == 1) {
    spgemm_init_kernel<uint8_t><<<blocks, kRowThreads, 0, stream>>>(g.rows, width, k, a.bias, a.x.values,
                                                                    a.x.index_u8(), self_rows, a.self_scale,
                                                                    a.self_coefs, a.out.data, a.out.ld);
  } else {
    spgemm_init_kernel<uint16_t><<<blocks, kRowThreads, 0, stream>>>(g.rows, width, k, a.bias, a.x.values,
                                                                     a.x.index_u16(), self_rows, a.self_scale,
                                                                     a.self_coefs, a.out.data, a.out.ld);
  }
  GALE_CHECK_CUDA(cudaGetLastError());
  if (groups.capacity == 0) return;

  AggParams p;
  p.groups = groups.groups;
  p.capacity = groups.capacity;
  p.count = groups.count;
  p.indices = g.indices;
  p.edge_weight = a.edge_weight;
  p.row_scale = a.row_scale;
  p.col_scale = a.col_scale;
  p.index = a.x.index;
  p.width = width;
  p.k = k;
  p.values = a.x.values;
  p.out = a.out.data;
  p.out_ld = a.out.ld;
  const AggShape s = agg_shape(width, k);
  p.slots = s.slots;
  const bool vec = width % 4 == 0 && a.out.ld % 4 == 0 && aligned16(a.out.data);
  if (a.x.index_bytes() == 1) {
    if (vec) {
      dispatch_spgemm<uint8_t, true>(s, groups.capacity, p, stream);
    } else {
      dispatch_spgemm<uint8_t, false>(s, groups.capacity, p, stream);
    }
  } else {
    if (vec) {
      dispatch_spgemm<uint16_t, true>(s, groups.capacity, p, stream);
    } else {
      dispatch_spgemm<uint16_t, false>(s, groups.capacity, p, stream);
    }
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
  p.groups = groups.groups;
  p.capacity = groups.capacity;
  p.count = groups.count;
  p.indices = g.indices;
  p.edge_weight = a.edge_weight;
  p.row_scale = a.row_scale;
  p.col_scale = a.col_scale;
  p.index = pat.index;
  p.width = width;
  p.k = k;
  p.grad = a.grad_out.data;
  p.grad_ld = a.grad_out.ld;
  p.grad_values = a.grad_values;
  const AggShape s = agg_shape(width, k);
  p.slots = s.slots;
  if (pat.index_bytes() == 1) {
    dispatch_sspmm<uint8_t>(s, groups.capacity, p, stream);
  } else {
    dispatch_sspmm<uint16_t>(s, groups.capacity, p, stream);
  }
}

}  // namespace gale::kernels
