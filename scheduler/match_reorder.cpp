#include "scheduler/match_reorder.hpp"

#include <tbb/parallel_for.h>

#include <string>

#include "kernels/error.hpp"

namespace gale::scheduler {
namespace {

bool is_node_set(const std::vector<int64_t>& ids) {
  return std::adjacent_find(ids.begin(), ids.end(), [](int64_t a, int64_t b) { return a >= b; }) == ids.end();
}

// M_zk > M_best, compared as fractions o / m (m = the smaller set's size; an empty set gives 0).
bool higher_match(int64_t o, int64_t m, int64_t best_o, int64_t best_m) {
  if (m == 0) return false;
  if (best_m == 0) return o > 0;
  return static_cast<unsigned __int128>(o) * static_cast<uint64_t>(best_m) >
         static_cast<unsigned __int128>(best_o) * static_cast<uint64_t>(m);
}

int64_t reuse_along(const std::vector<int64_t>& overlaps, int64_t n, const std::vector<int>& order) {
  int64_t total = 0;
  for (size_t t = 1; t < order.size(); ++t) total += overlaps[order[t - 1] * n + order[t]];
  return total;
}

std::vector<int> sampled_order(int n) {
  std::vector<int> order(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) order[i] = i;
  return order;
}

// Algorithm 1 plus the guard, on a window whose overlaps are known. `carried_first` is the
// first batch's reuse from the previous window's last one, shared by both orders.
WindowOrder choose_order(const std::vector<int64_t>& sizes, const std::vector<int64_t>& overlaps,
                         int64_t carried_first) {
  const auto n = static_cast<int64_t>(sizes.size());
  WindowOrder w;
  if (n == 0) return w;
  std::vector<int> greedy = greedy_order(sizes, overlaps);
  std::vector<int> sampled = sampled_order(static_cast<int>(n));
  const int64_t reused_greedy = carried_first + reuse_along(overlaps, n, greedy);
  w.reused_sampled = carried_first + reuse_along(overlaps, n, sampled);
  w.greedy = reused_greedy >= w.reused_sampled;
  w.order = w.greedy ? std::move(greedy) : std::move(sampled);
  w.reused = w.greedy ? reused_greedy : w.reused_sampled;
  return w;
}

// overlaps[i * n + j] for every pair of a window's node sets, one task per pair.
std::vector<int64_t> pairwise_overlaps(const std::vector<const std::vector<int64_t>*>& sets) {
  const auto n = static_cast<int64_t>(sets.size());
  std::vector<int64_t> overlaps(static_cast<size_t>(n * n), 0);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) pairs.emplace_back(i, j);
  tbb::parallel_for(size_t{0}, pairs.size(), [&](size_t p) {
    const auto [i, j] = pairs[p];
    const std::vector<int64_t>& a = *sets[i];
    const std::vector<int64_t>& b = *sets[j];
    const int64_t o = sorted_overlap(a.data(), static_cast<int64_t>(a.size()), b.data(), static_cast<int64_t>(b.size()));
    overlaps[i * n + j] = o;
    overlaps[j * n + i] = o;
  });
  for (int64_t i = 0; i < n; ++i) overlaps[i * n + i] = static_cast<int64_t>(sets[i]->size());
  return overlaps;
}

std::vector<std::vector<int64_t>> make_node_sets(const std::vector<std::vector<int64_t>>& node_sets) {
  std::vector<std::vector<int64_t>> sets(node_sets.size());
  tbb::parallel_for(size_t{0}, node_sets.size(), [&](size_t i) { sets[i] = make_node_set(node_sets[i]); });
  return sets;
}

std::vector<const std::vector<int64_t>*> pointers(const std::vector<std::vector<int64_t>>& sets) {
  std::vector<const std::vector<int64_t>*> p;
  for (const auto& s : sets) p.push_back(&s);
  return p;
}

int64_t overlap(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  return sorted_overlap(a.data(), static_cast<int64_t>(a.size()), b.data(), static_cast<int64_t>(b.size()));
}

}  // namespace

std::vector<int64_t> make_node_set(std::vector<int64_t> ids) {
  if (is_node_set(ids)) return ids;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

int64_t sorted_overlap(const int64_t* a, int64_t na, const int64_t* b, int64_t nb) {
  if (na > nb) {
    std::swap(a, b);
    std::swap(na, nb);
  }
  if (na == 0) return 0;
  int64_t count = 0;
  // A merge reads both arrays once; galloping costs about 2 log2(nb / na) probes per element of
  // the smaller array, so it pays once the larger is more than ~32 times the smaller.
  if (na * 32 < nb) {
    int64_t pos = 0;
    for (int64_t i = 0; i < na && pos < nb; ++i) {
      const int64_t x = a[i];
      // Invariant: b[pos - 1] < x (every earlier element is below x); double the step from pos
      // until b[lo + step] >= x or the end, then binary search the last step.
      int64_t lo = pos, step = 1;
      while (lo + step < nb && b[lo + step] < x) {
        lo += step;
        step *= 2;
      }
      pos = std::lower_bound(b + lo, b + std::min(lo + step, nb), x) - b;
      if (pos < nb && b[pos] == x) {
        ++count;
        ++pos;
      }
    }
    return count;
  }
  int64_t i = 0, j = 0;
  while (i < na && j < nb) {
    const int64_t x = a[i], y = b[j];
    count += x == y;
    i += x <= y;
    j += y <= x;
  }
  return count;
}

int64_t reused_nodes(const std::vector<int64_t>& previous, const std::vector<int64_t>& next) {
  if (is_node_set(previous) && is_node_set(next)) return overlap(previous, next);
  return overlap(make_node_set(previous), make_node_set(next));
}

int64_t reuse_of_order(const std::vector<std::vector<int64_t>>& node_sets, const std::vector<int>& order,
                       const std::vector<int64_t>* carried_in) {
  std::vector<char> seen(node_sets.size(), 0);
  for (int i : order) {
    if (i < 0 || static_cast<size_t>(i) >= node_sets.size() || seen[i])
      throw InputError("reuse_of_order: the order is not a permutation of the " +
                       std::to_string(node_sets.size()) + " batches (bad or repeated index " + std::to_string(i) + ")");
    seen[i] = 1;
  }
  if (order.size() != node_sets.size())
    throw InputError("reuse_of_order: the order names " + std::to_string(order.size()) + " of " +
                     std::to_string(node_sets.size()) + " batches");
  if (order.empty()) return 0;
  const std::vector<std::vector<int64_t>> sets = make_node_sets(node_sets);
  int64_t total = carried_in ? overlap(make_node_set(*carried_in), sets[order[0]]) : 0;
  for (size_t t = 1; t < order.size(); ++t) total += overlap(sets[order[t - 1]], sets[order[t]]);
  return total;
}

std::vector<int> greedy_order(const std::vector<int64_t>& sizes, const std::vector<int64_t>& overlaps) {
  const auto n = static_cast<int64_t>(sizes.size());
  if (static_cast<int64_t>(overlaps.size()) != n * n)
    throw InputError("greedy_order: expected a " + std::to_string(n) + " x " + std::to_string(n) +
                     " overlap matrix, found " + std::to_string(overlaps.size()) + " entries");
  std::vector<int> order;
  if (n == 0) return order;
  order.reserve(static_cast<size_t>(n));
  std::vector<char> visited(static_cast<size_t>(n), 0);
  int64_t z = 0;   // Algorithm 1 line 4-5: the first sampled batch goes first
  order.push_back(0);
  visited[0] = 1;
  for (int64_t step = 1; step < n; ++step) {
    // Line 7: h = argmax_k M_zk over the unvisited k; the strict comparison keeps the lowest k
    // among equals.
    int64_t h = -1, best_o = 0, best_m = 0;
    for (int64_t k = 0; k < n; ++k) {
      if (visited[k]) continue;
      const int64_t o = overlaps[z * n + k], m = std::min(sizes[z], sizes[k]);
      if (h < 0 || higher_match(o, m, best_o, best_m)) {
        h = k;
        best_o = o;
        best_m = m;
      }
    }
    order.push_back(static_cast<int>(h));
    visited[h] = 1;
    z = h;
  }
  return order;
}

std::vector<int> greedy_reorder(const std::vector<std::vector<int64_t>>& node_sets) {
  const std::vector<std::vector<int64_t>> sets = make_node_sets(node_sets);
  std::vector<int64_t> sizes;
  for (const auto& s : sets) sizes.push_back(static_cast<int64_t>(s.size()));
  return greedy_order(sizes, pairwise_overlaps(pointers(sets)));
}

WindowOrder match_reorder_window(const std::vector<std::vector<int64_t>>& node_sets,
                                 const std::vector<int64_t>* carried_in) {
  const std::vector<std::vector<int64_t>> sets = make_node_sets(node_sets);
  std::vector<int64_t> sizes;
  for (const auto& s : sets) sizes.push_back(static_cast<int64_t>(s.size()));
  const int64_t carried_first = carried_in && !sets.empty() ? overlap(make_node_set(*carried_in), sets[0]) : 0;
  return choose_order(sizes, pairwise_overlaps(pointers(sets)), carried_first);
}

MatchWindow::MatchWindow(int capacity)
    : capacity_(std::max(1, capacity)), overlaps_(static_cast<size_t>(capacity_) * static_cast<size_t>(capacity_), 0) {
  sets_.reserve(static_cast<size_t>(capacity_));
}

void MatchWindow::add(std::vector<int64_t> node_set) {
  if (full()) throw InternalError("MatchWindow::add: the window of " + std::to_string(capacity_) + " is full");
  auto set = std::make_shared<const std::vector<int64_t>>(make_node_set(std::move(node_set)));
  const int i = size();
  if (i == 0) {
    // Both candidate orders start with this batch, so its reuse from the previous window is known now.
    carried_in_first_ = carried_ ? overlap(*carried_, *set) : 0;
    carried_sampled_in_first_ = carried_sampled_ == carried_ ? carried_in_first_
                                : carried_sampled_           ? overlap(*carried_sampled_, *set)
                                                             : 0;
  }
  const int64_t cap = capacity_;
  tbb::parallel_for(0, i, [&](int k) {
    const int64_t o = overlap(*sets_[static_cast<size_t>(k)], *set);
    overlaps_[i * cap + k] = o;
    overlaps_[k * cap + i] = o;
  });
  overlaps_[i * cap + i] = static_cast<int64_t>(set->size());
  sets_.push_back(std::move(set));
}

std::vector<int> MatchWindow::release(ReuseCounts& counts) {
  const int64_t n = size();
  if (n == 0) return {};
  std::vector<int64_t> sizes(static_cast<size_t>(n)), overlaps(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i) {
    sizes[i] = static_cast<int64_t>(sets_[i]->size());
    for (int64_t j = 0; j < n; ++j) overlaps[i * n + j] = overlaps_[i * capacity_ + j];
  }
  WindowOrder w = choose_order(sizes, overlaps, carried_in_first_);
  counts.batches += n;
  for (int64_t s : sizes) counts.nodes += s;
  counts.reused += w.reused;
  counts.reused_sampled_order += w.reused_sampled - carried_in_first_ + carried_sampled_in_first_;
  counts.windows += 1;
  counts.windows_kept_sampled += w.greedy ? 0 : 1;
  carried_ = sets_[static_cast<size_t>(w.order.back())];
  carried_sampled_ = sets_.back();
  sets_.clear();
  return std::move(w.order);
}

}  // namespace gale::scheduler
