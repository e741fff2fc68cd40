// kernels/random.hpp's reproducible logarithm and exponential variates (weighted sampling compares
// them across CPU and GPU, so they avoid libm): close to std::log, exact where it must be, and the
// variates have the Exponential(1) mean and tail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "kernels/random.hpp"

namespace gale::kernels {
namespace {

TEST(ReproducibleLog, MatchesStdLogToAFewUlps) {
  double worst = 0;
  for (uint64_t i = 0; i < 200000; ++i) {
    const double u = (static_cast<double>(random_bits(3, i) >> 12) + 0.5) * 0x1p-52;
    const double want = std::log(u);
    worst = std::max(worst, std::fabs(reproducible_log(u) - want) / std::fabs(want));
  }
  for (double x : {0x1p-52, 0.25, 0.5, 0.70710678118654746, 0.70710678118654757, 0.9, 1.0 - 0x1p-53}) {
    const double want = std::log(x);
    worst = std::max(worst, std::fabs(reproducible_log(x) - want) / std::fabs(want));
  }
  EXPECT_LT(worst, 4e-16);
  EXPECT_EQ(reproducible_log(1.0), 0.0);
  EXPECT_EQ(reproducible_log(0.5), -0x1.62e42fefa39efp-1);
}

TEST(RandomExponential, IsPositiveWithUnitMeanAndExponentialTail) {
  const int n = 400000;
  double sum = 0;
  int above_3 = 0;
  for (int i = 0; i < n; ++i) {
    const double x = random_exponential(11, static_cast<uint64_t>(i));
    ASSERT_GT(x, 0.0);
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    above_3 += x > 3.0;
  }
  EXPECT_NEAR(sum / n, 1.0, 5 * 1.0 / std::sqrt(n));           // sd of the mean is 1 / sqrt(n)
  const double p = std::exp(-3.0);
  EXPECT_NEAR(static_cast<double>(above_3) / n, p, 5 * std::sqrt(p * (1 - p) / n));
}

// The pre-test is never wrong: as the weighted sampler uses it (x = t w for its threshold t and an
// entry's weight w), when it rules an entry out, the entry's priority e / w does reach t. And it
// rules most entries out at small thresholds.
TEST(RandomExponential, AtLeastIsNeverWrongAndUsuallyDecides) {
  const int n = 200000;
  for (const double x0 : {0.0, 1e-12, 1e-9, 1e-6, 1e-3, 0.05, 0.7, 1.0, 3.0, 40.0, 300.0}) {
    for (const float w : {1e-3f, 0.37f, 1.0f, 7.5f, 1e4f}) {
      const double t = x0 / static_cast<double>(w);
      const double x = t * static_cast<double>(w);
      int decided = 0;
      for (int i = 0; i < n; ++i) {
        if (!random_exponential_at_least(5, static_cast<uint64_t>(i), x)) continue;
        ++decided;
        ASSERT_GE(random_exponential(5, static_cast<uint64_t>(i)) / static_cast<double>(w), t) << x0 << " " << w << " " << i;
      }
      // P(decided) = P(u <= 1 - x) = 1 - x for x <= 1, else 0.
      if (x0 <= 1.0) EXPECT_NEAR(static_cast<double>(decided) / n, 1.0 - x0, 0.01) << x0;
      if (x0 > 1.0) EXPECT_EQ(decided, 0) << x0;
    }
  }
}

}  // namespace
}  // namespace gale::kernels
