// Dropout on CBSR values with the dense form's masks (kernels/maxk.hpp), CUDA twin: one thread per
// kept value, the same counter and the same float product as the CPU (and as dense dropout).
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/check.hpp"
#include "kernels/maxk.hpp"
#include "kernels/random.hpp"

namespace gale::kernels {

namespace {

template <typename I>
__global__ void cbsr_dropout_kernel(float* values, const I* index, int64_t rows, int64_t k, int64_t width, float p,
                                    float scale, uint64_t key) {
  const int64_t total = rows * k;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / k;
    const uint64_t counter = static_cast<uint64_t>(r * width + static_cast<int64_t>(index[i]));
    values[i] = random_uniform(key, counter) >= p ? __fmul_rn(values[i], scale) : 0.0f;
  }
}

}  // namespace

void cbsr_dropout_cuda(const CbsrView& x, float p, uint64_t key, cudaStream_t stream) {
  if (p <= 0.0f || x.rows == 0 || x.k == 0) return;
  const float scale = 1.0f / (1.0f - p);
  const int64_t total = x.rows * x.k;
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((total + 255) / 256, 1, 8192));
  if (x.index_bytes() == 1) {
    cbsr_dropout_kernel<<<blocks, 256, 0, stream>>>(x.values, x.index_u8(), x.rows, x.k, x.width, p, scale, key);
  } else {
    cbsr_dropout_kernel<<<blocks, 256, 0, stream>>>(x.values, x.index_u16(), x.rows, x.k, x.width, p, scale, key);
  }
  GALE_CHECK_CUDA(cudaGetLastError());
}

}  // namespace gale::kernels
