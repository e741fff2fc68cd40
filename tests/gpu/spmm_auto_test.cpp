// `--spmm auto` on a whole graph on the GPU (engine/spmm_auto.hpp): on fresh random graphs with
// empty rows and hubs, over the CSR and the CSC, overwriting and accumulating, the measured choice
// is one of the eligible kernels (GAR alone under --deterministic, tc only with --tf32), the output
// equals the CPU reference of the chosen kernel both when it is measured and when the choice is
// reused, and a tensor-core plan that does not fit is not built. An output mask (ReLU's backward
// folded in) leaves every kernel in the competition and is applied whichever wins, and ops::spmm
// applies it with every kernel (GAR in its epilogue, the others in a pass after it). Skips with a
// reason when no device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/device_context.hpp"
#include "engine/graph.hpp"
#include "engine/spmm_auto.hpp"
#include "engine/tensor.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/random.hpp"
#include "kernels/spmm.hpp"
#include "kernels/spmm_tc.hpp"
#include "tests/gpu/expect_close.hpp"
#include "tests/gpu/random_inputs.hpp"

namespace gale::engine {
namespace {

using kernels::SpmmKind;

class GpuSpmmAuto : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  }
};

struct Case {
  bool deterministic = false;
  bool tf32 = false;
  bool accumulate = false;
  bool csc = false;
  int64_t width = 64;
  bool masked = false;  // an output mask (SpmmArgs::out_mask)
  std::string describe() const {
    return std::string(csc ? "csc" : "csr") + " width " + std::to_string(width) +
           (deterministic ? " deterministic" : "") + (tf32 ? " tf32" : "") + (accumulate ? " accumulate" : "") +
           (masked ? " masked" : "");
  }
};

// Random mask words for rows x width outputs (ops::relu_mask's layout), on the host.
std::vector<uint32_t> random_mask(int64_t rows, int64_t width, uint64_t key) {
  std::vector<uint32_t> mask(static_cast<size_t>(rows * kernels::relu_mask_words(width)));
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<uint32_t>(kernels::random_bits(key, i));
  return mask;
}

// Aggregates over a fresh whole graph twice with auto (measured, then the choice reused) and checks
// each output against the CPU reference of the chosen kernel, and the choice against the rules.
void check(const Case& c, uint64_t key) {
  const kernels::testing::Graph g = kernels::testing::random_graph(key, 3001, 3001, 6000);
  const GraphOperand host(g.csr());
  const GraphOperand op = host.to(Device::cuda(0), /*edge_map=*/false);
  const int64_t n = g.rows, w = c.width;
  const auto x = kernels::testing::uniform(kernels::derive_key(key, 1), static_cast<size_t>(n * w), -1.0f, 1.0f);
  const auto previous = kernels::testing::uniform(kernels::derive_key(key, 2), static_cast<size_t>(n * w), -1.0f, 1.0f);
  const Tensor dx = Tensor::from_vector(x, n, w).to(op.device());
  const std::vector<uint32_t> mask = random_mask(n, w, kernels::derive_key(key, 3));
  const Tensor dmask = Tensor::from_host(mask.data(), n, kernels::relu_mask_words(w), DType::kI32, op.device());

  kernels::SpmmArgs a;
  if (c.masked) {
    a.out_mask = dmask.data<uint32_t>();
    a.out_mask_words = kernels::relu_mask_words(w);
  }
  a.nnz = op.nnz();
  a.self_scale = 1.25f;
  a.accumulate = c.accumulate;
  a.relu = true;
  ops::ExecOptions exec;
  exec.deterministic = c.deterministic;
  exec.tf32 = c.tf32;

  for (int call = 0; call < 2; ++call) {
    Tensor out = Tensor::from_vector(previous, n, w).to(op.device());
    a.graph = c.csc ? op.csc() : op.csr();
    a.x = dx.view();
    a.out = out.view();
    spmm_auto(op, c.csc, a, exec);
    const std::vector<float> gpu = out.to_vector();

    const std::vector<SpmmAutoChoice> choices = spmm_auto_choices(op.id());
    ASSERT_EQ(choices.size(), 1u) << c.describe() << ": one measurement, then the choice is reused";
    const SpmmAutoChoice& choice = choices[0];
    EXPECT_EQ(choice.transpose, c.csc);
    EXPECT_EQ(choice.width, w);
    bool eligible = false;
    for (const SpmmCandidate& k : choice.candidates) {
      if (k.excluded.empty()) EXPECT_EQ(k.ms.size(), static_cast<size_t>(kSpmmAutoRuns)) << spmm_kind_name(k.kind);
      if (k.kind == choice.kind) eligible = k.excluded.empty();
      // Nothing else competes for the memory of this small graph: only the rules exclude.
      if (k.kind == SpmmKind::kGas) EXPECT_EQ(k.excluded.empty(), !c.deterministic);
      if (k.kind == SpmmKind::kTensorCore) EXPECT_EQ(k.excluded.empty(), !c.deterministic && c.tf32);
    }
    EXPECT_TRUE(eligible) << c.describe() << ": chose " << spmm_kind_name(choice.kind);
    if (c.deterministic) EXPECT_EQ(choice.kind, SpmmKind::kGar);

    std::vector<float> cpu = c.accumulate ? previous : std::vector<float>(previous.size(), 0.0f);
    kernels::SpmmArgs r = a;
    r.graph = c.csc ? host.csc() : host.csr();
    r.x = {x.data(), n, w, w};
    r.out = {cpu.data(), n, w, w};
    r.long_rows = {};
    r.tc = {};
    if (c.masked) r.out_mask = mask.data();
    if (choice.kind == SpmmKind::kTensorCore) {
      kernels::spmm_tc_cpu(r);
    } else {
      kernels::spmm_cpu(r);
    }
    gale::testing::expect_close(gpu, cpu, choice.kind == SpmmKind::kTensorCore ? 1e-3f : 1e-4f,
                                c.describe() + " call " + std::to_string(call) + ": " + choice.text());
  }
}

TEST_F(GpuSpmmAuto, TheChoiceIsEligibleAndItsOutputMatchesTheCpu) {
  // Every combination of the rules, the direction, accumulate and two widths (16: float4 gathers
  // from dense rows; 100: GAR's padded copy of x), each on its own graph.
  for (int combo = 0; combo < 32; ++combo) {
    Case c;
    c.deterministic = combo & 1;
    c.tf32 = combo & 2;
    c.accumulate = combo & 4;
    c.csc = combo & 8;
    c.width = combo & 16 ? 100 : 16;
    check(c, 100 + static_cast<uint64_t>(combo));
  }
}

// With an output mask every kernel still competes under the rules (GAS and tc mask in a pass of
// their own), and the winner's output is masked, when measured and when reused.
TEST_F(GpuSpmmAuto, AnOutputMaskLeavesTheCompetitionAsItIsAndIsApplied) {
  for (int combo = 0; combo < 16; ++combo) {
    Case c;
    c.masked = true;
    c.deterministic = combo & 1;
    c.tf32 = combo & 2;
    c.accumulate = combo & 4;
    c.csc = combo & 8;
    c.width = combo % 3 == 0 ? 100 : 47;
    check(c, 200 + static_cast<uint64_t>(combo));
  }
}

// ops::spmm applies an output mask with every kernel of the family: GAR in its epilogue, GAS, the
// memory-aware kernel and tc after the product; each against its CPU twin, which masks in the
// kernel.
TEST_F(GpuSpmmAuto, OpsSpmmAppliesAnOutputMaskWithEveryKernel) {
  const kernels::testing::Graph g = kernels::testing::random_graph(300, 2001, 2001, 3000);
  const GraphOperand host(g.csr());
  const GraphOperand op = host.to(Device::cuda(0), /*edge_map=*/false);
  const int64_t n = g.rows;
  for (const int64_t w : {int64_t{1}, int64_t{47}, int64_t{256}}) {
    const auto x = kernels::testing::uniform(kernels::derive_key(301, static_cast<uint64_t>(w)), static_cast<size_t>(n * w),
                                             -1.0f, 1.0f);
    const std::vector<uint32_t> mask = random_mask(n, w, kernels::derive_key(302, static_cast<uint64_t>(w)));
    const Tensor dx = Tensor::from_vector(x, n, w).to(op.device());
    const Tensor dmask = Tensor::from_host(mask.data(), n, kernels::relu_mask_words(w), DType::kI32, op.device());
    for (const SpmmKind kind : {SpmmKind::kGar, SpmmKind::kGas, SpmmKind::kMemoryAware, SpmmKind::kTensorCore}) {
      Tensor out = Tensor::from_vector(std::vector<float>(static_cast<size_t>(n * w), std::nanf("")), n, w).to(op.device());
      kernels::SpmmArgs a;
      a.graph = op.csc();
      a.x = dx.view();
      a.out = out.view();
      a.nnz = op.nnz();
      a.self_scale = 1.25f;
      a.out_mask = dmask.data<uint32_t>();
      a.out_mask_words = kernels::relu_mask_words(w);
      if (kind == SpmmKind::kTensorCore) a.tc = op.tc_plan(/*csc=*/true);
      ops::spmm(a, op.device(), kind);
      const std::vector<float> gpu = out.to_vector();
      std::vector<float> cpu(static_cast<size_t>(n * w));
      kernels::SpmmArgs r = a;
      r.graph = host.csc();
      r.x = {x.data(), n, w, w};
      r.out = {cpu.data(), n, w, w};
      r.tc = {};
      r.out_mask = mask.data();
      if (kind == SpmmKind::kTensorCore) {
        kernels::spmm_tc_cpu(r);
      } else {
        kernels::spmm_cpu(r);
      }
      gale::testing::expect_close(gpu, cpu, kind == SpmmKind::kTensorCore ? 1e-3f : 1e-4f,
                                  std::string(spmm_kind_name(kind)) + " width " + std::to_string(w));
    }
  }
}

TEST_F(GpuSpmmAuto, APlanThatDoesNotFitIsNotBuilt) {
  const kernels::testing::Graph g = kernels::testing::random_graph(7, 2000, 2000, 3000);
  const GraphOperand op = GraphOperand(g.csr()).to(Device::cuda(0), /*edge_map=*/false);
  const uint64_t before = DeviceContext::get(0).pool().in_use();
  uint64_t bytes = 0;
  EXPECT_EQ(op.tc_plan_within(false, 1, &bytes).item_window, nullptr);
  EXPECT_EQ(bytes, kernels::spmm_tc_translate(g.csr()).bytes());
  EXPECT_EQ(DeviceContext::get(0).pool().in_use(), before);  // nothing uploaded
  EXPECT_NE(op.tc_plan_within(false, bytes, &bytes).item_window, nullptr);
  EXPECT_GT(DeviceContext::get(0).pool().in_use(), before);
  op.release_tc_plan(false);
  EXPECT_EQ(DeviceContext::get(0).pool().in_use(), before);
  EXPECT_NE(op.tc_plan(false).item_window, nullptr);  // built again on demand
}

}  // namespace
}  // namespace gale::engine
