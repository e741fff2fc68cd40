// tests/gpu/expect_close.hpp — the GPU suites' comparison of a kernel's output with its CPU
// reference when the two may round differently (another order of additions, atomics).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace gale::testing {

// Element-wise |gpu - cpu| <= rel * |scale[i]| + floor, where floor = rel * 1e-2 * max |cpu|
// absorbs sums that cancel to near zero. NaN on the GPU side always fails. For a sum, scale[i] may
// be the same sum over its terms' absolute values: a sum whose terms cancel may round to a large
// relative error in either order of additions, but never to a large one against the terms it adds.
inline void expect_close_to_sum(const std::vector<float>& gpu, const std::vector<float>& cpu,
                                const std::vector<float>& scale, float rel, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  ASSERT_EQ(scale.size(), cpu.size()) << what;
  float largest = 0.0f;
  for (float c : cpu) largest = std::max(largest, std::fabs(c));
  const float floor = rel * 1e-2f * largest;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const bool ok = !std::isnan(gpu[i]) && std::fabs(gpu[i] - cpu[i]) <= rel * std::fabs(scale[i]) + floor;
    if (!ok && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << gpu.size() << " differ; first at " << first << ": gpu "
                     << (bad ? gpu[first] : 0.0f) << " cpu " << (bad ? cpu[first] : 0.0f) << " scale "
                     << (bad ? scale[first] : 0.0f);
}

// Element-wise |gpu - cpu| <= rel * |cpu| + floor (GAT's grad_er sums alpha * (ga - w), which is 0
// in exact arithmetic when all scores are positive: the floor takes it).
inline void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, float rel,
                         const std::string& what) {
  expect_close_to_sum(gpu, cpu, cpu, rel, what);
}

}  // namespace gale::testing
