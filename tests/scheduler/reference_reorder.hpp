// tests/scheduler/reference_reorder.hpp — a plain, obviously correct Algorithm 1 (FastGL,
// ASPLOS'24) and the random windows the scheduler tests draw.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <set>
#include <vector>

#include "kernels/random.hpp"

namespace gale::scheduler::testing {

using NodeSets = std::vector<std::vector<int64_t>>;

inline int64_t reference_overlap(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const std::set<int64_t> sa(a.begin(), a.end()), sb(b.begin(), b.end());
  std::vector<int64_t> common;
  std::set_intersection(sa.begin(), sa.end(), sb.begin(), sb.end(), std::back_inserter(common));
  return static_cast<int64_t>(common.size());
}

inline int64_t reference_distinct(const std::vector<int64_t>& a) {
  return static_cast<int64_t>(std::set<int64_t>(a.begin(), a.end()).size());
}

// The full match-degree matrix M, then: start with batch 0, repeatedly append the unvisited batch
// of highest M with the last appended one (strictly higher, so the lowest index wins ties).
inline std::vector<int> reference_algorithm1(const NodeSets& window) {
  const size_t n = window.size();
  std::vector<std::vector<double>> m(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      const int64_t smaller = std::min(reference_distinct(window[i]), reference_distinct(window[j]));
      m[i][j] = smaller == 0 ? 0.0 : static_cast<double>(reference_overlap(window[i], window[j])) / smaller;
    }
  std::vector<int> order;
  if (n == 0) return order;
  std::vector<bool> visited(n, false);
  order.push_back(0);
  visited[0] = true;
  size_t z = 0;
  for (size_t step = 1; step < n; ++step) {
    int h = -1;
    double best = -1.0;
    for (size_t k = 0; k < n; ++k)
      if (!visited[k] && m[z][k] > best) {
        best = m[z][k];
        h = static_cast<int>(k);
      }
    order.push_back(h);
    visited[h] = true;
    z = static_cast<size_t>(h);
  }
  return order;
}

inline int64_t reference_reuse(const NodeSets& window, const std::vector<int>& order,
                               const std::vector<int64_t>* carried_in = nullptr) {
  int64_t total = 0;
  if (!order.empty() && carried_in) total += reference_overlap(*carried_in, window[order[0]]);
  for (size_t t = 1; t < order.size(); ++t) total += reference_overlap(window[order[t - 1]], window[order[t]]);
  return total;
}

inline std::vector<int> identity_order(size_t n) {
  std::vector<int> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<int>(i);
  return order;
}

// A window of n node sets over ids [0, universe): fresh random sets, near-copies of an earlier
// set (planted high-overlap pairs), exact copies (ties at M = 1), small subsets (M = 1 at a small
// overlap), and empty sets; unsorted, with occasional duplicate ids.
inline NodeSets random_window(kernels::CounterRng& rng, int n, int64_t universe) {
  NodeSets sets(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    std::vector<int64_t>& s = sets[static_cast<size_t>(i)];
    const uint64_t kind = i == 0 ? 0 : rng.below(6);
    const std::vector<int64_t>& earlier = sets[i == 0 ? 0 : rng.below(static_cast<uint64_t>(i))];
    if (kind == 0 || kind == 1) {
      const uint64_t size = rng.below(40);
      for (uint64_t k = 0; k < size; ++k) s.push_back(static_cast<int64_t>(rng.below(static_cast<uint64_t>(universe))));
    } else if (kind == 2 || kind == 3) {   // planted: keep most of an earlier set, add a few
      for (int64_t v : earlier)
        if (rng.below(10) < 8) s.push_back(v);
      const uint64_t extra = rng.below(8);
      for (uint64_t k = 0; k < extra; ++k) s.push_back(static_cast<int64_t>(rng.below(static_cast<uint64_t>(universe))));
    } else if (kind == 4) {
      s = earlier;
    } else if (rng.below(3) != 0) {   // a small subset of an earlier set
      for (int64_t v : earlier)
        if (rng.below(4) == 0) s.push_back(v);
    }   // else: empty
    for (size_t k = s.size(); k > 1; --k) std::swap(s[k - 1], s[rng.below(k)]);
  }
  return sets;
}

}  // namespace gale::scheduler::testing
