// The dense layer on a CBSR input and its input gradient at the kept positions (kernels/maxk.hpp),
// CUDA twins of cbsr_gemm_cpu and cbsr_gemm_grad_cpu. W sits in shared memory (a narrowing layer's
// W is 256 x 47 floats: 48 KiB; with SAGE's root term beside it, 96 KiB), so the CBSR input (160
// bytes a row at k = 32) and the gradient rows are all that come from global memory. Both kernels
// are bound by shared-memory reads of W: each reads every W float a kept value needs once, in
// 16-byte units, 128 contiguous bytes per quarter-warp, so without bank conflicts.
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

constexpr int kMaxCols = 128;                 // a row's output columns: 8 lanes x 4 float4 units
constexpr int kGemmThreads = 1024;           // up to two blocks an SM beside up to 113 KiB of W each
constexpr int kGradThreads = 1024;            // one block per SM: W takes most of its shared memory
constexpr size_t kSharedLimit = 200 * 1024;   // of the 227 KiB an H100 block may opt into
constexpr size_t kSumsSharedLimit = 227 * 1024;  // with the column sums' rows (sm_90's opt-in most)

// n floats rounded up to whole float4s: a W row's share of a shared-memory row.
__host__ __device__ int64_t padded4(int64_t n) { return (n + 3) / 4 * 4; }
// W and W2 side by side (n2 = 0 without W2).
size_t gemm_shared_bytes(int64_t width, int64_t n, int64_t n2) {
  return static_cast<size_t>(width * (padded4(n) + padded4(n2))) * sizeof(float);
}

// The gradient kernel's W row in shared memory: term 0's columns from float 0, term 1's from
// float padded4(term 0's columns), zero-padded to grad_row_units float4s: a multiple of the
// 8 lanes of a group, 8, 16, 24, 32 or 64 of them.
int grad_row_units(const int64_t* n, int terms) {
  const int64_t units = (padded4(n[0]) + (terms > 1 ? padded4(n[1]) : 0)) / 4;
  const int64_t per_lane = (units + 7) / 8;
  return static_cast<int>(8 * (per_lane > 4 ? 8 : per_lane));
}

// W, then per warp a dense row buffer (whole float4s).
size_t grad_shared_bytes(int64_t width, const int64_t* n, int terms) {
  const size_t per_warp = static_cast<size_t>((width + 3) / 4);
  return (static_cast<size_t>(grad_row_units(n, terms)) * static_cast<size_t>(width) +
          (kGradThreads / kWarp) * per_warp) * sizeof(float4);
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

// Copies W0 and W1 (rows x their columns; W1 absent when its data is null) into shared memory side
// by side: row r holds W0[r] from float 0 and W1[r] from float padded4(W0's columns), zeros
// elsewhere up to `stride` floats. A warp per row.
__device__ void stage_side_by_side(float* dst, const ConstMatrixView& w0, const ConstMatrixView& w1, int64_t rows,
                                   int stride) {
  const int64_t off1 = padded4(w0.cols);
  for (int64_t r = threadIdx.x / kWarp; r < rows; r += blockDim.x / kWarp) {
    for (int j = static_cast<int>(threadIdx.x) % kWarp; j < stride; j += kWarp) {
      float v = 0.0f;
      if (j < w0.cols) {
        v = w0.data[r * w0.ld + j];
      } else if (w1.data != nullptr && j >= off1 && j - off1 < w1.cols) {
        v = w1.data[r * w1.ld + (j - off1)];
      }
      dst[r * stride + j] = v;
    }
  }
}

// Where lane unit u of a row writes: out's columns 4u .. 4u + 3, or out2's past out's u1 units;
// null when that row or unit has none.
__device__ __forceinline__ float* unit_row(const CbsrGemmArgs& a, int64_t r, int u, int u1, int units, int64_t* j0,
                                           int64_t* n) {
  if (u >= units) return nullptr;
  if (u < u1) {
    *j0 = 4 * u;
    *n = a.w.cols;
    return a.out.data + r * a.out.ld;
  }
  if (r >= a.out2.rows) return nullptr;
  *j0 = 4 * (u - u1);
  *n = a.w2.cols;
  return a.out2.data + r * a.out2.ld;
}

// out = x W + beta * out (and out2 = x W2 + beta * out2 on its rows). A row belongs to L lanes
// (32 / L rows a warp); lane q of them holds P float4 units of the row's outputs, q, q + L, ...
// (out's columns first, then out2's). Per kept value (v, c), shuffled round the row's lanes L at a
// time, P 16-byte shared loads of [W | W2][c] and 4 P fused multiply-adds: the L lanes of a row
// read 16 L contiguous bytes of W, so a quarter-warp's loads never conflict.
template <typename I, int L, int P>
__global__ void __launch_bounds__(kGemmThreads) cbsr_gemm_kernel(CbsrGemmArgs a) {
  extern __shared__ float4 w4[];
  const int64_t k = a.x.k;
  const bool two = a.w2.data != nullptr;
  const int u1 = static_cast<int>(padded4(a.w.cols) / 4);
  const int units = u1 + (two ? static_cast<int>(padded4(a.w2.cols) / 4) : 0);
  stage_side_by_side(reinterpret_cast<float*>(w4), a.w, a.w2, a.x.width, 4 * units);
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
    float acc[P][4];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      int64_t j0 = 0, n = 0;
      const float* o = live && a.beta != 0.0f ? unit_row(a, r, q + L * p, u1, units, &j0, &n) : nullptr;
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[p][i] = o != nullptr && j0 + i < n ? a.beta * o[j0 + i] : 0.0f;
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
        const float4* wr = w4 + __shfl_sync(kFull, c, s, L) * units + q;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          if (q + L * p < units) {
            const float4 w = wr[L * p];
            acc[p][0] = fmaf(vs, w.x, acc[p][0]);
            acc[p][1] = fmaf(vs, w.y, acc[p][1]);
            acc[p][2] = fmaf(vs, w.z, acc[p][2]);
            acc[p][3] = fmaf(vs, w.w, acc[p][3]);
          }
        }
      }
    }
    if (!live) continue;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      int64_t j0 = 0, n = 0;
      float* o = unit_row(a, r, q + L * p, u1, units, &j0, &n);
      if (o == nullptr) continue;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (j0 + i < n) o[j0 + i] = acc[p][i];
      }
    }
  }
}

// Term t's value at column j of the gradient row r (0 past its rows or columns): float4 units of
// [grad0 | grad1] as the W rows in shared memory lay them out.
__device__ __forceinline__ float4 grad_unit(const CbsrGemmGradArgs& a, int64_t r, int64_t j, int64_t off1) {
  int t = 0;
  if (j >= off1) {
    t = 1;
    j -= off1;
  }
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const ConstMatrixView& g = a.grad[t];
  if (t >= a.terms || r >= g.rows || j >= g.cols) return v;
  const float* src = g.data + r * g.ld + j;
  if (j + 3 < g.cols && float4_rows(g.data, g.ld)) return __ldg(reinterpret_cast<const float4*>(src));
  v.x = __ldg(src);
  if (j + 1 < g.cols) v.y = __ldg(src + 1);
  if (j + 2 < g.cols) v.z = __ldg(src + 2);
  if (j + 3 < g.cols) v.w = __ldg(src + 3);
  return v;
}

// One warp per row, in groups of 8 lanes. Lane p of a group holds float4 units p, p + 8, ... of
// the row's gradient ([grad0 | grad1], V of them) in registers; the groups take the row's kept
// slots four at a time, and for slot s (column c) each lane dots its units with the same units of
// W's row c in shared memory: a group reads 128 contiguous bytes per load, so no bank conflicts
// and every W float read is used. After 8 slots a group's lanes hold 8 partial dots each, and a
// transposing reduction (7 shuffles) leaves lane p with slot 4 p + group's whole dot. The row is
// written dense through the warp's row buffer.
template <typename I, int V>
__global__ void __launch_bounds__(kGradThreads) cbsr_gemm_grad_kernel(CbsrGemmGradArgs a) {
  extern __shared__ float4 sh4[];
  constexpr int kUnits = 8 * V;
  const ConstCbsrView& p = a.pattern;
  const int width = static_cast<int>(p.width), k = static_cast<int>(p.k);
  const int64_t off1 = padded4(a.w[0].cols);
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const int group = lane / 8, pos = lane % 8;
  stage_side_by_side(reinterpret_cast<float*>(sh4), a.w[0], a.terms > 1 ? a.w[1] : ConstMatrixView(), width,
                     4 * kUnits);
  const int row_units = (width + 3) / 4;
  float4* row4 = sh4 + static_cast<int64_t>(width) * kUnits + warp * row_units;
  float* row_sh = reinterpret_cast<float*>(row4);
  // With column sums: the warp's row of them, after every warp's buffers (maxk.hpp).
  float* acc = a.column_partial == nullptr ? nullptr
               : reinterpret_cast<float*>(sh4 + static_cast<int64_t>(width) * kUnits +
                                          (kGradThreads / kWarp) * row_units) + warp * width;
  if (acc != nullptr) {
    for (int c = lane; c < width; c += kWarp) acc[c] = 0.0f;
  }
  __syncthreads();
  const bool vec_out = width % 4 == 0 && float4_rows(a.grad_in.data, a.grad_in.ld);
  const auto* index = static_cast<const I*>(p.index);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kGradThreads / kWarp);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (kGradThreads / kWarp) + warp; r < p.rows; r += warps) {
    // The row's gradient units and its first 32 kept columns, loaded together (one wait, not two).
    float4 g[V];
#pragma unroll
    for (int v = 0; v < V; ++v) g[v] = grad_unit(a, r, 4 * (pos + 8 * v), off1);
    const auto slot_column = [&](int t) { return t < k ? static_cast<int>(index[r * k + t]) : 0; };
    int mine = slot_column(lane);
    for (int u = lane; u < row_units; u += kWarp) row4[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __syncwarp();
    for (int t0 = 0; t0 < k; t0 += kWarp) {
      if (t0 > 0) mine = slot_column(t0 + lane);
      float part[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int c = __shfl_sync(kFull, mine, 4 * i + group);  // slot t0 + 4 i + group
        const float4* w = sh4 + c * kUnits + pos;
        float s = 0.0f;
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const float4 wv = w[8 * v];
          s = fmaf(g[v].x, wv.x, s);
          s = fmaf(g[v].y, wv.y, s);
          s = fmaf(g[v].z, wv.z, s);
          s = fmaf(g[v].w, wv.w, s);
        }
        part[i] = s;
      }
      // Transposing reduction over the group's 8 lanes: at each step a lane keeps the half of its
      // partials that its bit selects and adds its partner's copy of that half.
#pragma unroll
      for (int half = 4; half >= 1; half /= 2) {
        const bool upper = (pos & half) != 0;
#pragma unroll
        for (int i = 0; i < half; ++i) {
          const float send = upper ? part[i] : part[i + half];
          const float keep = upper ? part[i + half] : part[i];
          part[i] = keep + __shfl_xor_sync(kFull, send, half);
        }
      }
      const int slot = 4 * pos + group;
      const int c = __shfl_sync(kFull, mine, slot);
      if (t0 + slot < k) {
        row_sh[c] = part[0];  // kept columns are distinct: no two lanes write one slot
        if (acc != nullptr) acc[c] += part[0];  // in row order, one lane per slot
      }
    }
    __syncwarp();
    float* o = a.grad_in.data + r * a.grad_in.ld;
    if (vec_out) {
      for (int u = lane; u < row_units; u += kWarp) reinterpret_cast<float4*>(o)[u] = row4[u];
    } else {
      for (int c = lane; c < width; c += kWarp) o[c] = row_sh[c];
    }
    __syncwarp();  // the buffers are rewritten for the warp's next row
  }
  if (acc != nullptr) {
    float* pr = a.column_partial + (static_cast<int64_t>(blockIdx.x) * (kGradThreads / kWarp) + warp) * width;
    for (int c = lane; c < width; c += kWarp) pr[c] = acc[c];
  }
}

template <typename I>
void launch_gemm(const CbsrGemmArgs& a, cudaStream_t stream) {
  const size_t bytes = gemm_shared_bytes(a.x.width, a.w.cols, a.w2.data != nullptr ? a.w2.cols : 0);
  const int64_t units = (padded4(a.w.cols) + (a.w2.data != nullptr ? padded4(a.w2.cols) : 0)) / 4;
#define GALE_CBSR_GEMM(L, P)                                                                                      \
  if (units <= (L) * (P)) {                                                                                         \
    GALE_CHECK_CUDA(cudaFuncSetAttribute(cbsr_gemm_kernel<I, L, P>, cudaFuncAttributeMaxDynamicSharedMemorySize,   \
                                         static_cast<int>(bytes)));                                                \
    cbsr_gemm_kernel<I, L, P><<<grid_for(a.x.rows, kGemmThreads / (L), 2), kGemmThreads, bytes, stream>>>(a);      \
    GALE_CHECK_CUDA(cudaGetLastError());                                                                            \
    return;                                                                                                         \
  }
  // Up to 8 units a row takes a lane per unit; beyond, 8 lanes with up to 4 units each, so that a
  // shuffled kept value feeds 4 P multiply-adds a lane.
  GALE_CBSR_GEMM(1, 1)
  GALE_CBSR_GEMM(2, 1)
  GALE_CBSR_GEMM(4, 1)
  GALE_CBSR_GEMM(8, 1)
  GALE_CBSR_GEMM(8, 2)
  GALE_CBSR_GEMM(8, 3)
  GALE_CBSR_GEMM(8, 4)
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
  switch (grad_row_units(n, a.terms) / 8) {
    case 1: return launch(cbsr_gemm_grad_kernel<I, 1>);
    case 2: return launch(cbsr_gemm_grad_kernel<I, 2>);
    case 3: return launch(cbsr_gemm_grad_kernel<I, 3>);
    case 4: return launch(cbsr_gemm_grad_kernel<I, 4>);
    default: return launch(cbsr_gemm_grad_kernel<I, 8>);
  }
}

void require(const std::string& why, const char* op) {
  if (!why.empty()) throw InputError(std::string(op) + ": " + why);
}

}  // namespace

std::string cbsr_gemm_cuda_cannot(int64_t width, int64_t n, int terms) {
  if (n > kMaxCols) return "W has " + std::to_string(n) + " columns, the CUDA op takes up to " + std::to_string(kMaxCols);
  const int64_t cols[2] = {n, n};
  const size_t bytes = std::max(gemm_shared_bytes(width, n, 0), grad_shared_bytes(width, cols, terms));
  if (bytes > kSharedLimit)
    return "W (" + std::to_string(width) + " x " + std::to_string(n) + ", " + std::to_string(terms) +
           " of them) does not fit in shared memory";
  return "";
}

void cbsr_gemm_cuda(const CbsrGemmArgs& a, cudaStream_t stream) {
  require(cbsr_gemm_cannot(a), "cbsr_gemm");
  require(cbsr_gemm_cuda_cannot(a.x.width, a.w.cols, 1), "cbsr_gemm");
  const bool two = a.w2.data != nullptr;
  if (two) require(cbsr_gemm_cuda_cannot(a.x.width, a.w2.cols, 1), "cbsr_gemm");
  if (a.x.rows == 0) return;
  // Both products in one pass while a row's lanes (kMaxCols columns) and shared memory hold
  // W and W2 side by side; one after the other otherwise.
  if (two && (padded4(a.w.cols) + padded4(a.w2.cols) > kMaxCols ||
              gemm_shared_bytes(a.x.width, a.w.cols, a.w2.cols) > kSharedLimit)) {
    CbsrGemmArgs first = a, second = a;
    first.w2 = {};
    first.out2 = {};
    second.x.rows = a.out2.rows;
    second.w = a.w2;
    second.out = a.out2;
    second.w2 = {};
    second.out2 = {};
    cbsr_gemm_cuda(first, stream);
    return cbsr_gemm_cuda(second, stream);
  }
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
