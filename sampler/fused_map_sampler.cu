// sampler/fused_map_sampler.cu — FusedMapSampler's kernels and host loop (see the header for the
// algorithm, FastGL Sec. 4.3 / Algorithm 2).
#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "sampler/fused_map_sampler.hpp"
#include "sampler/neighbor_sampler.hpp"

namespace gale::sampler {

using kernels::cuda::DeviceBuffer;

namespace {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarp;
// Grid cap for the grid-stride kernels: 64K blocks of 256 threads fill a 132-SM GPU many times
// over; larger inputs loop inside the kernels.
constexpr int64_t kMaxBlocks = int64_t{1} << 16;
// Empty hash-table slot: all bits set, i.e. -1, which no node id takes (a memset of 0xff clears).
constexpr unsigned long long kEmpty = ~0ull;
// Largest local id count a hop may need: local ids are int32.
constexpr int64_t kMaxLocalIds = (int64_t{1} << 31) - 1;

// Error bits the kernels raise (device word state[kErrors]); the host turns them into messages.
enum ErrorBit : unsigned long long {
  kNodeOutOfRange = 1,  // a seed (or a graph index) outside [0, rows)
  kRepeatedSeed = 2,    // a seed listed twice
  kHugeRow = 4,         // more than 32 picks from a row of 2^31 or more entries (32-bit offsets)
  kBadWeight = 8,       // a weight that is not positive and finite in a row sampled by weight
};
// The per-call device state: the local id counter, then the error bits.
constexpr int kCounter = 0;
constexpr int kErrors = 1;

unsigned blocks_for(int64_t threads) {
  return static_cast<unsigned>(std::clamp<int64_t>((threads + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// The map: keys[] the global ids (kEmpty = free), values[] their local ids, size 2^log2_size.
struct HashTable {
  unsigned long long* keys = nullptr;
  int32_t* values = nullptr;
  int log2_size = 0;
  unsigned long long mask = 0;
};

// Fibonacci hashing: the top bits of g times 2^64 / phi spread consecutive ids (a frontier is
// often a run of nearby ids) over the whole table.
__device__ __forceinline__ unsigned long long slot_of(const HashTable& t, int64_t g) {
  return (static_cast<unsigned long long>(g) * 0x9e3779b97f4a7c15ull) >> (64 - t.log2_size);
}

// Algorithm 2, InsertID + Fused Map for a sampled source: claims a slot for g by atomicCAS with
// linear probing. Only the thread whose CAS found the slot empty (Flag = False) assigns the local
// id, from the atomicAdd counter, and records g as that local id's global id. A thread that finds
// g already there does nothing; its value may not be written yet, which is why the rewrite is a
// separate kernel.
__device__ __forceinline__ void insert_source(const HashTable& t, int64_t g, unsigned long long* counter,
                                              int64_t* __restrict__ src_ids) {
  const unsigned long long key = static_cast<unsigned long long>(g);
  for (unsigned long long s = slot_of(t, g);; s = (s + 1) & t.mask) {
    // A plain load first: most sampled ids repeat (hubs, the frontier), and a slot once set never
    // changes, so a key seen here is final and needs no atomic. A stale "empty" is settled by the
    // CAS below.
    const unsigned long long seen = t.keys[s];
    if (seen == key) return;
    if (seen != kEmpty) continue;
    const unsigned long long prev = atomicCAS(t.keys + s, kEmpty, key);
    if (prev == kEmpty) {
      const int64_t id = static_cast<int64_t>(atomicAdd(counter, 1ull));
      t.values[s] = static_cast<int32_t>(id);
      src_ids[id] = g;
      return;
    }
    if (prev == key) return;
  }
}

// The counter starts at the seed count (the seeds take local ids 0..n-1), no errors yet. A kernel
// rather than a copy from host memory, which would wait for the stream's earlier work.
__global__ void init_state_kernel(unsigned long long* state, int64_t num_seeds) {
  state[kCounter] = static_cast<unsigned long long>(num_seeds);
  state[kErrors] = 0;
}

// Step 1: take(v) = min(fanout, degree) (degree for fanout -1) for the live frontier entries
// i < n = *counter; 0 for the rest of the capacity and for the scan's extra last item.
__global__ void count_kernel(const int64_t* __restrict__ frontier, int64_t capacity,
                             unsigned long long* __restrict__ state, const int64_t* __restrict__ graph_indptr,
                             int64_t rows, int fanout, int64_t* __restrict__ counts) {
  const int64_t n = static_cast<int64_t>(state[kCounter]);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i <= capacity; i += stride) {
    int64_t take = 0;
    if (i < n) {
      const int64_t v = frontier[i];
      if (v < 0 || v >= rows) {
        atomicOr(state + kErrors, static_cast<unsigned long long>(kNodeOutOfRange));
      } else {
        const int64_t degree = graph_indptr[v + 1] - graph_indptr[v];
        take = (fanout < 0 || degree < fanout) ? degree : static_cast<int64_t>(fanout);
        if (take < degree && take > kWarp && degree > INT32_MAX)
          atomicOr(state + kErrors, static_cast<unsigned long long>(kHugeRow));
      }
    }
    counts[i] = take;
  }
}

// Step 3: the frontier takes local ids 0..n-1 (destinations first, in order) and heads src_ids.
__global__ void insert_frontier_kernel(const int64_t* __restrict__ frontier, int64_t n, HashTable table,
                                       int64_t* __restrict__ src_ids, unsigned long long* __restrict__ state) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t g = frontier[i];
    src_ids[i] = g;
    const unsigned long long key = static_cast<unsigned long long>(g);
    for (unsigned long long s = slot_of(table, g);; s = (s + 1) & table.mask) {
      const unsigned long long prev = atomicCAS(table.keys + s, kEmpty, key);
      if (prev == kEmpty) {
        table.values[s] = static_cast<int32_t>(i);
        break;
      }
      if (prev == key) {
        atomicOr(state + kErrors, static_cast<unsigned long long>(kRepeatedSeed));
        break;
      }
    }
  }
}

struct SampleArgs {
  const int64_t* frontier = nullptr;
  int64_t n = 0;
  const int64_t* graph_indptr = nullptr;
  const int32_t* graph_indices = nullptr;
  const int64_t* block_indptr = nullptr;
  uint64_t hop_key = 0;
  int32_t* scratch = nullptr;      // the block's indices, holding offsets until the rewrite
  int64_t* picked = nullptr;       // sampled global ids, per destination in graph order (null: not kept)
  HashTable table;
  unsigned long long* counter = nullptr;
  int64_t* src_ids = nullptr;
  const float* weights = nullptr;  // the graph's edge weights (weighted mode, or block weights)
  float* picked_weights = nullptr; // the picks' weights, beside `picked` (block weights only)
  unsigned long long* errors = nullptr;
  int64_t rows = 0;
};

// Records pick `at` (its entry in the block) and enters it in the map. A graph index outside
// [0, rows) (a damaged topology) is flagged instead of entered: -1 would read as the empty key, and
// the next hop's count would otherwise be the first to notice, which the last hop does not have.
// With block weights the pick's edge weight (graph entry `entry`) goes beside it. Sampling only
// the input nodes (sample_input_nodes), `picked` is null and the pick goes into the map alone.
__device__ __forceinline__ void record_pick(const SampleArgs& a, int64_t at, int64_t g, int64_t entry) {
  if (a.picked != nullptr) a.picked[at] = g;
  if (a.picked_weights) a.picked_weights[at] = a.weights[entry];
  if (g < 0 || g >= a.rows) {
    atomicOr(a.errors, static_cast<unsigned long long>(kNodeOutOfRange));
    return;
  }
  insert_source(a.table, g, a.counter, a.src_ids);
}

// Every neighbour of a row at or below the fanout, in graph order.
__device__ __forceinline__ void take_whole_row(const SampleArgs& a, int64_t begin, int64_t degree, int64_t picked,
                                               int lane) {
  for (int64_t j = lane; j < degree; j += kWarp) record_pick(a, picked + j, a.graph_indices[begin + j], begin + j);
}

// Step 4: one warp per destination (a grid-stride loop over warps, so every lane of a warp
// handles the same destination and the warp collectives are uniform).
//
// Floyd's algorithm, exactly as neighbor_sampler.cpp's sample_offsets: for j = deg - take ..
// deg - 1, t = random_below(key, j, j + 1); take t unless already taken, else j. The k picks are
// distinct, and sorting them restores graph order. With take <= 32 the m-th pick lives in lane
// m's register, membership is one ballot, and each pick's sorted position is its rank among the
// others (picks are distinct), found by shuffles. Larger takes keep the picks in the block's
// indices array (rewritten by step 5 anyway) and rank them with loads.
__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; i < a.n; i += warps) {
    const int64_t v = a.frontier[i];
    const int64_t begin = a.graph_indptr[v];
    const int64_t degree = a.graph_indptr[v + 1] - begin;
    const int64_t out = a.block_indptr[i];
    const int64_t take = a.block_indptr[i + 1] - out;
    const int32_t* nbrs = a.graph_indices + begin;
    const int64_t picked = out;  // the destination's first entry
    if (take == degree) {
      take_whole_row(a, begin, degree, picked, lane);
      continue;
    }
    const uint64_t key = kernels::derive_key(a.hop_key, static_cast<uint64_t>(v));
    if (take <= kWarp) {
      int64_t mine = -1;  // lane m holds pick m
      for (int m = 0; m < take; ++m) {
        const int64_t j = degree - take + m;
        const int64_t t = static_cast<int64_t>(
            kernels::random_below(key, static_cast<uint64_t>(j), static_cast<uint64_t>(j + 1)));
        const bool seen = __any_sync(kFull, lane < m && mine == t);
        if (lane == m) mine = seen ? j : t;
      }
      int rank = 0;
      for (int q = 0; q < take; ++q) rank += __shfl_sync(kFull, mine, q) < mine ? 1 : 0;
      if (lane < take) record_pick(a, picked + rank, nbrs[mine], begin + mine);
    } else {
      int32_t* chosen = a.scratch + out;
      for (int64_t m = 0; m < take; ++m) {
        const int64_t j = degree - take + m;
        const int64_t t = static_cast<int64_t>(
            kernels::random_below(key, static_cast<uint64_t>(j), static_cast<uint64_t>(j + 1)));
        bool hit = false;
        for (int64_t q = lane; q < m; q += kWarp) hit |= chosen[q] == t;
        const bool seen = __any_sync(kFull, hit);
        if (lane == 0) chosen[m] = static_cast<int32_t>(seen ? j : t);
        __syncwarp();  // makes chosen[m] visible to the whole warp before the next draw
      }
      for (int64_t m = lane; m < take; m += kWarp) {
        const int32_t offset = chosen[m];
        int64_t rank = 0;
        for (int64_t q = 0; q < take; ++q) rank += chosen[q] < offset ? 1 : 0;
        record_pick(a, picked + rank, nbrs[offset], begin + offset);
      }
    }
  }
}

// Entry j's priority in the weighted mode as order-preserving bits: E_j / w_j (NeighborSampler's
// weighted_offsets, bit for bit: random_exponential is reproducible and the division is IEEE).
// Priorities are positive, so their bit patterns order like the values. A weight that is not
// positive and finite raises kBadWeight and ranks last.
__device__ __forceinline__ unsigned long long priority_bits(uint64_t row_key, const float* weights, int64_t j,
                                                            unsigned long long* errors) {
  const float w = weights[j];
  if (!(w > 0.0f) || isinf(w)) {
    atomicOr(errors, static_cast<unsigned long long>(kBadWeight));
    return ~0ull;
  }
  const double priority = kernels::random_exponential(row_key, static_cast<uint64_t>(j)) / static_cast<double>(w);
  return static_cast<unsigned long long>(__double_as_longlong(priority));
}

// The weighted mode's candidates: a warp keeps up to this many (priority, entry) pairs in shared
// memory, and tries the candidate select for takes up to kCandidateTakeMax (it aims at about
// twice the take, so most rows fit).
constexpr int kCandidates = 256;
constexpr int kCandidatesPerLane = kCandidates / kWarp;
constexpr int64_t kCandidateTakeMax = 64;

// The weighted mode's fast path for one row (one warp; take < degree): every entry whose priority
// lies below a threshold t is a candidate, and when there are at least `take` of them (and at most
// kCandidates) the take smallest of the row are among them, so selecting among the candidates is
// exact, ties to the lower entry included. t starts at 2 take / (the row's total weight), where
// about 2 take priorities fall (P(E / w < t) = 1 - exp(-t w) <= t w), and grows fourfold while
// too few fall below it: usually one pass, which computes the priority only of the entries whose
// uniform does not already rule them out (kernels::random_exponential_at_least), against the
// radix select's nine passes computing every priority. False, with nothing written, when the row has a bad weight (the radix select
// flags it) or too many candidates: the caller then runs the radix select.
__device__ bool weighted_candidates(const SampleArgs& a, uint64_t key, const float* weights, const int32_t* nbrs,
                                    int64_t begin, int64_t degree, int64_t take, int64_t picked,
                                    unsigned long long* cand_key, int64_t* cand_entry, int lane) {
  if (take > kCandidateTakeMax) return false;
  float total = 0.0f;
  bool bad = false;
  for (int64_t j = lane; j < degree; j += kWarp) {
    const float w = weights[j];
    bad |= !(w > 0.0f) || isinf(w);
    total += w;
  }
  if (__any_sync(kFull, bad)) return false;
  for (int d = kWarp / 2; d > 0; d /= 2) total += __shfl_xor_sync(kFull, total, d);
  const unsigned lanes_below = (1u << lane) - 1u;
  double t = 2.0 * static_cast<double>(take) / static_cast<double>(total);
  for (int attempt = 0; attempt < 6 && t > 0.0 && isfinite(t); ++attempt, t *= 4.0) {
    const unsigned long long t_bits = static_cast<unsigned long long>(__double_as_longlong(t));
    __syncwarp();  // the list's last readers and writers (this row's last attempt, or the last row) are done
    int64_t count = 0;
    for (int64_t base = 0; base < degree && count <= kCandidates; base += kWarp) {
      const int64_t j = base + lane;
      // An entry whose variate surely reaches t w (most of them: about 2 take of the row do not)
      // is no candidate, and its priority is not computed.
      const bool maybe = j < degree && !kernels::random_exponential_at_least(
                                           key, static_cast<uint64_t>(j), t * static_cast<double>(weights[j]));
      const unsigned long long bits = maybe ? priority_bits(key, weights, j, a.errors) : ~0ull;
      const bool below = bits < t_bits;
      const unsigned mask = __ballot_sync(kFull, below);
      const int64_t at = count + __popc(mask & lanes_below);
      if (below && at < kCandidates) {
        cand_key[at] = bits;
        cand_entry[at] = j;
      }
      count += __popc(mask);
    }
    if (count > kCandidates) return false;
    if (count < take) continue;
    __syncwarp();
    // Each candidate's rank by (priority, entry); the take smallest are the picks.
    bool chosen[kCandidatesPerLane];
    for (int m = 0; m < kCandidatesPerLane; ++m) {
      const int i = lane + m * kWarp;
      chosen[m] = false;
      if (i >= count) continue;
      const unsigned long long ki = cand_key[i];
      const int64_t ei = cand_entry[i];
      int64_t rank = 0;
      for (int64_t q = 0; q < count; ++q) {
        const unsigned long long kq = cand_key[q];
        rank += kq < ki || (kq == ki && cand_entry[q] < ei) ? 1 : 0;
      }
      chosen[m] = rank < take;
    }
    __syncwarp();
    for (int m = 0; m < kCandidatesPerLane; ++m) {  // the others leave the list
      const int i = lane + m * kWarp;
      if (i < count && !chosen[m]) cand_entry[i] = -1;
    }
    __syncwarp();
    // The picks in graph order: each at its rank by entry among the chosen.
    for (int m = 0; m < kCandidatesPerLane; ++m) {
      const int i = lane + m * kWarp;
      if (i >= count || !chosen[m]) continue;
      const int64_t ei = cand_entry[i];
      int64_t pos = 0;
      for (int64_t q = 0; q < count; ++q) {
        const int64_t eq = cand_entry[q];
        pos += eq >= 0 && eq < ei ? 1 : 0;
      }
      record_pick(a, picked + pos, nbrs[ei], begin + ei);
    }
    __syncwarp();  // the list is free for the next row
    return true;
  }
  return false;
}

// Step 4, weighted mode (Efraimidis-Spirakis A-Res as an exponential race): one warp per
// destination takes the `take` entries of smallest priority, ties to the lower entry, as the CPU's
// nth_element over (priority, entry). Rows whose candidates below a threshold fit take the fast
// path above. Otherwise a radix select over the 64 priority bits, 8 bits a pass, finds the
// take-th smallest value T with a 256-bin histogram per warp in shared memory (priorities are
// recomputed each pass rather than stored: a hub row would not fit); a last pass in entry order
// takes every priority below T and the first `remaining` equal to it, writing each pick at its
// ballot rank, so the picks come out in graph order with no sort.
__global__ void __launch_bounds__(kThreads) weighted_sample_kernel(SampleArgs a) {
  __shared__ int histograms[kWarpsPerBlock][256];
  __shared__ unsigned long long candidate_keys[kWarpsPerBlock][kCandidates];
  __shared__ int64_t candidate_entries[kWarpsPerBlock][kCandidates];
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  int* hist = histograms[warp];
  const unsigned lanes_below = (1u << lane) - 1u;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; i < a.n; i += warps) {
    const int64_t v = a.frontier[i];
    const int64_t begin = a.graph_indptr[v];
    const int64_t degree = a.graph_indptr[v + 1] - begin;
    const int64_t out = a.block_indptr[i];
    const int64_t take = a.block_indptr[i + 1] - out;
    const int32_t* nbrs = a.graph_indices + begin;
    const float* weights = a.weights + begin;
    const int64_t picked = out;  // the destination's first entry
    if (take == degree) {
      take_whole_row(a, begin, degree, picked, lane);
      continue;
    }
    const uint64_t key = kernels::derive_key(a.hop_key, static_cast<uint64_t>(v));
    if (weighted_candidates(a, key, weights, nbrs, begin, degree, take, picked, candidate_keys[warp],
                            candidate_entries[warp], lane))
      continue;
    // Radix select: after the pass at `shift`, `prefix` holds T's bits above shift and
    // `remaining` is T's rank among the priorities sharing them (1-based).
    unsigned long long prefix = 0, prefix_mask = 0;
    int64_t remaining = take;
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int b = lane; b < 256; b += kWarp) hist[b] = 0;
      __syncwarp();
      for (int64_t j = lane; j < degree; j += kWarp) {
        const unsigned long long bits = priority_bits(key, weights, j, a.errors);
        if ((bits & prefix_mask) == prefix) atomicAdd(hist + ((bits >> shift) & 255), 1);
      }
      __syncwarp();
      // Lane l owns bins 8l .. 8l+7: its sum, then an inclusive scan over the lanes.
      int64_t own = 0;
      for (int b = 0; b < 8; ++b) own += hist[lane * 8 + b];
      int64_t inclusive = own;
      for (int d = 1; d < kWarp; d *= 2) {
        const int64_t up = __shfl_up_sync(kFull, inclusive, d);
        if (lane >= d) inclusive += up;
      }
      const int64_t exclusive = inclusive - own;
      const unsigned owner_mask = __ballot_sync(kFull, exclusive < remaining && remaining <= inclusive);
      const int owner = __ffs(owner_mask) - 1;
      int bin = 0;
      int64_t below = 0;
      if (lane == owner) {
        int64_t count = exclusive;
        for (int b = 0; b < 8; ++b) {
          const int c = hist[lane * 8 + b];
          if (count + c >= remaining) {
            bin = lane * 8 + b;
            below = count;
            break;
          }
          count += c;
        }
      }
      bin = __shfl_sync(kFull, bin, owner);
      below = __shfl_sync(kFull, below, owner);
      remaining -= below;
      prefix |= static_cast<unsigned long long>(bin) << shift;
      prefix_mask |= 255ull << shift;
      __syncwarp();  // every lane has read the histogram before the next pass clears it
    }
    // Take priorities below T, and the first `remaining` equal to T, in entry order.
    int64_t written = 0, ties = 0;
    for (int64_t base = 0; base < degree; base += kWarp) {
      const int64_t j = base + lane;
      const unsigned long long bits = j < degree ? priority_bits(key, weights, j, a.errors) : ~0ull;
      const bool equal = j < degree && bits == prefix;
      const unsigned equal_mask = __ballot_sync(kFull, equal);
      const bool chosen = (j < degree && bits < prefix) || (equal && ties + __popc(equal_mask & lanes_below) < remaining);
      const unsigned chosen_mask = __ballot_sync(kFull, chosen);
      if (chosen) record_pick(a, picked + written + __popc(chosen_mask & lanes_below), nbrs[j], begin + j);
      written += __popc(chosen_mask);
      ties += __popc(equal_mask);
    }
  }
}

// Step 5: every sampled global id becomes its local id (the table is complete: the previous
// kernel has finished). A probe stops at an empty slot too, so an id never entered (flagged as out
// of range by record_pick, and thrown at the next synchronisation) cannot loop forever.
__global__ void rewrite_kernel(const int64_t* __restrict__ picked, int64_t entries, HashTable table,
                               int32_t* __restrict__ indices) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < entries; e += stride) {
    const int64_t g = picked[e];
    const unsigned long long key = static_cast<unsigned long long>(g);
    int32_t local = 0;
    if (g >= 0) {
      for (unsigned long long s = slot_of(table, g);; s = (s + 1) & table.mask) {
        const unsigned long long k = table.keys[s];
        if (k == key) {
          local = table.values[s];
          break;
        }
        if (k == kEmpty) break;
      }
    }
    indices[e] = local;
  }
}

// What the host reads back at a synchronisation point.
struct HostState {
  unsigned long long counter = 0;
  unsigned long long errors = 0;
  int64_t entries = 0;
};

// Enqueues the copies of the device state (and, when given, the sampled entry count) and waits.
HostState read_state(const unsigned long long* state, const int64_t* entries, cudaStream_t stream) {
  HostState h;
  unsigned long long pair[2] = {0, 0};
  GALE_CHECK_CUDA(cudaMemcpyAsync(pair, state, sizeof(pair), cudaMemcpyDeviceToHost, stream));
  if (entries != nullptr)
    GALE_CHECK_CUDA(cudaMemcpyAsync(&h.entries, entries, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  GALE_CHECK_CUDA(cudaStreamSynchronize(stream));
  h.counter = pair[kCounter];
  h.errors = pair[kErrors];
  return h;
}

void throw_on_errors(unsigned long long errors, int64_t rows) {
  if (errors & kNodeOutOfRange)
    throw InputError("FusedMapSampler: a seed node (or a graph index) is out of range [0, " + std::to_string(rows) + ")");
  if (errors & kRepeatedSeed) throw InputError("FusedMapSampler: the seeds are not distinct");
  if (errors & kHugeRow)
    throw InputError("FusedMapSampler: a fanout above 32 met a row with 2^31 or more in-neighbours (offsets are 32-bit)");
  if (errors & kBadWeight)
    throw InputError("FusedMapSampler: weighted sampling met an edge weight that is not positive and finite");
}

int ceil_log2(int64_t x) {
  int b = 0;
  while ((int64_t{1} << b) < x) ++b;
  return b;
}

}  // namespace

FusedMapSampler::FusedMapSampler(kernels::CsrView graph, std::vector<int> fanouts, kernels::cuda::MemoryPool& pool,
                                 Sampling sampling, bool block_weights)
    : graph_(graph), fanouts_(std::move(fanouts)), pool_(&pool), sampling_(sampling), block_weights_(block_weights) {
  validate_fanouts(fanouts_);
  if (block_weights_ && graph_.weights == nullptr && graph_.rows > 0)
    throw InputError("FusedMapSampler: blocks with edge weights need a graph with edge weights, and the graph has none");
  if (sampling_ == Sampling::kWeighted && graph_.weights == nullptr && graph_.rows > 0)
    throw InputError("FusedMapSampler: weighted sampling needs edge weights, and the graph has none");
  if (graph_.rows < 0 || graph_.rows != graph_.cols)
    throw InputError("FusedMapSampler: the graph must be square (node ids index rows and columns), found " +
                     std::to_string(graph_.rows) + " x " + std::to_string(graph_.cols));
  if (graph_.rows > 0 && (graph_.indptr == nullptr || graph_.indices == nullptr))
    throw InputError("FusedMapSampler: null graph arrays");
}

DeviceSampledBatch FusedMapSampler::sample(const int64_t* seeds_device, int64_t num_seeds, uint64_t key,
                                           cudaStream_t stream) const {
  return run(seeds_device, num_seeds, key, stream, /*inputs_only=*/false);
}

DeviceInputNodes FusedMapSampler::sample_input_nodes(const int64_t* seeds_device, int64_t num_seeds, uint64_t key,
                                                     cudaStream_t stream) const {
  DeviceSampledBatch batch = run(seeds_device, num_seeds, key, stream, /*inputs_only=*/true);
  DeviceInputNodes out;
  out.count = batch.num_input_nodes();
  out.ids = std::move(batch.blocks.front().src_ids);
  return out;  // the other buffers go back to the pool on `stream`
}

DeviceSampledBatch FusedMapSampler::run(const int64_t* seeds_device, int64_t num_seeds, uint64_t key,
                                        cudaStream_t stream, bool inputs_only) const {
  if (num_seeds < 0) throw InputError("FusedMapSampler: negative seed count");
  if (num_seeds > 0 && seeds_device == nullptr) throw InputError("FusedMapSampler: null seeds");
  if (num_seeds > kMaxLocalIds) throw InputError("FusedMapSampler: too many seeds for 32-bit local ids");
  kernels::cuda::MemoryPool& pool = *pool_;
  const kernels::cuda::DeviceGuard guard(pool.device());  // kernels launch on the current device
  const int layers = num_layers();
  DeviceSampledBatch batch;
  batch.blocks.resize(static_cast<size_t>(layers));

  // state[kCounter] counts the local ids handed out in the current hop; after a hop it is that
  // hop's number of sources, which is the next hop's frontier size, so the next count kernel reads
  // it on the device and the host learns it at the next synchronisation.
  DeviceBuffer<unsigned long long> state(pool, 2, stream);
  init_state_kernel<<<1, 1, 0, stream>>>(state.data(), num_seeds);
  GALE_CHECK_CUDA(cudaGetLastError());

  const int64_t* frontier = seeds_device;
  int64_t capacity = num_seeds;  // entries the frontier array has room for; *counter are live
  for (int hop = 0; hop < layers; ++hop) {
    DeviceBlock& block = batch.blocks[static_cast<size_t>(layers - 1 - hop)];
    // 1. Counts and their scan, over the frontier's capacity (its live size is on the device).
    {
      DeviceBuffer<int64_t> counts(pool, static_cast<size_t>(capacity + 1), stream);
      block.indptr = DeviceBuffer<int64_t>(pool, static_cast<size_t>(capacity + 1), stream);
      count_kernel<<<blocks_for(capacity + 1), kThreads, 0, stream>>>(frontier, capacity, state.data(),
                                                                       graph_.indptr, graph_.rows, fanouts_[hop],
                                                                       counts.data());
      GALE_CHECK_CUDA(cudaGetLastError());
      size_t scan_bytes = 0;
      GALE_CHECK_CUDA(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts.data(), block.indptr.data(),
                                                    capacity + 1, stream));
      DeviceBuffer<unsigned char> scan_temp(pool, std::max<size_t>(scan_bytes, 1), stream);
      GALE_CHECK_CUDA(cub::DeviceScan::ExclusiveSum(scan_temp.data(), scan_bytes, counts.data(), block.indptr.data(),
                                                    capacity + 1, stream));
    }
    // 2. The one synchronisation of the hop.
    const HostState host = read_state(state.data(), block.indptr.data() + capacity, stream);
    throw_on_errors(host.errors, graph_.rows);
    const int64_t n = static_cast<int64_t>(host.counter);
    const int64_t entries = host.entries;
    if (hop > 0) batch.blocks[static_cast<size_t>(layers - hop)].num_src = n;
    if (n + entries > kMaxLocalIds)
      throw InputError("FusedMapSampler: hop " + std::to_string(hop) + " has " + std::to_string(n) +
                       " destinations and " + std::to_string(entries) +
                       " sampled entries, beyond 32-bit local ids; use smaller batches");
    block.num_dst = n;
    block.num_edges = entries;

    // 3. The table and the frontier's ids.
    const int64_t bound = n + entries;  // at most this many distinct keys
    block.indices = DeviceBuffer<int32_t>(pool, static_cast<size_t>(entries), stream);
    block.src_ids = DeviceBuffer<int64_t>(pool, static_cast<size_t>(bound), stream);
    DeviceBuffer<int64_t> picked(pool, inputs_only ? 0 : static_cast<size_t>(entries), stream);
    if (block_weights_ && !inputs_only) block.weights = DeviceBuffer<float>(pool, static_cast<size_t>(entries), stream);
    HashTable table;
    table.log2_size = std::max(4, ceil_log2(2 * std::max<int64_t>(bound, 1)));
    const size_t slots = size_t{1} << table.log2_size;
    table.mask = slots - 1;
    DeviceBuffer<unsigned long long> keys(pool, slots, stream);
    DeviceBuffer<int32_t> values(pool, slots, stream);
    table.keys = keys.data();
    table.values = values.data();
    GALE_CHECK_CUDA(cudaMemsetAsync(keys.data(), 0xff, keys.bytes(), stream));
    if (n > 0) {
      insert_frontier_kernel<<<blocks_for(n), kThreads, 0, stream>>>(frontier, n, table, block.src_ids.data(),
                                                                     state.data());
      GALE_CHECK_CUDA(cudaGetLastError());

      // 4. Sample and build the map (the counter already holds n).
      SampleArgs args;
      args.frontier = frontier;
      args.n = n;
      args.graph_indptr = graph_.indptr;
      args.graph_indices = graph_.indices;
      args.block_indptr = block.indptr.data();
      args.hop_key = kernels::derive_key(key, static_cast<uint64_t>(hop));
      args.scratch = block.indices.data();
      args.picked = inputs_only ? nullptr : picked.data();
      args.table = table;
      args.counter = state.data() + kCounter;
      args.src_ids = block.src_ids.data();
      args.errors = state.data() + kErrors;
      args.rows = graph_.rows;
      const unsigned sample_blocks = static_cast<unsigned>(
          std::clamp<int64_t>((n + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, kMaxBlocks));
      args.weights = graph_.weights;
      if (block_weights_ && !inputs_only) args.picked_weights = block.weights.data();
      if (sampling_ == Sampling::kWeighted) {
        weighted_sample_kernel<<<sample_blocks, kThreads, 0, stream>>>(args);
      } else {
        sample_kernel<<<sample_blocks, kThreads, 0, stream>>>(args);
      }
      GALE_CHECK_CUDA(cudaGetLastError());
    }
    // 5. Global ids to local ids (sampling only the input nodes: no entries to rewrite).
    if (entries > 0 && !inputs_only) {
      rewrite_kernel<<<blocks_for(entries), kThreads, 0, stream>>>(picked.data(), entries, table,
                                                                   block.indices.data());
      GALE_CHECK_CUDA(cudaGetLastError());
    }
    frontier = block.src_ids.data();
    capacity = bound;
  }
  // The input layer's number of sources (and any error of the last hop's frontier insertion).
  const HostState host = read_state(state.data(), nullptr, stream);
  throw_on_errors(host.errors, graph_.rows);
  batch.blocks.front().num_src = static_cast<int64_t>(host.counter);
  return batch;
}

}  // namespace gale::sampler
