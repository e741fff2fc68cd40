// engine/roofline.hpp — an epoch's lower bound from what its ops must do (OpProfile's table: each
// op's kind, shape and calls) and rates measured once on this GPU, for `gale bench train`.
//
// The bound is a sum of three terms, each op's work at the best rate this GPU showed for it:
//   - GEMMs: 2 m n k FLOPs a call, at the FLOP/s cuBLAS reaches for that very shape (m, n, k and
//     the transposes) through ops::gemm, in the run's precision (fp32, or TF32 with --tf32);
//     MaxK's CBSR products count as the dense GEMM over their kept values (m x n x k kept).
//   - aggregations: the larger of two floors. DRAM: what must cross HBM at least once (the row
//     pointers, each entry's index and value, the output; spmm_dram_bytes) at the copy bandwidth.
//     Gathers: every entry brings its source row to an SM (spmm_gathered_bytes) at the rate GAR
//     gathers rows when every one is an L2 hit (a synthetic graph over a table of a quarter of the
//     L2, measured per width). A real graph's SpMM misses the L2 more, so it gathers no faster;
//     only reuse inside an SM (the L1, or the tensor-core kernel's tiles of shared sources) could
//     beat this floor, and the bound says so where it is printed.
//   - everything else: the bytes the op reads and writes at least once (OpShape::bytes) at the
//     HBM bandwidth of a device-to-device copy.
// An op the profile has no shape or rate for counts nothing, so the bound stays a lower bound;
// ops overlap nothing on one stream, so the terms add.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/ops.hpp"
#include "kernels/views.hpp"

namespace gale::engine {

// The bytes an SpMM of `rows` destination rows over `nnz` entries and `width` feature columns must
// move at least once: the row pointers (8 bytes a row), each entry's column index (4) and value
// (value_bytes: 4 with edge weights, 0 without), each entry's source row (a gathered row is read
// once per entry: no reuse through the cache is assumed), and the output written once: the model
// of `gale bench spmm`'s GB/s column. It is the sum of the two below.
double spmm_min_bytes(int64_t rows, int64_t nnz, int64_t width, int64_t value_bytes);
// What of that must cross HBM whatever the cache holds: row pointers, indices, values, output.
double spmm_dram_bytes(int64_t rows, int64_t nnz, int64_t width, int64_t value_bytes);
// The source rows the entries gather (nnz x width floats), from wherever they are cached.
double spmm_gathered_bytes(int64_t nnz, int64_t width);

// Rates measured on one GPU: FLOP/s per GEMM shape, L2-hit gather bytes/s per feature width, HBM
// bytes/s.
// A rate of 0 (or none) means not measured.
struct RooflineRates {
  struct Gemm {
    int64_t m = 0, n = 0, k = 0;
    bool trans_a = false, trans_b = false;
    double flops_per_s = 0;
  };
  std::vector<Gemm> gemm;
  std::vector<std::pair<int64_t, double>> gather;  // width, gathered bytes/s with every row an L2 hit
  double hbm_bytes_per_s = 0;

  double gemm_rate(const ops::OpShape& s) const;
  double gather_rate(int64_t width) const;
};

// One epoch's bound, by term.
struct RooflineBound {
  double gemm_ms = 0, agg_ms = 0, other_ms = 0;
  double ms() const { return gemm_ms + agg_ms + other_ms; }
};

// The bound of one epoch of ops whose calls were summed over `epochs` epochs (0 or fewer: none).
RooflineBound roofline_bound(const std::vector<ops::OpProfile::Entry>& ops, const RooflineRates& rates, int epochs);
// bound / measured epoch, as a fraction; 0 when the epoch was not measured (epoch_ms <= 0).
double roofline_efficiency(const RooflineBound& bound, double epoch_ms);

// Adds to `rates` what the bound of `ops` needs and it lacks, measured on `device` (a GPU): each
// distinct GEMM shape through ops::gemm in the given precision, per distinct aggregation width
// GAR's SpMM over a synthetic graph of kRooflineGatherDegree entries a row whose sources (a fixed
// hash) lie in a table of a quarter of the device's L2 (kRooflineGatherBytes gathered a call), and a
// kRooflineCopyBytes copy; three warm-up calls, then the median of seven, each timed on the device
// by an OpProfile of its own (so no other OpProfile may be alive on this thread). A shape whose
// operands do not fit in the device's memory (or budget) gets a rate of 0. Keeping `rates` from one
// model to the next measures each shape once per run. Throws DeviceError on the CPU.
constexpr int64_t kRooflineGatherBytes = int64_t{2} << 30;
constexpr int64_t kRooflineGatherDegree = 32;
constexpr int64_t kRooflineCopyBytes = int64_t{256} << 20;
void measure_roofline_rates(const std::vector<ops::OpProfile::Entry>& ops, const Device& device, bool tf32,
                            RooflineRates* rates);

}  // namespace gale::engine
