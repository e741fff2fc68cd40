// kernels/cuda/warp.cuh — the warp-level pieces the CUDA kernels share: the warp size and full
// mask, a lane's mask of the lanes below it, whole-warp reductions (one instruction each on sm_80
// and later, shuffles before), and the per-element float / float4 operations their gathers use:
// adds and atomics, four floats in one 16-byte atomic on sm_90. Device code: include from .cu
// files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gale::kernels {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ unsigned lanemask_lt(int lane) { return (1u << lane) - 1u; }

// Whole-warp reductions of int or uint32_t: every lane gets the result. Before sm_80, xor shuffles.
template <typename T, typename Op>
__device__ __forceinline__ T shuffle_reduce(T v, Op op) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

#if __CUDA_ARCH__ >= 800
template <typename T>
__device__ __forceinline__ T warp_min(T v) { return __reduce_min_sync(kFull, v); }
template <typename T>
__device__ __forceinline__ T warp_max(T v) { return __reduce_max_sync(kFull, v); }
template <typename T>
__device__ __forceinline__ T warp_sum(T v) { return __reduce_add_sync(kFull, v); }
#else
template <typename T>
__device__ __forceinline__ T warp_min(T v) { return shuffle_reduce(v, [](T a, T b) { return min(a, b); }); }
template <typename T>
__device__ __forceinline__ T warp_max(T v) { return shuffle_reduce(v, [](T a, T b) { return max(a, b); }); }
template <typename T>
__device__ __forceinline__ T warp_sum(T v) { return shuffle_reduce(v, [](T a, T b) { return a + b; }); }
#endif

// One float or one float4: zero, loads, stores, a += w v.
__device__ __forceinline__ void set_zero(float& a) { a = 0.0f; }
__device__ __forceinline__ void set_zero(float4& a) { a = make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// Read-only data (x, bias) goes through the non-coherent cache.
__device__ __forceinline__ void load_ro(float& v, const float* p) { v = __ldg(p); }
__device__ __forceinline__ void load_ro(float4& v, const float* p) {
  v = __ldg(reinterpret_cast<const float4*>(p));
}
// out may be read (accumulate) and written by the same launch: plain loads.
__device__ __forceinline__ void load_rw(float& v, const float* p) { v = *p; }
__device__ __forceinline__ void load_rw(float4& v, const float* p) { v = *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void store(float* p, const float& v) { *p = v; }
__device__ __forceinline__ void store(float* p, const float4& v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void fma_to(float& a, float w, const float& v) { a = fmaf(w, v, a); }
__device__ __forceinline__ void fma_to(float4& a, float w, const float4& v) {
  a.x = fmaf(w, v.x, a.x);
  a.y = fmaf(w, v.y, a.y);
  a.z = fmaf(w, v.z, a.z);
  a.w = fmaf(w, v.w, a.w);
}
__device__ __forceinline__ void add_to(float& a, float b) { a += b; }
__device__ __forceinline__ void add_to(float4& a, float4 b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}

// One element of the SpMM epilogue (spmm.hpp) in spmm_cpu's order: rs * sum, + self * xs (xs is
// ignored when self is 0), + old when accumulating, + bias[col], then ReLU.
__device__ __forceinline__ float spmm_finish(float sum, float rs, float self, float xs, bool accumulate, float old,
                                             const float* bias, int64_t col, bool relu) {
  float v = rs * sum;
  if (self != 0.0f) v += self * xs;
  if (accumulate) v += old;
  if (bias) v += __ldg(bias + col);
  return relu ? fmaxf(v, 0.0f) : v;
}

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(float* p, float4 v) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(p), v);  // one 16-byte atomic
#else
  atomicAdd(p, v.x);
  atomicAdd(p + 1, v.y);
  atomicAdd(p + 2, v.z);
  atomicAdd(p + 3, v.w);
#endif
}

}  // namespace gale::kernels
