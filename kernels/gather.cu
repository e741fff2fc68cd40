// kernels/gather.cu — the CUDA twin of gather_rows (gather.hpp).
//
// A group of L lanes copies one row, L the smallest power of two covering the row's vectors
// (capped at a warp), so narrow rows do not leave most of a warp idle and a wide row is read by a
// whole warp in 512-byte strides. Values move as raw 32-bit words (uint4 / uint32_t), never as
// floats, so the copy is bit-exact.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/error.hpp"
#include "kernels/gather.hpp"

namespace gale::kernels {
namespace {

constexpr int kThreads = 256;
// Grid cap: 32 blocks of 256 threads per SM on a 132-SM H100/H200 several times over; longer id
// lists loop inside the kernel.
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

template <bool kVec4>
// 5 blocks per SM (at most 48 registers a thread, no spills on sm_90): a copy is latency-bound,
// so resident warps count, most of all when the loads cross PCIe; tighter caps spill the
// unrolled loads.
__global__ void __launch_bounds__(kThreads, 5)
    gather_rows_kernel(const uint32_t* __restrict__ src, int64_t src_ld, const int64_t* __restrict__ ids, int64_t n,
                       uint32_t* __restrict__ out, int64_t out_ld, int64_t cols, int lanes) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.x / lanes;
  for (int64_t i = thread / lanes; i < n; i += groups) {
    const uint32_t* s = src + ids[i] * src_ld;
    uint32_t* o = out + i * out_ld;
    int64_t c = 0;
    if (kVec4) {
      const int64_t nv = cols / 4;
      const uint4* s4 = reinterpret_cast<const uint4*>(s);
      uint4* o4 = reinterpret_cast<uint4*>(o);
      for (int64_t v = lane; v < nv; v += lanes) o4[v] = s4[v];
      c = nv * 4;
    }
    for (int64_t k = c + lane; k < cols; k += lanes) o[k] = s[k];
  }
}

}  // namespace

void gather_rows_cuda(ConstMatrixView src, const int64_t* ids, int64_t n, MatrixView out, cudaStream_t stream) {
  const std::string why = gather_rows_cannot(src, n, out);
  if (!why.empty()) throw InputError("gather_rows_cuda: " + why);
  if (n == 0 || src.cols == 0) return;
  if (ids == nullptr) throw InputError("gather_rows_cuda: null ids");
  const bool vec4 = float4_rows(src.data, src.ld) && float4_rows(out.data, out.ld);
  const int64_t per_row = vec4 ? (src.cols + 3) / 4 : src.cols;
  int lanes = 1;
  while (lanes < 32 && lanes < per_row) lanes *= 2;
  const int64_t rows_per_block = kThreads / lanes;
  const unsigned blocks = static_cast<unsigned>(std::min(kMaxBlocks, (n + rows_per_block - 1) / rows_per_block));
  const auto* s = reinterpret_cast<const uint32_t*>(src.data);
  auto* o = reinterpret_cast<uint32_t*>(out.data);
  if (vec4) {
    gather_rows_kernel<true><<<blocks, kThreads, 0, stream>>>(s, src.ld, ids, n, o, out.ld, src.cols, lanes);
  } else {
    gather_rows_kernel<false><<<blocks, kThreads, 0, stream>>>(s, src.ld, ids, n, o, out.ld, src.cols, lanes);
  }
  GALE_CHECK_CUDA(cudaGetLastError());
}

}  // namespace gale::kernels
