// METIS k-way and LDG streaming partitioning (see partition.hpp for when each runs).
#include "storage/partition.hpp"

#include <metis.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <utility>

#include "kernels/error.hpp"

namespace gale::storage {

namespace {

// METIS indexes its arrays with idx_t; Debian's libmetis is built with 32-bit idx_t.
constexpr int64_t kMetisMaxIndex = static_cast<int64_t>(std::numeric_limits<idx_t>::max());

// METIS's default imbalance for k-way (ufactor 30 = 3 %); part_capacity() uses the same slack.
constexpr int64_t kImbalancePerMille = 30;

// Rows must be ascending for the reverse-edge lookups below; a store's always are (the EdgeSorter
// writes them so), other callers may hand anything. Also rejects ids outside the graph.
bool rows_ascending(const kernels::CsrView& g) {
  bool sorted = true;
  for (int64_t d = 0; d < g.rows; ++d) {
    for (int64_t k = g.indptr[d]; k < g.indptr[d + 1]; ++k) {
      const int32_t s = g.indices[k];
      if (s < 0 || s >= g.rows)
        throw InputError("--partitions: the graph has an edge from node " + std::to_string(s) + " into node " +
                         std::to_string(d) + ", outside its " + std::to_string(g.rows) + " nodes");
      if (k > g.indptr[d] && s < g.indices[k - 1]) sorted = false;
    }
  }
  return sorted;
}

bool has_entry(const kernels::CsrView& g, int64_t row, int32_t col) {
  return std::binary_search(g.indices + g.indptr[row], g.indices + g.indptr[row + 1], col);
}

// Calls visit(u, v) once for every undirected pair {u, v}, u != v, joined by an entry in either
// direction: entry (d, s) is visited as (d, s), and as (s, d) as well unless row s holds d (then
// row s's own visit covers it). Rows must be ascending; duplicates in a row are skipped.
template <typename Visit>
void for_each_symmetric_entry(const kernels::CsrView& g, Visit&& visit) {
  for (int64_t d = 0; d < g.rows; ++d) {
    int64_t prev = -1;
    for (int64_t k = g.indptr[d]; k < g.indptr[d + 1]; ++k) {
      const int32_t s = g.indices[k];
      if (s == d || s == prev) continue;
      prev = s;
      visit(d, s);
      if (!has_entry(g, s, static_cast<int32_t>(d))) visit(s, d);
    }
  }
}

// The graph with each row sorted, owning its indices.
struct SortedCsr {
  std::vector<int32_t> indices;
  kernels::CsrView view;
};

SortedCsr sorted_copy(const kernels::CsrView& g) {
  SortedCsr c;
  c.indices.assign(g.indices, g.indices + g.indptr[g.rows]);
  for (int64_t d = 0; d < g.rows; ++d)
    std::sort(c.indices.begin() + g.indptr[d], c.indices.begin() + g.indptr[d + 1]);
  c.view = g;
  c.view.indices = c.indices.data();
  return c;
}

// Neighbour count of each node in the symmetrised, self-loop-free, duplicate-free graph.
std::vector<int64_t> symmetric_degrees(const kernels::CsrView& g) {
  std::vector<int64_t> degree(static_cast<size_t>(g.rows), 0);
  for_each_symmetric_entry(g, [&](int64_t u, int64_t) { ++degree[u]; });
  return degree;
}

int64_t symmetric_entries(const kernels::CsrView& g) {
  int64_t entries = 0;
  for_each_symmetric_entry(g, [&](int64_t, int64_t) { ++entries; });
  return entries;
}

uint64_t input_bytes(int64_t n, int64_t entries) {
  return static_cast<uint64_t>(n + 1 + entries + n) * sizeof(idx_t);
}

// METIS's peak footprint over its input arrays, measured with getrusage around partition_graph:
// 14x on sbm 200K nodes / 4M entries (8 and 64 parts), 13x on rmat scale 17, 11x on sbm 20K; 16
// leaves a margin.
constexpr uint64_t kMetisFootprintFactor = 16;

// METIS keeps its 3 % imbalance on ordinary graphs but not always when parts approach the node
// count (20 parts of 20 nodes came back as 3 parts). This repair moves nodes out of every part above
// part_capacity(): the nodes with the fewest neighbours inside their part first, each to the part
// with room holding most of its neighbours (ties and no neighbours: the least loaded part). A part
// above capacity implies one below it, so every move has a target; parts within capacity are
// left exactly as METIS made them.
void rebalance(const std::vector<idx_t>& xadj, const std::vector<idx_t>& adjncy, int parts,
               std::vector<int32_t>* part_io) {
  std::vector<int32_t>& part = *part_io;
  const auto n = static_cast<int64_t>(part.size());
  const int64_t capacity = part_capacity(n, parts);
  std::vector<int64_t> size(static_cast<size_t>(parts), 0);
  for (const int32_t q : part) ++size[q];
  if (*std::max_element(size.begin(), size.end()) <= capacity) return;
  std::vector<std::pair<int64_t, int64_t>> movable;  // (neighbours inside its part, node)
  for (int64_t v = 0; v < n; ++v) {
    if (size[part[v]] <= capacity) continue;
    int64_t inside = 0;
    for (idx_t k = xadj[v]; k < xadj[v + 1]; ++k) inside += part[adjncy[k]] == part[v];
    movable.push_back({inside, v});
  }
  std::sort(movable.begin(), movable.end());
  std::set<std::pair<int64_t, int32_t>> by_size;
  for (int32_t q = 0; q < parts; ++q) by_size.insert({size[q], q});
  std::vector<int64_t> neighbours(static_cast<size_t>(parts), 0);
  std::vector<int32_t> touched;
  for (const auto& [inside, v] : movable) {
    const int32_t from = part[v];
    if (size[from] <= capacity) continue;
    for (idx_t k = xadj[v]; k < xadj[v + 1]; ++k) {
      const int32_t q = part[adjncy[k]];
      if (neighbours[q]++ == 0) touched.push_back(q);
    }
    int32_t to = by_size.begin()->second;
    int64_t to_neighbours = neighbours[to];
    for (const int32_t q : touched) {
      if (size[q] < capacity &&
          (neighbours[q] > to_neighbours || (neighbours[q] == to_neighbours && size[q] < size[to]))) {
        to = q;
        to_neighbours = neighbours[q];
      }
    }
    for (const int32_t q : touched) neighbours[q] = 0;
    touched.clear();
    for (const int32_t q : {from, to}) by_size.erase({size[q], q});
    --size[from];
    ++size[to];
    for (const int32_t q : {from, to}) by_size.insert({size[q], q});
    part[v] = to;
  }
}

std::vector<int32_t> metis_partition(const kernels::CsrView& g, const std::vector<int64_t>& degree, int64_t entries,
                                     int parts, uint64_t seed) {
  const int64_t n = g.rows;
  std::vector<idx_t> xadj(static_cast<size_t>(n + 1), 0);
  for (int64_t v = 0; v < n; ++v) xadj[v + 1] = xadj[v] + static_cast<idx_t>(degree[v]);
  // One spare slot: METIS is handed a valid pointer even for a graph without edges.
  std::vector<idx_t> adjncy(static_cast<size_t>(entries) + 1);
  std::vector<idx_t> fill(xadj.begin(), xadj.end() - 1);
  for_each_symmetric_entry(g, [&](int64_t u, int64_t v) { adjncy[fill[u]++] = static_cast<idx_t>(v); });
  fill = {};

  idx_t nvtxs = static_cast<idx_t>(n), ncon = 1, nparts = parts, objval = 0;
  idx_t options[METIS_NOPTIONS];
  METIS_SetDefaultOptions(options);
  options[METIS_OPTION_OBJTYPE] = METIS_OBJTYPE_CUT;
  options[METIS_OPTION_NUMBERING] = 0;
  // METIS takes a non-negative idx_t seed; fold the 64-bit one into it.
  options[METIS_OPTION_SEED] = static_cast<idx_t>((seed ^ (seed >> 32)) & 0x7fffffff);
  std::vector<idx_t> part(static_cast<size_t>(n));
  const int rc = METIS_PartGraphKway(&nvtxs, &ncon, xadj.data(), adjncy.data(), nullptr, nullptr, nullptr, &nparts,
                                     nullptr, nullptr, options, &objval, part.data());
  if (rc == METIS_ERROR_MEMORY)
    throw ResourceError("--partitions: METIS ran out of memory on " + std::to_string(n) + " nodes and " +
                        std::to_string(entries) + " adjacency entries (a smaller --mem-budget selects the streaming "
                        "partitioner)");
  if (rc != METIS_OK)
    throw InternalError("--partitions: METIS_PartGraphKway failed (code " + std::to_string(rc) + ") on " +
                        std::to_string(n) + " nodes and " + std::to_string(entries) + " adjacency entries");
  std::vector<int32_t> result(part.begin(), part.end());
  rebalance(xadj, adjncy, parts, &result);
  return result;
}

// LDG (Stanton & Kliot 2012, Sec. 3): node v goes to argmax_i |P_i ∩ N(v)| * (1 - |P_i| / C)
// over parts below C = part_capacity(); with no placed neighbour (or all their parts full) to the
// least loaded part, lowest index first. Only v's row is read (its in-neighbours), so one pass over the CSR suffices.
std::vector<int32_t> ldg_partition(const kernels::CsrView& g, int parts) {
  const int64_t n = g.rows;
  const int64_t capacity = part_capacity(n, parts);
  std::vector<int32_t> part(static_cast<size_t>(n), -1);
  std::vector<int64_t> size(static_cast<size_t>(parts), 0), placed_neighbours(static_cast<size_t>(parts), 0);
  std::vector<int32_t> touched;
  std::set<std::pair<int64_t, int32_t>> by_size;  // (size, part): the least loaded part first
  for (int32_t i = 0; i < parts; ++i) by_size.insert({0, i});
  const double inv_capacity = 1.0 / static_cast<double>(capacity);
  for (int64_t v = 0; v < n; ++v) {
    for (int64_t k = g.indptr[v]; k < g.indptr[v + 1]; ++k) {
      const int32_t s = g.indices[k];
      if (s == v) continue;
      const int32_t q = part[s];
      if (q < 0) continue;
      if (placed_neighbours[q]++ == 0) touched.push_back(q);
    }
    int32_t best = -1;
    double best_score = 0;
    for (const int32_t q : touched) {
      if (size[q] < capacity) {
        const double score =
            static_cast<double>(placed_neighbours[q]) * (1.0 - static_cast<double>(size[q]) * inv_capacity);
        if (best < 0 || score > best_score ||
            (score == best_score && (size[q] < size[best] || (size[q] == size[best] && q < best)))) {
          best = q;
          best_score = score;
        }
      }
      placed_neighbours[q] = 0;
    }
    touched.clear();
    if (best < 0) best = by_size.begin()->second;
    by_size.erase({size[best], best});
    ++size[best];
    by_size.insert({size[best], best});
    part[v] = best;
  }
  return part;
}

}  // namespace

int64_t part_capacity(int64_t num_nodes, int parts) {
  const int64_t p = parts;
  return std::max((num_nodes + p - 1) / p, num_nodes * (1000 + kImbalancePerMille) / (p * 1000));
}

uint64_t metis_memory_bytes(kernels::CsrView csr) { return kMetisFootprintFactor * metis_input_bytes(csr); }

uint64_t metis_input_bytes(kernels::CsrView csr) {
  SortedCsr copy;
  if (!rows_ascending(csr)) {
    copy = sorted_copy(csr);
    csr = copy.view;
  }
  return input_bytes(csr.rows, symmetric_entries(csr));
}

std::vector<int32_t> partition_graph(kernels::CsrView csr, int parts, uint64_t mem_budget_bytes, uint64_t seed,
                                     std::string* method) {
  const int64_t n = csr.rows;
  if (parts < 1)
    throw InputError("--partitions: expected a positive part count, found " + std::to_string(parts));
  if (parts > n)
    throw InputError("--partitions: " + std::to_string(parts) + " parts for a graph of " + std::to_string(n) +
                     " nodes; expected at most one part per node");
  if (csr.cols != n)
    throw InputError("--partitions: expected a square adjacency, found " + std::to_string(n) + " x " +
                     std::to_string(csr.cols));
  if (parts == 1) {
    if (method) *method = "single";
    return std::vector<int32_t>(static_cast<size_t>(n), 0);
  }
  SortedCsr copy;
  if (!rows_ascending(csr)) {
    copy = sorted_copy(csr);
    csr = copy.view;
  }
  // The exact symmetrised size decides between METIS and LDG: a symmetric store (every generated
  // graph, every --undirected import) needs half of what counting both directions would suggest.
  // Counted without a per-node array, so the streaming path holds nothing but its part array.
  const int64_t entries = symmetric_entries(csr);
  const uint64_t metis_bytes = kMetisFootprintFactor * input_bytes(n, entries);
  if (metis_bytes > mem_budget_bytes) {
    if (method) *method = "ldg";
    return ldg_partition(csr, parts);
  }
  if (entries > kMetisMaxIndex || n > kMetisMaxIndex)
    throw InputError("--partitions: the symmetrised graph has " + std::to_string(entries) +
                     " adjacency entries; this libmetis indexes with " + std::to_string(8 * sizeof(idx_t)) +
                     "-bit idx_t and takes at most " + std::to_string(kMetisMaxIndex) +
                     " (a --mem-budget below " + std::to_string(metis_bytes) +
                     " bytes selects the streaming partitioner)");
  if (method) *method = "metis";
  return metis_partition(csr, symmetric_degrees(csr), entries, parts, seed);
}

int64_t edge_cut(kernels::CsrView csr, const int32_t* part) {
  int64_t cut = 0;
  for (int64_t d = 0; d < csr.rows; ++d)
    for (int64_t k = csr.indptr[d]; k < csr.indptr[d + 1]; ++k) {
      const int32_t s = csr.indices[k];
      cut += s != d && part[s] != part[d];
    }
  return cut;
}

}  // namespace gale::storage
