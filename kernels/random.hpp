// kernels/random.hpp — counter-based random numbers.
//
// Every random draw in Gale (weight init, dropout masks, neighbour sampling, shuffles, splits) is
// a pure function of (key, counter), so a run is reproducible regardless of thread count or
// schedule, resuming from a checkpoint needs no RNG state beyond the epoch number, and the CPU and
// CUDA versions of an op can draw the same numbers. The mixer is SplitMix64's finaliser applied
// to a key/counter combination (a well-studied 64-bit bijection with full avalanche).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/views.hpp"  // GALE_HD

namespace gale::kernels {

GALE_HD uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A 64-bit random value for (key, counter).
GALE_HD uint64_t random_bits(uint64_t key, uint64_t counter) {
  return mix64(mix64(key) ^ (counter * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL));
}

// Uniform float in [0, 1) with 24 random bits.
GALE_HD float random_uniform(uint64_t key, uint64_t counter) {
  return static_cast<float>(random_bits(key, counter) >> 40) * (1.0f / 16777216.0f);
}

// Uniform integer in [0, n) (n > 0). Lemire's multiply-shift on 32 bits for n < 2^32 (bias below
// 2^-32 per draw); a 64-bit modulo beyond (bias below n / 2^64).
GALE_HD uint64_t random_below(uint64_t key, uint64_t counter, uint64_t n) {
  const uint64_t bits = random_bits(key, counter);
  if (n <= 0xffffffffULL) return ((bits >> 32) * n) >> 32;
  return bits % n;
}

// Natural logarithm of x in (0, 1] with the same bits on the host and the device: x = m 2^e with
// m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) = 2s + 2s z P(z), s = (m - 1) / (m + 1), z = s^2,
// P the atanh series to z^10 (truncation below 1e-17 relative), every multiply-add an explicit
// fma. libm's log and CUDA's may differ in the last bit; frexp, IEEE division and fma do not, and
// no product here is left for a compiler to contract. Accurate to a few ulps.
GALE_HD double reproducible_log(double x) {
  int e = 0;
  double m = frexp(x, &e);  // m in [0.5, 1)
  if (m < 0x1.6a09e667f3bcdp-1) {
    m = m * 2.0;  // exact
    e -= 1;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double z = s * s;
  double p = 0x1.642c8590b2164p-5;          // 1/23
  p = fma(p, z, 0x1.8618618618618p-5);      // 1/21
  p = fma(p, z, 0x1.af286bca1af28p-5);      // 1/19
  p = fma(p, z, 0x1.e1e1e1e1e1e1ep-5);      // 1/17
  p = fma(p, z, 0x1.1111111111111p-4);      // 1/15
  p = fma(p, z, 0x1.3b13b13b13b14p-4);      // 1/13
  p = fma(p, z, 0x1.745d1745d1746p-4);      // 1/11
  p = fma(p, z, 0x1.c71c71c71c71cp-4);      // 1/9
  p = fma(p, z, 0x1.2492492492492p-3);      // 1/7
  p = fma(p, z, 0x1.999999999999ap-3);      // 1/5
  p = fma(p, z, 0x1.5555555555555p-2);      // 1/3
  const double two_s = 2.0 * s;             // exact
  const double two_s_z = two_s * z;
  const double log_m = fma(two_s_z, p, two_s);
  return fma(static_cast<double>(e), 0x1.62e42fefa39efp-1, log_m);  // + e ln 2
}

// An Exponential(1) variate for (key, counter): -ln u with u = (52 random bits + 1/2) / 2^52,
// strictly inside (0, 1), so the result is finite and positive. Bit-identical on host and device
// (reproducible_log), which weighted sampling needs: it compares these values across CPU and GPU.
GALE_HD double random_exponential_uniform(uint64_t key, uint64_t counter) {
  return (static_cast<double>(random_bits(key, counter) >> 12) + 0.5) * 0x1p-52;
}
GALE_HD double random_exponential(uint64_t key, uint64_t counter) {
  return -reproducible_log(random_exponential_uniform(key, counter));
}

// True only when random_exponential(key, counter) >= x + 1e-12 for certain, decided from its
// uniform u alone, without the logarithm: -ln u >= 1 - u, so u <= 1 - x - 1e-12 settles it. The
// 1e-12 covers reproducible_log's few ulps (and a caller's roundings of x / w against t) for x up
// to a few hundred; beyond, 1 - x < 0 and it is never true. A cheap pre-test for a threshold on
// the variate: when false, compute the variate.
GALE_HD bool random_exponential_at_least(uint64_t key, uint64_t counter, double x) {
  return random_exponential_uniform(key, counter) <= 1.0 - x - 1e-12;
}

// Derives a sub-key, e.g. derive_key(seed, epoch) then derive_key(that, layer).
GALE_HD uint64_t derive_key(uint64_t key, uint64_t tag) { return mix64(key ^ mix64(tag + 0x632be59bd9b4e019ULL)); }

// A sequential generator over the same stream, for code that draws many values in order
// (std::shuffle takes it as a UniformRandomBitGenerator).
class CounterRng {
 public:
  using result_type = uint64_t;
  explicit CounterRng(uint64_t key, uint64_t counter = 0) : key_(key), counter_(counter) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~0ULL; }
  result_type operator()() { return random_bits(key_, counter_++); }
  float uniform() { return random_uniform(key_, counter_++); }
  uint64_t below(uint64_t n) { return random_below(key_, counter_++, n); }

 private:
  uint64_t key_;
  uint64_t counter_;
};

}  // namespace gale::kernels
