// storage/edge_sorter.hpp — sorts a stream of edges by (destination, source) within a memory
// budget: in memory when the edges fit, else sorted runs on disk and a k-way merge. Every input
// path and every budget gives the same output order, so the same graph always makes the same
// store.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gale::storage {

struct Edge {
  int64_t dst;
  int64_t src;
  float weight;
};

// Total order on edges (dst, src, weight): duplicates sort together, smallest weight first.
inline bool edge_less(const Edge& a, const Edge& b) {
  if (a.dst != b.dst) return a.dst < b.dst;
  if (a.src != b.src) return a.src < b.src;
  return a.weight < b.weight;
}

class EdgeSorter {
 public:
  // `budget` bytes of edges are held in memory; runs spill into a fresh directory under
  // `temp_parent` that is removed when the sorter is destroyed.
  EdgeSorter(uint64_t budget, std::filesystem::path temp_parent);
  ~EdgeSorter();
  EdgeSorter(const EdgeSorter&) = delete;
  EdgeSorter& operator=(const EdgeSorter&) = delete;

  void add(int64_t src, int64_t dst, float weight) {
    buffer_.push_back({dst, src, weight});
    ++added_;
    if (buffer_.size() >= capacity_) spill();
  }
  int64_t added() const { return added_; }
  int64_t runs() const { return static_cast<int64_t>(runs_.size()); }

  // Calls `emit` for every edge in sorted order; with `dedup`, repeated (dst, src) pairs are
  // emitted once (with the smallest weight). `drop_self_loops` skips dst == src. Call once.
  void finish(bool dedup, bool drop_self_loops, const std::function<void(const Edge&)>& emit);

 private:
  void spill();
  std::filesystem::path run_dir();

  uint64_t capacity_;
  std::filesystem::path temp_parent_;
  std::filesystem::path dir_;
  std::vector<Edge> buffer_;
  std::vector<std::filesystem::path> runs_;
  int64_t added_ = 0;
};

}  // namespace gale::storage
