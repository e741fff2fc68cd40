// graph_norms on the GPU: one thread per source; the arithmetic is graph_norms_cpu.cpp's, in the
// same precision, so the factors agree bit for bit.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda/check.hpp"
#include "kernels/error.hpp"
#include "kernels/graph_norms.hpp"

namespace gale::kernels {

namespace {

constexpr int kThreads = 256;

__device__ float norm_of(double degree) {
  return degree + 1.0 > 0.0 ? static_cast<float>(1.0 / sqrt(degree + 1.0)) : 0.0f;
}

// graph_norms_cpu.cpp's weighted_degree: a double sum in entry order, rounded to f32.
__device__ float weighted_degree(const float* w, int64_t begin, int64_t end) {
  double d = 0;
  for (int64_t e = begin; e < end; ++e) d += w[e];
  return static_cast<float>(d);
}

__global__ void __launch_bounds__(kThreads) graph_norms_kernel(GraphNormsArgs a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; j < a.csr.cols; j += stride) {
    if (j < a.csr.rows) {
      const int64_t d = a.csr.indptr[j + 1] - a.csr.indptr[j];
      const float n = norm_of(a.csr.weights ? weighted_degree(a.csr.weights, a.csr.indptr[j], a.csr.indptr[j + 1])
                                            : static_cast<double>(d));
      a.dst_norm[j] = n;
      a.src_norm[j] = n;
      a.self_norm[j] = __fmul_rn(n, n);
      a.inv_degree[j] = d > 0 ? __fdiv_rn(1.0f, static_cast<float>(d)) : 0.0f;
    } else {
      const int64_t v = a.src_ids[j];
      a.src_norm[j] = norm_of(a.csr.weights ? a.full_degree[v]
                                            : static_cast<double>(a.full_indptr[v + 1] - a.full_indptr[v]));
    }
  }
}

}  // namespace

void graph_norms_cuda(const GraphNormsArgs& a, cudaStream_t stream) {
  if (const std::string why = graph_norms_cannot(a); !why.empty()) throw InputError("graph_norms_cuda: " + why);
  if (a.csr.cols == 0) return;
  const int64_t blocks = std::min<int64_t>((a.csr.cols + kThreads - 1) / kThreads, 65536);
  graph_norms_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  GALE_CHECK_CUDA(cudaGetLastError());
}

}  // namespace gale::kernels
