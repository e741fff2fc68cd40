// kernels/random.hpp — counter-based random numbers.
//
// Every random draw in Gale (weight init, dropout masks, neighbour sampling, shuffles, splits) is
// a pure function of (key, counter), so a run is reproducible regardless of thread count or
// schedule, resuming from a checkpoint needs no RNG state beyond the epoch number, and the CPU and
// CUDA versions of an op can draw the same numbers. The mixer is SplitMix64's finaliser applied
// to a key/counter combination (a well-studied 64-bit bijection with full avalanche).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define GALE_HD __host__ __device__ __forceinline__
#else
#define GALE_HD inline
#endif

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
