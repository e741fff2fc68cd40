// Device side of the random-number test in fused_map_sampler_test.cpp: random_exponential on the
// GPU, which weighted sampling needs bit-identical to the host's.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/check.hpp"
#include "kernels/random.hpp"

namespace gale::gpu_test {

__global__ void random_exponential_kernel(uint64_t key, int64_t n, double* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = kernels::random_exponential(key, static_cast<uint64_t>(i));
}

void random_exponential_on_device(uint64_t key, int64_t n, double* out, cudaStream_t stream) {
  if (n == 0) return;
  random_exponential_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(key, n, out);
  GALE_CHECK_CUDA(cudaGetLastError());
}

}  // namespace gale::gpu_test
