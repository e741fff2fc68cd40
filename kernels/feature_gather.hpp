// kernels/feature_gather.hpp — the one gather behind the feature tiers (storage/feature_tiers.hpp):
// every row of a batch's input features comes from the fastest place that holds it, in this order:
//   1. the previous batch's features, already on the GPU (FastGL's match): prev_rows[i] >= 0;
//   2. all features resident on the GPU, when they fit the budget;
//   3. the GPU cache of hot nodes: cache_slot[id] >= 0;
//   4. pinned host memory, read by the kernel itself over UVA (no staging copy): every node's row
//      by its id, or (features on disk) the batch's own rows the host staged there, row i of the
//      batch at host_rows[i].
// CPU reference in feature_gather_cpu.cpp, CUDA twin in feature_gather.cu (one warp per row,
// 16-byte loads when every source is aligned).
#pragma once

#include <cstdint>

#include "kernels/views.hpp"

namespace gale::kernels {

enum FeatureTier : int { kTierPrevious = 0, kTierDevice = 1, kTierCache = 2, kTierHost = 3, kFeatureTiers = 4 };

struct TieredGatherArgs {
  const int64_t* ids = nullptr;         // n global node ids
  int64_t n = 0;
  const int32_t* prev_rows = nullptr;   // per id: its row in `prev`, or -1; null: no previous batch
  ConstMatrixView prev;
  ConstMatrixView device;               // every node's features on the GPU; data null: not resident
  const int32_t* cache_slot = nullptr;  // per node id: its row in `cache`, or -1; null: no cache
  ConstMatrixView cache;
  ConstMatrixView host;                 // every node's features (pinned host memory for the CUDA twin)
  // null: host holds every node by id. Else row i of the batch is host row host_rows[i] (a batch's
  // staged rows; read only for rows no faster tier holds, so those of other tiers may be -1).
  const int32_t* host_rows = nullptr;
  MatrixView out;                       // n x width
  int64_t* counters = nullptr;          // kFeatureTiers row counts, added to; null: not counted
};

void tiered_gather_cpu(const TieredGatherArgs& a);

// FastGL's match kept as a map over node ids, so a batch's reuse is found without a host pass:
// row_of[v] is v's row in the previous batch's features, or -1 (every entry -1 at the start).
// match_rows: rows[i] = row_of[ids[i]], the prev_rows of a tiered gather.
// match_advance: makes `ids` the previous batch: row_of[prev_ids[i]] = -1 for i < prev_n, then
// row_of[ids[i]] = i for i < n (ids distinct, as a batch's input nodes are).
void match_rows_cpu(const int32_t* row_of, const int64_t* ids, int64_t n, int32_t* rows);
void match_advance_cpu(int32_t* row_of, const int64_t* prev_ids, int64_t prev_n, const int64_t* ids, int64_t n);

// The ids[0..n) whose rows the GPU cache lacks (cache_slot[id] < 0), in their order, into out (room
// for n); returns how many. The read-ahead's sampling thread asks the host only for these.
int64_t uncached_ids_cpu(const int32_t* cache_slot, const int64_t* ids, int64_t n, int64_t* out);

}  // namespace gale::kernels

struct CUstream_st;
typedef CUstream_st* cudaStream_t;  // NOLINT: must match cuda_runtime_api.h exactly

namespace gale::kernels {

// Every pointer is device-accessible (host: mapped pinned memory). Never synchronises.
void tiered_gather_cuda(const TieredGatherArgs& a, cudaStream_t stream);
// The match map's CUDA twins; device pointers, stream-ordered, never synchronise.
void match_rows_cuda(const int32_t* row_of, const int64_t* ids, int64_t n, int32_t* rows, cudaStream_t stream);
void match_advance_cuda(int32_t* row_of, const int64_t* prev_ids, int64_t prev_n, const int64_t* ids, int64_t n,
                        cudaStream_t stream);
// uncached_ids_cpu's twin (CUB's stable select): writes the count to *count (device). scratch:
// uncached_ids_scratch_bytes(n) bytes of device memory. Stream-ordered, never synchronises.
size_t uncached_ids_scratch_bytes(int64_t n);
void uncached_ids_cuda(const int32_t* cache_slot, const int64_t* ids, int64_t n, int64_t* out, int64_t* count,
                       void* scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace gale::kernels
