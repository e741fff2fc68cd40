// kernels/gat_cuda.cu — CUDA twins of gat_cpu.cpp, in fuseGNN's fused GAR form (ICCAD'20, Sec. 4-6).
//
// Forward: one warp per destination row of the CSR. The row's per-head softmax statistics (max and
// sum of exp) are computed online in registers, the scores never leave the chip, and the weighted
// sum over the in-neighbours' z rows is reduced in registers; only alpha (E x heads) is written,
// for backward. No E x D message tensor exists at any point (fuseGNN's DRAM-footprint argument,
// Sec. 3 and Fig. 12).
//
// Backward, in the CPU reference's two phases:
//   1. per destination (CSR): d loss / d alpha for every entry (a dot of grad_out with the source's
//      z over one head), the softmax and LeakyReLU backward, grad_er; the per-entry score
//      gradients go to an E x heads workspace;
//   2. per source (CSC + csc_edge): grad_z as a weighted gather of grad_out rows and grad_el as
//      the sum of the workspace entries of the source's out-edges.
// Every output element has exactly one writer, so there are no atomics and results do not depend
// on scheduling (fuseGNN's GAR vs GAS, Sec. 4).
//
// Rows (and, in backward, the transpose's rows) of more than kGatLongRow entries go to a block
// each instead of a warp (gat_long_gather_kernel, gat_long_score_grad_kernel): a power-law graph's
// hubs would otherwise keep single warps busy long after the rest of the grid is done. The
// backward's dots take a whole entry (all heads) per lane group where the shape allows
// (score_dots_by_entry), reading each source row once rather than once a head.
//
// Dropout multipliers come from random_uniform(key, counter) with the CPU's counters, so masks are
// bit-identical. Per-lane work splits follow fuseGNN's "several edges per warp when the feature is
// short" (Sec. 6, Table 4): a warp gathers 32 / L entries at once when a row needs only L lanes.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/cuda/warp.cuh"
#include "kernels/error.hpp"
#include "kernels/gat.hpp"
#include "kernels/random.hpp"

namespace gale::kernels {

namespace {

// 4 warps (128 threads) per block: small blocks keep the tail of a skewed degree distribution from
// holding a whole SM, and 4 x the largest per-warp staging area (10 KiB at 512 heads) stays below
// the 48 KiB of shared memory a launch gets without opting in.
constexpr int kWarpsPerBlock = 4;
constexpr int kBlock = kWarpsPerBlock * kWarp;
// Resident blocks an SM the gather and score-gradient kernels are compiled for (64 registers a
// thread): left to itself the compiler gave them 68-109 registers, and the score gradients ran at
// 15% occupancy. R-MAT 21, 3 x (4 x 64) GAT epoch on an H100 (same run): 340 ms uncapped, 297 ms
// with 8, 339 with 12 (40 registers: spills).
constexpr int kWarpKernelBlocksPerSm = 8;
// Entries whose rows a lane group of gat_gather_kernel gathers before it adds them.
constexpr int kGatherUnroll = 4;
// Entries whose coefficients a warp stages at once: 32 covers one entry per lane; with many heads
// fewer entries keep the staging area near 1024 floats.
constexpr int64_t kStagedCoefficients = 1024;

// ---- device helpers -------------------------------------------------------------------------

__device__ __forceinline__ float leaky(float x, float slope) { return x > 0.0f ? x : slope * x; }

// Dropout multiplier of attention counter `counter`: same draw and comparison as gat_cpu.cpp's
// keep(); `scale` is 1 / (1 - p) computed on the host in float, as the CPU does.
__device__ __forceinline__ float keep(float p, float scale, uint64_t key, uint64_t counter) {
  if (p <= 0.0f) return 1.0f;
  return random_uniform(key, counter) >= p ? scale : 0.0f;
}

__device__ __forceinline__ int64_t entry_count(const int64_t* indptr, int64_t rows) {
  return rows == 0 ? 0 : indptr[rows] - indptr[0];
}

// Online softmax: (m, s) is (max, sum of exp(x - max)) of the values seen so far.
__device__ __forceinline__ void softmax_push(float& m, float& s, float v) {
  if (v > m) {
    s = s * expf(m - v) + 1.0f;
    m = v;
  } else {
    s += expf(v - m);
  }
}

__device__ __forceinline__ void softmax_merge(float& m, float& s, float m2, float s2) {
  if (s2 == 0.0f) return;  // the other lane saw nothing
  if (s == 0.0f) {
    m = m2;
    s = s2;
    return;
  }
  const float mx = fmaxf(m, m2);
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

// Head groups: when `heads` divides 32 a warp sweeps all heads of 32 / heads entries at once and
// every lane keeps one head (lane % heads) for the whole sweep, so per-head reductions are xor
// shuffles over offsets 16 .. heads. Otherwise the warp sweeps one head at a time (group = 1).
__device__ __forceinline__ float group_sum(float v, int group) {
  for (int off = kWarp / 2; off >= group; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// Softmax statistics of destination `row` for head h (the lane's head in its group): the maximum
// over the entries and the self loop, and 1 / sum exp(score - max). Every lane returns the values
// of its own head.
__device__ __forceinline__ void row_softmax_stats(const int64_t* indptr, const int32_t* indices, int64_t row,
                                                  int64_t heads, int group, int64_t h, int lane, float slope,
                                                  const float* el, const float* er, float& max_out, float& inv_out) {
  const float eri = er[row * heads + h];
  float m = -INFINITY, s = 0.0f;
  if (lane < group) softmax_push(m, s, leaky(el[row * heads + h] + eri, slope));
  const int64_t end = indptr[row + 1];
  for (int64_t e = indptr[row] + lane / group; e < end; e += kWarp / group) {
    softmax_push(m, s, leaky(el[static_cast<int64_t>(indices[e]) * heads + h] + eri, slope));
  }
  for (int off = kWarp / 2; off >= group; off >>= 1) {
    const float m2 = __shfl_xor_sync(kFull, m, off);
    const float s2 = __shfl_xor_sync(kFull, s, off);
    softmax_merge(m, s, m2, s2);
  }
  max_out = m;
  inv_out = 1.0f / s;
}

template <int kVec>
struct Vec {
  float v[kVec];
};

template <int kVec>
__device__ __forceinline__ Vec<kVec> load(const float* p) {
  Vec<kVec> r;
  if constexpr (kVec == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    r.v[0] = t.x;
    r.v[1] = t.y;
    r.v[2] = t.z;
    r.v[3] = t.w;
  } else {
    r.v[0] = *p;
  }
  return r;
}

template <int kVec>
__device__ __forceinline__ void store(float* p, const Vec<kVec>& r) {
  if constexpr (kVec == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  } else {
    *p = r.v[0];
  }
}

// The lane's vectors of a tile (lane c of a group of `lanes`: vectors tile + v * lanes + c of the
// row's nvec), their first columns and heads (a vector never straddles heads: f % kVec == 0).
template <int kVec, int kNv>
__device__ __forceinline__ void tile_vectors(int64_t tile, int lanes, int c, int64_t nvec, int64_t f,
                                             int64_t (&col)[kNv], int64_t (&head)[kNv], bool (&valid)[kNv]) {
#pragma unroll
  for (int v = 0; v < kNv; ++v) {
    const int64_t idx = tile + static_cast<int64_t>(v) * lanes + c;
    valid[v] = idx < nvec;
    col[v] = idx * kVec;
    head[v] = valid[v] ? col[v] / f : 0;
  }
}

// acc[v] += w[u][v] * (vector v of rows[u]) for kU entries: every row whose coefficient is not 0 is
// loaded before any is added, so kU rows are in flight at once (one at a time left a warp waiting
// on each). A zero coefficient is a dropped entry, skipped like the CPU: its row is not read.
template <int kU, int kVec, int kNv>
__device__ __forceinline__ void add_weighted_rows(const float* const (&rows)[kU], const int64_t (&col)[kNv],
                                                  const float (&w)[kU][kNv], Vec<kVec> (&acc)[kNv]) {
  Vec<kVec> xv[kU][kNv];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
#pragma unroll
    for (int v = 0; v < kNv; ++v) {
      if (w[u][v] != 0.0f) {
        xv[u][v] = load<kVec>(rows[u] + col[v]);
      } else {
#pragma unroll
        for (int q = 0; q < kVec; ++q) xv[u][v].v[q] = 0.0f;
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
#pragma unroll
    for (int v = 0; v < kNv; ++v) {
#pragma unroll
      for (int q = 0; q < kVec; ++q) acc[v].v[q] += w[u][v] * xv[u][v].v[q];
    }
  }
}

// ---- softmax ----------------------------------------------------------------------------------

struct SoftmaxArgs {
  int64_t rows = 0;
  const int64_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  int64_t heads = 1;
  int group = 1;
  float slope = 0.2f;
  const float* el = nullptr;
  const float* er = nullptr;
  float* alpha = nullptr;
  float* alpha_self = nullptr;
};

// One warp per destination; with group == heads lane l writes alpha[(b + l / heads) * heads +
// l % heads], i.e. consecutive lanes write consecutive floats.
__global__ void __launch_bounds__(kBlock) gat_softmax_kernel(SoftmaxArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= a.rows) return;  // uniform per warp
  const int64_t H = a.heads, b = a.indptr[row], end = a.indptr[row + 1];
  for (int64_t h0 = 0; h0 < H; h0 += a.group) {
    const int64_t h = h0 + lane % a.group;
    float m, inv;
    row_softmax_stats(a.indptr, a.indices, row, H, a.group, h, lane, a.slope, a.el, a.er, m, inv);
    const float eri = a.er[row * H + h];
    if (lane < a.group) a.alpha_self[row * H + h] = expf(leaky(a.el[row * H + h] + eri, a.slope) - m) * inv;
    for (int64_t e = b + lane / a.group; e < end; e += kWarp / a.group) {
      const float v = leaky(a.el[static_cast<int64_t>(a.indices[e]) * H + h] + eri, a.slope);
      a.alpha[e * H + h] = expf(v - m) * inv;
    }
  }
}

// ---- weighted gather (forward aggregation, fused forward, backward grad_z) -----------------------

enum class GatherMode {
  kAggregate,  // coefficients read from alpha (gat_aggregate_cuda)
  kFused,      // coefficients computed from el / er and written to alpha (gat_forward_cuda)
  kGradZ,      // CSC walk: coefficients alpha[csc_edge[q]], plus grad_el (gat_backward_cuda phase 2)
};

struct GatherArgs {
  int64_t rows = 0;                  // output rows: destinations (forward) or sources (kGradZ)
  const int64_t* indptr = nullptr;   // the walked structure: CSR (forward) or CSC (kGradZ)
  const int32_t* indices = nullptr;
  const int64_t* edge = nullptr;     // kGradZ: CSR position of each CSC entry
  const int64_t* csr_indptr = nullptr;  // for E, which numbers the self-loop dropout counters
  int64_t csr_rows = 0;              // destinations: rows below this have a self loop
  int64_t heads = 1;
  int64_t f = 1;
  int group = 1;                     // head group, see group_sum
  int lanes = 32;                    // lanes per entry (power of two); 32 / lanes entries at once
  int64_t chunk = 32;                // entries staged per warp
  float slope = 0.2f;
  float p = 0.0f;
  float scale = 1.0f;
  uint64_t key = 0;
  const float* el = nullptr;         // kFused
  const float* er = nullptr;         // kFused
  const float* alpha = nullptr;      // read (kAggregate, kGradZ)
  const float* alpha_self = nullptr;
  float* alpha_out = nullptr;        // written (kFused)
  float* alpha_self_out = nullptr;
  const float* x = nullptr;          // gathered rows: z (forward) or grad_out (kGradZ)
  int64_t x_ld = 0;
  float* out = nullptr;              // out (forward) or grad_z (kGradZ)
  int64_t out_ld = 0;
  const float* gpre = nullptr;       // kGradZ: per-entry score gradients from phase 1
  const float* gpre_self = nullptr;
  float* grad_el = nullptr;
};

// One warp per output row. Per warp shared memory: coef[chunk * heads] (the staged, dropped-out
// coefficients of `chunk` entries), self_coef[heads], the softmax max[heads] and inv[heads]
// (kFused), and src[chunk] (the staged entries' gathered rows).
//
// The heads*f features are split into vectors of kVec floats; `lanes` consecutive lanes cover
// kNv * lanes vectors of one entry (a tile), and the warp's 32 / lanes lane groups take different
// entries of the chunk, their partial sums reduced at the end with xor shuffles (fuseGNN's group
// reduce, Fig. 6, done in registers). Rows wider than a tile loop over tiles.
template <int kVec, int kNv, GatherMode kMode>
__global__ void __launch_bounds__(kBlock, kWarpKernelBlocksPerSm) gat_gather_kernel(GatherArgs a) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= a.rows) return;  // uniform per warp

  const int64_t H = a.heads, F = a.f, chunk = a.chunk;
  float* coef = smem + warp * (chunk * H + 3 * H + chunk);
  float* self_coef = coef + chunk * H;
  float* stat_max = self_coef + H;
  float* stat_inv = stat_max + H;
  int32_t* src = reinterpret_cast<int32_t*>(stat_inv + H);

  const int64_t nnz = entry_count(a.csr_indptr, a.csr_rows);
  const int64_t b = a.indptr[row], end = a.indptr[row + 1];
  // A block of gat_long_gather_kernel takes a long row (gat_aggregate_cuda keeps a warp per row).
  if (kMode != GatherMode::kAggregate && end - b > kGatLongRow) return;
  const bool has_self = row < a.csr_rows;

  if constexpr (kMode == GatherMode::kFused) {
    for (int64_t h0 = 0; h0 < H; h0 += a.group) {
      const int64_t h = h0 + lane % a.group;
      float m, inv;
      row_softmax_stats(a.indptr, a.indices, row, H, a.group, h, lane, a.slope, a.el, a.er, m, inv);
      if (lane < a.group) {
        stat_max[h] = m;
        stat_inv[h] = inv;
      }
    }
    __syncwarp();
  }
  for (int64_t h = lane; h < H; h += kWarp) {
    float c = 0.0f;
    if (has_self) {
      float al;
      if constexpr (kMode == GatherMode::kFused) {
        al = expf(leaky(a.el[row * H + h] + a.er[row * H + h], a.slope) - stat_max[h]) * stat_inv[h];
        a.alpha_self_out[row * H + h] = al;
      } else {
        al = a.alpha_self[row * H + h];
      }
      c = al * keep(a.p, a.scale, a.key, static_cast<uint64_t>(nnz + row) * H + h);
    }
    self_coef[h] = c;
  }
  if constexpr (kMode == GatherMode::kGradZ) {
    // grad_el[j, h]: the score gradients of j's out-edges, plus its self loop's.
    for (int64_t h0 = 0; h0 < H; h0 += a.group) {
      const int64_t h = h0 + lane % a.group;
      float sum = (lane < a.group && has_self) ? a.gpre_self[row * H + h] : 0.0f;
      for (int64_t q = b + lane / a.group; q < end; q += kWarp / a.group) sum += a.gpre[a.edge[q] * H + h];
      sum = group_sum(sum, a.group);
      if (lane < a.group) a.grad_el[row * H + h] = sum;
    }
  }
  __syncwarp();

  const int lanes = a.lanes;
  const int c = lane % lanes, grp = lane / lanes, groups = kWarp / lanes;
  const int64_t nvec = H * F / kVec;
  const float* x_self = a.x + row * a.x_ld;
  float* out_row = a.out + row * a.out_ld;
  for (int64_t tile = 0; tile < nvec; tile += static_cast<int64_t>(lanes) * kNv) {
    Vec<kVec> acc[kNv];
    int64_t col[kNv], head[kNv];
    bool valid[kNv];
    tile_vectors<kVec>(tile, lanes, c, nvec, F, col, head, valid);
#pragma unroll
    for (int v = 0; v < kNv; ++v) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[v].v[k] = 0.0f;
      // The self loop, as the CPU does it: no skip when its coefficient is 0.
      if (grp == 0 && valid[v] && has_self) {
        const Vec<kVec> xv = load<kVec>(x_self + col[v]);
        const float sc = self_coef[head[v]];
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[v].v[k] = sc * xv.v[k];
      }
    }
    for (int64_t c0 = b; c0 < end; c0 += chunk) {
      const int64_t count = end - c0 < chunk ? end - c0 : chunk;
      __syncwarp();  // every lane is done reading the previous chunk
      for (int64_t t = lane; t < count * H; t += kWarp) {
        const int64_t k = t / H, h = t % H, q = c0 + k;
        const int64_t e = kMode == GatherMode::kGradZ ? a.edge[q] : q;
        float al;
        if constexpr (kMode == GatherMode::kFused) {
          const float v = leaky(a.el[static_cast<int64_t>(a.indices[q]) * H + h] + a.er[row * H + h], a.slope);
          al = expf(v - stat_max[h]) * stat_inv[h];
          if (tile == 0) a.alpha_out[e * H + h] = al;
        } else {
          al = a.alpha[e * H + h];
        }
        coef[t] = al * keep(a.p, a.scale, a.key, static_cast<uint64_t>(e) * H + h);
        if (h == 0) src[k] = a.indices[q];
      }
      __syncwarp();
      for (int64_t k0 = grp; k0 < count; k0 += static_cast<int64_t>(groups) * kGatherUnroll) {
        float w[kGatherUnroll][kNv];
        const float* rows[kGatherUnroll];
#pragma unroll
        for (int u = 0; u < kGatherUnroll; ++u) {
          const int64_t k = k0 + static_cast<int64_t>(u) * groups;
          const bool in = k < count;
          rows[u] = a.x + (in ? static_cast<int64_t>(src[k]) : 0) * a.x_ld;
#pragma unroll
          for (int v = 0; v < kNv; ++v) w[u][v] = in && valid[v] ? coef[k * H + head[v]] : 0.0f;
        }
        add_weighted_rows<kGatherUnroll>(rows, col, w, acc);
      }
    }
#pragma unroll
    for (int v = 0; v < kNv; ++v) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        for (int off = kWarp / 2; off >= lanes; off >>= 1) acc[v].v[k] += __shfl_xor_sync(kFull, acc[v].v[k], off);
      }
      if (grp == 0 && valid[v]) store<kVec>(out_row + col[v], acc[v]);
    }
  }
}

// ---- backward phase 1: per-entry score gradients ------------------------------------------------

struct ScoreGradArgs {
  int64_t rows = 0;
  const int64_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  int64_t heads = 1;
  int64_t f = 1;
  int group = 1;
  int lanes = 32;                   // lanes per (entry, head) dot product, a power of two; with whole
                                    // entries (kNv > 0) lanes per entry
  float slope = 0.2f;
  float p = 0.0f;
  float scale = 1.0f;
  uint64_t key = 0;
  const float* el = nullptr;
  const float* er = nullptr;
  const float* alpha = nullptr;
  const float* alpha_self = nullptr;
  const float* z = nullptr;
  int64_t z_ld = 0;
  const float* grad_out = nullptr;
  int64_t grad_out_ld = 0;
  float* gpre = nullptr;            // E x heads (workspace)
  int64_t gpre_capacity = 0;        // floats available at gpre
  float* gpre_self = nullptr;       // destinations x heads (workspace)
  float* grad_er = nullptr;
};

// Step 1 of the score gradient a lane group per (entry, head) pair: `threads` threads (a warp, or
// a block of whole warps), thread `t` of them, take the row's (deg + 1) x heads pairs (entry deg
// is the self loop), a.lanes lanes a pair; the loop is uniform over them.
template <int kVec>
__device__ __forceinline__ void score_dots_by_pair(const ScoreGradArgs& a, int64_t row, int64_t b, int64_t deg,
                                                   int64_t nnz, int t, int threads) {
  const int64_t H = a.heads, F = a.f;
  const int lanes = a.lanes, c = t % lanes;
  const int64_t per_pass = threads / lanes, pairs = (deg + 1) * H, nf = F / kVec;
  const float* go = a.grad_out + row * a.grad_out_ld;
  for (int64_t t0 = 0; t0 < pairs; t0 += per_pass) {
    const int64_t pair = t0 + t / lanes;
    const bool valid = pair < pairs;
    const int64_t k = pair / H, h = pair % H;
    const bool self = k == deg;
    const uint64_t counter = self ? static_cast<uint64_t>(nnz + row) * H + h : static_cast<uint64_t>(b + k) * H + h;
    const float m = valid ? keep(a.p, a.scale, a.key, counter) : 0.0f;
    float dot = 0.0f;
    // A dropped entry's ga is 0 without reading z (the CPU skips it too); the self loop's is
    // dot * m like the CPU's.
    if (valid && (self || m != 0.0f)) {
      const int64_t src = self ? row : static_cast<int64_t>(a.indices[b + k]);
      const float* zr = a.z + src * a.z_ld + h * F;
      const float* gr = go + h * F;
      for (int64_t fv = c; fv < nf; fv += lanes) {
        const Vec<kVec> zv = load<kVec>(zr + fv * kVec), gv = load<kVec>(gr + fv * kVec);
#pragma unroll
        for (int q = 0; q < kVec; ++q) dot += gv.v[q] * zv.v[q];
      }
    }
    for (int off = lanes / 2; off >= 1; off >>= 1) dot += __shfl_xor_sync(kFull, dot, off);
    if (valid && c == 0) {
      if (self) {
        a.gpre_self[row * H + h] = dot * m;
      } else {
        a.gpre[(b + k) * H + h] = m == 0.0f ? 0.0f : dot * m;
      }
    }
  }
}

// Step 1 of the score gradient with whole entries a lane group (kNv > 0; launch_score_grad): the
// row's grad_out vectors stay in registers, lane group grp takes entries first + grp, first + grp +
// step, ... (k == deg is the self loop), kGatherUnroll of them in flight, and each entry's z row is
// read once for all heads instead of once a head. A head's dot is reduced over the `seg` lanes that
// hold its vectors (one head: all of the group's lanes, its vectors summed first). `first` and
// `step` are uniform over the warp, and so is the loop.
template <int kVec, int kNv>
__device__ __forceinline__ void score_dots_by_entry(const ScoreGradArgs& a, int64_t row, int64_t b, int64_t deg,
                                                    int64_t nnz, int64_t first, int64_t step) {
  const int lane = threadIdx.x % kWarp;
  const int64_t H = a.heads, F = a.f, nvec = H * F / kVec;
  const int lanes = a.lanes, c = lane % lanes, grp = lane / lanes;
  const int seg = H == 1 ? lanes : static_cast<int>(F / kVec);  // a head's vectors: a power of two
  const float* go = a.grad_out + row * a.grad_out_ld;
  Vec<kVec> gv[kNv];
  int64_t off[kNv], head[kNv];
  bool valid[kNv];
#pragma unroll
  for (int v = 0; v < kNv; ++v) {
    const int64_t idx = static_cast<int64_t>(v) * lanes + c;
    valid[v] = idx < nvec;
    off[v] = valid[v] ? idx * kVec : 0;
    head[v] = off[v] / F;
    if (valid[v]) {
      gv[v] = load<kVec>(go + off[v]);
    } else {
#pragma unroll
      for (int q = 0; q < kVec; ++q) gv[v].v[q] = 0.0f;
    }
  }
  for (int64_t base = first; base <= deg; base += step * kGatherUnroll) {
    float m[kGatherUnroll][kNv];
    Vec<kVec> zv[kGatherUnroll][kNv];
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      const int64_t k = base + grp + u * step;
      const bool in = k <= deg, self = k == deg;
      const int64_t src = !in ? 0 : self ? row : static_cast<int64_t>(a.indices[b + k]);
      const float* zr = a.z + src * a.z_ld;
#pragma unroll
      for (int v = 0; v < kNv; ++v) {
        const uint64_t counter = self ? static_cast<uint64_t>(nnz + row) * H + head[v]
                                      : static_cast<uint64_t>(b + k) * H + head[v];
        m[u][v] = in && valid[v] ? keep(a.p, a.scale, a.key, counter) : 0.0f;
        // A dropped entry's ga is 0 without reading z (the CPU skips it too); the self loop's is
        // dot * m like the CPU's.
        if (in && valid[v] && (self || m[u][v] != 0.0f)) {
          zv[u][v] = load<kVec>(zr + off[v]);
        } else {
#pragma unroll
          for (int q = 0; q < kVec; ++q) zv[u][v].v[q] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      const int64_t k = base + grp + u * step;
      const bool in = k <= deg, self = k == deg;
      float dots[kNv];
#pragma unroll
      for (int v = 0; v < kNv; ++v) {
        float d = 0.0f;
#pragma unroll
        for (int q = 0; q < kVec; ++q) d += gv[v].v[q] * zv[u][v].v[q];
        dots[v] = d;
      }
      if (H == 1) {  // every vector is head 0's
#pragma unroll
        for (int v = 1; v < kNv; ++v) dots[0] += dots[v];
      }
#pragma unroll
      for (int v = 0; v < kNv; ++v) {
        if (H == 1 && v > 0) break;
        for (int o = seg / 2; o >= 1; o >>= 1) dots[v] += __shfl_xor_sync(kFull, dots[v], o);
        if (in && valid[v] && c % seg == 0) {
          const int64_t h = head[v];
          const float mm = m[u][v];
          if (self) {
            a.gpre_self[row * H + h] = dots[v] * mm;
          } else {
            a.gpre[(b + k) * H + h] = mm == 0.0f ? 0.0f : dots[v] * mm;
          }
        }
      }
    }
  }
}

// One warp per destination i. Step 1: for every (entry, head) pair, and the self loop's,
// ga = drop(grad_out[i, h, :] . z[j, h, :]) written to the workspace; `lanes` lanes share one dot
// (32 / lanes pairs at once, consecutive pairs are consecutive workspace floats). Step 2 (per head
// group): w = sum alpha * ga. Step 3: gpre = alpha * (ga - w) * LeakyReLU'(score), in place, and
// grad_er = sum gpre. Steps 2 and 3 touch each (entry, head) from the same lane, and step 1's
// writes are published to the warp by __syncwarp.
template <int kVec, int kNv>
__global__ void __launch_bounds__(kBlock, kWarpKernelBlocksPerSm) gat_score_grad_kernel(ScoreGradArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= a.rows) return;  // uniform per warp
  const int64_t H = a.heads;
  const int64_t nnz = entry_count(a.indptr, a.rows);
  // A workspace smaller than gat_backward_workspace_bytes promised is a caller bug that would
  // otherwise corrupt unrelated memory.
  if (nnz * H > a.gpre_capacity) __trap();
  const int64_t b = a.indptr[row], end = a.indptr[row + 1], deg = end - b;
  if (deg > kGatLongRow) return;  // a block of gat_long_score_grad_kernel takes it
  if constexpr (kNv > 0) {
    score_dots_by_entry<kVec, kNv>(a, row, b, deg, nnz, 0, kWarp / a.lanes);
  } else {
    score_dots_by_pair<kVec>(a, row, b, deg, nnz, lane, kWarp);
  }
  __syncwarp();

  for (int64_t h0 = 0; h0 < H; h0 += a.group) {
    const int64_t h = h0 + lane % a.group;
    const float eri = a.er[row * H + h];
    float w = lane < a.group ? a.alpha_self[row * H + h] * a.gpre_self[row * H + h] : 0.0f;
    for (int64_t e = b + lane / a.group; e < end; e += kWarp / a.group) w += a.alpha[e * H + h] * a.gpre[e * H + h];
    w = group_sum(w, a.group);
    float sum = 0.0f;
    if (lane < a.group) {
      const float gs = a.alpha_self[row * H + h] * (a.gpre_self[row * H + h] - w);
      const float gp = gs * (a.el[row * H + h] + eri > 0.0f ? 1.0f : a.slope);
      a.gpre_self[row * H + h] = gp;
      sum += gp;
    }
    for (int64_t e = b + lane / a.group; e < end; e += kWarp / a.group) {
      const float gs = a.alpha[e * H + h] * (a.gpre[e * H + h] - w);
      const float gp = gs * (a.el[static_cast<int64_t>(a.indices[e]) * H + h] + eri > 0.0f ? 1.0f : a.slope);
      a.gpre[e * H + h] = gp;
      sum += gp;
    }
    sum = group_sum(sum, a.group);
    if (lane < a.group) a.grad_er[row * H + h] = sum;
  }
}

// ---- long rows: a block per row ------------------------------------------------------------------
//
// A warp per row leaves each hub of a power-law graph to one warp, which walks its entries one at
// a time: on R-MAT scale 21 (rows of up to ~10^5 entries) 3 x (4 x 64) GAT's forward took 108 ms a
// layer and its backward 285 ms on an H100, against ~10 ms for GAR over the same entries. The warp
// kernels skip rows of more than kGatLongRow entries and these kernels take them, a
// block of kLongWarps warps per row: the row's entries are dealt to the warps, and the warps'
// softmax statistics, sums and partial rows are combined in shared memory in warp order, so the
// results do not depend on scheduling. Block b takes the long rows among b, b + grid, ... (it finds
// them by scanning: no list of long rows has to exist).
constexpr int kLongWarps = 16;
constexpr int kLongThreads = kLongWarps * kWarp;
// Entries a warp gathers before it adds them: a long row's warps are few, so each keeps several
// source rows in flight.
constexpr int kLongUnroll = 4;
// Resident long-row blocks an SM (their register cap), and the grid's blocks an SM: many small
// shares of the rows even out the long rows' sizes (R-MAT 21, 3 x (4 x 64) GAT epoch on an H100:
// 4 / 16 / 32 blocks an SM 345 / 336 / 334 ms).
constexpr int kLongBlocksPerSm = 2;
constexpr int kLongGridPerSm = 32;

// Calls body(row) for every row of this block's share (rows blockIdx.x, blockIdx.x + gridDim.x, ...)
// with more than kGatLongRow entries. Every thread of the block runs it together; body may use
// __syncthreads.
template <typename Body>
__device__ __forceinline__ void for_long_rows(const int64_t* indptr, int64_t rows, Body&& body) {
  __shared__ int64_t found[kLongThreads];
  __shared__ int found_count;
  for (int64_t base = 0; blockIdx.x + base * gridDim.x < rows; base += kLongThreads) {
    if (threadIdx.x == 0) found_count = 0;
    __syncthreads();
    const int64_t r = blockIdx.x + (base + threadIdx.x) * gridDim.x;
    if (r < rows && indptr[r + 1] - indptr[r] > kGatLongRow) found[atomicAdd(&found_count, 1)] = r;
    __syncthreads();
    const int n = found_count;  // each row's results depend on that row alone, whatever the order
    for (int i = 0; i < n; ++i) body(found[i]);
    __syncthreads();  // found and found_count are rewritten next round
  }
}

// Sum over the block of one value per (warp, lane < group), in warp order: parts is kLongWarps x
// kWarp floats of shared memory. Thread t < group returns head h0 + t's sum plus `first`.
__device__ __forceinline__ float block_sum_in_order(float v, int group, float* parts, float first) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = group_sum(v, group);
  if (lane < group) parts[warp * kWarp + lane] = v;
  __syncthreads();
  float t = first;
  if (static_cast<int>(threadIdx.x) < group) {
    for (int w = 0; w < kLongWarps; ++w) t += parts[w * kWarp + threadIdx.x];
  }
  __syncthreads();  // parts is reused by the caller's next sum
  return t;
}

// gat_gather_kernel's kFused and kGradZ modes for the long rows. Shared memory: part[kLongWarps x
// tile floats] (each warp's partial sums of a tile), stat_max, stat_inv, self_coef [heads], and
// kLongWarps x kWarp floats twice for the reductions.
template <int kVec, int kNv, GatherMode kMode>
__global__ void __launch_bounds__(kLongThreads, kLongBlocksPerSm) gat_long_gather_kernel(GatherArgs a) {
  static_assert(kMode != GatherMode::kAggregate, "gat_aggregate_cuda keeps a warp per row");
  extern __shared__ float smem[];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t H = a.heads, F = a.f;
  const int lanes = a.lanes;
  const int64_t tile_floats = static_cast<int64_t>(lanes) * kNv * kVec;
  float* part = smem;
  float* stat_max = part + kLongWarps * tile_floats;
  float* stat_inv = stat_max + H;
  float* self_coef = stat_inv + H;
  float* wm = self_coef + H;
  float* ws = wm + kLongWarps * kWarp;
  const int64_t nnz = entry_count(a.csr_indptr, a.csr_rows);
  const int per = kWarp / a.group;  // entries a warp sweeps at once in the per-head passes

  for_long_rows(a.indptr, a.rows, [&](int64_t row) {
    const int64_t b = a.indptr[row], end = a.indptr[row + 1];
    const bool has_self = row < a.csr_rows;
    if constexpr (kMode == GatherMode::kFused) {
      // Softmax statistics per head group: each warp's online (max, sum) over its entries, merged
      // after the self loop's in warp order.
      for (int64_t h0 = 0; h0 < H; h0 += a.group) {
        const int64_t h = h0 + lane % a.group;
        const float eri = a.er[row * H + h];
        float m = -INFINITY, sum = 0.0f;
        for (int64_t e = b + warp * per + lane / a.group; e < end; e += kLongWarps * per) {
          softmax_push(m, sum, leaky(a.el[static_cast<int64_t>(a.indices[e]) * H + h] + eri, a.slope));
        }
        for (int off = kWarp / 2; off >= a.group; off >>= 1) {
          const float m2 = __shfl_xor_sync(kFull, m, off);
          const float s2 = __shfl_xor_sync(kFull, sum, off);
          softmax_merge(m, sum, m2, s2);
        }
        if (lane < a.group) {
          wm[warp * kWarp + lane] = m;
          ws[warp * kWarp + lane] = sum;
        }
        __syncthreads();
        if (static_cast<int>(threadIdx.x) < a.group) {  // lane == threadIdx.x: h is this thread's head
          float mm = -INFINITY, ss = 0.0f;
          softmax_push(mm, ss, leaky(a.el[row * H + h] + eri, a.slope));
          for (int w = 0; w < kLongWarps; ++w) softmax_merge(mm, ss, wm[w * kWarp + threadIdx.x], ws[w * kWarp + threadIdx.x]);
          stat_max[h] = mm;
          stat_inv[h] = 1.0f / ss;
        }
        __syncthreads();
      }
      for (int64_t h = threadIdx.x; h < H; h += kLongThreads) {
        const float al = expf(leaky(a.el[row * H + h] + a.er[row * H + h], a.slope) - stat_max[h]) * stat_inv[h];
        a.alpha_self_out[row * H + h] = al;
        self_coef[h] = al * keep(a.p, a.scale, a.key, static_cast<uint64_t>(nnz + row) * H + h);
      }
      // Every coefficient, written once here and read back below (this block's own writes: visible
      // after the barrier).
      for (int64_t t = threadIdx.x; t < (end - b) * H; t += kLongThreads) {
        const int64_t e = b + t / H, h = t % H;
        const float v = leaky(a.el[static_cast<int64_t>(a.indices[e]) * H + h] + a.er[row * H + h], a.slope);
        a.alpha_out[e * H + h] = expf(v - stat_max[h]) * stat_inv[h];
      }
    } else {
      for (int64_t h = threadIdx.x; h < H; h += kLongThreads) {
        self_coef[h] = has_self ? a.alpha_self[row * H + h] *
                                      keep(a.p, a.scale, a.key, static_cast<uint64_t>(nnz + row) * H + h)
                                : 0.0f;
      }
      // grad_el[j, h]: the score gradients of j's out-edges, after its self loop's.
      for (int64_t h0 = 0; h0 < H; h0 += a.group) {
        const int64_t h = h0 + lane % a.group;
        float sum = 0.0f;
        for (int64_t q = b + warp * per + lane / a.group; q < end; q += kLongWarps * per) sum += a.gpre[a.edge[q] * H + h];
        const float first = static_cast<int>(threadIdx.x) < a.group && has_self ? a.gpre_self[row * H + h] : 0.0f;
        const float total = block_sum_in_order(sum, a.group, wm, first);
        if (static_cast<int>(threadIdx.x) < a.group) a.grad_el[row * H + h] = total;
      }
    }
    __syncthreads();  // self_coef (and alpha_out) are read below

    const float* alpha = kMode == GatherMode::kFused ? a.alpha_out : a.alpha;
    const int c = lane % lanes, grp = lane / lanes, groups = kWarp / lanes;
    const int64_t nvec = H * F / kVec, stride = static_cast<int64_t>(kLongWarps) * groups;
    const float* x_self = a.x + row * a.x_ld;
    float* out_row = a.out + row * a.out_ld;
    for (int64_t tile = 0; tile < nvec; tile += static_cast<int64_t>(lanes) * kNv) {
      Vec<kVec> acc[kNv];
      int64_t col[kNv], head[kNv];
      bool valid[kNv];
      tile_vectors<kVec>(tile, lanes, c, nvec, F, col, head, valid);
#pragma unroll
      for (int v = 0; v < kNv; ++v) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[v].v[k] = 0.0f;
      }
      for (int64_t q0 = b + warp * groups + grp; q0 < end; q0 += stride * kLongUnroll) {
        float w[kLongUnroll][kNv];
        const float* rows[kLongUnroll];
#pragma unroll
        for (int u = 0; u < kLongUnroll; ++u) {
          const int64_t q = q0 + u * stride;
          const bool in = q < end;
          const int64_t e = !in ? 0 : kMode == GatherMode::kGradZ ? a.edge[q] : q;
          rows[u] = a.x + (in ? static_cast<int64_t>(a.indices[q]) : 0) * a.x_ld;
#pragma unroll
          for (int v = 0; v < kNv; ++v) {
            const uint64_t counter = static_cast<uint64_t>(e) * H + head[v];
            w[u][v] = in && valid[v] ? alpha[e * H + head[v]] * keep(a.p, a.scale, a.key, counter) : 0.0f;
          }
        }
        add_weighted_rows<kLongUnroll>(rows, col, w, acc);
      }
#pragma unroll
      for (int v = 0; v < kNv; ++v) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          for (int off = kWarp / 2; off >= lanes; off >>= 1) acc[v].v[k] += __shfl_xor_sync(kFull, acc[v].v[k], off);
        }
        if (grp == 0) store<kVec>(part + warp * tile_floats + (static_cast<int64_t>(v) * lanes + c) * kVec, acc[v]);
      }
      __syncthreads();
      // The self term first, as the warp kernel starts its sums, then the warps' sums in order.
      for (int64_t i = threadIdx.x; i < tile_floats; i += kLongThreads) {
        const int64_t col0 = tile * kVec + i;
        if (col0 >= H * F) continue;
        float sum = has_self ? self_coef[col0 / F] * x_self[col0] : 0.0f;
        for (int w = 0; w < kLongWarps; ++w) sum += part[w * tile_floats + i];
        out_row[col0] = sum;
      }
      __syncthreads();  // part is rewritten by the next tile
    }
  });
}

// gat_score_grad_kernel for the long rows: the same three steps, each over the whole block, with
// the per-head sums (w, grad_er) combined in warp order.
template <int kVec, int kNv>
__global__ void __launch_bounds__(kLongThreads, kLongBlocksPerSm) gat_long_score_grad_kernel(ScoreGradArgs a) {
  __shared__ float parts[kLongWarps * kWarp];
  __shared__ float w_head[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t H = a.heads;
  const int64_t nnz = entry_count(a.indptr, a.rows);
  if (nnz * H > a.gpre_capacity) __trap();
  const int per = kWarp / a.group;
  for_long_rows(a.indptr, a.rows, [&](int64_t row) {
    const int64_t b = a.indptr[row], end = a.indptr[row + 1], deg = end - b;
    if constexpr (kNv > 0) {
      const int64_t groups = kWarp / a.lanes;
      score_dots_by_entry<kVec, kNv>(a, row, b, deg, nnz, warp * groups, kLongWarps * groups);
    } else {
      score_dots_by_pair<kVec>(a, row, b, deg, nnz, threadIdx.x, kLongThreads);
    }
    __syncthreads();  // the workspace written above is read by other threads below

    for (int64_t h0 = 0; h0 < H; h0 += a.group) {
      const int64_t h = h0 + lane % a.group;
      const bool head_thread = static_cast<int>(threadIdx.x) < a.group;  // then h is its head
      const float eri = a.er[row * H + h];
      float w = 0.0f;
      for (int64_t e = b + warp * per + lane / a.group; e < end; e += kLongWarps * per) w += a.alpha[e * H + h] * a.gpre[e * H + h];
      const float self_w = head_thread ? a.alpha_self[row * H + h] * a.gpre_self[row * H + h] : 0.0f;
      const float total_w = block_sum_in_order(w, a.group, parts, self_w);
      if (head_thread) w_head[threadIdx.x] = total_w;
      __syncthreads();
      const float wh = w_head[lane % a.group];
      float sum = 0.0f;
      for (int64_t e = b + warp * per + lane / a.group; e < end; e += kLongWarps * per) {
        const float gs = a.alpha[e * H + h] * (a.gpre[e * H + h] - wh);
        const float gp = gs * (a.el[static_cast<int64_t>(a.indices[e]) * H + h] + eri > 0.0f ? 1.0f : a.slope);
        a.gpre[e * H + h] = gp;
        sum += gp;
      }
      float self_gp = 0.0f;
      if (head_thread) {
        const float gs = a.alpha_self[row * H + h] * (a.gpre_self[row * H + h] - wh);
        self_gp = gs * (a.el[row * H + h] + eri > 0.0f ? 1.0f : a.slope);
        a.gpre_self[row * H + h] = self_gp;
      }
      const float total = block_sum_in_order(sum, a.group, parts, self_gp);
      if (head_thread) a.grad_er[row * H + h] = total;
    }
  });
}

// ---- host side ----------------------------------------------------------------------------------

int next_pow2(int64_t n) {
  int p = 1;
  while (p < n && p < kWarp) p <<= 1;
  return p;
}

int head_group(int64_t heads) { return kWarp % heads == 0 ? static_cast<int>(heads) : 1; }

unsigned grid_for(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// The long-row kernels' grid: kLongGridPerSm blocks an SM (each scans its share of the rows for
// long ones), and no more blocks than rows.
unsigned long_row_blocks(int64_t rows) {
  const int64_t most = static_cast<int64_t>(cuda::current_multiprocessors()) * kLongGridPerSm;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(rows, most)));
}

void check_shape(const char* op, const GatShape& s) {
  if (s.heads < 1 || s.heads > kGatCudaMaxHeads || s.f < 1) {
    throw InputError(std::string(op) + ": heads = " + std::to_string(s.heads) + ", f = " + std::to_string(s.f) +
                     "; the CUDA kernels take 1 to " + std::to_string(kGatCudaMaxHeads) +
                     " heads of at least one feature");
  }
}

float dropout_scale(float p) { return p > 0.0f ? 1.0f / (1.0f - p) : 1.0f; }

// Whole entries a lane group for the score gradients' dots (score_dots_by_entry) when an entry's
// vectors fill at most 4 a lane and each head's vectors are a power of two of lanes (or there is
// one head); else a lane group per (entry, head) pair, as before. Sets a.lanes and launches the
// warp and the long-row kernels.
void launch_score_grad(ScoreGradArgs a, bool vec4, cudaStream_t stream) {
  const int vec = vec4 ? 4 : 1;
  const int64_t per_head = a.f / vec, nvec = a.heads * per_head;
  const bool pow2_head = per_head <= kWarp && (per_head & (per_head - 1)) == 0;
  const int nv = nvec <= 32 ? 1 : nvec <= 64 ? 2 : nvec <= 128 ? 4 : 0;
  const bool by_entry = nv > 0 && (a.heads == 1 || pow2_head);
  const unsigned grid = grid_for(a.rows), long_grid = long_row_blocks(a.rows);
  if (!by_entry) {
    a.lanes = next_pow2(per_head);
    if (vec4) gat_score_grad_kernel<4, 0><<<grid, kBlock, 0, stream>>>(a);
    else gat_score_grad_kernel<1, 0><<<grid, kBlock, 0, stream>>>(a);
    GALE_CHECK_CUDA(cudaGetLastError());
    if (vec4) gat_long_score_grad_kernel<4, 0><<<long_grid, kLongThreads, 0, stream>>>(a);
    else gat_long_score_grad_kernel<1, 0><<<long_grid, kLongThreads, 0, stream>>>(a);
    GALE_CHECK_CUDA(cudaGetLastError());
    return;
  }
  a.lanes = next_pow2(nvec);
#define GALE_GAT_SCORE_GRAD(VEC, NV)                                                   \
  if (vec == VEC && nv == NV) {                                                        \
    gat_score_grad_kernel<VEC, NV><<<grid, kBlock, 0, stream>>>(a);                    \
    GALE_CHECK_CUDA(cudaGetLastError());                                               \
    gat_long_score_grad_kernel<VEC, NV><<<long_grid, kLongThreads, 0, stream>>>(a);    \
    GALE_CHECK_CUDA(cudaGetLastError());                                               \
    return;                                                                            \
  }
  GALE_GAT_SCORE_GRAD(4, 1)
  GALE_GAT_SCORE_GRAD(4, 2)
  GALE_GAT_SCORE_GRAD(4, 4)
  GALE_GAT_SCORE_GRAD(1, 1)
  GALE_GAT_SCORE_GRAD(1, 2)
  GALE_GAT_SCORE_GRAD(1, 4)
#undef GALE_GAT_SCORE_GRAD
}

// What every gather sets: the walked structure (the CSR forward, the CSC for kGradZ), the CSR whose
// rows number the self-loop dropout counters, the shape, the dropout, and the gathered rows x and
// the written rows out.
GatherArgs gather_args(const CsrView& walked, const CsrView& csr, const GatShape& s, float p, uint64_t key,
                       ConstMatrixView x, MatrixView out) {
  GatherArgs a;
  a.rows = walked.rows;
  a.indptr = walked.indptr;
  a.indices = walked.indices;
  a.csr_indptr = csr.indptr;
  a.csr_rows = csr.rows;
  a.heads = s.heads;
  a.f = s.f;
  a.slope = s.slope;
  a.p = p;
  a.scale = dropout_scale(p);
  a.key = key;
  a.x = x.data;
  a.x_ld = x.ld;
  a.out = out.data;
  a.out_ld = out.ld;
  return a;
}

// Whether a kernel over rows of x and y (heads x f floats each) may move float4s.
bool vec4_rows(const GatShape& s, ConstMatrixView x, ConstMatrixView y) {
  return s.f % 4 == 0 && float4_rows(x.data, x.ld) && float4_rows(y.data, y.ld);
}

// Chooses the vector width, lanes per entry and vectors per lane for a gather over heads*f floats
// per row, and launches.
template <GatherMode kMode>
void launch_gather(GatherArgs a, bool vec4, cudaStream_t stream) {
  const int vec = vec4 ? 4 : 1;
  const int64_t nvec = a.heads * a.f / vec;
  a.lanes = next_pow2(nvec);
  const int nv = nvec <= 32 ? 1 : nvec <= 64 ? 2 : 4;
  a.group = head_group(a.heads);
  a.chunk = a.heads <= 32 ? 32 : std::max<int64_t>(1, kStagedCoefficients / a.heads);
  const size_t smem = kWarpsPerBlock * static_cast<size_t>(a.chunk * a.heads + 3 * a.heads + a.chunk) * sizeof(float);
  const unsigned grid = grid_for(a.rows);
  if (vec4) {
    if (nv == 1) gat_gather_kernel<4, 1, kMode><<<grid, kBlock, smem, stream>>>(a);
    else if (nv == 2) gat_gather_kernel<4, 2, kMode><<<grid, kBlock, smem, stream>>>(a);
    else gat_gather_kernel<4, 4, kMode><<<grid, kBlock, smem, stream>>>(a);
  } else {
    if (nv == 1) gat_gather_kernel<1, 1, kMode><<<grid, kBlock, smem, stream>>>(a);
    else if (nv == 2) gat_gather_kernel<1, 2, kMode><<<grid, kBlock, smem, stream>>>(a);
    else gat_gather_kernel<1, 4, kMode><<<grid, kBlock, smem, stream>>>(a);
  }
  GALE_CHECK_CUDA(cudaGetLastError());
  if constexpr (kMode != GatherMode::kAggregate) {
    const size_t tile_floats = static_cast<size_t>(a.lanes) * static_cast<size_t>(nv) * static_cast<size_t>(vec);
    const size_t long_smem = (kLongWarps * tile_floats + 3 * static_cast<size_t>(a.heads) + 2 * kLongWarps * kWarp) * sizeof(float);
    const unsigned long_grid = long_row_blocks(a.rows);
    if (vec4) {
      if (nv == 1) gat_long_gather_kernel<4, 1, kMode><<<long_grid, kLongThreads, long_smem, stream>>>(a);
      else if (nv == 2) gat_long_gather_kernel<4, 2, kMode><<<long_grid, kLongThreads, long_smem, stream>>>(a);
      else gat_long_gather_kernel<4, 4, kMode><<<long_grid, kLongThreads, long_smem, stream>>>(a);
    } else {
      if (nv == 1) gat_long_gather_kernel<1, 1, kMode><<<long_grid, kLongThreads, long_smem, stream>>>(a);
      else if (nv == 2) gat_long_gather_kernel<1, 2, kMode><<<long_grid, kLongThreads, long_smem, stream>>>(a);
      else gat_long_gather_kernel<1, 4, kMode><<<long_grid, kLongThreads, long_smem, stream>>>(a);
    }
    GALE_CHECK_CUDA(cudaGetLastError());
  }
}

constexpr size_t kWorkspaceAlign = 256;

size_t self_workspace_bytes(int64_t dst_rows, const GatShape& s) {
  const size_t bytes = static_cast<size_t>(dst_rows * s.heads) * sizeof(float);
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

}  // namespace

void gat_softmax_cuda(const CsrView& g, const GatShape& s, const float* el, const float* er, float* alpha,
                      float* alpha_self, cudaStream_t stream) {
  check_shape("gat_softmax_cuda", s);
  if (g.rows == 0) return;
  SoftmaxArgs a;
  a.rows = g.rows;
  a.indptr = g.indptr;
  a.indices = g.indices;
  a.heads = s.heads;
  a.group = head_group(s.heads);
  a.slope = s.slope;
  a.el = el;
  a.er = er;
  a.alpha = alpha;
  a.alpha_self = alpha_self;
  gat_softmax_kernel<<<grid_for(g.rows), kBlock, 0, stream>>>(a);
  GALE_CHECK_CUDA(cudaGetLastError());
}

void gat_aggregate_cuda(const CsrView& g, const GatShape& s, const float* alpha, const float* alpha_self, float p,
                        uint64_t key, ConstMatrixView z, MatrixView out, cudaStream_t stream) {
  check_shape("gat_aggregate_cuda", s);
  if (g.rows == 0) return;
  GatherArgs a = gather_args(g, g, s, p, key, z, out);
  a.alpha = alpha;
  a.alpha_self = alpha_self;
  launch_gather<GatherMode::kAggregate>(a, vec4_rows(s, z, out), stream);
}

void gat_forward_cuda(const CsrView& g, const GatShape& s, const float* el, const float* er, float p, uint64_t key,
                      ConstMatrixView z, float* alpha, float* alpha_self, MatrixView out, cudaStream_t stream) {
  check_shape("gat_forward_cuda", s);
  if (g.rows == 0) return;
  GatherArgs a = gather_args(g, g, s, p, key, z, out);
  a.el = el;
  a.er = er;
  a.alpha_out = alpha;
  a.alpha_self_out = alpha_self;
  launch_gather<GatherMode::kFused>(a, vec4_rows(s, z, out), stream);
}

size_t gat_backward_workspace_bytes(int64_t nnz, int64_t dst_rows, const GatShape& s) {
  return self_workspace_bytes(dst_rows, s) + static_cast<size_t>(nnz * s.heads) * sizeof(float);
}

void gat_backward_cuda(const CsrView& g, const CsrView& csc, const int64_t* csc_edge, const GatShape& s,
                       const float* el, const float* er, const float* alpha, const float* alpha_self, float p,
                       uint64_t key, ConstMatrixView z, ConstMatrixView grad_out, MatrixView grad_z, float* grad_el,
                       float* grad_er, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  check_shape("gat_backward_cuda", s);
  // The self-loop part sits first so its offset is known without E; the entries' part follows.
  const size_t self_bytes = self_workspace_bytes(g.rows, s);
  if (g.rows > 0 && (workspace == nullptr || workspace_bytes < self_bytes)) {
    throw InputError("gat_backward_cuda: workspace of " + std::to_string(workspace_bytes) + " bytes is below the " +
                     std::to_string(self_bytes) + " its " + std::to_string(g.rows) +
                     " destinations need; size it with gat_backward_workspace_bytes");
  }
  float* gpre_self = static_cast<float*>(workspace);
  float* gpre = g.rows > 0 ? reinterpret_cast<float*>(static_cast<char*>(workspace) + self_bytes) : nullptr;
  const float scale = dropout_scale(p);

  if (g.rows > 0) {
    ScoreGradArgs a;
    a.rows = g.rows;
    a.indptr = g.indptr;
    a.indices = g.indices;
    a.heads = s.heads;
    a.f = s.f;
    a.group = head_group(s.heads);
    a.slope = s.slope;
    a.p = p;
    a.scale = scale;
    a.key = key;
    a.el = el;
    a.er = er;
    a.alpha = alpha;
    a.alpha_self = alpha_self;
    a.z = z.data;
    a.z_ld = z.ld;
    a.grad_out = grad_out.data;
    a.grad_out_ld = grad_out.ld;
    a.gpre = gpre;
    a.gpre_capacity = static_cast<int64_t>((workspace_bytes - self_bytes) / sizeof(float));
    a.gpre_self = gpre_self;
    a.grad_er = grad_er;
    const bool vec4 = vec4_rows(s, z, grad_out);
    launch_score_grad(a, vec4, stream);
  }

  if (csc.rows > 0) {
    GatherArgs a = gather_args(csc, g, s, p, key, grad_out, grad_z);
    a.edge = csc_edge;
    a.alpha = alpha;
    a.alpha_self = alpha_self;
    a.gpre = gpre;
    a.gpre_self = gpre_self;
    a.grad_el = grad_el;
    launch_gather<GatherMode::kGradZ>(a, vec4_rows(s, grad_out, grad_z), stream);
  }
}

void gat_scores_cuda(cublasHandle_t handle, ConstMatrixView z, const GatShape& s, const float* att, int64_t rows,
                     float* scores) {
  check_shape("gat_scores_cuda", s);
  if (rows == 0) return;
  // Head h: scores[:, h] = Z_h att_h, Z_h the rows x f block of z at column h*f. Column-major,
  // Z_h is the f x rows matrix at z + h*f with leading dimension z.ld, so op T gives Z_h.
  const float one = 1.0f, zero = 0.0f;
  GALE_CHECK_CUBLAS(cublasSgemvStridedBatched_64(handle, CUBLAS_OP_T, s.f, rows, &one, z.data, z.ld, s.f, att, 1, s.f,
                                                 &zero, scores, s.heads, 1, s.heads));
}

void gat_scores_backward_cuda(cublasHandle_t handle, ConstMatrixView z, const GatShape& s, const float* att,
                              int64_t rows, const float* grad_scores, MatrixView grad_z, float* grad_att) {
  check_shape("gat_scores_backward_cuda", s);
  if (rows == 0) return;
  const float one = 1.0f;
  // grad_att_h += Z_h^T gs_h: column-major op N on the f x rows block.
  GALE_CHECK_CUBLAS(cublasSgemvStridedBatched_64(handle, CUBLAS_OP_N, s.f, rows, &one, z.data, z.ld, s.f, grad_scores,
                                                 s.heads, 1, &one, grad_att, 1, s.f, s.heads));
  // grad_z_h += gs_h att_h^T: column-major, the f x rows block gets att_h (f) times gs_h^T (rows).
  for (int64_t h = 0; h < s.heads; ++h) {
    GALE_CHECK_CUBLAS(cublasSger_v2_64(handle, s.f, rows, &one, att + h * s.f, 1, grad_scores + h, s.heads,
                                       grad_z.data + h * s.f, grad_z.ld));
  }
}

}  // namespace gale::kernels
