// kernels/transpose.cu — csr_transpose_cuda (declared in spmm.hpp beside the CPU csr_transpose):
// the CSC of a device CSR, as the backward aggregations read it.
//
// The CPU version is a stable counting sort of the entries by column. Here a radix sort of
// (column, position) pairs, which CUB makes stable, orders the entries the same way: ties keep
// their input (row-major) order. Keys are sorted over just the bits of cols - 1 (one to four
// 8-bit passes instead of always four). The sort runs on CUB's double buffers (the workspace's
// arrays and the caller's indices_out / perm_out), so CUB needs no nnz-sized storage of its own.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/error.hpp"
#include "kernels/spmm.hpp"

namespace gale::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

unsigned blocks_for(int64_t items) {
  return static_cast<unsigned>(std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Bits a column id in [0, cols) needs (at least one, so CUB gets a non-empty bit range).
int key_bits(int64_t cols) {
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < cols) ++bits;
  return bits;
}

size_t sort_temp_bytes(int64_t nnz, int bits) {
  size_t bytes = 0;
  cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr);
  cub::DoubleBuffer<int64_t> values(nullptr, nullptr);
  GALE_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, values, nnz, 0, bits));
  return bytes;
}

// Sort input: entry k's column and its position in the input arrays (base + k, as perm_out holds
// them). base = indptr[0] lives on the device, so it is read here rather than offset on the host.
__global__ void transpose_keys_kernel(const int64_t* __restrict__ indptr, const int32_t* __restrict__ indices,
                                      int64_t nnz, uint32_t* __restrict__ keys, int64_t* __restrict__ positions) {
  const int64_t base = indptr[0];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < nnz; k += stride) {
    keys[k] = static_cast<uint32_t>(indices[base + k]);
    positions[k] = base + k;
  }
}

// indptr_out[c] = the number of sorted keys below c (a lower bound), for c in [0, cols].
__global__ void transpose_indptr_kernel(const uint32_t* __restrict__ sorted, int64_t nnz, int64_t cols,
                                        int64_t* __restrict__ indptr_out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c <= cols; c += stride) {
    int64_t lo = 0, hi = nnz;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (static_cast<int64_t>(sorted[mid]) < c) lo = mid + 1;
      else hi = mid;
    }
    indptr_out[c] = lo;
  }
}

// indices_out[k] = the row holding input position perm[k]: the last r with indptr[r] <= perm[k]
// (empty rows share their indptr value with the next row, so the last one is the non-empty row).
// Copies perm into perm_out when the sort left it in the workspace.
__global__ void transpose_rows_kernel(const int64_t* __restrict__ indptr, int64_t rows, const int64_t* perm,
                                      int64_t nnz, int32_t* __restrict__ indices_out, int64_t* perm_out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < nnz; k += stride) {
    const int64_t p = perm[k];
    int64_t lo = 0, hi = rows - 1;  // the answer lies in [lo, hi]; indptr[lo] <= p holds
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (indptr[mid] <= p) lo = mid;
      else hi = mid - 1;
    }
    indices_out[k] = static_cast<int32_t>(lo);
    if (perm != perm_out) perm_out[k] = p;
  }
}

std::string transpose_cannot(const CsrView& csr, int64_t nnz) {
  if (csr.rows < 0 || csr.cols < 0 || nnz < 0) return "negative size";
  if (csr.rows >= (int64_t{1} << 31)) return std::to_string(csr.rows) + " rows do not fit 32-bit column ids";
  if (csr.cols >= (int64_t{1} << 31)) return std::to_string(csr.cols) + " columns do not fit 32-bit ids";
  if (csr.rows == 0 && nnz != 0) return "entries in a graph without rows";
  if (csr.cols == 0 && nnz != 0) return "entries in a graph without columns";
  if (csr.rows > 0 && csr.indptr == nullptr) return "null indptr";
  if (nnz > 0 && csr.indices == nullptr) return "null indices";
  return "";
}

}  // namespace

size_t csr_transpose_cuda_workspace_bytes(int64_t rows, int64_t cols, int64_t nnz) {
  (void)rows;
  if (nnz <= 0) return 0;
  return align256(static_cast<size_t>(nnz) * sizeof(uint32_t)) + align256(static_cast<size_t>(nnz) * sizeof(int64_t)) +
         align256(sort_temp_bytes(nnz, key_bits(cols)));
}

void csr_transpose_cuda(const CsrView& csr, int64_t nnz, int64_t* indptr_out, int32_t* indices_out, int64_t* perm_out,
                        void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const std::string why = transpose_cannot(csr, nnz);
  if (!why.empty()) throw InputError("csr_transpose_cuda: " + why);
  if (indptr_out == nullptr || (nnz > 0 && (indices_out == nullptr || perm_out == nullptr)))
    throw InputError("csr_transpose_cuda: null output");
  if (nnz == 0) {
    GALE_CHECK_CUDA(cudaMemsetAsync(indptr_out, 0, static_cast<size_t>(csr.cols + 1) * sizeof(int64_t), stream));
    return;
  }
  const size_t need = csr_transpose_cuda_workspace_bytes(csr.rows, csr.cols, nnz);
  if (workspace == nullptr || workspace_bytes < need)
    throw InputError("csr_transpose_cuda: the workspace has " + std::to_string(workspace_bytes) + " bytes, " +
                     std::to_string(need) + " needed");
  const int bits = key_bits(csr.cols);
  char* ws = static_cast<char*>(workspace);
  auto* keys = reinterpret_cast<uint32_t*>(ws);
  ws += align256(static_cast<size_t>(nnz) * sizeof(uint32_t));
  auto* positions = reinterpret_cast<int64_t*>(ws);
  ws += align256(static_cast<size_t>(nnz) * sizeof(int64_t));
  size_t temp_bytes = workspace_bytes - static_cast<size_t>(ws - static_cast<char*>(workspace));

  transpose_keys_kernel<<<blocks_for(nnz), kThreads, 0, stream>>>(csr.indptr, csr.indices, nnz, keys, positions);
  GALE_CHECK_CUDA(cudaGetLastError());
  // indices_out doubles as the key sort's second buffer (column ids fit its 32 bits), perm_out as
  // the positions'; the selectors say on the host where each result ended up.
  cub::DoubleBuffer<uint32_t> key_buffers(keys, reinterpret_cast<uint32_t*>(indices_out));
  cub::DoubleBuffer<int64_t> value_buffers(positions, perm_out);
  GALE_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(ws, temp_bytes, key_buffers, value_buffers, nnz, 0, bits, stream));
  // Reads the sorted keys (maybe in indices_out) before the next kernel overwrites indices_out.
  transpose_indptr_kernel<<<blocks_for(csr.cols + 1), kThreads, 0, stream>>>(key_buffers.Current(), nnz, csr.cols,
                                                                             indptr_out);
  GALE_CHECK_CUDA(cudaGetLastError());
  transpose_rows_kernel<<<blocks_for(nnz), kThreads, 0, stream>>>(csr.indptr, csr.rows, value_buffers.Current(), nnz,
                                                                  indices_out, perm_out);
  GALE_CHECK_CUDA(cudaGetLastError());
}

}  // namespace gale::kernels
