// tests/gpu/fault_device.hpp — makes a device fail as a bug or a broken GPU would: a kernel that
// writes through an invalid address. Every later CUDA call in the process then fails, so run it
// only in a child process (a gtest death test, threadsafe style).
#pragma once

#include <cuda_runtime_api.h>

namespace gale::testing_support {

// Enqueues the faulting kernel on `stream`; the fault shows at the next synchronisation.
void fault_device(cudaStream_t stream);

}  // namespace gale::testing_support
