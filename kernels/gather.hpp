// kernels/gather.hpp — row gather: out[i] = src[ids[i]], the step that turns a sampled batch's
// input node list into its feature matrix (FastGL's memory-IO phase; the feature tiers read the
// pinned host tier through it over UVA). CPU version in gather_cpu.cpp, the CUDA twin in gather.cu.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/views.hpp"

namespace gale::kernels {

// Why gather_rows cannot take these shapes, or "": out must have n rows and src's width, ld at
// least the width, and n must not be negative. Reads no ids.
std::string gather_rows_cannot(ConstMatrixView src, int64_t n, MatrixView out);

// out[i][c] = src[ids[i]][c] for i < n, c < src.cols; rows of out beyond n and columns beyond the
// width are left alone. Throws InputError on bad shapes and on an id outside [0, src.rows). An id
// may repeat. Bit-exact copy (NaN payloads kept). TBB-parallel over rows.
void gather_rows(ConstMatrixView src, const int64_t* ids, int64_t n, MatrixView out);

}  // namespace gale::kernels

// cudaStream_t exactly as the CUDA headers declare it, so this header stays plain C++.
struct CUstream_st;
typedef CUstream_st* cudaStream_t;  // NOLINT: must match cuda_runtime_api.h

namespace gale::kernels {

// The CUDA twin (gather.cu; GALE_WITH_CUDA builds only), stream-ordered, never synchronises.
// src.data and ids may be device memory or mapped pinned host memory (cudaHostAlloc with
// cudaHostAllocMapped, or registered with cudaHostRegisterMapped) read over UVA, which is how a
// feature table larger than the GPU is gathered without a staging copy; out is device memory (or
// mapped host memory). Rows are copied with 16-byte loads and stores when both matrices' data
// pointers are 16-byte aligned and their leading dimensions multiples of 4 (the last width % 4
// columns with scalar ones), else with 4-byte ones; a row is read by consecutive lanes, so each
// warp request covers whole 128-byte lines, which is what PCIe reads of pinned memory need.
// Same result as gather_rows bit for bit. The ids are not range-checked (that would need a host
// synchronisation): an id outside [0, src.rows) reads out of bounds.
void gather_rows_cuda(ConstMatrixView src, const int64_t* ids, int64_t n, MatrixView out, cudaStream_t stream);

}  // namespace gale::kernels
