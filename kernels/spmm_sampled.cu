// kernels/spmm_sampled.cu — ES-SpMM (Lin et al. 2021): the cache-first edge-sampled SpMM, for
// inference on graphs whose rows have more entries than it is worth reading.
//
// A warp takes a row at a time. It first loads the row's sample into its slice of shared memory:
// for each of the at most S entries spmm_sample_entry picks (Bucket: the first S; FastRand:
// (j * P) mod n), the column and the entry's coefficient (column scale times edge weight). Then it
// walks the row's output columns, 32 lanes of one float4 (or one float, when rows are not 16-byte
// aligned) at a time, each lane summing the sample's terms for its columns from shared memory, so
// the row's indices and weights are read once whatever the width. The sum is scaled by n / S when
// the row was sampled, then the row scale, the self term and the fused epilogue apply as in every
// SpMM (spmm.hpp). Sums run in sample order, as spmm_sampled_cpu's do.
//
// A block holds as many warps as 64 KiB of shared memory gives slices of S entries (eight at S <=
// 1024, down to two at S = 4096); the grid strides over the rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/cuda/warp.cuh"
#include "kernels/spmm.hpp"
#include "kernels/views.hpp"

namespace gale::kernels {

namespace {

constexpr int kSliceBytes = 64 * 1024;  // shared memory a block gives its warps' samples
constexpr int kMaxWarps = 8;

struct SampledParams {
  CsrView graph;
  const float* x;
  int64_t ldx, x_rows;
  float* out;
  int64_t ldo, width;
  const float* row_scale;
  const float* col_scale;
  const float* edge_weight;
  const float* self_coefs;
  float self_scale;
  bool accumulate;
  const float* bias;
  bool relu;
  int64_t s;
  SpmmSampling sampling;
};

// The epilogue of one element (spmm_finish with this launch's options).
__device__ __forceinline__ float finish(const SampledParams& p, float sum, float rs, float self, float xs,
                                        float old, int64_t col) {
  return spmm_finish(sum, rs, self, xs, p.accumulate, old, p.bias, col, p.relu);
}

// T = float4 (rows of x and out 16-byte aligned, the width a multiple of 4) or float.
template <typename T>
__global__ void sampled_kernel(SampledParams p) {
  extern __shared__ int32_t sample_smem[];
  constexpr int V = sizeof(T) / sizeof(float);
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  int32_t* cols = sample_smem + static_cast<int64_t>(warp) * p.s * 2;
  float* coefs = reinterpret_cast<float*>(cols + p.s);
  const int64_t self_rows = min(p.graph.rows, p.x_rows);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps + warp; r < p.graph.rows;
       r += static_cast<int64_t>(gridDim.x) * warps) {
    const int64_t begin = p.graph.indptr[r], n = p.graph.indptr[r + 1] - begin, taken = min(n, p.s);
    const int64_t stride = spmm_sample_stride(n, p.s, p.sampling);
    for (int64_t j = lane; j < taken; j += kWarp) {
      const int64_t e = begin + spmm_sample_entry(j, n, stride);
      const int32_t c = __ldg(p.graph.indices + e);
      float coef = p.col_scale ? __ldg(p.col_scale + c) : 1.0f;
      if (p.edge_weight) coef *= __ldg(p.edge_weight + e);
      cols[j] = c;
      coefs[j] = coef;
    }
    __syncwarp();
    float rs = p.row_scale ? __ldg(p.row_scale + r) : 1.0f;
    if (n > taken) rs *= static_cast<float>(n) / static_cast<float>(taken);
    const float self = r < self_rows ? p.self_scale + (p.self_coefs ? __ldg(p.self_coefs + r) : 0.0f) : 0.0f;
    for (int64_t c0 = static_cast<int64_t>(lane) * V; c0 < p.width; c0 += kWarp * V) {
      T acc, v[4];
      set_zero(acc);
      int64_t j = 0;
      for (; j + 4 <= taken; j += 4) {  // four gathers in flight
#pragma unroll
        for (int u = 0; u < 4; ++u) load_ro(v[u], p.x + cols[j + u] * p.ldx + c0);
#pragma unroll
        for (int u = 0; u < 4; ++u) fma_to(acc, coefs[j + u], v[u]);
      }
      for (; j < taken; ++j) {
        load_ro(v[0], p.x + cols[j] * p.ldx + c0);
        fma_to(acc, coefs[j], v[0]);
      }
      float* o = p.out + r * p.ldo + c0;
      const float* xs = p.x + r * p.ldx + c0;
      T s, old;
      set_zero(s);
      set_zero(old);
      if (self != 0.0f) load_ro(s, xs);
      if (p.accumulate) load_rw(old, o);
      if constexpr (V == 4) {
        store(o, make_float4(finish(p, acc.x, rs, self, s.x, old.x, c0), finish(p, acc.y, rs, self, s.y, old.y, c0 + 1),
                             finish(p, acc.z, rs, self, s.z, old.z, c0 + 2), finish(p, acc.w, rs, self, s.w, old.w, c0 + 3)));
      } else {
        store(o, finish(p, acc, rs, self, s, old, c0));
      }
    }
    __syncwarp();  // the slice is rewritten for the next row
  }
}

}  // namespace

void spmm_sampled_cuda(const SpmmArgs& a, cudaStream_t stream) {
  if (a.graph.rows == 0 || a.out.cols == 0) return;
  const SampledParams p{a.graph,      a.x.data,        a.x.ld,       a.x.rows,   a.out.data,     a.out.ld,
                        a.out.cols,   a.row_scale,     a.col_scale,  a.edge_weight, a.self_coefs, a.self_scale,
                        a.accumulate, a.bias,          a.relu,       a.sample_width, a.sampling};
  const int warps = static_cast<int>(
      std::clamp<int64_t>(kSliceBytes / (a.sample_width * 2 * static_cast<int64_t>(sizeof(int32_t))), 1, kMaxWarps));
  const size_t smem = static_cast<size_t>(warps) * a.sample_width * 2 * sizeof(int32_t);
  const int64_t blocks = std::min<int64_t>((a.graph.rows + warps - 1) / warps, int64_t{64} * cuda::current_multiprocessors());
  const bool vec = a.out.cols % 4 == 0 && float4_rows(a.x.data, a.x.ld) && float4_rows(a.out.data, a.out.ld);
  if (vec) {
    GALE_CHECK_CUDA(cudaFuncSetAttribute(sampled_kernel<float4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
    sampled_kernel<float4><<<static_cast<unsigned>(blocks), warps * kWarp, smem, stream>>>(p);
  } else {
    GALE_CHECK_CUDA(cudaFuncSetAttribute(sampled_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
    sampled_kernel<float><<<static_cast<unsigned>(blocks), warps * kWarp, smem, stream>>>(p);
  }
  GALE_CHECK_CUDA(cudaGetLastError());
}

}  // namespace gale::kernels
