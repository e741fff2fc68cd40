// storage/partition.hpp — splits a graph's nodes into P parts for multi-GPU training
// (`gale preprocess --partitions P` stores the result as partition.npy).
//
// Two methods, picked by memory:
//   metis  METIS_PartGraphKway (libmetis) on the symmetrised, self-loop-free adjacency:
//          minimum edge cut, node counts balanced within METIS's default ufactor (3 %),
//          seeded with METIS_OPTION_SEED so the same graph and seed give the same parts; where
//          METIS overshoots part_capacity() (it can when parts approach the node count), the
//          fewest-connected nodes of the overfull parts move to parts with room.
//   ldg    Linear deterministic greedy (Stanton & Kliot, "Streaming graph partitioning for
//          large distributed graphs", KDD 2012): one pass over the CSR in node order, each node
//          joining the part holding most of its already-placed in-neighbours, weighted by
//          (1 - size / capacity), capacity part_capacity(). Memory: the part array only.
// METIS is used when its estimated footprint (metis_memory_bytes) fits in the memory budget, LDG
// otherwise. Edge weights are ignored (the cut counts edges).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/views.hpp"

namespace gale::storage {

// The part in [0, parts) of each of the csr.rows nodes. csr is destination-major (rows hold
// in-neighbours) and need not be symmetric, sorted or free of self loops / duplicates.
// `method` (may be null) receives "metis", "ldg", or "single" when parts == 1 (all zeros).
// Throws InputError naming --partitions when parts < 1 or parts > csr.rows, or when the graph
// fits the budget but has 2^31 or more symmetrised entries (METIS's idx_t is 32-bit here);
// ResourceError when METIS runs out of memory.
std::vector<int32_t> partition_graph(kernels::CsrView csr, int parts, uint64_t mem_budget_bytes, uint64_t seed,
                                     std::string* method);

// The most nodes either method puts in one part: max(ceil(N / P), floor(1.03 N / P)).
int64_t part_capacity(int64_t num_nodes, int parts);

// Bytes of the METIS input for csr: (N + 1) offsets, the symmetrised adjacency and N parts, all
// idx_t.
uint64_t metis_input_bytes(kernels::CsrView csr);
// What partition_graph compares with the budget: METIS's peak memory, estimated as 16 x its input
// (its coarsening hierarchy; 11-14x measured, see partition.cpp).
uint64_t metis_memory_bytes(kernels::CsrView csr);

// CSR entries (self loops excluded) whose two ends lie in different parts.
int64_t edge_cut(kernels::CsrView csr, const int32_t* part);

}  // namespace gale::storage
