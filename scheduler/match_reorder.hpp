// scheduler/match_reorder.hpp — FastGL's Match and greedy Reorder (ASPLOS'24, section 4.1).
//
// Match: before a batch's input features are loaded, the nodes it shares with the previous batch
// (whose features are already on the device) are reused, so only the rest travel. Reorder
// (Algorithm 1): within a window of n sampled batches, train them in a greedy order that puts
// batches sharing many nodes next to each other, so the match finds more.
//
// A batch's node set is the global ids whose features it reads (SampledBatch::input_nodes()).
// Functions here accept node sets in any order; duplicates count once.
//
// Algorithm 1, as implemented (greedy_reorder):
//   M_ij = |N_i ∩ N_j| / min(|N_i|, |N_j|)   (0 when either set is empty)
//   order = [0]; repeat: append the unvisited batch k of highest M_zk, z the last appended.
// Ties go to the lowest index (the earliest sampled batch), so a window with no overlap at all
// keeps its sampled order. M is compared exactly (as fractions), not in floating point. The
// paper's line 9 zeroes the rows of visited batches so they are never picked again; here they are
// skipped outright, which is the same thing without its corner case (a row of zeros whose argmax
// would be a visited batch).
//
// The guard (match_reorder_window, MatchReorder): Algorithm 1 maximises the match degree, a ratio,
// one step at a time; the match saves absolute nodes summed over the whole order, so the greedy
// order can reuse fewer nodes than the sampled one. A window whose greedy order reuses fewer
// nodes than its sampled order keeps the sampled order, so the reorder never reuses fewer nodes
// than sampling order would in any window (ties keep the greedy order). Both orders start with the
// window's first batch, so the reuse carried in from the previous window's last batch is the same
// for both and the comparison is fair.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace gale::scheduler {

// The distinct ids of `ids`, sorted ascending (the form the overlap counts work on). Returns the
// input itself, untouched, when it already is strictly increasing.
std::vector<int64_t> make_node_set(std::vector<int64_t> ids);

// |a ∩ b| for two strictly increasing arrays: a merge, or galloping through the larger one when
// the sizes differ by much.
int64_t sorted_overlap(const int64_t* a, int64_t na, const int64_t* b, int64_t nb);

// The match: how many of `next`'s nodes are already loaded, having been in `previous`.
int64_t reused_nodes(const std::vector<int64_t>& previous, const std::vector<int64_t>& next);

// Total reuse when the batches run in `order` (a permutation of 0..n-1): the sum of reused_nodes
// over consecutive batches, plus the first batch's reuse from `carried_in` (the previous window's
// last batch) when given. Throws InputError when `order` is not a permutation.
int64_t reuse_of_order(const std::vector<std::vector<int64_t>>& node_sets, const std::vector<int>& order,
                       const std::vector<int64_t>* carried_in = nullptr);

// Algorithm 1 on a window whose overlaps are known: sizes[i] = |N_i|, overlaps[i * n + j] =
// |N_i ∩ N_j| (n = sizes.size(); the diagonal is not read).
std::vector<int> greedy_order(const std::vector<int64_t>& sizes, const std::vector<int64_t>& overlaps);

// Algorithm 1 on a window of node sets; the pairwise overlaps are counted in parallel. The
// result is deterministic (it does not depend on thread count or scheduling).
std::vector<int> greedy_reorder(const std::vector<std::vector<int64_t>>& node_sets);

// A window's training order after the guard, with the reuse of both orders.
struct WindowOrder {
  std::vector<int> order;       // positions in the window (0 = first sampled), training order
  bool greedy = true;           // false: the greedy order reused fewer nodes; sampled order kept
  int64_t reused = 0;           // reuse_of_order(order), counting the carried-in batch
  int64_t reused_sampled = 0;   // reuse_of_order(0, 1, ..., n-1), counting the carried-in batch
};

// Greedy order of a window, or its sampled order where the greedy one reuses fewer nodes.
WindowOrder match_reorder_window(const std::vector<std::vector<int64_t>>& node_sets,
                                 const std::vector<int64_t>* carried_in = nullptr);

// What the match expects to save over an epoch; bytes saved = reused * feature row bytes.
struct ReuseCounts {
  int64_t batches = 0;
  int64_t nodes = 0;                  // node-set sizes summed over the batches (load everything)
  int64_t reused = 0;                 // nodes found in the previous batch, in the released order
  int64_t reused_sampled_order = 0;   // the same had every batch kept its sampled order (match alone)
  int64_t windows = 0;                // windows released (the last may be partial)
  int64_t windows_kept_sampled = 0;   // windows where the guard kept the sampled order

  int64_t loaded() const { return nodes - reused; }
};

// The node sets of one window and their pairwise overlaps, grown one batch at a time: each new
// set is intersected with those already in (in parallel), so the work is spread over the window's
// arrivals and releasing it is only Algorithm 1 on a small matrix. Remembers the last batch
// released and the last in sampled order across windows, for the reuse carried in.
class MatchWindow {
 public:
  explicit MatchWindow(int capacity);   // capacity <= 1: every batch is a window of its own

  int capacity() const { return capacity_; }
  int size() const { return static_cast<int>(sets_.size()); }
  bool full() const { return size() >= capacity_; }

  // Adds the next batch in sampled order; `node_set` in any order (made a set here unless it
  // already is one). Throws InternalError when the window is full.
  void add(std::vector<int64_t> node_set);
  // The window's training order (positions in arrival order, after the guard); updates `counts`
  // and the carried-in batch, and empties the window. An empty window returns an empty order.
  std::vector<int> release(ReuseCounts& counts);

 private:
  using Set = std::shared_ptr<const std::vector<int64_t>>;
  int capacity_;
  std::vector<Set> sets_;
  std::vector<int64_t> overlaps_;          // capacity x capacity, rows of the batches added so far
  Set carried_, carried_sampled_;          // last released batch, last batch in sampled order
  int64_t carried_in_first_ = 0;           // |carried_ ∩ first of this window|
  int64_t carried_sampled_in_first_ = 0;   // |carried_sampled_ ∩ first of this window|
};

// A pipeline stage's view of match-reorder: batches go in one by one in sampled order, with their
// node sets, and come out in windows, reordered. Item is any movable payload (the pipeline passes
// its prepared batches). Window 0 or 1 passes every batch straight through, in order, and still
// counts the match's reuse. Every batch pushed comes out exactly once, provided flush() is
// called after the last push.
template <typename Item>
class MatchReorder {
 public:
  explicit MatchReorder(int window) : window_(window) { items_.reserve(static_cast<size_t>(window_.capacity())); }

  int window() const { return window_.capacity(); }
  int buffered() const { return static_cast<int>(items_.size()); }
  const ReuseCounts& counts() const { return counts_; }

  // Adds the next batch; returns the batches released by it, in training order: none while a
  // window fills, the whole window once it is full.
  std::vector<Item> push(Item item, std::vector<int64_t> node_set) {
    window_.add(std::move(node_set));
    items_.push_back(std::move(item));
    if (!window_.full()) return {};
    return release();
  }

  // Releases the last, partial window (nothing when the epoch's batch count filled every window).
  std::vector<Item> flush() { return release(); }

 private:
  std::vector<Item> release() {
    const std::vector<int> order = window_.release(counts_);
    std::vector<Item> out;
    out.reserve(order.size());
    for (int i : order) out.push_back(std::move(items_[static_cast<size_t>(i)]));
    items_.clear();
    return out;
  }

  MatchWindow window_;
  std::vector<Item> items_;   // arrival (sampled) order
  ReuseCounts counts_;
};

}  // namespace gale::scheduler
