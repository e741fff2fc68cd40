// The tiered gather of kernels/feature_gather.hpp on the GPU: one warp per output row picks the
// row's tier (warp-uniform), then copies it with 16-byte loads when every source and the output
// are aligned (4-byte loads otherwise). Rows read from host memory cross PCIe / C2C as the warp's
// coalesced 128-byte requests, which is what a UVA gather needs to approach the link's bandwidth.
#include <cuda_runtime.h>

#include <cub/device/device_select.cuh>

#include <algorithm>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/warp.cuh"
#include "kernels/feature_gather.hpp"

namespace gale::kernels {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads) tiered_gather_kernel(TieredGatherArgs a) {
  constexpr int K = sizeof(T) / sizeof(float);
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / kWarp);
  const int64_t units = a.out.cols / K;
  int local[kFeatureTiers] = {0, 0, 0, 0};
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarp; i < a.n; i += warps) {
    const int64_t id = a.ids[i];
    const float* src;
    int tier;
    if (a.prev_rows != nullptr && a.prev_rows[i] >= 0) {
      src = a.prev.data + static_cast<int64_t>(a.prev_rows[i]) * a.prev.ld;
      tier = kTierPrevious;
    } else if (a.device.data != nullptr) {
      src = a.device.data + id * a.device.ld;
      tier = kTierDevice;
    } else if (a.cache_slot != nullptr && a.cache_slot[id] >= 0) {
      src = a.cache.data + static_cast<int64_t>(a.cache_slot[id]) * a.cache.ld;
      tier = kTierCache;
    } else {
      src = a.host.data + (a.host_rows != nullptr ? static_cast<int64_t>(a.host_rows[i]) : id) * a.host.ld;
      tier = kTierHost;
    }
    ++local[tier];
    const T* s = reinterpret_cast<const T*>(src);
    T* o = reinterpret_cast<T*>(a.out.data + i * a.out.ld);
    for (int64_t u = lane; u < units; u += kWarp) o[u] = s[u];
  }
  if (a.counters != nullptr && lane == 0) {
    for (int t = 0; t < kFeatureTiers; ++t) {
      if (local[t] != 0) atomicAdd(reinterpret_cast<unsigned long long*>(a.counters + t), local[t]);
    }
  }
}

__global__ void match_rows_kernel(const int32_t* row_of, const int64_t* ids, int64_t n, int32_t* rows) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) rows[i] = row_of[ids[i]];
}

// value < 0: row_of[ids[i]] = value; else row_of[ids[i]] = i.
__global__ void match_assign_kernel(int32_t* row_of, const int64_t* ids, int64_t n, int32_t value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    row_of[ids[i]] = value < 0 ? value : static_cast<int32_t>(i);
}

struct Uncached {
  const int32_t* cache_slot;
  __device__ bool operator()(int64_t id) const { return cache_slot[id] < 0; }
};

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 8192)); }

bool aligned(const ConstMatrixView& m) {
  return m.data == nullptr || float4_rows(m.data, m.ld);
}

}  // namespace

void tiered_gather_cuda(const TieredGatherArgs& a, cudaStream_t stream) {
  if (a.n == 0 || a.out.cols == 0) return;
  const bool vec = a.out.cols % 4 == 0 && aligned(a.prev) && aligned(a.device) && aligned(a.cache) &&
                   aligned(a.host) && aligned(ConstMatrixView(a.out));
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((a.n + kThreads / kWarp - 1) / (kThreads / kWarp), 1, 4096));
  if (vec) {
    tiered_gather_kernel<float4><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    tiered_gather_kernel<float><<<blocks, kThreads, 0, stream>>>(a);
  }
  GALE_CHECK_CUDA(cudaGetLastError());
}

void match_rows_cuda(const int32_t* row_of, const int64_t* ids, int64_t n, int32_t* rows, cudaStream_t stream) {
  if (n == 0) return;
  match_rows_kernel<<<grid_for(n), kThreads, 0, stream>>>(row_of, ids, n, rows);
  GALE_CHECK_CUDA(cudaGetLastError());
}

void match_advance_cuda(int32_t* row_of, const int64_t* prev_ids, int64_t prev_n, const int64_t* ids, int64_t n,
                        cudaStream_t stream) {
  if (prev_n > 0) match_assign_kernel<<<grid_for(prev_n), kThreads, 0, stream>>>(row_of, prev_ids, prev_n, -1);
  if (n > 0) match_assign_kernel<<<grid_for(n), kThreads, 0, stream>>>(row_of, ids, n, 0);
  GALE_CHECK_CUDA(cudaGetLastError());
}

size_t uncached_ids_scratch_bytes(int64_t n) {
  size_t bytes = 0;
  GALE_CHECK_CUDA(cub::DeviceSelect::If(nullptr, bytes, static_cast<const int64_t*>(nullptr),
                                        static_cast<int64_t*>(nullptr), static_cast<int64_t*>(nullptr), n,
                                        Uncached{nullptr}));
  return std::max<size_t>(bytes, 1);
}

void uncached_ids_cuda(const int32_t* cache_slot, const int64_t* ids, int64_t n, int64_t* out, int64_t* count,
                       void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  GALE_CHECK_CUDA(cub::DeviceSelect::If(scratch, scratch_bytes, ids, out, count, n, Uncached{cache_slot}, stream));
}

}  // namespace gale::kernels
