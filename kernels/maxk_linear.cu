// The dense layer on a CBSR input and its input gradient at the kept positions (kernels/maxk.hpp),
// CUDA twins of cbsr_gemm_cpu and cbsr_gemm_grad_cpu. W sits in shared memory (a narrowing layer's
// W is 256 x 47 floats: 48 KiB), so the CBSR input (160 bytes a row at k = 32) and the gradient
// rows are all that come from global memory; both kernels read W in 16-byte units without bank
// conflicts.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/warp.cuh"
#include "kernels/cuda/runtime.hpp"
#include "kernels/error.hpp"
#include "kernels/maxk.hpp"

namespace gale::kernels {

namespace {

constexpr int kMaxCols = 128;                 // output columns a lane covers: up to 4 per lane
constexpr int kGemmThreads = 512;
constexpr int kGradThreads = 1024;            // one block per SM: W takes most of its shared memory
constexpr size_t kSharedLimit = 200 * 1024;   // of the 227 KiB an H100 block may opt into
constexpr size_t kSumsSharedLimit = 227 * 1024;  // with the column sums' rows (sm_90's opt-in most)

// Row stride (floats) of W in shared memory for the forward: n rounded up to whole float4s.
__host__ __device__ int64_t forward_stride(int64_t n) { return (n + 3) / 4 * 4; }
// ... and for the gradient: 64 or 128 floats (16 or 32 float4 units), zero-padded, so that the
// rotation below keeps every quarter-warp's 16-byte loads on distinct banks.
__host__ __device__ int64_t grad_stride(int64_t n) { return n <= 64 ? 64 : 128; }

size_t gemm_shared_bytes(int64_t width, int64_t n) {
  return static_cast<size_t>(width * forward_stride(n)) * sizeof(float);
}

// Float4 units per W row (and staged grad row) of the gradient kernel: both terms at the wider one's.
int grad_units(const int64_t* n, int terms) {
  int64_t widest = n[0];
  for (int t = 1; t < terms; ++t) widest = std::max(widest, n[t]);
  return static_cast<int>(grad_stride(widest) / 4);
}

// W copies of the terms, then per warp the staged grad rows and a dense row buffer.
size_t grad_shared_bytes(int64_t width, const int64_t* n, int terms) {
  const size_t units = static_cast<size_t>(grad_units(n, terms)) * static_cast<size_t>(terms);
  const size_t per_warp = units + static_cast<size_t>((width + 3) / 4);
  return (units * static_cast<size_t>(width) + (kGradThreads / kWarp) * per_warp) * sizeof(float4);
}

// The column sums' rows of the gradient kernel: one of width floats per warp.
size_t sums_shared_bytes(int64_t width) {
  return static_cast<size_t>(kGradThreads / kWarp) * static_cast<size_t>(width) * sizeof(float);
}

// Blocks for `rows` at rows_per_block, at most `per_sm` per multiprocessor: the blocks loop over
// rows, so W is staged once per block, not once per handful of rows.
unsigned grid_for(int64_t rows, int rows_per_block, int per_sm) {
  const int64_t most = std::max<int64_t>(1, static_cast<int64_t>(cuda::current_multiprocessors()) * per_sm);
  return static_cast<unsigned>(std::clamp<int64_t>((rows + rows_per_block - 1) / rows_per_block, 1, most));
}

// Copies W (rows x n, leading dimension ld) into shared memory with row stride `stride`, zeros in
// the padding: a warp per row.
__device__ void stage_w(float* dst, const float* w, int64_t rows, int64_t n, int64_t ld, int64_t stride) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  for (int64_t r = threadIdx.x / kWarp; r < rows; r += blockDim.x / kWarp) {
    for (int64_t j = lane; j < stride; j += kWarp) dst[r * stride + j] = j < n ? w[r * ld + j] : 0.0f;
  }
}

// out = x W + beta * out. A row belongs to L lanes (32 / L rows a warp), lane q of them holding
// output columns 4q .. 4q + 3 as a float4: per kept value (v, c), shuffled round the row's lanes
// L at a time, one 16-byte shared load of W[c] and four fused multiply-adds.
template <typename I, int L>
__global__ void __launch_bounds__(kGemmThreads) cbsr_gemm_kernel(CbsrGemmArgs a) {
  extern __shared__ float4 w4[];
  const int64_t n = a.w.cols, k = a.x.k;
  const int units = static_cast<int>(forward_stride(n) / 4);
  stage_w(reinterpret_cast<float*>(w4), a.w.data, a.x.width, n, a.w.ld, forward_stride(n));
  __syncthreads();
  constexpr int kRowsPerWarp = kWarp / L;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int q = lane % L;
  const auto* index = static_cast<const I*>(a.x.index);
  const int64_t rows_per_grid = static_cast<int64_t>(gridDim.x) * (kGemmThreads / kWarp) * kRowsPerWarp;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * (kGemmThreads / kWarp) + threadIdx.x / kWarp) *
                            kRowsPerWarp + lane / L;
  // Every lane runs the same trip count (full-mask shuffles): rows past the end compute nothing.
  const int64_t trips = (a.x.rows + rows_per_grid - 1) / rows_per_grid;
  for (int64_t trip = 0; trip < trips; ++trip) {
    const int64_t r = first + trip * rows_per_grid;
    const bool live = r < a.x.rows;
    float* o = live ? a.out.data + r * a.out.ld : nullptr;
    float acc[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t j = 4 * q + i;
      acc[i] = live && a.beta != 0.0f && j < n ? a.beta * o[j] : 0.0f;
    }
    for (int64_t t0 = 0; t0 < k; t0 += L) {
      float v = 0.0f;
      int c = 0;
      if (live && t0 + q < k) {
        v = a.x.values[r * k + t0 + q];
        c = index[r * k + t0 + q];
      }
      const int count = static_cast<int>(min(static_cast<int64_t>(L), k - t0));
#pragma unroll 4
      for (int s = 0; s < count; ++s) {
        const float vs = __shfl_sync(kFull, v, s, L);
        const int cs = __shfl_sync(kFull, c, s, L);
        if (q < units) {
          const float4 w = w4[cs * units + q];
          acc[0] = fmaf(vs, w.x, acc[0]);
          acc[1] = fmaf(vs, w.y, acc[1]);
          acc[2] = fmaf(vs, w.z, acc[2]);
          acc[3] = fmaf(vs, w.w, acc[3]);
        }
      }
    }
    if (!live) continue;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t j = 4 * q + i;
      if (j < n) o[j] = acc[i];
    }
  }
}

// One warp per row: the grad rows staged (zero-padded) in the warp's buffer; lane t forms kept
// slot t's dot products (and t + 32's, ...) over the U float4 units of a row taken in the order
// (u + t) mod U, so the eight lanes of each quarter-warp read eight different banks of W and of
// the staged rows whatever their columns; the row is written dense through the warp's row buffer.
// Every term's W has row stride 4 U (U = 16 or 32: up to 64 or 128 columns).
template <typename I, int U>
__global__ void __launch_bounds__(kGradThreads) cbsr_gemm_grad_kernel(CbsrGemmGradArgs a) {
  extern __shared__ float4 sh4[];
  const ConstCbsrView& p = a.pattern;
  const int width = static_cast<int>(p.width), k = static_cast<int>(p.k), terms = a.terms;
  for (int t = 0; t < terms; ++t) {
    stage_w(reinterpret_cast<float*>(sh4 + t * width * U), a.w[t].data, width, a.w[t].cols, a.w[t].ld, 4 * U);
  }
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  float4* g_sh = sh4 + terms * width * U + warp * (terms * U + (width + 3) / 4);
  float* row_sh = reinterpret_cast<float*>(g_sh + terms * U);
  // With column sums: the warp's row of them, after every warp's buffers (maxk.hpp).
  float* acc = a.column_partial == nullptr ? nullptr
               : reinterpret_cast<float*>(sh4 + terms * width * U +
                                          (kGradThreads / kWarp) * (terms * U + (width + 3) / 4)) + warp * width;
  if (acc != nullptr) {
    for (int c = lane; c < width; c += kWarp) acc[c] = 0.0f;
  }
  __syncthreads();
  const auto* index = static_cast<const I*>(p.index);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kGradThreads / kWarp);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (kGradThreads / kWarp) + warp; r < p.rows; r += warps) {
    for (int t = 0; t < terms; ++t) {
      const ConstMatrixView& gm = a.grad[t];
      const bool has = r < gm.rows;
      const float* src = gm.data + (has ? r * gm.ld : 0);
      float* g = reinterpret_cast<float*>(g_sh + t * U);
      for (int j = lane; j < 4 * U; j += kWarp) g[j] = has && j < gm.cols ? src[j] : 0.0f;
    }
    for (int c = lane; c < width; c += kWarp) row_sh[c] = 0.0f;
    __syncwarp();
    for (int t = lane; t < k; t += kWarp) {
      const int c = index[r * k + t];
      float sum = 0.0f;
      for (int term = 0; term < terms; ++term) {
        const float4* w = sh4 + (term * width + c) * U;
        const float4* g = g_sh + term * U;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int uu = (u + lane) & (U - 1);
          const float4 wv = w[uu], gv = g[uu];
          sum = fmaf(gv.x, wv.x, sum);
          sum = fmaf(gv.y, wv.y, sum);
          sum = fmaf(gv.z, wv.z, sum);
          sum = fmaf(gv.w, wv.w, sum);
        }
      }
      row_sh[c] = sum;  // kept columns are distinct: no two lanes write one slot
      if (acc != nullptr) acc[c] += sum;  // in row order, one lane per slot
    }
    __syncwarp();
    float* o = a.grad_in.data + r * a.grad_in.ld;
    for (int c = lane; c < width; c += kWarp) o[c] = row_sh[c];
    __syncwarp();  // the buffers are rewritten for the warp's next row
  }
  if (acc != nullptr) {
    float* pr = a.column_partial + (static_cast<int64_t>(blockIdx.x) * (kGradThreads / kWarp) + warp) * width;
    for (int c = lane; c < width; c += kWarp) pr[c] = acc[c];
  }
}

template <typename I>
void launch_gemm(const CbsrGemmArgs& a, cudaStream_t stream) {
  const size_t bytes = gemm_shared_bytes(a.x.width, a.w.cols);
  const int64_t units = forward_stride(a.w.cols) / 4;
#define GALE_CBSR_GEMM(L)                                                                                     \
  if (units <= L) {                                                                                           \
    GALE_CHECK_CUDA(cudaFuncSetAttribute(cbsr_gemm_kernel<I, L>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                         static_cast<int>(bytes)));                                          \
    cbsr_gemm_kernel<I, L><<<grid_for(a.x.rows, kGemmThreads / L, 4), kGemmThreads, bytes, stream>>>(a);      \
    GALE_CHECK_CUDA(cudaGetLastError());                                                                      \
    return;                                                                                                   \
  }
  GALE_CBSR_GEMM(1)
  GALE_CBSR_GEMM(2)
  GALE_CBSR_GEMM(4)
  GALE_CBSR_GEMM(8)
  GALE_CBSR_GEMM(16)
  GALE_CBSR_GEMM(32)
#undef GALE_CBSR_GEMM
}

template <typename I>
void launch_grad(const CbsrGemmGradArgs& a, cudaStream_t stream) {
  const int64_t n[2] = {a.w[0].cols, a.terms > 1 ? a.w[1].cols : 0};
  const size_t bytes = grad_shared_bytes(a.pattern.width, n, a.terms) +
                       (a.column_partial != nullptr ? sums_shared_bytes(a.pattern.width) : 0);
  const unsigned grid = grid_for(a.pattern.rows, kGradThreads / kWarp, 1);
  const auto launch = [&](auto kernel) {
    GALE_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    kernel<<<grid, kGradThreads, bytes, stream>>>(a);
    GALE_CHECK_CUDA(cudaGetLastError());
  };
  if (grad_units(n, a.terms) == 16) return launch(cbsr_gemm_grad_kernel<I, 16>);
  launch(cbsr_gemm_grad_kernel<I, 32>);
}

void require(const std::string& why, const char* op) {
  if (!why.empty()) throw InputError(std::string(op) + ": " + why);
}

}  // namespace

std::string cbsr_gemm_cuda_cannot(int64_t width, int64_t n, int terms) {
  if (n > kMaxCols) return "W has " + std::to_string(n) + " columns, the CUDA op takes up to " + std::to_string(kMaxCols);
  const int64_t cols[2] = {n, n};
  const size_t bytes = std::max(gemm_shared_bytes(width, n), grad_shared_bytes(width, cols, terms));
  if (bytes > kSharedLimit)
    return "W (" + std::to_string(width) + " x " + std::to_string(n) + ", " + std::to_string(terms) +
           " of them) does not fit in shared memory";
  return "";
}

void cbsr_gemm_cuda(const CbsrGemmArgs& a, cudaStream_t stream) {
  require(cbsr_gemm_cannot(a), "cbsr_gemm");
  require(cbsr_gemm_cuda_cannot(a.x.width, a.w.cols, 1), "cbsr_gemm");
  if (a.x.rows == 0) return;
  if (a.x.index_bytes() == 1) return launch_gemm<uint8_t>(a, stream);
  launch_gemm<uint16_t>(a, stream);
}

std::string cbsr_gemm_grad_sums_cannot(const CbsrGemmGradArgs& a) {
  const int64_t n[2] = {a.w[0].cols, a.terms > 1 ? a.w[1].cols : 0};
  const size_t bytes = grad_shared_bytes(a.pattern.width, n, a.terms) + sums_shared_bytes(a.pattern.width);
  if (bytes > kSumsSharedLimit)
    return "W (" + std::to_string(a.pattern.width) + " x " + std::to_string(std::max(n[0], n[1])) +
           ") with the column sums does not fit in shared memory";
  return "";
}

int64_t cbsr_gemm_grad_sum_rows(int64_t rows) {
  return rows == 0 ? 0 : static_cast<int64_t>(grid_for(rows, kGradThreads / kWarp, 1)) * (kGradThreads / kWarp);
}

void cbsr_gemm_grad_cuda(const CbsrGemmGradArgs& a, cudaStream_t stream) {
  require(cbsr_gemm_grad_cannot(a), "cbsr_gemm_grad");
  for (int t = 0; t < a.terms; ++t) require(cbsr_gemm_cuda_cannot(a.pattern.width, a.w[t].cols, a.terms), "cbsr_gemm_grad");
  if (a.column_partial != nullptr) require(cbsr_gemm_grad_sums_cannot(a), "cbsr_gemm_grad");
  if (a.pattern.rows == 0) return;
  if (a.pattern.index_bytes() == 1) return launch_grad<uint8_t>(a, stream);
  launch_grad<uint16_t>(a, stream);
}

}  // namespace gale::kernels
