// kernels/cuda/fill.hpp — set every element of a device array to one value (stream-ordered).
//
// cudaMemsetAsync only repeats a byte, which covers zero but not 1.0f or -1; this covers the rest
// (initial values, padding, masks). Instantiated for float, double, int32_t, int64_t and uint8_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace gale::kernels::cuda {

template <typename T>
void fill(T* data, size_t count, T value, cudaStream_t stream);

}  // namespace gale::kernels::cuda
