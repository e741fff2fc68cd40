#include "engine/graph.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/error.hpp"
#include "kernels/gather.hpp"
#include "kernels/graph_norms.hpp"
#include "kernels/spmm.hpp"
#include "kernels/spmm_tc.hpp"
#if GALE_WITH_CUDA
#include "engine/device_context.hpp"
#endif

namespace gale::engine {

namespace {

Tensor host_tensor(int64_t n, DType dtype) { return Tensor::empty(n, 1, dtype, Device::cpu()); }

uint64_t next_id() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

}  // namespace

GraphOperand::GraphOperand(kernels::CsrView csr, const int64_t* src_ids, const int64_t* full_indptr,
                           bool with_transpose, const float* full_degree) {
  GALE_ASSERT(csr.rows <= csr.cols);
  GALE_ASSERT(csr.rows == csr.cols || (src_ids != nullptr && full_indptr != nullptr));
  GALE_ASSERT(csr.rows == csr.cols || csr.weights == nullptr || full_degree != nullptr);
  // Per-edge arrays (attention coefficients, weights, csc_edge) are indexed by CSR position, so
  // the CSR must start at entry 0 (a full store CSR and every sampled block do).
  GALE_ASSERT(csr.rows == 0 || csr.indptr[0] == 0);
  csr_ = csr;
  nnz_ = csr.nnz();
  whole_graph_ = src_ids == nullptr && csr.rows == csr.cols;
  id_ = next_id();
  has_transpose_ = with_transpose;
  if (with_transpose) {
    csc_indptr_ = host_tensor(csr.cols + 1, DType::kI64);
    csc_indices_ = host_tensor(nnz_, DType::kI32);
    csc_edge_ = host_tensor(nnz_, DType::kI64);
    kernels::csr_transpose(csr, csc_indptr_.data<int64_t>(), csc_indices_.data<int32_t>(), csc_edge_.data<int64_t>());
    if (csr.weights) {
      csc_weights_ = host_tensor(nnz_, DType::kF32);
      const int64_t* edge = csc_edge_.data<int64_t>();
      for (int64_t k = 0; k < nnz_; ++k) csc_weights_.f32()[k] = csr.weights[edge[k]];
    }
    // Symmetric: the transpose has the same structure (and weights) as the CSR itself.
    symmetric_ = csr.rows == csr.cols &&
                 std::memcmp(csc_indptr_.data<int64_t>(), csr.indptr, static_cast<size_t>(csr.rows + 1) * 8) == 0 &&
                 std::memcmp(csc_indices_.data<int32_t>(), csr.indices, static_cast<size_t>(nnz_) * 4) == 0 &&
                 (csr.weights == nullptr ||
                  std::memcmp(csc_weights_.f32(), csr.weights, static_cast<size_t>(nnz_) * 4) == 0);
    if (symmetric_) csc_indptr_ = csc_indices_ = csc_weights_ = Tensor();  // the CSR serves as its own CSC
  }
  if (whole_graph_) {
    gar_chunk_rows_[0] = kernels::gar_chunk_rows_for(csr);
    if (with_transpose) {
      gar_chunk_rows_[1] = symmetric_ ? gar_chunk_rows_[0]
                                      : kernels::gar_chunk_rows_for({csr.cols, csr.rows, csc_indptr_.data<int64_t>(),
                                                                     csc_indices_.data<int32_t>(), nullptr});
    }
  }

  dst_norm_ = host_tensor(csr.rows, DType::kF32);
  src_norm_ = host_tensor(csr.cols, DType::kF32);
  self_norm_ = host_tensor(csr.rows, DType::kF32);
  inv_degree_ = host_tensor(csr.rows, DType::kF32);
  kernels::graph_norms({csr, src_ids, full_indptr, dst_norm_.f32(), src_norm_.f32(), self_norm_.f32(), inv_degree_.f32(),
                        full_degree});
  set_views();
}

GraphOperand GraphOperand::from_device_block(const Device& device, kernels::CsrView csr, int64_t nnz,
                                             const int64_t* src_ids, const int64_t* full_indptr, bool edge_map,
                                             const float* full_degree) {
  GALE_ASSERT(device.is_cuda() && (csr.weights == nullptr || full_degree != nullptr));
#if GALE_WITH_CUDA
  kernels::cuda::Stream& stream = DeviceContext::get(device.ordinal).io_stream();
  GraphOperand g;
  g.device_ = device;
  g.csr_ = csr;
  g.nnz_ = nnz;
  g.symmetric_ = false;  // a block's sources outnumber its destinations, or it is used once: no test
  g.id_ = next_id();
  auto make = [&](int64_t n, DType dtype) { return Tensor::empty_io(n, 1, dtype, device); };
  g.indptr_ = make(csr.rows + 1, DType::kI64);
  g.indices_ = make(nnz, DType::kI32);
  kernels::cuda::copy_on_device(g.indptr_.data<int64_t>(), csr.indptr, static_cast<size_t>(csr.rows + 1), stream);
  kernels::cuda::copy_on_device(g.indices_.data<int32_t>(), csr.indices, static_cast<size_t>(nnz), stream);
  if (csr.weights) {
    g.weights_ = make(nnz, DType::kF32);
    kernels::cuda::copy_on_device(g.weights_.data<float>(), csr.weights, static_cast<size_t>(nnz), stream);
  }
  g.set_views();  // csr_ now views the copies
  g.csc_indptr_ = make(csr.cols + 1, DType::kI64);
  g.csc_indices_ = make(nnz, DType::kI32);
  g.csc_edge_ = make(nnz, DType::kI64);
  const size_t ws_bytes = kernels::csr_transpose_cuda_workspace_bytes(csr.rows, csr.cols, nnz);
  {
    Tensor ws = make(static_cast<int64_t>(ws_bytes), DType::kU8);
    kernels::csr_transpose_cuda(g.csr_, nnz, g.csc_indptr_.data<int64_t>(), g.csc_indices_.data<int32_t>(),
                                g.csc_edge_.data<int64_t>(), ws.data<unsigned char>(), ws_bytes, stream);
  }  // freed once the IO stream has passed the transpose
  if (csr.weights) {  // the CSC's weights: the CSR's, in the transpose's entry order
    g.csc_weights_ = make(nnz, DType::kF32);
    kernels::gather_rows_cuda(kernels::ConstMatrixView(g.weights_.data<float>(), nnz, 1, 1), g.csc_edge_.data<int64_t>(),
                              nnz, kernels::MatrixView{g.csc_weights_.data<float>(), nnz, 1, 1}, stream);
  }
  if (!edge_map) g.csc_edge_ = Tensor();
  g.dst_norm_ = make(csr.rows, DType::kF32);
  g.src_norm_ = make(csr.cols, DType::kF32);
  g.self_norm_ = make(csr.rows, DType::kF32);
  g.inv_degree_ = make(csr.rows, DType::kF32);
  kernels::graph_norms_cuda({g.csr_, src_ids, full_indptr, g.dst_norm_.f32(), g.src_norm_.f32(), g.self_norm_.f32(),
                             g.inv_degree_.f32(), full_degree},
                            stream);
  g.set_views();
  return g;
#else
  (void)csr, (void)nnz, (void)src_ids, (void)full_indptr, (void)edge_map, (void)full_degree;
  throw DeviceError("this build has no CUDA backend");
#endif
}

void GraphOperand::set_views() {
  if (indptr_.defined()) {
    csr_.indptr = indptr_.data<int64_t>();
    csr_.indices = indices_.data<int32_t>();
    csr_.weights = weights_.defined() ? weights_.f32() : nullptr;
  }
  if (!has_transpose_) {
    csc_ = {csr_.cols, csr_.rows, nullptr, nullptr, nullptr};
  } else if (symmetric_) {
    csc_ = {csr_.cols, csr_.rows, csr_.indptr, csr_.indices, csr_.weights};
  } else {
    csc_ = {csr_.cols, csr_.rows, csc_indptr_.data<int64_t>(), csc_indices_.data<int32_t>(),
            csc_weights_.defined() ? csc_weights_.f32() : nullptr};
  }
}

kernels::CsrView GraphOperand::csc() const {
  if (!has_transpose_) throw InternalError("GraphOperand: built without its transpose (for inference only)");
  return csc_;
}

const int64_t* GraphOperand::csc_edge() const {
  if (!has_transpose_) throw InternalError("GraphOperand: built without its transpose (for inference only)");
  if (!csc_edge_.defined()) throw InternalError("GraphOperand: the edge map was not copied to " + device_.name());
  return csc_edge_.data<int64_t>();
}

GraphOperand GraphOperand::to(const Device& device, bool edge_map) const {
  GraphOperand g;
  g.device_ = device;
  g.csr_ = csr_;
  g.nnz_ = nnz_;
  g.symmetric_ = symmetric_;
  g.has_transpose_ = has_transpose_;
  g.whole_graph_ = whole_graph_;
  g.gar_chunk_rows_[0] = gar_chunk_rows_[0];
  g.gar_chunk_rows_[1] = gar_chunk_rows_[1];
  g.id_ = next_id();
  auto copy = [&](const void* data, int64_t n, DType dtype) { return Tensor::from_host(data, n, 1, dtype, device); };
  auto move = [&](const Tensor& t) { return t.defined() ? t.to(device) : Tensor(); };
  GALE_ASSERT(device_.is_cpu());  // operands are built on the host and copied once
  if (device.is_cpu()) return *this;
  g.indptr_ = copy(csr_.indptr, csr_.rows + 1, DType::kI64);
  g.indices_ = copy(csr_.indices, nnz_, DType::kI32);
  if (csr_.weights) g.weights_ = copy(csr_.weights, nnz_, DType::kF32);
  if (!symmetric_) {
    g.csc_indptr_ = move(csc_indptr_);
    g.csc_indices_ = move(csc_indices_);
    g.csc_weights_ = move(csc_weights_);
  }
  if (edge_map) g.csc_edge_ = move(csc_edge_);
  g.dst_norm_ = move(dst_norm_);
  g.src_norm_ = move(src_norm_);
  g.self_norm_ = move(self_norm_);
  g.inv_degree_ = move(inv_degree_);
  g.set_views();
  return g;
}

const float* GraphOperand::entry_scale(EntryScale which) const {
  if (device_.is_cpu() || !whole_graph_) return nullptr;
#if GALE_WITH_CUDA
  // A symmetric graph's CSC is its CSR, and a whole graph's src_norm is its dst_norm: one array.
  if (symmetric_ && which == EntryScale::kGcnCsc) which = EntryScale::kGcnCsr;
  Tensor& t = entry_scales_[static_cast<int>(which)];
  if (!t.defined()) {
    t = Tensor::empty(nnz_, 1, DType::kF32, device_);
    const bool csc = which != EntryScale::kGcnCsr;
    const float* scale = which == EntryScale::kGcnCsr ? src_norm() : which == EntryScale::kGcnCsc ? dst_norm() : inv_degree();
    kernels::spmm_entry_scale_cuda(csc ? csc_ : csr_, nnz_, scale, t.f32(), DeviceContext::get(device_.ordinal).stream());
  }
  return t.f32();
#else
  (void)which;
  return nullptr;
#endif
}

kernels::EdgeGroupsView GraphOperand::edge_groups() const {
  if (device_.is_cpu()) return {};
#if GALE_WITH_CUDA
  const int64_t capacity = kernels::edge_groups_capacity(csr_.rows, nnz_);
  if (!edge_groups_.defined()) {
    static_assert(sizeof(kernels::EdgeGroup) == 16, "an edge group is 16 bytes");
    edge_groups_ = Tensor::empty(capacity, 2, DType::kI64, device_);
    edge_group_count_ = Tensor::empty(1, 1, DType::kI64, device_);
    const size_t ws_bytes = kernels::edge_groups_workspace_bytes(csr_.rows);
    const Tensor ws = Tensor::empty(static_cast<int64_t>(ws_bytes), 1, DType::kU8, device_);
    kernels::edge_groups_cuda(csr_, kernels::kMaxkEdgeGroupSize,
                              reinterpret_cast<kernels::EdgeGroup*>(edge_groups_.data<int64_t>()), capacity,
                              edge_group_count_.data<int64_t>(), const_cast<unsigned char*>(ws.data<unsigned char>()),
                              ws_bytes, DeviceContext::get(device_.ordinal).stream());
  }
  return {reinterpret_cast<const kernels::EdgeGroup*>(edge_groups_.data<int64_t>()), capacity,
          edge_group_count_.data<int64_t>()};
#else
  return {};
#endif
}

kernels::GarLongRows GraphOperand::gar_long_rows(bool csc) const {
  if (device_.is_cpu() || !whole_graph_) return {};
#if GALE_WITH_CUDA
  const int which = csc && !symmetric_ ? 1 : 0;  // a symmetric graph's CSC is its CSR
  const kernels::CsrView& g = which == 1 ? csc_ : csr_;
  const int64_t capacity = kernels::gar_long_rows_capacity(g.rows, nnz_);
  if (!long_rows_[which].defined()) {
    long_rows_[which] = Tensor::empty(std::max<int64_t>(capacity, 1), 1, DType::kI64, device_);
    long_row_count_[which] = Tensor::empty(1, 1, DType::kI64, device_);
    kernels::gar_long_rows_cuda(g, long_rows_[which].data<int64_t>(), capacity, long_row_count_[which].data<int64_t>(),
                                DeviceContext::get(device_.ordinal).stream());
  }
  return {long_rows_[which].data<int64_t>(), long_row_count_[which].data<int64_t>(), capacity};
#else
  (void)csc;
  return {};
#endif
}

kernels::SpmmTcPlan GraphOperand::tc_plan(bool csc) const {
  return tc_plan_within(csc, std::numeric_limits<uint64_t>::max(), nullptr);
}

kernels::SpmmTcPlan GraphOperand::tc_plan_within(bool csc, uint64_t max_bytes, uint64_t* bytes) const {
  if (device_.is_cpu() || !whole_graph_) return {};
  const int which = csc && !symmetric_ ? 1 : 0;  // a symmetric graph's CSC is its CSR
  if (bytes != nullptr) *bytes = tc_bytes_[which];
  if (!tc_arrays_[which].empty()) return tc_plans_[which];  // on the device already: nothing more to fit
  if (tc_bytes_[which] > max_bytes) return {};  // found too large before: not translated again
  const Tensor indptr = (which == 1 ? csc_indptr_ : indptr_).to(Device::cpu());
  const Tensor indices = (which == 1 ? csc_indices_ : indices_).to(Device::cpu());
  const kernels::CsrView& g = which == 1 ? csc_ : csr_;
  const kernels::SpmmTcTranslation t =
      kernels::spmm_tc_translate({g.rows, g.cols, indptr.data<int64_t>(), indices.data<int32_t>(), nullptr});
  tc_bytes_[which] = std::max<uint64_t>(t.bytes(), 1);
  if (bytes != nullptr) *bytes = tc_bytes_[which];
  if (tc_bytes_[which] > max_bytes) return {};
  tc_plans_[which] = t.placed([&](const std::vector<int32_t>& v) {
    tc_arrays_[which].push_back(Tensor::from_host(v.data(), static_cast<int64_t>(v.size()), 1, DType::kI32, device_));
    return static_cast<const int32_t*>(tc_arrays_[which].back().data<int32_t>());
  });
  return tc_plans_[which];
}

void GraphOperand::release_tc_plan(bool csc) const {
  const int which = csc && !symmetric_ ? 1 : 0;
  tc_arrays_[which].clear();
  tc_plans_[which] = {};
}

kernels::SspmmHubsView GraphOperand::sspmm_hubs(int64_t k) const {
  if (device_.is_cpu() || !whole_graph_) return {};
#if GALE_WITH_CUDA
  const int capacity = kernels::sspmm_hub_capacity(k);
  if (capacity < 1 || k < kernels::kSspmmHubMinK) return {};
  if (!hub_ids_.defined() || hub_ids_.rows() != capacity) {
    hub_ids_ = Tensor::empty(capacity, 1, DType::kI32, device_);
    hub_mask_ = Tensor::empty(std::max<int64_t>(kernels::sspmm_hub_mask_words(nnz_), 1), 1, DType::kI32, device_);
    const size_t ws_bytes = kernels::sspmm_hubs_workspace_bytes(csr_.cols);
    const Tensor ws = Tensor::empty(static_cast<int64_t>(ws_bytes), 1, DType::kU8, device_);
    kernels::sspmm_hubs_cuda(csr_, capacity, kernels::kSspmmHubMinEntries, hub_ids_.data<int32_t>(),
                             reinterpret_cast<uint32_t*>(hub_mask_.data<int32_t>()), nnz_,
                             const_cast<unsigned char*>(ws.data<unsigned char>()), ws_bytes,
                             DeviceContext::get(device_.ordinal).stream());
  }
  return {hub_ids_.data<int32_t>(), reinterpret_cast<const uint32_t*>(hub_mask_.data<int32_t>()), capacity};
#else
  (void)k;
  return {};
#endif
}

}  // namespace gale::engine
