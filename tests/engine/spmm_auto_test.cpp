// `--spmm auto`'s decision on the CPU: which kernels compete under --deterministic, --tf32 and the
// budget; the lowest median wins (ties to GAR); the measurement's calls end with the winner's, so
// the output holds its result; and a CPU operand is aggregated by the CPU kernel, unmeasured.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "engine/graph.hpp"
#include "engine/spmm_auto.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"

namespace gale::engine {
namespace {

using kernels::SpmmKind;

const SpmmCandidate& candidate(const std::vector<SpmmCandidate>& c, SpmmKind kind) {
  for (const SpmmCandidate& x : c)
    if (x.kind == kind) return x;
  throw InternalError("no such candidate");
}

std::vector<SpmmCandidate> timed(std::vector<std::pair<SpmmKind, std::vector<float>>> ms) {
  std::vector<SpmmCandidate> c;
  for (auto& [kind, t] : ms) c.push_back({kind, "", std::move(t)});
  return c;
}

TEST(SpmmAutoCandidates, GarAndGasCompeteByDefaultAndTcOnlyWithTf32) {
  const auto plain = spmm_auto_candidates({});
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(plain[0].kind, SpmmKind::kGar);  // timed first, and wins ties
  EXPECT_TRUE(candidate(plain, SpmmKind::kGar).excluded.empty());
  EXPECT_TRUE(candidate(plain, SpmmKind::kGas).excluded.empty());
  EXPECT_NE(candidate(plain, SpmmKind::kTensorCore).excluded.find("--tf32"), std::string::npos);

  SpmmAutoRules tf32;
  tf32.tf32 = true;
  for (const SpmmCandidate& c : spmm_auto_candidates(tf32)) EXPECT_TRUE(c.excluded.empty()) << spmm_kind_name(c.kind);
}

TEST(SpmmAutoCandidates, DeterministicLeavesGarAlone) {
  SpmmAutoRules rules;
  rules.deterministic = true;
  rules.tf32 = true;
  const auto c = spmm_auto_candidates(rules);
  EXPECT_TRUE(candidate(c, SpmmKind::kGar).excluded.empty());
  EXPECT_NE(candidate(c, SpmmKind::kGas).excluded.find("--deterministic"), std::string::npos);
  EXPECT_NE(candidate(c, SpmmKind::kTensorCore).excluded.find("--deterministic"), std::string::npos);
}

TEST(SpmmAutoCandidates, APlanThatDoesNotFitDoesNotCompete) {
  SpmmAutoRules rules;
  rules.tf32 = true;
  rules.tc_cannot = "its plan (2 GiB) is over half of the 3 GiB the GPU budget leaves";
  const auto c = spmm_auto_candidates(rules);
  EXPECT_EQ(candidate(c, SpmmKind::kTensorCore).excluded, rules.tc_cannot);
  EXPECT_TRUE(candidate(c, SpmmKind::kGas).excluded.empty());
}

TEST(SpmmAutoPick, TheLowestMedianWinsAndOneSlowCallDoesNotDecide) {
  EXPECT_DOUBLE_EQ(spmm_median_ms({3.0f, 1.0f, 2.0f}), 2.0);
  EXPECT_DOUBLE_EQ(spmm_median_ms({4.0f, 1.0f, 2.0f, 3.0f}), 2.5);
  // GAR's mean is the lowest but one call of GAS stalled: the medians say GAS.
  EXPECT_EQ(spmm_auto_pick(timed({{SpmmKind::kGar, {1.2f, 1.2f, 1.2f}},
                                  {SpmmKind::kGas, {1.0f, 9.0f, 1.0f}},
                                  {SpmmKind::kTensorCore, {1.5f, 1.4f, 1.6f}}})),
            SpmmKind::kGas);
  EXPECT_EQ(spmm_auto_pick(timed({{SpmmKind::kGar, {2.0f, 2.0f, 2.0f}},
                                  {SpmmKind::kGas, {2.5f, 2.5f, 2.5f}},
                                  {SpmmKind::kTensorCore, {1.9f, 1.94f, 2.0f}}})),
            SpmmKind::kTensorCore);
}

TEST(SpmmAutoPick, ATieGoesToGarAndAnExcludedKernelNeverWins) {
  EXPECT_EQ(spmm_auto_pick(timed({{SpmmKind::kGar, {1.0f}}, {SpmmKind::kGas, {1.0f}}})), SpmmKind::kGar);
  auto c = timed({{SpmmKind::kGar, {2.0f}}, {SpmmKind::kGas, {1.0f}}});
  c[1].excluded = "--deterministic";
  EXPECT_EQ(spmm_auto_pick(c), SpmmKind::kGar);
  c[0].excluded = "nothing competes";
  EXPECT_THROW(spmm_auto_pick(c), InternalError);
  EXPECT_THROW(spmm_auto_pick(timed({{SpmmKind::kGar, {}}})), InternalError);  // competing, never timed
}

// The calls a measurement makes: per competing candidate a warm-up and kSpmmAutoRuns timed calls,
// then the winner's once more unless its timed call was the last (the output is then its result).
TEST(SpmmAutoMeasure, TimesEachCompetitorAndEndsWithTheWinnersCall) {
  const std::vector<std::pair<SpmmKind, float>> speeds = {
      {SpmmKind::kGar, 2.0f}, {SpmmKind::kGas, 1.0f}, {SpmmKind::kTensorCore, 3.0f}};
  const auto ms_of = [&](SpmmKind k) {
    for (const auto& [kind, ms] : speeds)
      if (kind == k) return ms;
    return 0.0f;
  };
  std::vector<std::string> calls;
  const auto run = [&](SpmmKind k) { calls.push_back(std::string("run ") + spmm_kind_name(k)); };
  const auto time = [&](SpmmKind k) {
    calls.push_back(std::string("time ") + spmm_kind_name(k));
    return ms_of(k);
  };
  std::vector<SpmmCandidate> c = spmm_auto_candidates({});  // tc excluded: never called
  EXPECT_EQ(spmm_auto_measure(&c, run, time), SpmmKind::kGas);
  const std::vector<std::string> want = {"run gar", "time gar", "time gar", "time gar",
                                         "run gas", "time gas", "time gas", "time gas"};
  EXPECT_EQ(calls, want);  // GAS won and its timed call was the last: no extra call
  EXPECT_EQ(candidate(c, SpmmKind::kGar).ms, std::vector<float>(kSpmmAutoRuns, 2.0f));
  EXPECT_TRUE(candidate(c, SpmmKind::kTensorCore).ms.empty());

  calls.clear();
  SpmmAutoRules tf32;
  tf32.tf32 = true;
  c = spmm_auto_candidates(tf32);
  EXPECT_EQ(spmm_auto_measure(&c, run, time), SpmmKind::kGas);
  ASSERT_EQ(calls.size(), 3u * (1 + kSpmmAutoRuns) + 1);
  EXPECT_EQ(calls.back(), "run gas");  // tc was timed last: the winner runs once more
}

TEST(SpmmAutoChoice, TextNamesEveryCandidateAndTheWinner) {
  SpmmAutoChoice choice;
  choice.transpose = true;
  choice.width = 64;
  choice.kind = SpmmKind::kGas;
  choice.candidates = spmm_auto_candidates({});
  choice.candidates[0].ms = {2.0f, 2.5f, 2.25f};
  choice.candidates[1].ms = {1.0f, 1.0f, 1.0f};
  EXPECT_EQ(choice.key(), "csc:64");
  EXPECT_EQ(choice.text(),
            "spmm auto: csc:64: gar 2.250 ms, gas 1.000 ms -> gas (not timed: tc: computes in TF32: competes with "
            "--tf32)");
}

// On the CPU there is one kernel: auto runs it, measures nothing and records no choice.
TEST(SpmmAuto, ACpuOperandRunsTheCpuKernelUnmeasured) {
  const int64_t n = 50, width = 5;
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> indices;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t k = 0; k < r % 4; ++k)
      indices.push_back(static_cast<int32_t>(kernels::random_below(5, static_cast<uint64_t>(r * 4 + k), n)));
    indptr.push_back(static_cast<int64_t>(indices.size()));
  }
  const GraphOperand g({n, n, indptr.data(), indices.data(), nullptr});
  EXPECT_FALSE(spmm_auto_measures(g));
  std::vector<float> x(static_cast<size_t>(n * width)), got(x.size()), want(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = kernels::random_uniform(6, i) - 0.5f;
  kernels::SpmmArgs a;
  a.graph = g.csr();
  a.nnz = g.nnz();
  a.x = {x.data(), n, width, width};
  a.self_scale = 1.5f;
  a.out = {want.data(), n, width, width};
  kernels::spmm_cpu(a);
  a.out = {got.data(), n, width, width};
  ops::ExecOptions exec;
  exec.tf32 = true;
  spmm_auto(g, /*csc=*/false, a, exec);
  EXPECT_EQ(got, want);
  EXPECT_TRUE(spmm_auto_choices(g.id()).empty());
}

}  // namespace
}  // namespace gale::engine
