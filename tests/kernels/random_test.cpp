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

}  // namespace
}  // namespace gale::kernels
