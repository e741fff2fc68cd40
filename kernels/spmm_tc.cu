// kernels/spmm_tc.cu — TC-GNN's tensor-core SpMM (ATC'23, Sec. 4.2-4.3, Algorithm 2) over the
// translated graph of spmm_tc_translate (spmm_tc.hpp), in TF32 with f32 sums.
//
// One thread block takes one work item: a window of 16 rows, or kTcItemBlocks of the TC blocks of a
// window that has more. Its warps split the output columns into slices (32 or 64 columns each; a
// block of up to 8 warps, more slices in gridDim.y) and share the A tiles: chunks of 8 to 32 TC
// blocks are built in shared memory by all the block's threads (each planned entry's coefficient,
// edge weight x column scale, added at its row and condensed column; duplicate entries add), with
// the blocks' source ids beside them. (Tiles built by each warp for itself, two blocks at a time and
// without barriers, measured slower: 20.1 against 17.6 ms at width 256 on R-MAT scale 21.)
//
// Each warp then runs one m16n8k8 MMA per 8 columns of its slice and TC block. The B fragment is
// gathered straight from x: lane (g, t) = (lane / 4, lane % 4) holds B[k = t][n = g] and
// B[k = t + 4][n = g], and tile j of the slice takes x's column kTiles * n + j for its column n, so
// a lane's values for all kTiles tiles are kTiles consecutive floats of one source row (one or two
// float4), and eight lanes read a source's 32- or 64-column slice whole. The accumulators come out
// the same way: lane (g, t) holds rows g and g + 8 of the window at the slice's columns
// 2 t kTiles .. 2 t kTiles + 2 kTiles - 1, contiguous, so the epilogue stores float4s.
//
// A window cut into several items (a hub's rows) has its rows prepared before (accumulate, self
// term and bias: spmm_tc_prepare_kernel), its items add their scaled sums with atomics, and ReLU, if
// asked, runs after (spmm_tc_relu_kernel). Every other row is written once, by its only item, in a
// fixed order; such split rows and rows with duplicate entries sum in an order that can vary.
//
// Where the time goes (ncu, width 256, R-MAT scale 21): L2 at 80% of its peak, DRAM 65%, SM 35%. A
// window's warps fetch whole source rows between them at once, so between windows less stays in L2
// than in GAR's passes over 32-column tiles (L2 hit rate 39%); the tiles and their barriers cost
// ~1.3 ms of the 17 (a build that skipped them, results wrong, took 16.7 against 18.0). Running the
// slices apart instead, each block one slice (gridDim.y = slices: every window's first slice
// first), builds each tile once per slice and lost: at width 64 / 128 / 256, blocks of at most 1
// warp took 6.14 / 12.02 / 20.17 ms on R-MAT and 3.22 / 6.44 / 10.60 on the class-ordered SBM of
// docs/performance.md, at most 2 warps 4.83 / 9.46 / 17.51 and 2.51 / 5.04 / 8.76, against 4.82 /
// 8.53 / 16.94 and 2.51 / 4.20 / 7.57 with every slice of a window in one block.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/warp.cuh"
#include "kernels/spmm.hpp"
#include "kernels/views.hpp"

namespace gale::kernels {

namespace {

constexpr int kMaxWarps = 8;    // slices a thread block takes
constexpr int kTileSlots = kTcWindowRows * kTcBlockCols;

// v as a TF32 operand, rounded to nearest with ties away from zero: half a TF32 unit added to the
// bits, whose low 13 the MMA then ignores. One integer add where cvt.rna.tf32.f32 takes several
// instructions (the same result for finite values; infinities turn into NaNs).
__device__ __forceinline__ uint32_t to_tf32(float v) { return __float_as_uint(v) + 0x1000u; }

// c += A (16 x 8, row) B (8 x 8, col), TF32 inputs, f32 accumulators.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A tile's slot for (row, column): the column's halves swap for rows 4-7 and 12-15, so that the
// A fragment's loads (row g or g + 8, column t or t + 4, g = 0..7, t = 0..3) hit 32 banks.
__device__ __forceinline__ int tile_slot(int row, int col) { return row * kTcBlockCols + (col ^ (((row >> 2) & 1) << 2)); }

// The values lane n of a source's slice gathers: columns c .. c + kTiles - 1 of row `src` (zeros
// for a padding source, -1, and past the width).
template <int kTiles, bool kVec>
__device__ __forceinline__ void gather(const SpmmArgs& a, int32_t src, int64_t c, float (&v)[kTiles]) {
  if (src < 0) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) v[j] = 0.0f;
    return;
  }
  const float* p = a.x.data + static_cast<int64_t>(src) * a.x.ld + c;
  if constexpr (kVec) {
#pragma unroll
    for (int j = 0; j < kTiles; j += 4) {
      float4 q;
      load_ro(q, p + j);
      v[j] = q.x;
      v[j + 1] = q.y;
      v[j + 2] = q.z;
      v[j + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) v[j] = c + j < a.out.cols ? __ldg(p + j) : 0.0f;
  }
}

// Row r's self-term coefficient: self_scale + self_coefs[r] where x has row r, else 0.
__device__ __forceinline__ float self_coef(const SpmmArgs& a, int64_t r) {
  return r < min(a.graph.rows, a.x.rows) ? a.self_scale + (a.self_coefs ? __ldg(a.self_coefs + r) : 0.0f) : 0.0f;
}

// The epilogue of element (r, c) (spmm_finish), reading x's and out's values only where it needs
// them; ReLU when `relu`.
__device__ __forceinline__ float finish(const SpmmArgs& a, float sum, float rs, float self, int64_t r, int64_t c,
                                        bool relu) {
  const float xs = self != 0.0f ? __ldg(a.x.data + r * a.x.ld + c) : 0.0f;
  const float old = a.accumulate ? a.out.data[r * a.out.ld + c] : 0.0f;
  return spmm_finish(sum, rs, self, xs, a.accumulate, old, a.bias, c, relu);
}

// Adds (or, with kClear, zeroes) the coefficients of TC blocks [b, b + n) of a window into the
// chunk's tiles, a thread an entry.
template <bool kClear>
__device__ __forceinline__ void place_entries(const SpmmArgs& a, int32_t b, int n, int32_t condensed_base,
                                              float (*tiles)[kTileSlots], const int32_t (*srcs)[kTcBlockCols]) {
  const SpmmTcPlan& plan = a.tc;
  for (int32_t i = plan.block_entries[b] + threadIdx.x; i < plan.block_entries[b + n]; i += blockDim.x) {
    const int32_t s = plan.slot[i];
    const int32_t col = s / kTcWindowRows - condensed_base;  // 0 .. n * 8 - 1
    float* slot = &tiles[col / kTcBlockCols][tile_slot(s % kTcWindowRows, col % kTcBlockCols)];
    if constexpr (kClear) {
      atomicExch(slot, 0.0f);  // duplicate entries clear one slot: an exchange, not a racing store
    } else {
      float coef = a.edge_weight ? __ldg(a.edge_weight + plan.entry[i]) : 1.0f;
      if (a.col_scale) coef *= __ldg(a.col_scale + srcs[col / kTcBlockCols][col % kTcBlockCols]);
      atomicAdd(slot, coef);
    }
  }
}

// kVec: every slice whole (the width a multiple of 8 kTiles) and x's and out's rows 16-byte aligned.
template <int kTiles, bool kVec, int kChunk>
__global__ void __launch_bounds__(kMaxWarps * kWarp) spmm_tc_kernel(SpmmArgs a, int64_t slices) {
  __shared__ float tiles[kChunk][kTileSlots];
  __shared__ int32_t srcs[kChunk][kTcBlockCols];
  const SpmmTcPlan& plan = a.tc;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, t = lane % 4;
  const int64_t item = blockIdx.x;
  const int32_t w = plan.item_window[item];
  const int32_t window_first = plan.window_blocks[w], window_end = plan.window_blocks[w + 1];
  const int32_t b_begin = plan.item_block[item];
  const int32_t b_end = min(b_begin + kTcItemBlocks, window_end);
  const bool split = window_end - window_first > kTcItemBlocks;
  const int64_t slice = static_cast<int64_t>(blockIdx.y) * (blockDim.x / kWarp) + warp;
  const bool active = slice < slices;
  const int64_t col0 = slice * 8 * kTiles;

  float acc[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  // The tiles are zeroed once; after each chunk its entries put their slots back to zero, which
  // writes a few dozen floats where zeroing the chunk wrote 2048.
  for (int i = threadIdx.x; i < kChunk * kTileSlots / 4; i += blockDim.x)
    store(&tiles[0][0] + 4 * i, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
  for (int32_t cb = b_begin; cb < b_end; cb += kChunk) {
    const int n = min(kChunk, b_end - cb);
    const int32_t condensed_base = (cb - window_first) * kTcBlockCols;
    for (int i = threadIdx.x; i < n * kTcBlockCols; i += blockDim.x)
      (&srcs[0][0])[i] = plan.block_src[static_cast<int64_t>(cb) * kTcBlockCols + i];
    __syncthreads();  // zeroed slots, this chunk's sources
    place_entries<false>(a, cb, n, condensed_base, tiles, srcs);
    __syncthreads();
    if (active) {
      const int s0 = tile_slot(g, t), s1 = tile_slot(g + 8, t), s2 = tile_slot(g, t + 4), s3 = tile_slot(g + 8, t + 4);
#pragma unroll 2
      for (int b = 0; b < n; ++b) {
        const uint32_t frag[4] = {to_tf32(tiles[b][s0]), to_tf32(tiles[b][s1]), to_tf32(tiles[b][s2]), to_tf32(tiles[b][s3])};
        float lo[kTiles], hi[kTiles];
        gather<kTiles, kVec>(a, srcs[b][t], col0 + kTiles * g, lo);
        gather<kTiles, kVec>(a, srcs[b][t + 4], col0 + kTiles * g, hi);
#pragma unroll
        for (int j = 0; j < kTiles; ++j) mma_tf32(acc[j], frag, to_tf32(lo[j]), to_tf32(hi[j]));
      }
    }
    __syncthreads();  // every warp has read the chunk
    place_entries<true>(a, cb, n, condensed_base, tiles, srcs);
  }
  if (!active) return;

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t r = static_cast<int64_t>(w) * kTcWindowRows + g + 8 * half;
    if (r >= a.graph.rows) continue;
    const float rs = a.row_scale ? __ldg(a.row_scale + r) : 1.0f;
    float v[2 * kTiles];
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      v[j] = acc[j][2 * half];
      v[kTiles + j] = acc[j][2 * half + 1];
    }
    const int64_t c0 = col0 + 2 * t * kTiles;
    float* o = a.out.data + r * a.out.ld;
    if (split) {
#pragma unroll
      for (int q = 0; q < 2 * kTiles; ++q)
        if (kVec || c0 + q < a.out.cols) atomicAdd(o + c0 + q, rs * v[q]);
      continue;
    }
    const float self = self_coef(a, r);
    if constexpr (kVec) {
#pragma unroll
      for (int q = 0; q < 2 * kTiles; q += 4)
        store(o + c0 + q, make_float4(finish(a, v[q], rs, self, r, c0 + q, a.relu),
                                      finish(a, v[q + 1], rs, self, r, c0 + q + 1, a.relu),
                                      finish(a, v[q + 2], rs, self, r, c0 + q + 2, a.relu),
                                      finish(a, v[q + 3], rs, self, r, c0 + q + 3, a.relu)));
    } else {
#pragma unroll
      for (int q = 0; q < 2 * kTiles; ++q)
        if (c0 + q < a.out.cols) o[c0 + q] = finish(a, v[q], rs, self, r, c0 + q, a.relu);
    }
  }
}

// The rows of split windows before their items add into them: (accumulate ? out : 0) + self + bias.
__global__ void spmm_tc_prepare_kernel(SpmmArgs a) {
  const int64_t r = static_cast<int64_t>(a.tc.split_windows[blockIdx.x]) * kTcWindowRows + blockIdx.y;
  if (r >= a.graph.rows) return;
  const float self = self_coef(a, r);
  float* o = a.out.data + r * a.out.ld;
  for (int64_t c = threadIdx.x; c < a.out.cols; c += blockDim.x) o[c] = finish(a, 0.0f, 0.0f, self, r, c, /*relu=*/false);
}

// ReLU on the rows of split windows, once all their items have added.
__global__ void spmm_tc_relu_kernel(SpmmArgs a) {
  const int64_t r = static_cast<int64_t>(a.tc.split_windows[blockIdx.x]) * kTcWindowRows + blockIdx.y;
  if (r >= a.graph.rows) return;
  float* o = a.out.data + r * a.out.ld;
  for (int64_t c = threadIdx.x; c < a.out.cols; c += blockDim.x) o[c] = fmaxf(o[c], 0.0f);
}

template <int kTiles, int kChunk>
void launch(const SpmmArgs& a, dim3 grid, int warps, int64_t slices, bool vec, cudaStream_t stream) {
  if (vec) {
    spmm_tc_kernel<kTiles, true, kChunk><<<grid, warps * kWarp, 0, stream>>>(a, slices);
  } else {
    spmm_tc_kernel<kTiles, false, kChunk><<<grid, warps * kWarp, 0, stream>>>(a, slices);
  }
  GALE_CHECK_CUDA(cudaGetLastError());
}

// Tiles a chunk holds: 8 per warp of the block, at most 32. Fewer barriers per tile pay at width 128
// and up, but a chunk's shared memory bounds the blocks an SM holds, which for blocks of one or two
// warps (widths to 64) is what keeps gathers in flight. Measured (ms, H100, chunks of 8 / 16 / 32 tiles)
// on R-MAT scale 21: width 32 3.26 / 3.44 / 5.60, 64 4.96 / 4.90 / 5.50, 128 9.29 / 8.76 / 8.63, 256
// 18.07 / 17.30 / 16.95; on a class-ordered SBM of 2M nodes: 1.61 / 1.93 / 3.16, 2.46 / 2.53 / 2.89,
// 4.40 / 4.33 / 4.22, 8.07 / 7.88 / 7.54. (Unrolling four tiles' gathers instead of two changed
// nothing.)
template <int kTiles>
void launch(const SpmmArgs& a, cudaStream_t stream) {
  const int64_t slices = (a.out.cols + 8 * kTiles - 1) / (8 * kTiles);
  const int warps = static_cast<int>(std::min<int64_t>(slices, kMaxWarps));
  const dim3 grid(static_cast<unsigned>(a.tc.items), static_cast<unsigned>((slices + warps - 1) / warps));
  const bool vec = a.out.cols % (8 * kTiles) == 0 && float4_rows(a.x.data, a.x.ld) && float4_rows(a.out.data, a.out.ld);
  if (warps == 1) {
    launch<kTiles, 8>(a, grid, warps, slices, vec, stream);
  } else if (warps == 2) {
    launch<kTiles, 16>(a, grid, warps, slices, vec, stream);
  } else {
    launch<kTiles, 32>(a, grid, warps, slices, vec, stream);
  }
}

}  // namespace

void spmm_tc_cuda(const SpmmArgs& a, cudaStream_t stream) {
  if (a.graph.rows == 0 || a.out.cols == 0) return;
  const int threads = static_cast<int>(std::clamp<int64_t>((a.out.cols + 31) / 32 * 32, 32, 256));
  const dim3 split_grid(static_cast<unsigned>(a.tc.splits), kTcWindowRows);
  if (a.tc.splits > 0) {
    spmm_tc_prepare_kernel<<<split_grid, threads, 0, stream>>>(a);
    GALE_CHECK_CUDA(cudaGetLastError());
  }
  // Slices of 64 columns from width 256 up (more MMAs per A fragment, two float4 per source row),
  // else of 32, which keep four warps on a window of width 128.
  if (a.tc_slice == 64 || (a.tc_slice == 0 && a.out.cols >= 256)) {
    launch<8>(a, stream);
  } else {
    launch<4>(a, stream);
  }
  if (a.tc.splits > 0 && a.relu) {
    spmm_tc_relu_kernel<<<split_grid, threads, 0, stream>>>(a);
    GALE_CHECK_CUDA(cudaGetLastError());
  }
}

}  // namespace gale::kernels
