#include "tests/gpu/fault_device.hpp"

#include <cstdint>

namespace gale::testing_support {
namespace {

__global__ void write_through(float* p) { p[threadIdx.x] = 1.0f; }

}  // namespace

void fault_device(cudaStream_t stream) {
  // An address no allocation holds: the first page, which the driver never maps.
  write_through<<<1, 32, 0, stream>>>(reinterpret_cast<float*>(uintptr_t{64}));
}

}  // namespace gale::testing_support
