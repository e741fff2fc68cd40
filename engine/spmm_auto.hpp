// engine/spmm_auto.hpp — `--spmm auto` on a whole graph: the aggregation kernel chosen by
// measurement, once per operand, direction and width.
//
// The first aggregation of a whole graph's CSR (or its CSC, for a backward pass) at a width runs
// each eligible kernel on the real inputs, into the real output: one warm-up call, then
// kSpmmAutoRuns calls timed by CUDA events on the compute stream. The lowest median wins, the last
// call is the winner's (so the output holds its result), and every later aggregation of that
// operand, direction and width runs the winner. Which kernels compete (spmm_auto_candidates):
//
//   GAR  always (deterministic: a row's sum is one thread's, in entry order);
//   GAS  unless deterministic (its atomic additions land in a varying order);
//   tc   unless deterministic (a long window's items meet by atomics), only where TF32 is allowed
//        (`--tf32`: it rounds x and the coefficients to TF32, and auto never changes the
//        arithmetic asked for), and only when its plan fits: at most half of what the GPU budget
//        leaves at that moment (the rest of the step's tensors are still to come). A plan that
//        lost is freed again.
//
// An output mask (SpmmArgs::out_mask, ReLU's backward folded in) does not change who competes: GAR
// applies it in its epilogue, the others in a pass of their own (ops::spmm), and that pass is timed
// with them.
//
// Sampled blocks (and layer-wise inference's chunks, which are blocks) keep kernels::spmm_resolve's
// rule, the memory-aware kernel: they change every step, so a measurement would not be reused. On
// the CPU there is one kernel. The choice is reported by spmm_auto_choices (metrics
// `spmm_choice`, `gale train -v`).
//
// The decision (spmm_auto_candidates, spmm_auto_pick) and the order of calls (spmm_auto_measure)
// are plain functions of their inputs, so they are tested on the CPU; spmm_auto adds the device.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/graph.hpp"
#include "engine/ops.hpp"
#include "kernels/spmm.hpp"

namespace gale::engine {

// One kernel auto considers: whether it competes, and its timed calls once measured.
struct SpmmCandidate {
  kernels::SpmmKind kind = kernels::SpmmKind::kGar;
  std::string excluded;   // why it does not compete; "" : it does
  std::vector<float> ms;  // its timed calls, milliseconds
};

// What decides eligibility beyond the kernels' own argument checks (kernels::spmm_cannot).
struct SpmmAutoRules {
  bool deterministic = false;  // --deterministic: only deterministic kernels compete
  bool tf32 = false;           // --tf32: TF32 arithmetic allowed (the tensor-core kernel)
  std::string tc_cannot;       // why tc's plan cannot be had (it does not fit the budget); "" : it can
};

// GAR, GAS and tc, in the order they are timed, each with why it is excluded under `rules` ("" when
// it competes). GAR always competes.
std::vector<SpmmCandidate> spmm_auto_candidates(const SpmmAutoRules& rules);

// The median of a candidate's timed calls (the mean of the middle two for an even count; 0 for none).
double spmm_median_ms(std::vector<float> ms);

// The competing candidate with the lowest median time; a tie goes to the earlier one (GAR, the
// deterministic kernel, first). Throws InternalError when none competes or one that does has no
// timings.
kernels::SpmmKind spmm_auto_pick(const std::vector<SpmmCandidate>& candidates);

constexpr int kSpmmAutoRuns = 3;

// Measures the competing candidates in order: run(kind) once as a warm-up, then time(kind)
// kSpmmAutoRuns times (each runs the kernel once and returns its milliseconds), recorded in their
// `ms`; then picks (spmm_auto_pick) and runs the winner once more unless its timed call was the last
// call, so that the output holds the winner's result. Returns the winner.
kernels::SpmmKind spmm_auto_measure(std::vector<SpmmCandidate>* candidates,
                                    const std::function<void(kernels::SpmmKind)>& run,
                                    const std::function<float(kernels::SpmmKind)>& time);

// A choice made: for which operand (GraphOperand::id), direction and width, what won, and what
// each candidate measured or why it did not compete.
struct SpmmAutoChoice {
  uint64_t operand = 0;
  bool transpose = false;  // over the CSC: a backward pass
  int64_t width = 0;
  kernels::SpmmKind kind = kernels::SpmmKind::kGar;
  std::vector<SpmmCandidate> candidates;

  // "csr:256", the metrics file's key for it.
  std::string key() const;
  // "spmm auto: csr:256: gar 2.561 ms, gas 3.102 ms, tc 1.940 ms -> tc (gas: ...)", for `-v`.
  std::string text() const;
};

// Whether auto measures aggregations over `g`: a whole graph on a GPU.
bool spmm_auto_measures(const GraphOperand& g);

// The aggregation `a` over g's CSR (csc: its CSC; a.graph must be that one) with auto's choice: as
// measured before for this operand, direction and width, else measured now (above). An operand
// auto does not measure (spmm_auto_measures) runs ops::spmm's kAuto. exec gives --deterministic
// and --tf32.
void spmm_auto(const GraphOperand& g, bool csc, kernels::SpmmArgs a, const ops::ExecOptions& exec);

// The choices made so far over operand `operand`, in the order they were made. Thread-safe.
std::vector<SpmmAutoChoice> spmm_auto_choices(uint64_t operand);

}  // namespace gale::engine
