// kernels/maxk.hpp — the MaxK-GNN kernel family (Peng et al., ASPLOS'24; digest in
// shared/seeds/digests/maxk-gnn.md): the MaxK nonlinearity (per-row top-k) that packs a dense
// activation into CBSR, the forward aggregation over CBSR (SpGEMM, sparse x sparse -> dense), the
// backward aggregation sampled at the CBSR pattern (SSpMM, sparse x dense -> sparse), and the
// scatter back to dense that MaxK's own backward needs. CPU references (*_cpu, maxk_cpu.cpp) and
// CUDA twins (*_cuda, maxk.cu) take the same arguments; the CUDA ones take device pointers and a
// stream, allocate nothing and never synchronise.
//
// The aggregations keep spmm.hpp's general form, so one layer code serves GCN, SAGE-mean and GIN:
//
//   SpGEMM:  out[r] = row_scale[r] * sum_e col_scale[c_e] * w_e * x[c_e]  +  self_coef(r) * x[r]  (+ bias)
//   SSpMM:   gv[j][t] = sum_{e = (i, j)} row_scale[i] * col_scale[j] * w_e * g[i][idx[j][t]]
//                       + self_coef(j) * g[j][idx[j][t]]
//
// with x in CBSR (idx[j][t] the t-th kept column of row j), self_coef(r) = self_scale +
// (self_coefs ? self_coefs[r] : 0) for r < min(graph.rows, x.rows), and 0 beyond (destinations
// are the first sources, as in a sampled block). SSpMM is the gradient of SpGEMM with respect to
// the kept values: gv = d <g, out> / d x.values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/views.hpp"

namespace gale::kernels {

// ---- CBSR (Compressed Balanced Sparse Row, MaxK-GNN Sec. 3.2) -------------------------------
//
// A rows x width matrix with exactly k nonzeros per row, stored as two rows x k arrays with no
// row pointer (row r starts at r * k in both): values (float) and index (the column of each
// value). Within a row the columns are distinct and increasing, which is what maxk_forward writes
// (the order a warp ballot compaction gives, and deterministic). The index type follows from the
// width alone, so a view cannot disagree with its data: uint8_t when width <= 256 (the paper's
// 5 bytes per kept value), uint16_t up to kCbsrMaxWidth.
constexpr int64_t kCbsrMaxWidth = 65536;

// Bytes per column index for a width: 1 (uint8_t) up to 256 columns, else 2 (uint16_t).
constexpr int cbsr_index_bytes(int64_t width) { return width <= 256 ? 1 : 2; }

struct CbsrView {
  int64_t rows = 0;
  int64_t width = 0;          // dim_origin: the dense width the columns index into
  int64_t k = 0;              // kept values per row, 1 <= k <= width
  float* values = nullptr;    // rows x k
  void* index = nullptr;      // rows x k, uint8_t or uint16_t (cbsr_index_bytes(width))

  int index_bytes() const { return cbsr_index_bytes(width); }
  uint8_t* index_u8() const { return static_cast<uint8_t*>(index); }
  uint16_t* index_u16() const { return static_cast<uint16_t*>(index); }
  // Host-side element access (CPU references and tests).
  int64_t column(int64_t r, int64_t t) const {
    return index_bytes() == 1 ? index_u8()[r * k + t] : index_u16()[r * k + t];
  }
  void set_column(int64_t r, int64_t t, int64_t c) const {
    if (index_bytes() == 1) {
      index_u8()[r * k + t] = static_cast<uint8_t>(c);
    } else {
      index_u16()[r * k + t] = static_cast<uint16_t>(c);
    }
  }
};

struct ConstCbsrView {
  int64_t rows = 0;
  int64_t width = 0;
  int64_t k = 0;
  const float* values = nullptr;
  const void* index = nullptr;

  ConstCbsrView() = default;
  ConstCbsrView(int64_t r, int64_t w, int64_t kk, const float* v, const void* i)
      : rows(r), width(w), k(kk), values(v), index(i) {}
  ConstCbsrView(const CbsrView& c) : rows(c.rows), width(c.width), k(c.k), values(c.values), index(c.index) {}  // NOLINT

  int index_bytes() const { return cbsr_index_bytes(width); }
  const uint8_t* index_u8() const { return static_cast<const uint8_t*>(index); }
  const uint16_t* index_u16() const { return static_cast<const uint16_t*>(index); }
  int64_t column(int64_t r, int64_t t) const {
    return index_bytes() == 1 ? index_u8()[r * k + t] : index_u16()[r * k + t];
  }
};

// Bytes of the index array of a rows x k CBSR matrix of this width.
inline int64_t cbsr_index_size_bytes(int64_t rows, int64_t width, int64_t k) {
  return rows * k * cbsr_index_bytes(width);
}

// ---- SSpMM's hub plan -----------------------------------------------------------------------
//
// SSpMM adds each entry (i, j)'s k values into grad_values[j] with global atomics, and on a
// power-law graph a few sources j take a large share of them (R-MAT scale 21: the 256 sources with
// the most entries hold ~7% of them). A hub plan names up to `capacity` such sources; the CUDA
// SSpMM then sums their entries in shared memory per thread block and adds each block's sums once
// at the end, so their entries cost a shared atomic instead of a global one. Build it once per
// graph (like the edge groups) for the k it will serve: the capacity follows from k.
//
// ids: `capacity` values, the hubs in increasing order, then kSspmmNoHub for the unused places.
// entry_mask: one bit per entry of the graph, bit e % 32 of word e / 32 set when indices[e] is a
// hub (words: sspmm_hub_mask_words(nnz)). The hubs are the sources with at least `min_entries`
// entries, the most entries first and, among equal counts, the lower id first, up to capacity.
constexpr int32_t kSspmmNoHub = 0x7fffffff;
constexpr int64_t kSspmmHubMinEntries = 1024;
// Shared memory a block spends on the hubs' sums: capacity x k floats within it (and at most
// kSspmmMaxHubs hubs).
constexpr int64_t kSspmmHubBytes = 32 * 1024;
constexpr int kSspmmMaxHubs = 1024;

// Training and `gale bench spmm` use a plan from this k on: on R-MAT scale 21 (H100, width 256) it
// made SSpMM 2.7% faster at k = 32 and 1% slower at k = 16, where an entry's atomic is half a
// line and the shared atomics and the lookups cost what they save. The kernel takes a plan at any k.
constexpr int64_t kSspmmHubMinK = 32;

inline int sspmm_hub_capacity(int64_t k) {
  if (k < 1) return 0;
  const int64_t c = kSspmmHubBytes / (k * static_cast<int64_t>(sizeof(float)));
  return static_cast<int>(c < kSspmmMaxHubs ? c : kSspmmMaxHubs);
}
inline int64_t sspmm_hub_mask_words(int64_t nnz) { return (nnz + 31) / 32; }

struct SspmmHubsView {
  const int32_t* ids = nullptr;
  const uint32_t* entry_mask = nullptr;
  int capacity = 0;  // 0: no plan
};

struct SspmmHubs {
  std::vector<int32_t> ids;
  std::vector<uint32_t> entry_mask;
  SspmmHubsView view() const { return {ids.data(), entry_mask.data(), static_cast<int>(ids.size())}; }
};

// Why a plan of this capacity cannot be built for the graph, or "" (both builders check it).
std::string sspmm_hubs_cannot(const CsrView& graph, int capacity);

// The plan of a host graph whose entries index `sources` columns (graph.cols).
SspmmHubs sspmm_hubs_cpu(const CsrView& graph, int capacity, int64_t min_entries = kSspmmHubMinEntries);

// ---- arguments ------------------------------------------------------------------------------

// Forward aggregation over a CBSR input (the first formula above).
struct SpgemmCbsrArgs {
  CsrView graph;                      // rows = out.rows (destinations), cols <= x.rows (sources)
  ConstCbsrView x;                    // x.width = out.cols
  MatrixView out;                     // written whole (zeros where nothing lands)
  const float* row_scale = nullptr;   // per destination; null = 1
  const float* col_scale = nullptr;   // per source; null = 1
  const float* edge_weight = nullptr; // per entry, in the graph's entry order; null = 1
  const float* self_coefs = nullptr;  // per destination; null = 0
  float self_scale = 0.0f;
  const float* bias = nullptr;        // out.cols values added to every row; null = none
};

// Backward aggregation sampled at the CBSR pattern of x (the second formula above). The graph and
// the scales are the forward pass's: rows are destinations i, entries sources j.
struct SspmmCbsrArgs {
  CsrView graph;
  ConstMatrixView grad_out;           // g: graph.rows x width
  ConstCbsrView pattern;              // x's CBSR (graph.cols <= rows); only the index is read
  float* grad_values = nullptr;       // pattern.rows x pattern.k, written whole
  const float* row_scale = nullptr;
  const float* col_scale = nullptr;
  const float* edge_weight = nullptr;
  const float* self_coefs = nullptr;
  float self_scale = 0.0f;
  // Optional (CUDA only; the CPU ignores it): the graph's hub plan for pattern.k (see below).
  SspmmHubsView hubs;
};

// The dense layer after MaxK, on the CBSR form of its input (maxk_linear_cpu.cpp / maxk_linear.cu):
// out = x W + beta * out, with x rows x width in CBSR and W width x n dense. A row costs k x n
// multiply-adds instead of width x n, and x is never read in dense form: on a narrowing layer
// (hidden 256 to 47 classes, W small enough for shared memory) this beats a dense GEMM that reads
// the dense input.
struct CbsrGemmArgs {
  ConstCbsrView x;
  ConstMatrixView w;      // x.width x out.cols
  float beta = 0.0f;      // 0: out is written whole (never read)
  MatrixView out;         // x.rows x w.cols
  // Optional (absent while w2.data is null): a second product from the same reads of x, on its
  // leading rows: out2 = x[0, out2.rows) W2 + beta * out2, W2 x.width x out2.cols (a SAGE layer's
  // x W and x_dst W_root in one pass).
  ConstMatrixView w2;
  MatrixView out2;
};

// Its input gradient, restricted to the kept positions (MaxK's backward folded in), summed over up
// to two such products and scattered to dense:
//   grad_in[r][c] = sum_p sum_j grad[p][r][j] * w[p][c][j]   for c kept in row r of pattern,
//   grad_in[r][c] = 0                                        elsewhere,
// where grad[p] may have fewer rows than pattern (a sampled block's destinations): rows past them
// add nothing.
struct CbsrGemmGradArgs {
  ConstCbsrView pattern;
  int terms = 1;                  // 1 or 2
  ConstMatrixView grad[2];        // grad[p]: rows <= pattern.rows, w[p].cols columns
  ConstMatrixView w[2];           // w[p]: pattern.width x grad[p].cols
  MatrixView grad_in;             // pattern.rows x pattern.width, written whole
  // Optional (CUDA): cbsr_gemm_grad_sum_rows(pattern.rows) x pattern.width floats for the column
  // sums of grad_in (see "Column sums" below).
  float* column_partial = nullptr;
};

// Why the ops cannot take these arguments, or "" (shapes and set inputs only, never memory).
std::string maxk_forward_cannot(ConstMatrixView x, const CbsrView& out);
std::string maxk_backward_cannot(const ConstCbsrView& pattern, ConstMatrixView grad_dense, MatrixView grad_in);
std::string spgemm_cbsr_cannot(const SpgemmCbsrArgs& a);
std::string sspmm_cbsr_cannot(const SspmmCbsrArgs& a);
std::string cbsr_gemm_cannot(const CbsrGemmArgs& a);
std::string cbsr_gemm_grad_cannot(const CbsrGemmGradArgs& a);

// ---- CPU references ------------------------------------------------------------------------
// Each throws InputError with the *_cannot reason. Rows are independent and computed in a fixed
// order (TBB-parallel over output rows), so results do not depend on the thread count.

// MaxK: keeps, per row of x, the k largest values by signed value and writes them to out in
// increasing column order. Ties are broken towards the lower column, so exactly k are kept. The
// order is that of the order-preserving uint32 key of each float (sign flipped for positives,
// all bits flipped for negatives): -0.0 ranks below +0.0, NaNs with the sign bit clear above
// +inf and NaNs with it set below -inf. out.width = x.cols, out.rows = x.rows.
void maxk_forward_cpu(ConstMatrixView x, const CbsrView& out);

// MaxK backward, scattered to dense: grad_in[r][c] = (grad_dense ? grad_dense[r][c] : 0) +
// (grad_values ? grad_values[r][t] : 0) where c = pattern's t-th column of row r, and 0 at every
// column not kept. grad_dense (absent when its data is null) has pattern.rows x pattern.width,
// grad_values (nullable) pattern.rows x pattern.k; grad_in must alias neither.
void maxk_backward_cpu(const ConstCbsrView& pattern, const float* grad_values, ConstMatrixView grad_dense,
                       MatrixView grad_in);

// The dense matrix a CBSR one stands for: out[r][idx[r][t]] = values[r][t], 0 elsewhere
// (maxk_backward with grad_values = x.values and no dense gradient).
void cbsr_to_dense_cpu(const ConstCbsrView& x, MatrixView out);
// Inverted dropout on the kept values with the masks dense dropout (dense.hpp) draws for the same
// key on the dense form: value (r, t) at column c is kept when random_uniform(key, r * width + c)
// >= p and then scaled by 1 / (1 - p). So dropout before a MaxK-input layer can act on both the
// dense input and its CBSR form consistently (maxk_dropout.cpp / maxk_dropout.cu).
void cbsr_dropout_cpu(const CbsrView& x, float p, uint64_t key);

void spgemm_cbsr_cpu(const SpgemmCbsrArgs& a);

// Sums per source in the transpose's (stable) entry order; builds the transpose internally.
void sspmm_cbsr_cpu(const SspmmCbsrArgs& a);

// Per output element, the kept values' products added in kept order (t = 0, 1, ...) onto
// beta * out; per gradient element, term 0's then term 1's products in column order.
void cbsr_gemm_cpu(const CbsrGemmArgs& a);
void cbsr_gemm_grad_cpu(const CbsrGemmGradArgs& a);

// ---- edge groups (MaxK-GNN Sec. 4.1 "warp level partition") ---------------------------------
//
// The unit of work of both CUDA aggregations: a run of at most `group_size` consecutive entries of
// one row (never spanning two rows; empty rows have none). A hub row becomes many groups whose
// partial results meet through atomics, so every warp's work is bounded. Groups are listed in row
// order and, within a row, in entry order. One table serves forward and backward; build it once
// per graph (or sampled block). The paper's (and its code's) group size is 64.
constexpr int64_t kMaxkEdgeGroupSize = 64;

struct EdgeGroup {
  int64_t start = 0;   // first entry (an index into indices / edge weights)
  int32_t row = 0;
  int32_t count = 0;   // entries, 1 <= count <= group_size
};

// The groups of a graph, built on the host. Needs graph.rows < 2^31.
std::vector<EdgeGroup> edge_groups_cpu(const CsrView& graph, int64_t group_size = kMaxkEdgeGroupSize);

// A group table in device memory. `count` (device memory, nullable) holds how many of the
// `capacity` entries are groups; null means all of them are (a table built on the host and
// copied over).
struct EdgeGroupsView {
  const EdgeGroup* groups = nullptr;
  int64_t capacity = 0;
  const int64_t* count = nullptr;
};

// An upper bound on the number of groups of a graph with these sizes: what to allocate for
// edge_groups_cuda. Each nonempty row has at most floor(degree / group_size) + 1 groups, so
// min(rows, nnz) + nnz / group_size.
int64_t edge_groups_capacity(int64_t rows, int64_t nnz, int64_t group_size = kMaxkEdgeGroupSize);

}  // namespace gale::kernels

// ---- CUDA twins (maxk.cu; GALE_WITH_CUDA builds only) ----------------------------------------
// Declared without CUDA headers so CPU-only code can include this file.
struct CUstream_st;
typedef CUstream_st* cudaStream_t;  // NOLINT: must match cuda_runtime_api.h exactly

namespace gale::kernels {

// Widest rows the CUDA ops take: top-k keeps a row in registers (up to 128 per lane), and the
// aggregations keep one to four width-float rows per warp in shared memory (16 KiB each at 4096).
constexpr int64_t kMaxkCudaMaxWidth = 4096;

// Why the CUDA twin cannot take a width: "" or the reason (the *_cannot above still apply).
std::string maxk_cuda_cannot(int64_t width);

// Scratch edge_groups_cuda needs (CUB style: the caller allocates it, e.g. from the MemoryPool):
// per-row group offsets and CUB's scan storage.
size_t edge_groups_workspace_bytes(int64_t rows);

// Builds the group table of a device CSR on `stream`: per-row group counts, an exclusive scan
// (CUB), then one thread per row writes its groups. groups has room for `capacity` entries
// (edge_groups_capacity(rows, nnz, group_size)); *count (device) receives the number written,
// which may be below capacity. The same table as edge_groups_cpu.
void edge_groups_cuda(const CsrView& graph, int64_t group_size, EdgeGroup* groups, int64_t capacity,
                      int64_t* count, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// One warp per row: the row's order-preserving keys sit in registers, a bisection of the key
// interval between a lower bound and the row's maximum finds the k-th largest key (stopping as
// soon as the count is exactly k), and a ballot/popc compaction writes the kept values in column order with ties
// broken towards lower columns. Same output as maxk_forward_cpu, bit for bit. With `dense` (data
// not null; x.rows x x.cols, and it may be x itself: each row is read before it is written) the
// warp also writes the dense form, cbsr_to_dense_cpu of the output, from the values it holds:
// the model's next layer then needs no separate scatter pass.
void maxk_forward_cuda(ConstMatrixView x, const CbsrView& out, cudaStream_t stream, MatrixView dense = {});

// Column sums. The gradient these kernels write (MaxK's backward, cbsr_gemm_grad) is the next
// layer down's output gradient, whose column sums are that layer's bias gradient; it is zero past
// the kept positions, so a separate column_sum would read 4 x width bytes a row for k values.
// Given `column_partial` (maxk_backward_sum_rows(rows), or cbsr_gemm_grad_sum_rows(rows), x width
// floats), each warp of the kernel adds the values it writes into its own row of width floats in
// shared memory, in row order, and writes that row to column_partial; column_sum_cuda over those
// rows (a fixed order, in double) then gives the sums, deterministic like column_sum itself.
// maxk_backward takes widths up to kMaxkSumWidth with them; cbsr_gemm_grad whatever leaves room
// in shared memory (cbsr_gemm_grad_sums_cannot).
constexpr int64_t kMaxkSumWidth = 1024;
int64_t maxk_backward_sum_rows(int64_t rows);
int64_t cbsr_gemm_grad_sum_rows(int64_t rows);
void maxk_backward_cuda(const ConstCbsrView& pattern, const float* grad_values, ConstMatrixView grad_dense,
                        MatrixView grad_in, cudaStream_t stream, float* column_partial = nullptr);

void cbsr_to_dense_cuda(const ConstCbsrView& x, MatrixView out, cudaStream_t stream);
void cbsr_dropout_cuda(const CbsrView& x, float p, uint64_t key, cudaStream_t stream);

// MaxK-GNN Alg. 1: width-float accumulators in shared memory, filled by groups of k lanes reading
// each neighbour's k values and columns with coalesced loads. A row of at most 128 entries is
// summed whole by one warp and written once with plain stores (bias and self term included); a
// longer row is set to bias + self term first, then its edge groups add their sums with float4
// atomics. Out needs no zeroing by the caller. Atomics reorder the long rows' sums: results match
// the CPU to rounding, and those rows vary in the last bits from run to run.
void spgemm_cbsr_cuda(const SpgemmCbsrArgs& a, const EdgeGroupsView& groups, cudaStream_t stream);

// MaxK-GNN Alg. 2 (outer product): per row i the dense gradient row g[i] (times row_scale[i]) is
// staged in shared memory once for its consecutive edge groups, then for each entry (i, j) the
// warp gathers it at j's k columns and atomically adds into grad_values[j] (float4 atomics when
// k is a multiple of 4), which a memset or a first kernel (self term) sets beforehand.
//
// With a hub plan (a.hubs.capacity > 0, at most sspmm_hub_capacity(k)) the entries of the plan's
// hubs go to per-block sums in shared memory instead, added to grad_values when the block ends.
void sspmm_cbsr_cuda(const SspmmCbsrArgs& a, const EdgeGroupsView& groups, cudaStream_t stream);

// Scratch sspmm_hubs_cuda needs for a graph of `sources` columns (CUB style, as for edge groups).
size_t sspmm_hubs_workspace_bytes(int64_t sources);

// Builds the hub plan of a device CSR on `stream` (the same plan as sspmm_hubs_cpu): per-source
// entry counts, a CUB radix sort of the sources by count, the first `capacity` of at least
// min_entries sorted by id into ids (capacity values), then one bit per entry into entry_mask
// (sspmm_hub_mask_words(nnz) words, where nnz = indptr[rows]: the caller sizes it from its own
// count). Allocates nothing and never synchronises.
void sspmm_hubs_cuda(const CsrView& graph, int capacity, int64_t min_entries, int32_t* ids, uint32_t* entry_mask,
                     int64_t nnz, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// The CBSR dense layer keeps W (both W's for the gradient) in shared memory: "" when it fits, else
// the reason (the caller then uses the dense form and a GEMM). Up to 128 output columns.
std::string cbsr_gemm_cuda_cannot(int64_t width, int64_t n, int terms);

// One warp per row: the kept (column, value) pairs go round the warp by shuffles and each lane
// adds value * W[column][lane + 32 m] for its output columns, in kept order (the CPU's order; fused
// multiply-adds here, so results match the CPU to rounding). The gradient: per row the warp stages grad rows in shared memory, lane t
// forms kept column t's dot products, and the row is written dense through a shared row buffer.
void cbsr_gemm_cuda(const CbsrGemmArgs& a, cudaStream_t stream);
void cbsr_gemm_grad_cuda(const CbsrGemmGradArgs& a, cudaStream_t stream);
std::string cbsr_gemm_grad_sums_cannot(const CbsrGemmGradArgs& a);

}  // namespace gale::kernels
