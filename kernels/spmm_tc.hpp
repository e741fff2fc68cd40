// kernels/spmm_tc.hpp — TC-GNN (Wang et al., ATC'23): the sparse graph translation that lets the
// aggregation run on tensor cores, and the tensor-core SpMM's CPU twin.
//
// The translation (Sec. 4.1, Algorithm 1) is done once per graph, on the host: the rows are cut
// into windows of kTcWindowRows, each window's distinct columns are condensed (sorted, so column c
// becomes the window's i-th distinct column), and every kTcBlockCols condensed columns make one TC
// block, a 16 x 8 tile of A that one TF32 MMA (m16n8k8) multiplies with the 8 source rows it names.
// What a window's rows share is then gathered once for all of them, and the tiles are as dense as
// the window's rows let them be: nnz / (blocks * 128) of their slots hold an entry.
//
//   SpmmTcTranslation t = spmm_tc_translate(csr);        // host arrays
//   ... copy t's arrays to the device, point a SpmmTcPlan at them (SpmmArgs::tc) ...
//   spmm_cuda(SpmmKind::kTensorCore, args, stream);      // spmm_tc.cu
//
// The kernel (spmm_tc.cu) takes one work item per thread block: a window, or up to kTcItemBlocks
// blocks of a window that has more. It builds the item's A tiles in shared memory from the planned
// entries (coefficient = edge weight x column scale, duplicate entries added), each warp gathers
// its 32- or 64-column slice of the 8 source rows straight into MMA fragments, and the epilogue
// (row scale, self term, accumulate, bias, ReLU) runs on the accumulators as in every SpMM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/spmm.hpp"

namespace gale::kernels {

// The translation's arrays on the host (SpmmTcPlan documents each); view() points a plan at them.
struct SpmmTcTranslation {
  int64_t windows = 0;
  std::vector<int32_t> window_blocks, block_entries, block_src, entry, slot, item_window, item_block, split_windows;

  SpmmTcPlan view() const;
  // The same plan with each non-empty array replaced by place(array) (a device copy's pointer, say);
  // empty arrays stay null. Arrays are placed in a fixed order.
  template <typename Place>
  SpmmTcPlan placed(Place place) const {
    SpmmTcPlan p = view();
    const std::vector<int32_t>* arrays[] = {&window_blocks, &block_entries, &block_src,  &entry,
                                            &slot,          &item_window,   &item_block, &split_windows};
    const int32_t** pointers[] = {&p.window_blocks, &p.block_entries, &p.block_src,  &p.entry,
                                  &p.slot,          &p.item_window,   &p.item_block, &p.split_windows};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; ++i) *pointers[i] = arrays[i]->empty() ? nullptr : place(*arrays[i]);
    return p;
  }
  // Bytes of all the arrays (what a device copy costs).
  size_t bytes() const;
  // nnz / (blocks * 128): how full the tiles are (0 without blocks).
  double density() const;
};

// Translates a CSR whose entries start at 0 (indptr[0] == 0). Throws InputError when it has 2^31
// or more rows or entries (the plan's 32-bit ids), or a column outside [0, cols). Parallel over
// windows (TBB); the result does not depend on the thread count.
SpmmTcTranslation spmm_tc_translate(const CsrView& graph);

// TF32 as the tensor-core SpMM rounds its operands (as cvt.rna.tf32.f32 would): the mantissa
// rounded to 10 bits, to nearest with ties away from zero; infinities and NaNs unchanged here (the
// kernel turns infinities into NaNs).
inline float round_to_tf32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & ~0x1fffu;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// The CPU twin of the tensor-core SpMM: spmm_cpu's general form on the terms the MMA multiplies.
// A row's entries of one column are one coefficient in a tile, the sum of their column scale x edge
// weight (in entry order here, by shared-memory atomics there) rounded to TF32; each gathered x
// value is rounded to TF32; the products are summed in column order, the row scale, the self term
// and the epilogue applied in f32. Reads the CSR only (the translation orders the sum by column).
void spmm_tc_cpu(const SpmmArgs& a);

}  // namespace gale::kernels
