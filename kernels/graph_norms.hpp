// kernels/graph_norms.hpp — the per-node factors a layer's aggregation reads, computed once per
// graph or sampled block: GCN's symmetric normalisation with a self loop and SAGE's mean.
//
// For a destination-major CSR (rows = destinations, the first `rows` sources are the destinations)
// the in-degree of a destination is its row length. A source that is not a destination (a sampled
// block's outer nodes) has no row; its degree is read from the full graph instead, at its global
// id: full_indptr[src_ids[j] + 1] - full_indptr[src_ids[j]]. CPU reference in graph_norms_cpu.cpp,
// CUDA twin in graph_norms.cu.
//
// With edge weights (csr.weights) GCN's degree is weighted, as PyG's gcn_norm with edge_weight:
// the sum of the row's weights (in entry order, in double, then rounded to f32), plus 1 for the
// self loop, and an outer source's is full_degree[src_ids[j]] (weighted_in_degree of the full
// graph). A factor whose degree + 1 is not positive is 0 (PyG's masked infinity). SAGE's mean
// stays 1 / (entry count): a mean of weighted messages, as DGL's SAGEConv with edge_weight.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/views.hpp"

namespace gale::kernels {

struct GraphNormsArgs {
  CsrView csr;                          // rows <= cols
  const int64_t* src_ids = nullptr;     // cols global ids (destinations first); null: rows == cols
  const int64_t* full_indptr = nullptr; // the full graph's indptr; needed when rows < cols
  float* dst_norm = nullptr;            // rows: 1 / sqrt(in-degree + 1)
  float* src_norm = nullptr;            // cols: the same for every source (dst_norm for destinations)
  float* self_norm = nullptr;           // rows: dst_norm^2 = 1 / (in-degree + 1)
  float* inv_degree = nullptr;          // rows: 1 / in-degree, 0 without in-neighbours
  const float* full_degree = nullptr;   // weighted: the full graph's weighted in-degrees
};

// Each row's weighted in-degree as graph_norms takes it: the sum of its weights in entry order, in
// double, rounded to f32 (TBB-parallel over rows). The graph must have weights.
std::vector<float> weighted_in_degree(const CsrView& graph);

// Why graph_norms cannot take these arguments, or "": every output given, rows <= cols, and
// src_ids with full_indptr (and full_degree, when weighted) when some source is not a destination.
std::string graph_norms_cannot(const GraphNormsArgs& a);

// TBB-parallel; throws InputError when graph_norms_cannot says why.
void graph_norms(const GraphNormsArgs& a);

}  // namespace gale::kernels

struct CUstream_st;
typedef CUstream_st* cudaStream_t;  // NOLINT: must match cuda_runtime_api.h exactly

namespace gale::kernels {

// The CUDA twin: the same values bit for bit (each factor is one correctly rounded division or
// square root of the same integer). Every pointer is device-accessible (full_indptr may be mapped
// pinned host memory read over UVA). Stream-ordered, never synchronises; throws InputError as
// graph_norms does.
void graph_norms_cuda(const GraphNormsArgs& a, cudaStream_t stream);

}  // namespace gale::kernels
