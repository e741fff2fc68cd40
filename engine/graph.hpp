// engine/graph.hpp — what a layer aggregates over: a full graph or one sampled block.
//
// Destination-major CSR (rows = destinations, in-neighbours as entries) plus, built once here,
// its transpose (CSC) for backward passes and the GCN normalisation factors. The destinations are
// the first num_dst sources (a full graph has num_dst == num_src), so a layer's self / root term
// for destination i reads source row i.
//
// An operand lives on one device: it is built on the host and copied whole to a GPU with to(), so
// the CSR, the CSC and the norms are uploaded once per graph or block and every layer's forward
// and backward reuse them. When the CSC equals the CSR (a symmetric graph, the common case for
// full-graph training on undirected data) the copy shares one set of arrays for both.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.hpp"
#include "kernels/maxk.hpp"
#include "kernels/spmm.hpp"
#include "kernels/views.hpp"

namespace gale::engine {

class GraphOperand {
 public:
  // Borrows `csr` (host arrays that must outlive this object). A source that is not a destination
  // (csr.cols > csr.rows: a sampled block) takes its GCN norm from its in-degree in the full graph,
  // read at its global id `src_ids[j]` in `full_indptr` (both host arrays, needed then). Without
  // `with_transpose` (inference: forwards read the CSR alone) the transpose is not built, and
  // csc() and csc_edge() throw InternalError.
  //
  // Edge weights (csr.weights, in entry order) make every aggregation weighted (GCN's degrees too:
  // kernels/graph_norms.hpp); a block's outer sources then take their GCN degree from
  // `full_degree` (kernels::weighted_in_degree of the full graph, indexed by global id). Without
  // weights the aggregations are unweighted: the caller chooses by passing them or not
  // (ModelConfig::edge_weights).
  explicit GraphOperand(kernels::CsrView csr, const int64_t* src_ids = nullptr, const int64_t* full_indptr = nullptr,
                        bool with_transpose = true, const float* full_degree = nullptr);

  // A block sampled on the GPU (sampler/device_block.hpp) as an operand on `device`, built there on
  // the device's IO stream (Tensor::empty_io), which must already be ordered after the work that
  // wrote the arrays, and which the compute stream must wait for before using the operand: the
  // CSR is copied (so the sampler's buffers may be freed), the CSC built by csr_transpose_cuda
  // and the norms by graph_norms_cuda. `csr`, `src_ids` and `full_indptr` are device-accessible
  // (full_indptr may be mapped host memory); nnz is the entry count as known on the host. With
  // csr.weights the weights are copied too, and full_degree (device-accessible) is needed.
  static GraphOperand from_device_block(const Device& device, kernels::CsrView csr, int64_t nnz,
                                        const int64_t* src_ids, const int64_t* full_indptr, bool edge_map,
                                        const float* full_degree = nullptr);

  // A copy on `device` owning every array (this operand's arrays when it is already there).
  // csc_edge is copied only with `edge_map` (attention needs it; the 8 bytes per entry are
  // otherwise wasted on the GPU).
  GraphOperand to(const Device& device, bool edge_map) const;

  const Device& device() const { return device_; }
  int64_t num_dst() const { return csr_.rows; }
  int64_t num_src() const { return csr_.cols; }
  int64_t nnz() const { return nnz_; }
  // Views whose arrays live on device(): a device operand's pointers cannot be read by the host.
  const kernels::CsrView& csr() const { return csr_; }
  // Transpose: rows = sources, entries = destinations; csc_edge()[k] is the CSR position of
  // CSC entry k, so per-edge values (attention, weights) can be read in either order.
  kernels::CsrView csc() const;
  const int64_t* csc_edge() const;
  bool symmetric() const { return symmetric_; }
  // A whole graph (square, not a sampled block): aggregated at every step of full-graph training.
  bool whole_graph() const { return whole_graph_; }
  // Distinct for every operand built or copied to a device (copies of one object share it, and
  // its arrays): what a layer keys results derived from the graph by.
  uint64_t id() const { return id_; }

  // Whether the aggregations are weighted (the CSR has edge weights).
  bool weighted() const { return csr_.weights != nullptr; }
  // GCN symmetric normalisation with a self loop: 1 / sqrt(in-degree + 1) (weighted degree when
  // weighted()).
  const float* dst_norm() const { return dst_norm_.f32(); }
  const float* src_norm() const { return src_norm_.f32(); }
  // GCN's self-loop coefficient of each destination: dst_norm^2 = 1 / (in-degree + 1).
  const float* self_norm() const { return self_norm_.f32(); }
  // SAGE mean: 1 / in-degree (0 for a destination without in-neighbours).
  const float* inv_degree() const { return inv_degree_.f32(); }

  // A column scale copied into entry order (kernels::spmm_entry_scale), for aggregations that
  // pass it as a coalesced per-entry weight instead of gathering it per entry and column tile:
  // kGcnCsr = src_norm over the CSR's columns (GCN forward), kGcnCsc = dst_norm over the CSC's
  // (GCN backward; the same array as kGcnCsr when the graph is symmetric), kMeanCsc = inv_degree
  // over the CSC's (SAGE mean backward), times the entry's weight when weighted(), so that the copy
  // is the entry's whole column coefficient. Built on the device on first use and kept (a cache, like
  // edge_groups, nnz floats each). Null on the CPU and for sampled blocks, which are aggregated a
  // few times only: callers then pass the column scale itself.
  enum class EntryScale { kGcnCsr = 0, kGcnCsc = 1, kMeanCsc = 2 };
  const float* entry_scale(EntryScale which) const;
  // The MaxK aggregations' edge-group table of the CSR (kernels/maxk.hpp), built on the device on
  // first use and kept (a cache: not thread-safe, like the layers that use it). Empty on the CPU,
  // whose kernels need none.
  kernels::EdgeGroupsView edge_groups() const;
  // GAR's list of the CSR's (or the CSC's) rows of more than kernels::kGarLongRow entries, built
  // on the device on first use and kept (a cache, like edge_groups), so that GAR need not scan for
  // them in every call. Empty on the CPU and for sampled blocks: GAR then scans.
  kernels::GarLongRows gar_long_rows(bool csc) const;
  // GAR's chunk for the CSR (or the CSC): kernels::gar_chunk_rows_for, found on the host when a
  // whole graph's operand is built; 0 (the default chunk) for sampled blocks.
  int64_t gar_chunk_rows(bool csc) const { return gar_chunk_rows_[csc ? 1 : 0]; }
  // SSpMM's hub plan of the CSR for a CBSR of k kept values (kernels::sspmm_hub_capacity(k)
  // hubs), built on the device on first use and kept while k stays the same (a cache, like
  // edge_groups). Empty on the CPU, below k = kernels::kSspmmHubMinK and for sampled blocks,
  // whose SSpMM then takes global atomics only.
  kernels::SspmmHubsView sspmm_hubs(int64_t k) const;
  // TC-GNN's translation of the CSR (or the CSC) for the tensor-core SpMM (`--spmm tc`), built on
  // first use and kept (a cache, like edge_groups): the arrays come back to the host once, are
  // translated there (kernels::spmm_tc_translate, as TC-GNN preprocesses) and go up again, charged
  // to the device's budget. Empty on the CPU and for sampled blocks.
  kernels::SpmmTcPlan tc_plan(bool csc) const;
  // The same when the plan's arrays take at most max_bytes or are on the device already (else an
  // empty plan, nothing uploaded), with their bytes in *bytes either way: what `--spmm auto` asks
  // before letting tc compete. A plan found too large is remembered by its size and not translated
  // again for a room no larger.
  kernels::SpmmTcPlan tc_plan_within(bool csc, uint64_t max_bytes, uint64_t* bytes) const;
  // Frees the plan's device arrays (auto measured tc, and it lost); tc_plan builds them again.
  void release_tc_plan(bool csc) const;

 private:
  GraphOperand() = default;
  void set_views();

  Device device_ = Device::cpu();
  kernels::CsrView csr_, csc_;
  int64_t nnz_ = 0;
  bool symmetric_ = false;
  bool has_transpose_ = true;
  // Owned arrays. A host operand borrows the CSR (indptr_ and indices_ stay undefined); a device
  // operand owns copies. For a symmetric graph the CSC arrays are left undefined and csc_ views
  // the CSR's.
  Tensor indptr_, indices_, weights_;
  Tensor csc_indptr_, csc_indices_, csc_weights_, csc_edge_;
  Tensor dst_norm_, src_norm_, self_norm_, inv_degree_;
  mutable Tensor edge_groups_, edge_group_count_;
  mutable Tensor long_rows_[2], long_row_count_[2];  // of the CSR, of the CSC
  mutable Tensor hub_ids_, hub_mask_;  // hub_ids_ has the plan's capacity rows
  mutable Tensor entry_scales_[3];
  mutable std::vector<Tensor> tc_arrays_[2];  // of the CSR, of the CSC
  mutable kernels::SpmmTcPlan tc_plans_[2];
  mutable uint64_t tc_bytes_[2] = {0, 0};  // the translation's bytes, once known (0: not yet)
  bool whole_graph_ = false;
  int64_t gar_chunk_rows_[2] = {0, 0};  // of the CSR, of the CSC
  uint64_t id_ = 0;
};

}  // namespace gale::engine
