// kernels/spmm_tc_cpu.cpp — TC-GNN's sparse graph translation (spmm_tc.hpp). The CPU twin of the
// tensor-core SpMM itself is spmm_tc_cpu, in spmm_cpu.cpp beside the general form it rounds.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/error.hpp"
#include "kernels/spmm_tc.hpp"

namespace gale::kernels {

SpmmTcPlan SpmmTcTranslation::view() const {
  SpmmTcPlan p;
  p.windows = windows;
  p.items = static_cast<int64_t>(item_window.size());
  p.window_blocks = window_blocks.data();
  p.block_entries = block_entries.data();
  p.block_src = block_src.data();
  p.entry = entry.data();
  p.slot = slot.data();
  p.item_window = item_window.data();
  p.item_block = item_block.data();
  p.split_windows = split_windows.data();
  p.splits = static_cast<int64_t>(split_windows.size());
  return p;
}

size_t SpmmTcTranslation::bytes() const {
  return sizeof(int32_t) * (window_blocks.size() + block_entries.size() + block_src.size() + entry.size() +
                            slot.size() + item_window.size() + item_block.size() + split_windows.size());
}

double SpmmTcTranslation::density() const {
  const size_t blocks = block_src.size() / kTcBlockCols;
  return blocks == 0 ? 0.0 : static_cast<double>(entry.size()) / (static_cast<double>(blocks) * kTcWindowRows * kTcBlockCols);
}

namespace {

// The plan's ids are 32-bit: rows, columns, entries and slots stay below this.
constexpr int64_t kLimit = int64_t{1} << 31;

// The graph's entry count, after checking that the plan can hold the graph.
int64_t checked_nnz(const CsrView& g) {
  if (g.rows < 0 || g.cols < 0) throw InputError("spmm_tc_translate: the graph has a negative size");
  if (g.rows > 0 && g.indptr[0] != 0) throw InputError("spmm_tc_translate: the graph's entries must start at 0");
  const int64_t nnz = g.rows == 0 ? 0 : g.indptr[g.rows];
  if (g.rows >= kLimit || nnz >= kLimit || g.cols >= kLimit)
    throw InputError("spmm_tc_translate: the tensor-core plan takes fewer than 2^31 rows, columns and entries, not " +
                     std::to_string(g.rows) + " rows and " + std::to_string(nnz) + " entries");
  return nnz;
}

// The first entry of window w (w == windows: the end of the entries).
int64_t first_entry(const CsrView& g, int64_t w) { return g.indptr[std::min(g.rows, w * kTcWindowRows)]; }

// One entry of a window as it is sorted: its column, its position in the CSR, its row in the window.
struct Key {
  int32_t col, pos;
  int row;
};

// Window w's entries sorted by (column, position) into entry and slot; returns its distinct columns.
// scratch: the keys' vector, reused across a thread's windows.
int64_t condense_window(const CsrView& g, int64_t w, std::vector<Key>* scratch, SpmmTcTranslation* t) {
  std::vector<Key>& keys = *scratch;
  keys.clear();
  const int64_t row_end = std::min(g.rows, (w + 1) * kTcWindowRows);
  for (int64_t r = w * kTcWindowRows; r < row_end; ++r) {
    for (int64_t e = g.indptr[r]; e < g.indptr[r + 1]; ++e) {
      const int32_t c = g.indices[e];
      if (c < 0 || c >= g.cols)
        throw InputError("spmm_tc_translate: entry " + std::to_string(e) + " has column " + std::to_string(c) +
                         ", outside [0, " + std::to_string(g.cols) + ")");
      keys.push_back({c, static_cast<int32_t>(e), static_cast<int>(r - w * kTcWindowRows)});
    }
  }
  std::sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) { return a.col != b.col ? a.col < b.col : a.pos < b.pos; });
  int64_t condensed = -1;
  const int64_t base = first_entry(g, w);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i == 0 || keys[i].col != keys[i - 1].col) ++condensed;
    t->entry[static_cast<size_t>(base) + i] = keys[i].pos;
    t->slot[static_cast<size_t>(base) + i] = static_cast<int32_t>(condensed * kTcWindowRows + keys[i].row);
  }
  if ((condensed + 1) * kTcWindowRows >= kLimit)
    throw InputError("spmm_tc_translate: rows " + std::to_string(w * kTcWindowRows) + " to " +
                     std::to_string(row_end - 1) + " have more distinct columns than the plan's slots hold (2^27)");
  return condensed + 1;
}

// Stage 1: each window's entries sorted by (column, position); equal columns share a condensed
// column. A window's entries keep the CSR's range, so windows write disjoint parts of entry and
// slot. Returns each window's distinct columns.
std::vector<int64_t> condense_columns(const CsrView& g, SpmmTcTranslation* t) {
  std::vector<int64_t> distinct(static_cast<size_t>(t->windows));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, t->windows, 64), [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<Key> keys;
    for (int64_t w = range.begin(); w < range.end(); ++w)
      distinct[static_cast<size_t>(w)] = condense_window(g, w, &keys, t);
  });
  return distinct;
}

// Window w's work items, its nb blocks from `first_block` on: one per kTcItemBlocks blocks (an
// empty window is still an item, whose epilogue writes its rows); a window cut in more is a split.
void add_items(int64_t w, int64_t first_block, int64_t nb, SpmmTcTranslation* t) {
  const int64_t items = std::max<int64_t>(1, (nb + kTcItemBlocks - 1) / kTcItemBlocks);
  for (int64_t i = 0; i < items; ++i) {
    t->item_window.push_back(static_cast<int32_t>(w));
    t->item_block.push_back(static_cast<int32_t>(first_block + i * kTcItemBlocks));
  }
  if (items > 1) t->split_windows.push_back(static_cast<int32_t>(w));
}

// Stage 2: blocks per window (a prefix sum) and work items (a window of more than kTcItemBlocks
// blocks is cut). Returns the blocks in all.
int64_t lay_out_blocks(const std::vector<int64_t>& distinct, SpmmTcTranslation* t) {
  t->window_blocks.resize(static_cast<size_t>(t->windows) + 1);
  int64_t blocks = 0;
  for (int64_t w = 0; w < t->windows; ++w) {
    t->window_blocks[static_cast<size_t>(w)] = static_cast<int32_t>(blocks);
    const int64_t nb = (distinct[static_cast<size_t>(w)] + kTcBlockCols - 1) / kTcBlockCols;
    add_items(w, blocks, nb, t);
    blocks += nb;
  }
  t->window_blocks[static_cast<size_t>(t->windows)] = static_cast<int32_t>(blocks);
  return blocks;
}

// Stage 3: each block's first entry and its 8 source ids (-1 past a window's last condensed column).
// Every condensed column has an entry, so each block's first entry is where its first column starts.
void fill_blocks(const CsrView& g, int64_t blocks, int64_t nnz, SpmmTcTranslation* t) {
  t->block_src.assign(static_cast<size_t>(blocks) * kTcBlockCols, -1);
  t->block_entries.resize(static_cast<size_t>(blocks) + 1);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, t->windows, 64), [&](const tbb::blocked_range<int64_t>& range) {
    for (int64_t w = range.begin(); w < range.end(); ++w) {
      const int64_t b0 = t->window_blocks[static_cast<size_t>(w)];
      const int64_t e1 = first_entry(g, w + 1);
      int64_t previous = -1;
      for (int64_t i = first_entry(g, w); i < e1; ++i) {
        const int64_t condensed = t->slot[static_cast<size_t>(i)] / kTcWindowRows;
        t->block_src[static_cast<size_t>(b0 * kTcBlockCols + condensed)] = g.indices[t->entry[static_cast<size_t>(i)]];
        if (condensed / kTcBlockCols != previous) {
          previous = condensed / kTcBlockCols;
          t->block_entries[static_cast<size_t>(b0 + previous)] = static_cast<int32_t>(i);
        }
      }
    }
  });
  t->block_entries[static_cast<size_t>(blocks)] = static_cast<int32_t>(nnz);
}

}  // namespace

SpmmTcTranslation spmm_tc_translate(const CsrView& g) {
  const int64_t nnz = checked_nnz(g);
  SpmmTcTranslation t;
  t.windows = (g.rows + kTcWindowRows - 1) / kTcWindowRows;
  t.entry.resize(static_cast<size_t>(nnz));
  t.slot.resize(static_cast<size_t>(nnz));
  const std::vector<int64_t> distinct = condense_columns(g, &t);
  const int64_t blocks = lay_out_blocks(distinct, &t);
  fill_blocks(g, blocks, nnz, &t);
  return t;
}

}  // namespace gale::kernels
