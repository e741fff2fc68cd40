// kernels/threads.hpp — how many CPU threads the CPU backend uses.
//
// TBB parallel loops run in the caller's arena (a tbb::global_control or task_arena bounds them);
// OpenBLAS keeps its own pool, set here, so `--threads N` and `--deterministic` bound both.
#pragma once

namespace gale::kernels {

// Sets OpenBLAS's thread count (n >= 1).
void set_blas_threads(int n);

}  // namespace gale::kernels
