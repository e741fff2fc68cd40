// kernels/cuda/fill.cu — the CUDA side of fill.hpp.
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/fill.hpp"

#include <algorithm>
#include <cstdint>

namespace gale::kernels::cuda {
namespace {

// Grid-stride loop: consecutive threads write consecutive elements (coalesced), and a grid capped
// in size covers any count without overflowing gridDim.x.
template <typename T>
__global__ void fill_kernel(T* __restrict__ data, size_t count, T value) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    data[i] = value;
  }
}

}  // namespace

template <typename T>
void fill(T* data, size_t count, T value, cudaStream_t stream) {
  if (count == 0) return;
  constexpr unsigned kThreads = 256;
  // 4096 blocks of 256 threads: enough to keep every SM of an H100/H200 (132 SMs × 2048 threads)
  // busy several times over; larger arrays loop inside the kernel.
  constexpr size_t kMaxBlocks = 4096;
  const size_t blocks = std::min(kMaxBlocks, (count + kThreads - 1) / kThreads);
  fill_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(data, count, value);
  GALE_CHECK_CUDA(cudaGetLastError());
}

template void fill<float>(float*, size_t, float, cudaStream_t);
template void fill<double>(double*, size_t, double, cudaStream_t);
template void fill<int32_t>(int32_t*, size_t, int32_t, cudaStream_t);
template void fill<int64_t>(int64_t*, size_t, int64_t, cudaStream_t);
template void fill<uint8_t>(uint8_t*, size_t, uint8_t, cudaStream_t);

}  // namespace gale::kernels::cuda
