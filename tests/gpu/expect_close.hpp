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

// Element-wise |gpu - cpu| <= rel * |cpu| + floor, where floor = rel * 1e-2 * max |cpu| absorbs
// sums that cancel to near zero (GAT's grad_er sums alpha * (ga - w), which is 0 in exact
// arithmetic when all scores are positive). NaN on the GPU side always fails.
inline void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, float rel,
                         const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  float scale = 0.0f;
  for (float c : cpu) scale = std::max(scale, std::fabs(c));
  const float floor = rel * 1e-2f * scale;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const bool ok = !std::isnan(gpu[i]) && std::fabs(gpu[i] - cpu[i]) <= rel * std::fabs(cpu[i]) + floor;
    if (!ok && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << gpu.size() << " differ; first at " << first << ": gpu "
                     << (bad ? gpu[first] : 0.0f) << " cpu " << (bad ? cpu[first] : 0.0f);
}

}  // namespace gale::testing
