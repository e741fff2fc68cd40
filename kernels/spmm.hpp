// kernels/spmm.hpp — sparse × dense aggregation over a destination-major CSR (CPU in
// spmm_cpu.cpp; the CUDA families come beside it).
//
// One general form covers GCN, SAGE-mean, GIN-sum and their backward passes over the transpose:
//
//   out[r] (+)= row_scale[r] * sum_e col_scale[c_e] * w_e * x[c_e]  +  self_coef(r) * x[r]
//
// where e runs over row r's entries (c_e its column), w_e the optional edge weight, and
// self_coef(r) = self_scale + (self_coefs ? self_coefs[r] : 0) for r < min(rows, x.rows).
//
// An optional fused epilogue follows fuseGNN (ICCAD'20, Sec. 5), which folds the layer's bias
// and activation into the aggregation so the aggregated rows make one trip through memory:
//
//   out[r] = relu?( (accumulate ? out[r] : 0) + <the sum above> + bias )
//
// and, last, an optional output mask that zeroes the elements whose bit is clear: ReLU's backward
// (kernels/dense.hpp, relu_backward_mask) folded into the kernel that writes the gradient it
// masks, so that gradient makes one trip through memory instead of three.
//
// The CUDA family (spmm.cu) offers fuseGNN's two aggregation models over the same arguments:
// GAR (gather-apply-reduce, row-parallel, register reduction, deterministic) and GAS
// (gather-apply-scatter, edge-parallel, atomics); FastGL's memory-aware aggregation for sampled
// blocks (a block of rows per thread block, their entries' coefficients and partial sums in
// shared memory, deterministic); plus cuSPARSE as the baseline `gale bench spmm` compares
// against. spmm_cannot says why a kind cannot take given arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/views.hpp"

namespace gale::kernels {

// GAR hands the rows of more than kGarLongRow entries to blocks of their own, each row cut over a
// whole block (spmm.cu). Those blocks find the rows by scanning every row, once per call and column
// tile, unless the rows are listed: a graph aggregated many times lists them once
// (gar_long_rows_cuda) and passes the list with every call.
constexpr int64_t kGarLongRow = 4096;

struct GarLongRows {
  const int64_t* rows = nullptr;   // the graph's rows of more than kGarLongRow entries, any order
  const int64_t* count = nullptr;  // how many (device memory, as the list is built on the device)
  int64_t capacity = 0;            // the list's length, gar_long_rows_capacity: count is clamped to it
};

// ES-SpMM's edge sampling (kSampled): which of a row's entries stand for it when it has more than
// the sample width S. Bucket: its first S. FastRand: entries (j * P) mod n for j = 0 .. S-1, n the
// row's entries and P the first of 577, 587, 593, 599, 601, 607 that does not divide n, so the S
// entries are distinct (ES-SpMM uses 577 alone, which repeats entries when 577 divides n).
enum class SpmmSampling { kFastRand, kBucket };

// TC-GNN's translated graph (ATC'23, Sec. 4.1, sparse graph translation) for the tensor-core SpMM
// (kTensorCore), as device (or, for the CPU twin, host) arrays; built once per graph by
// spmm_tc_translate (spmm_tc.hpp). The rows are cut into windows of kTcWindowRows; a window's
// distinct columns, in increasing order, are its condensed columns, and each run of kTcBlockCols of
// them is one TC block: the 16 x 8 tile of A that one m16n8k8 MMA takes. Windows of more than
// kTcItemBlocks blocks are cut into work items of that many (their sums meet in out by atomics).
constexpr int kTcWindowRows = 16;
constexpr int kTcBlockCols = 8;
constexpr int kTcItemBlocks = 256;

struct SpmmTcPlan {
  int64_t windows = 0;                     // ceil(rows / kTcWindowRows)
  int64_t items = 0;                       // work items in all
  const int32_t* window_blocks = nullptr;  // windows + 1: each window's first block
  const int32_t* block_entries = nullptr;  // blocks + 1: each block's first planned entry
  const int32_t* block_src = nullptr;      // blocks * kTcBlockCols: its condensed columns' ids, -1 past the last
  const int32_t* entry = nullptr;          // nnz: the graph position of each planned entry, grouped by block
  const int32_t* slot = nullptr;           // nnz: condensed column (within the window) * 16 + row within the window
  const int32_t* item_window = nullptr;    // items: the window of each item, in window order
  const int32_t* item_block = nullptr;     // items: its first block (it takes up to kTcItemBlocks)
  const int32_t* split_windows = nullptr;  // the windows cut into several items
  int64_t splits = 0;                      // how many
};

struct SpmmArgs {
  CsrView graph;                      // rows = out.rows, cols = x.rows
  ConstMatrixView x;
  MatrixView out;
  const float* row_scale = nullptr;   // per row (e.g. 1/deg for mean, GCN dst norm); null = 1
  const float* col_scale = nullptr;   // per column (GCN src norm); null = 1
  const float* edge_weight = nullptr; // per entry, in the graph's entry order; null = 1
  const float* self_coefs = nullptr;  // per row self term coefficient; null = 0
  float self_scale = 0.0f;            // uniform self term coefficient (GIN's 1 + eps)
  bool accumulate = false;            // add into out instead of overwriting
  // Fused epilogue: bias (out.cols values) added after the row scale and the self term, then
  // max(0, .) applied last, to the accumulated value when accumulate is set.
  const float* bias = nullptr;
  bool relu = false;
  // Output mask, applied after everything above: out[r][c] = 0 where bit c % 32 of
  // out_mask[r * out_mask_words + c / 32] is clear (ops::relu_mask's layout, relu_mask_words(
  // out.cols) words a row at least), the value kept where it is set: exactly relu_backward_mask
  // after the unmasked product. Null = none. GAR and the CPU twins only (spmm_cannot).
  const uint32_t* out_mask = nullptr;
  int64_t out_mask_words = 0;
  // GAR only: this graph's long rows, listed (device pointers); none = GAR scans for them. The list
  // must be of this very graph: a row missing from it is left unwritten.
  GarLongRows long_rows;
  // GAR only: the consecutive rows it deals to a block at a time, 16 (0 = 16) or 256. 256 keeps a
  // block's rows together (their shared sources hit L1) but would pile a degree-ordered graph's
  // heavy rows onto a few blocks: gar_chunk_rows_for says which a graph takes.
  int64_t gar_chunk_rows = 0;
  // kSampled only: ES-SpMM's sample width S (1 to kSpmmMaxSample) and strategy. A row of n > S
  // entries sums its S sampled entries' terms times n / S (an unbiased estimate of the whole
  // row's sum under FastRand); the row scale, the self term and the epilogue apply as above.
  int64_t sample_width = 0;
  SpmmSampling sampling = SpmmSampling::kFastRand;
  // kTensorCore only: this graph's translation (spmm_tc_translate), device pointers, and the output
  // columns each warp takes, 32 or 64 (0: 64 from width 256 up, else 32).
  SpmmTcPlan tc;
  int tc_slice = 0;
  // graph.nnz() as known on the host. spmm_cuda's graph arrays are device memory, which the host
  // cannot read without a synchronisation; kAuto (the average degree) and kCusparse (its
  // descriptor) need the count, GAR and GAS do not. -1 = not given.
  int64_t nnz = -1;
};

void spmm_cpu(const SpmmArgs& a);
// kSampled's reference: spmm_cpu over each row's sampled entries (in sample order j = 0 .. S-1),
// the sum times n / S. Throws InputError unless 1 <= sample_width <= kSpmmMaxSample.
void spmm_sampled_cpu(const SpmmArgs& a);
constexpr int64_t kSpmmMaxSample = 4096;
// "" when 1 <= s <= kSpmmMaxSample, else the reason (spmm_cannot's and spmm_sampled_cpu's check).
std::string spmm_sample_width_cannot(int64_t s);

// The stride a row of n entries walks its sample with (computed once a row): 1, in order, for
// Bucket or a row of at most S entries, else FastRand's prime; and entry j (0 <= j < min(n, S)) of
// the sample, relative to the row's first entry. Host and device code share them.
#if defined(__CUDACC__)
#define GALE_SPMM_HD __host__ __device__
#else
#define GALE_SPMM_HD
#endif
GALE_SPMM_HD inline int64_t spmm_sample_stride(int64_t n, int64_t s, SpmmSampling sampling) {
  if (n <= s || sampling == SpmmSampling::kBucket) return 1;
  if (n % 577 != 0) return 577;
  if (n % 587 != 0) return 587;
  if (n % 593 != 0) return 593;
  if (n % 599 != 0) return 599;
  if (n % 601 != 0) return 601;
  return 607;  // n a multiple of all five: 7e13 entries or more in one row
}
GALE_SPMM_HD inline int64_t spmm_sample_entry(int64_t j, int64_t n, int64_t stride) {
  return stride == 1 ? j : j * stride % n;
}
#undef GALE_SPMM_HD

// GAR's chunk for this graph (SpmmArgs::gar_chunk_rows): 256 when no span of 256 consecutive rows
// holds more than 16 times the mean span's entries (rows of more than kGarLongRow entries not
// counted: blocks of their own take them), else 16. Reads indptr on the host, once per graph.
int64_t gar_chunk_rows_for(const CsrView& graph);

// The most rows of more than kGarLongRow entries a graph of `rows` rows and nnz entries can have.
int64_t gar_long_rows_capacity(int64_t rows, int64_t nnz);
// The rows of more than kGarLongRow entries, in increasing order (the CPU twin of
// gar_long_rows_cuda, whose order is unspecified).
std::vector<int64_t> gar_long_rows_cpu(const CsrView& graph);

// The scale of each entry's column, in entry order: out[e] = col_scale[indices[e]] for the
// graph's entries, which must start at 0 (indptr[0] == 0, as a whole CSR or CSC does), times the
// entry's weight graph.weights[e] when the graph has weights (one f32 product). A graph aggregated many times (full-graph training) passes it as
// edge_weight with col_scale = null: GAR and GAS then read one coalesced value per entry instead
// of gathering col_scale[c] (a random 32-byte sector) for every entry and column tile.
void spmm_entry_scale(const CsrView& graph, const float* col_scale, float* out);

// The CUDA kernels (spmm.cu; these functions exist in GALE_WITH_CUDA builds only). kAuto picks the
// memory-aware kernel for a sampled block or its transpose (rows != cols), else GAR when the
// average degree nnz / rows is at least kSpmmGarMinDegree, else GAS (see spmm.cu for why).
// kSampled is ES-SpMM's cache-first edge-sampled SpMM (spmm_sampled.cu): an estimate of the
// product for inference, never picked by kAuto. kTensorCore is TC-GNN's tensor-core SpMM
// (spmm_tc.cu) over a translated graph (SpmmArgs::tc), in TF32: never picked by kAuto either. This
// rule is kAuto for a caller that has only the arguments; the engine's `--spmm auto` times GAR, GAS
// and kTensorCore on a whole graph instead and keeps the fastest (engine/spmm_auto.hpp).
enum class SpmmKind { kAuto, kGar, kGas, kCusparse, kMemoryAware, kSampled, kTensorCore };

constexpr double kSpmmGarMinDegree = 4.0;

// "gar", "gas", "cusparse", "auto".
const char* spmm_kind_name(SpmmKind kind);

// Why `kind` cannot take these arguments, or "" when it can. Checks only the arguments' shape
// (sizes, which optional inputs are set), never device memory. cuSPARSE computes the plain
// product out = A x with A's values in edge_weight, so it needs edge weights, no row or column
// scale, no self term, no epilogue, and fewer than 2^31 entries.
std::string spmm_cannot(SpmmKind kind, const SpmmArgs& a);

// The kernel kAuto stands for with these arguments (by the rule above); any other kind as it is.
SpmmKind spmm_resolve(SpmmKind kind, const SpmmArgs& a);

// The leading dimension GAR would rather gather x with, or 0 when x's rows already suit it. GAR
// gathers 32-float tiles of source rows; a row that starts inside a 128-byte line makes every
// tile straddle two lines, which halves what the L2 holds of the hot rows (on R-MAT scale 21 at
// width 100, 14.6 GB read from DRAM instead of 8.4, the tiles 57% slower), and a row that is not
// 16-byte aligned forbids 16-byte gathers altogether. So widths from 64 up want rows of whole
// lines (x.ld a multiple of 32 floats, x 128-byte aligned), widths 9-63 rows of 64-byte halves
// (a multiple of 16 floats: 47 is padded to 48, which costs less memory than 64 at a small
// price in straddling tiles), widths 8 and under 32-byte sectors; narrower ones are left alone. GAR writes its output a float at a time when the output's rows
// are not 16-byte aligned, so only x needs the copy.
int64_t spmm_gar_padded_ld(const SpmmArgs& a);
// The row length (floats) that rule pads a width to (the width itself below 8), so that a
// producer can write x in such rows to begin with and spare the copy: 47 -> 48, 100 -> 128; and
// the alignment (floats) it asks of the rows.
int64_t spmm_gar_row_floats(int64_t width);
int64_t spmm_gar_row_align(int64_t width);

}  // namespace gale::kernels

// cudaStream_t exactly as the CUDA headers declare it, so this header stays plain C++.
struct CUstream_st;
typedef CUstream_st* cudaStream_t;  // NOLINT: must match cuda_runtime_api.h

namespace gale::kernels {

// Runs `kind` on `stream`; every pointer in `a` is a device pointer. Never synchronises.
// Throws InputError with spmm_cannot's reason when the kind cannot take the arguments, and
// DeviceError when a launch or cuSPARSE call fails. GAR is deterministic; GAS is not (the order
// of its atomic additions varies from run to run). kCusparse keeps a per-thread handle and
// workspace outside the memory budget: it is the benchmark's baseline, not a training path.
void spmm_cuda(SpmmKind kind, const SpmmArgs& a, cudaStream_t stream);
// What spmm_cuda runs for kSampled (spmm_sampled.cu) and kTensorCore (spmm_tc.cu), after its checks.
void spmm_sampled_cuda(const SpmmArgs& a, cudaStream_t stream);
void spmm_tc_cuda(const SpmmArgs& a, cudaStream_t stream);

// Lists the graph's rows of more than kGarLongRow entries in rows[0, *count), in an unspecified
// order, for SpmmArgs::long_rows; `capacity` = gar_long_rows_capacity(graph.rows, nnz). Stream-
// ordered, never synchronises.
void gar_long_rows_cuda(const CsrView& graph, int64_t* rows, int64_t capacity, int64_t* count, cudaStream_t stream);

// Twin of spmm_entry_scale; nnz as known on the host. Stream-ordered, never synchronises.
void spmm_entry_scale_cuda(const CsrView& graph, int64_t nnz, const float* col_scale, float* out, cudaStream_t stream);

// Transposes a CSR (rows x cols) into its CSC (cols x rows) with a stable counting sort:
// within each output row entries keep the input's row order. indptr_out has cols + 1 entries,
// indices_out and perm_out nnz; perm_out[k] is the input position of output entry k.
void csr_transpose(const CsrView& csr, int64_t* indptr_out, int32_t* indices_out, int64_t* perm_out);

// Scratch csr_transpose_cuda needs, in bytes (CUB style: the caller allocates it, e.g. from the
// MemoryPool): the entries' column keys and positions (12 bytes per entry) and CUB's radix-sort
// storage for that many items over the bits of cols - 1.
size_t csr_transpose_cuda_workspace_bytes(int64_t rows, int64_t cols, int64_t nnz);

// csr_transpose on the GPU (transpose.cu; GALE_WITH_CUDA builds only): the same indptr_out,
// indices_out and perm_out, exactly. Every pointer is device memory; nnz is csr.nnz() as known on
// the host (the host cannot read a device indptr without a synchronisation). A stable radix sort
// of the column keys (cub::DeviceRadixSort over the bits of cols - 1, entry positions as values)
// gives perm_out; indptr_out[c] is a binary search for c among the sorted keys and indices_out[k]
// one for perm_out[k] in csr.indptr. Stream-ordered, never synchronises; `workspace` must hold
// csr_transpose_cuda_workspace_bytes(csr.rows, csr.cols, nnz) bytes and stay alive until the
// stream has passed the call. Throws InputError on bad sizes or a short workspace.
void csr_transpose_cuda(const CsrView& csr, int64_t nnz, int64_t* indptr_out, int32_t* indices_out,
                        int64_t* perm_out, void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace gale::kernels
