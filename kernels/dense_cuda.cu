// kernels/dense_cuda.cu — CUDA twins of dense_cpu.cpp (and of engine/model.cpp's softmax
// cross-entropy), each matching its CPU reference so a run can train on either device.
//
// Elementwise ops share one grid-stride kernel over V-column groups of a row-major view: V = 4
// (float4 loads and stores) when every pointer is 16-byte aligned and every leading dimension and
// the width are multiples of 4, V = 1 otherwise. They are memory-bound, so the vector width is what
// matters, not the arithmetic.
//
// Reductions are deterministic: no floating-point atomics, every sum in an order fixed by the
// shape alone, accumulated in double as the CPU does. Random draws use random.hpp's counter RNG
// with the CPU's counters, so dropout masks are bit-identical.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/warp.cuh"
#include "kernels/dense.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"

namespace gale::kernels {

namespace {

constexpr int kThreads = 256;
// 4096 blocks of 256 threads keep every SM of an H100/H200 (132 SMs x 2048 threads) busy several
// times over; larger arrays loop inside the kernel.
constexpr int64_t kMaxBlocks = 4096;

constexpr int64_t kWarpsPerMask = kThreads / kWarp;  // mask words per block

unsigned blocks_for(int64_t work_items, int64_t items_per_block = kThreads) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((work_items + items_per_block - 1) / items_per_block, 1, kMaxBlocks));
}

void check_launch() { GALE_CHECK_CUDA(cudaGetLastError()); }

// ---- elementwise ------------------------------------------------------------------------------

template <int V>
struct Pack {
  float v[V];
};

template <int V>
__device__ __forceinline__ Pack<V> load(const float* p) {
  Pack<V> out;
  if constexpr (V == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    out.v[0] = q.x;
    out.v[1] = q.y;
    out.v[2] = q.z;
    out.v[3] = q.w;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out.v[i] = p[i];
  }
  return out;
}

template <int V>
__device__ __forceinline__ void store(float* p, const Pack<V>& x) {
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(x.v[0], x.v[1], x.v[2], x.v[3]);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = x.v[i];
  }
}

// Calls op.apply<V>(r, c) for every group of V consecutive columns c .. c + V - 1 of a
// rows x (groups * V) matrix. Consecutive threads take consecutive groups of one row: coalesced.
template <int V, typename Op>
__global__ void map_kernel(int64_t rows, int64_t groups, Op op) {
  const int64_t total = rows * groups;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / groups;
    op.template apply<V>(r, (i - r * groups) * V);
  }
}

template <typename Op>
void launch_map(int64_t rows, int64_t cols, bool vec4, const Op& op, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  if (vec4 && cols % 4 == 0) {
    const int64_t groups = cols / 4;
    map_kernel<4><<<blocks_for(rows * groups), kThreads, 0, stream>>>(rows, groups, op);
  } else {
    map_kernel<1><<<blocks_for(rows * cols), kThreads, 0, stream>>>(rows, cols, op);
  }
  check_launch();
}

__device__ __forceinline__ const float* at(const ConstMatrixView& m, int64_t r, int64_t c) {
  return m.data + r * m.ld + c;
}
__device__ __forceinline__ float* at(const MatrixView& m, int64_t r, int64_t c) { return m.data + r * m.ld + c; }

template <bool kRelu>
struct AddBias {
  MatrixView out;
  const float* bias;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    Pack<V> x = load<V>(at(out, r, c));
    const Pack<V> b = load<V>(bias + c);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      x.v[i] += b.v[i];
      if (kRelu) x.v[i] = x.v[i] > 0.0f ? x.v[i] : 0.0f;
    }
    store<V>(at(out, r, c), x);
  }
};

struct FillBlock {
  MatrixView out;
  float value;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    Pack<V> x;
#pragma unroll
    for (int i = 0; i < V; ++i) x.v[i] = value;
    store<V>(at(out, r, c), x);
  }
};

// side_by_side_cuda: each element from the block whose columns hold it, or 0.
struct SideBySide {
  ColumnBlock blocks[kMaxSideBySide];
  int count;
  MatrixView out;
  __device__ float value(int64_t r, int64_t c) const {
    for (int b = 0; b < count; ++b) {
      const ColumnBlock& k = blocks[b];
      if (c >= k.col && c < k.col + k.x.cols) return r < k.x.rows ? k.x.data[r * k.x.ld + (c - k.col)] : 0.0f;
    }
    return 0.0f;
  }
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    Pack<V> x;
#pragma unroll
    for (int i = 0; i < V; ++i) x.v[i] = value(r, c + i);
    store<V>(at(out, r, c), x);
  }
};

struct Axpy {
  ConstMatrixView x;
  float alpha;
  MatrixView y;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    const Pack<V> a = load<V>(at(x, r, c));
    Pack<V> b = load<V>(at(y, r, c));
#pragma unroll
    for (int i = 0; i < V; ++i) b.v[i] = fmaf(alpha, a.v[i], b.v[i]);
    store<V>(at(y, r, c), b);
  }
};

struct ReluForward {
  ConstMatrixView x;
  MatrixView out;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    Pack<V> a = load<V>(at(x, r, c));
#pragma unroll
    for (int i = 0; i < V; ++i) a.v[i] = a.v[i] > 0.0f ? a.v[i] : 0.0f;
    store<V>(at(out, r, c), a);
  }
};

struct ReluBackward {
  ConstMatrixView grad_out, y;
  MatrixView grad_in;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    Pack<V> g = load<V>(at(grad_out, r, c));
    const Pack<V> yv = load<V>(at(y, r, c));
#pragma unroll
    for (int i = 0; i < V; ++i) g.v[i] = yv.v[i] > 0.0f ? g.v[i] : 0.0f;
    store<V>(at(grad_in, r, c), g);
  }
};

struct ReluBackwardMask {
  ConstMatrixView grad_out;
  const uint32_t* bits;
  int64_t words;
  MatrixView grad_in;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    Pack<V> g = load<V>(at(grad_out, r, c));
    // V <= 4 consecutive columns from a multiple of V never straddle a 32-bit word.
    const uint32_t word = bits[r * words + c / 32] >> (c % 32);
#pragma unroll
    for (int i = 0; i < V; ++i) g.v[i] = (word >> i) & 1u ? g.v[i] : 0.0f;
    store<V>(at(grad_in, r, c), g);
  }
};

// One warp per mask word: lane l tests column 32 w + l, the ballot is the word.
__global__ void relu_mask_kernel(ConstMatrixView y, uint32_t* bits, int64_t words) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t total = y.rows * words;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; i < total; i += warps) {
    const int64_t r = i / words;
    const int64_t c = (i - r * words) * kWarp + lane;
    const bool positive = c < y.cols && y.data[r * y.ld + c] > 0.0f;
    const unsigned word = __ballot_sync(kFull, positive);
    if (lane == 0) bits[i] = word;
  }
}

// The same words from 16-byte loads (rows 16-byte aligned): 8 lanes a word, each testing 4
// columns, their nibbles ORed together by shuffles within the 8; a grid-stride loop whose steps
// are warp-uniform, so every shuffle has all 32 lanes. Reads at ~2x the rate of the kernel above.
__global__ void relu_mask4_kernel(ConstMatrixView y, uint32_t* bits, int64_t words) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t per_row = words * 8;
  const int64_t total = y.rows * per_row;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x - lane; base < total; base += step) {
    const int64_t t = base + lane;
    unsigned nibble = 0;
    int sub = 0;
    if (t < total) {
      const int64_t r = t / per_row;
      const int64_t j = t - r * per_row;
      sub = static_cast<int>(j % 8);
      const int64_t c = (j / 8) * kWarp + sub * 4;
      if (c < y.cols) {
        const float4 v = *reinterpret_cast<const float4*>(y.data + r * y.ld + c);
        nibble = (v.x > 0.0f ? 1u : 0u) | (c + 1 < y.cols && v.y > 0.0f ? 2u : 0u) |
                 (c + 2 < y.cols && v.z > 0.0f ? 4u : 0u) | (c + 3 < y.cols && v.w > 0.0f ? 8u : 0u);
      }
    }
    unsigned word = nibble << (4 * sub);
    word |= __shfl_xor_sync(kFull, word, 1);
    word |= __shfl_xor_sync(kFull, word, 2);
    word |= __shfl_xor_sync(kFull, word, 4);
    if (t < total && sub == 0) bits[t / 8] = word;
  }
}

struct EluForward {
  ConstMatrixView x;
  MatrixView out;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    Pack<V> a = load<V>(at(x, r, c));
#pragma unroll
    for (int i = 0; i < V; ++i) a.v[i] = a.v[i] > 0.0f ? a.v[i] : expm1f(a.v[i]);
    store<V>(at(out, r, c), a);
  }
};

struct EluBackward {
  ConstMatrixView grad_out, y;
  MatrixView grad_in;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    Pack<V> g = load<V>(at(grad_out, r, c));
    const Pack<V> yv = load<V>(at(y, r, c));
#pragma unroll
    for (int i = 0; i < V; ++i) g.v[i] = yv.v[i] > 0.0f ? g.v[i] : __fmul_rn(g.v[i], yv.v[i] + 1.0f);
    store<V>(at(grad_in, r, c), g);
  }
};

// Element (r, c) uses counter r * cols + c, the CPU's; `scale` is 1 / (1 - p) computed on the host
// in float as the CPU does, so kept values are bit-identical too.
struct Dropout {
  ConstMatrixView x;
  MatrixView out;
  float p, scale;
  uint64_t key;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    Pack<V> a = load<V>(at(x, r, c));
    const uint64_t base = static_cast<uint64_t>(r) * static_cast<uint64_t>(x.cols) + static_cast<uint64_t>(c);
#pragma unroll
    for (int i = 0; i < V; ++i) a.v[i] = random_uniform(key, base + i) >= p ? __fmul_rn(a.v[i], scale) : 0.0f;
    store<V>(at(out, r, c), a);
  }
};

// C = beta * C for k = 0, where cuBLAS would not be called (BLAS leaves C untouched when beta = 0
// only as "need not be set", and the CPU twin writes zeros).
__global__ void scale_kernel(float* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  const int64_t total = m * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    float* e = c + (i / n) * ldc + i % n;
    *e = beta == 0.0f ? 0.0f : beta * *e;
  }
}

// ---- column sum -------------------------------------------------------------------------------

void require(bool ok, const std::string& what) {
  if (!ok) throw InputError(what);
}

constexpr int kSumThreads = 512;

// K column sums of one pass over a rows x cols matrix of values, e.g. a column's sum and its sum
// of squares. Two passes, deterministic. Pass 1: block (tile, chunk) sums rows
// [chunk * chunk_rows, ...) of TW columns: thread (tx, ty) adds rows ty, ty + RL, ... of column
// c0 + tx in double, then the RL partials of each column meet in a fixed binary tree in shared
// memory and go to partial[chunk][k][c]. Pass 2: one thread per column adds the chunks in chunk
// order and hands the K sums to a finishing functor. The order of every addition depends only on
// the shape, never on scheduling, and a tall matrix still spreads over ~1024 chunks x tiles blocks
// (one block per 32-column tile could not fill the GPU). TW shrinks with narrow matrices so a bias
// of 1-16 columns still uses all 512 threads on rows. The K values summed at (r, c) come from a
// functor (load), which may also write something there (store), so a kernel that writes a matrix
// can sum its columns in the same pass (ReluMaskedValue).
template <int K, typename T = float>
struct Vals {
  T v[K];
};

struct MatrixValue {
  ConstMatrixView x;
  __device__ Vals<1> load(int64_t r, int64_t c) const { return {{x.data[r * x.ld + c]}}; }
  __device__ void store(int64_t, int64_t, const Vals<1>&) const {}
};
// relu_backward_mask's element, written to grad_in (which may be grad_out) and summed.
struct ReluMaskedValue {
  ConstMatrixView grad_out;
  const uint32_t* bits;
  int64_t words;
  MatrixView grad_in;
  __device__ Vals<1> load(int64_t r, int64_t c) const {
    return {{(bits[r * words + c / 32] >> (c % 32)) & 1u ? grad_out.data[r * grad_out.ld + c] : 0.0f}};
  }
  __device__ void store(int64_t r, int64_t c, const Vals<1>& v) const { grad_in.data[r * grad_in.ld + c] = v.v[0]; }
};
// relu_backward's element (ReluBackward), written to grad_in (which may be grad_out) and summed.
struct ReluValue {
  ConstMatrixView grad_out, y;
  MatrixView grad_in;
  __device__ Vals<1> load(int64_t r, int64_t c) const {
    return {{y.data[r * y.ld + c] > 0.0f ? grad_out.data[r * grad_out.ld + c] : 0.0f}};
  }
  __device__ void store(int64_t r, int64_t c, const Vals<1>& v) const { grad_in.data[r * grad_in.ld + c] = v.v[0]; }
};

template <int TW, int K, typename Value>
__global__ void __launch_bounds__(kSumThreads)
    column_sum_partial_kernel(int64_t rows, int64_t cols, Value value, int64_t chunk_rows, double* partial) {
  constexpr int kRowLanes = kSumThreads / TW;
  __shared__ double lanes[K][kSumThreads];
  const int tx = static_cast<int>(threadIdx.x) % TW;
  const int ty = static_cast<int>(threadIdx.x) / TW;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * TW + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = min(rows, r0 + chunk_rows);
  double acc[K] = {};
  if (c < cols) {
    // Four rows' loads go out before their stores (a store may alias a later load's matrix, so the
    // compiler would not move the loads up itself); the additions stay in row order.
    constexpr int kUnroll = 4;
    int64_t r = r0 + ty;
    for (; r + (kUnroll - 1) * kRowLanes < r1; r += kUnroll * kRowLanes) {
      decltype(value.load(r, c)) v[kUnroll];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) v[i] = value.load(r + i * kRowLanes, c);
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        value.store(r + i * kRowLanes, c, v[i]);
#pragma unroll
        for (int k = 0; k < K; ++k) acc[k] += v[i].v[k];
      }
    }
    for (; r < r1; r += kRowLanes) {
      const auto v = value.load(r, c);
      value.store(r, c, v);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += v.v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) lanes[k][threadIdx.x] = acc[k];
  __syncthreads();
#pragma unroll
  for (int s = kRowLanes / 2; s > 0; s >>= 1) {
    if (ty < s) {
#pragma unroll
      for (int k = 0; k < K; ++k) lanes[k][threadIdx.x] += lanes[k][threadIdx.x + s * TW];
    }
    __syncthreads();
  }
  if (ty == 0 && c < cols) {
#pragma unroll
    for (int k = 0; k < K; ++k) partial[(static_cast<int64_t>(blockIdx.y) * K + k) * cols + c] = lanes[k][tx];
  }
}

template <int K, typename Finish>
__global__ void column_sum_finish_kernel(const double* partial, int64_t chunks, int64_t cols, Finish finish) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  double sum[K] = {};
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
#pragma unroll
    for (int k = 0; k < K; ++k) sum[k] += partial[(chunk * K + k) * cols + c];
  }
  finish(c, sum);
}

// out[c] (+)= the column's sum / divisor.
struct SumInto {
  float* out;
  bool accumulate;
  double divisor;
  __device__ void operator()(int64_t c, const double* sum) const {
    out[c] = static_cast<float>((accumulate ? static_cast<double>(out[c]) : 0.0) + sum[0] / divisor);
  }
};

// Rows per pass-1 chunk: at least 4096 (so each block has work), at most 1024 chunks.
constexpr int64_t kSumMinChunkRows = 4096;
constexpr int64_t kSumMaxChunks = 1024;
int64_t column_sum_chunks(int64_t rows) {
  return std::clamp<int64_t>((rows + kSumMinChunkRows - 1) / kSumMinChunkRows, 1, kSumMaxChunks);
}
// The pass-1 partials of K sums.
size_t column_sums_workspace_bytes(int64_t rows, int64_t cols, int k) {
  return static_cast<size_t>(column_sum_chunks(rows)) * static_cast<size_t>(std::max<int64_t>(cols, 0)) *
         static_cast<size_t>(k) * sizeof(double);
}

// Pass 1 over `rows` rows in `chunks` chunks of chunk_rows, into partial[0, chunks), TW sized to
// the width.
template <int TW, int K, typename Value>
void launch_column_sum_partials(int64_t rows, int64_t cols, Value value, int64_t chunk_rows, int64_t chunks,
                                double* partial, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((cols + TW - 1) / TW), static_cast<unsigned>(chunks));
  column_sum_partial_kernel<TW, K><<<grid, kSumThreads, 0, stream>>>(rows, cols, value, chunk_rows, partial);
  check_launch();
}
template <int K, typename Value>
void column_sum_partials(int64_t rows, int64_t cols, Value value, int64_t chunk_rows, int64_t chunks, double* partial,
                         cudaStream_t stream) {
  if (cols == 1) return launch_column_sum_partials<1, K>(rows, cols, value, chunk_rows, chunks, partial, stream);
  if (cols <= 2) return launch_column_sum_partials<2, K>(rows, cols, value, chunk_rows, chunks, partial, stream);
  if (cols <= 4) return launch_column_sum_partials<4, K>(rows, cols, value, chunk_rows, chunks, partial, stream);
  if (cols <= 8) return launch_column_sum_partials<8, K>(rows, cols, value, chunk_rows, chunks, partial, stream);
  if (cols <= 16) return launch_column_sum_partials<16, K>(rows, cols, value, chunk_rows, chunks, partial, stream);
  launch_column_sum_partials<32, K>(rows, cols, value, chunk_rows, chunks, partial, stream);
}

// K column sums of rows x cols values (a functor above) handed to finish.
template <int K, typename Value, typename Finish>
void column_sums(int64_t rows, int64_t cols, Value value, Finish finish, void* workspace, size_t workspace_bytes,
                 const char* op, cudaStream_t stream) {
  if (cols == 0) return;
  const size_t needed = column_sums_workspace_bytes(rows, cols, K);
  require(workspace_bytes >= needed, std::string(op) + ": workspace of " + std::to_string(workspace_bytes) +
                                         " bytes, " + std::to_string(needed) + " needed");
  auto* partial = static_cast<double*>(workspace);
  const int64_t chunks = column_sum_chunks(rows);
  column_sum_partials<K>(rows, cols, value, (rows + chunks - 1) / chunks, chunks, partial, stream);
  column_sum_finish_kernel<K><<<blocks_for(cols), kThreads, 0, stream>>>(partial, chunks, cols, finish);
  check_launch();
}

// ---- Adam -------------------------------------------------------------------------------------

// Several tensors in one launch: each block takes kManyChunk elements of one tensor; chunk_start
// holds where each tensor's chunks begin (a prefix over count + 1 entries).
constexpr int64_t kManyChunk = 4096;

struct AdamMany {
  AdamTensor t[kAdamTensorsPerLaunch];
  int64_t chunk_start[kAdamTensorsPerLaunch + 1];
  int count;
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, step_size, bc2_sqrt;
};

struct ZeroMany {
  float* data[kAdamTensorsPerLaunch];
  int64_t n[kAdamTensorsPerLaunch];
  int64_t chunk_start[kAdamTensorsPerLaunch + 1];
  int count;
};

// The tensor whose chunks include `chunk` (count is small: a linear scan).
__device__ int tensor_of_chunk(const int64_t* chunk_start, int count, int64_t chunk) {
  int t = 0;
  while (t + 1 < count && chunk_start[t + 1] <= chunk) ++t;
  return t;
}

__global__ void adam_many_kernel(const AdamMany a) {
  const int t = tensor_of_chunk(a.chunk_start, a.count, blockIdx.x);
  const AdamTensor& x = a.t[t];
  const int64_t begin = (static_cast<int64_t>(blockIdx.x) - a.chunk_start[t]) * kManyChunk;
  const int64_t end = begin + kManyChunk < x.n ? begin + kManyChunk : x.n;
  // The CPU's float expression, operation by operation; the _rn intrinsics keep nvcc from
  // contracting a * b + c into an FMA, which would round differently from the CPU.
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float wi = x.w[i];
    const float grad = __fadd_rn(x.g[i], __fmul_rn(a.weight_decay, wi));
    const float mi = __fadd_rn(__fmul_rn(a.beta1, x.m[i]), __fmul_rn(a.one_minus_beta1, grad));
    const float vi = __fadd_rn(__fmul_rn(a.beta2, x.v[i]), __fmul_rn(__fmul_rn(a.one_minus_beta2, grad), grad));
    x.m[i] = mi;
    x.v[i] = vi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2_sqrt), a.eps);
    x.w[i] = __fsub_rn(wi, __fdiv_rn(__fmul_rn(a.step_size, mi), denom));
  }
}

__global__ void zero_many_kernel(const ZeroMany z) {
  const int t = tensor_of_chunk(z.chunk_start, z.count, blockIdx.x);
  const int64_t begin = (static_cast<int64_t>(blockIdx.x) - z.chunk_start[t]) * kManyChunk;
  const int64_t end = begin + kManyChunk < z.n[t] ? begin + kManyChunk : z.n[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) z.data[t][i] = 0.0f;
}

// Fills chunk_start for `count` tensors of n(i) elements; returns the total chunk count.
template <typename N>
int64_t chunk_prefix(int64_t* chunk_start, int count, N n) {
  chunk_start[0] = 0;
  for (int i = 0; i < count; ++i) chunk_start[i + 1] = chunk_start[i] + (n(i) + kManyChunk - 1) / kManyChunk;
  return chunk_start[count];
}

// ---- softmax cross-entropy --------------------------------------------------------------------

struct RowStats {
  float max;
  int64_t arg;
  double log_sum;
};

// A logits row belongs to a group of G lanes of a warp (32 / G rows at once), sized to the class
// count so few lanes idle and the group's shuffles cover only log2(G) steps: at 47 classes a
// warp per row left 17 of 64 lane-slots empty and spent most of its time on ten double-width
// shuffle rounds per row (1.85 ms for 2M rows; the double exps themselves are ~0.1 ms of FP64).
// Each lane keeps exp(z - max) of its first K columns for the gradient, so rows of up to G * K
// classes need one double exp per logit.
template <int G>
struct CeGroup {
  static_assert(G == 8 || G == 16 || G == 32, "a row group is 8, 16 or 32 lanes");
  static constexpr int kKept = G == 32 ? 4 : 8;
  int sub;        // the lane's place in its group
  unsigned mask;  // the group's lanes
  __device__ CeGroup() {
    const int lane = static_cast<int>(threadIdx.x) % kWarp;
    sub = lane % G;
    mask = G == kWarp ? kFull : ((1u << G) - 1u) << (lane - sub);
  }
};

// Max, first argmax and log-sum-exp (shifted by the max, in double) of one row, computed by a
// group; every lane of it returns the same values. The xor butterfly stays inside the group and
// leaves the same bits in every lane because each step adds the same two partials, only in
// swapped order. Lane s's exp(z[k] - max) for k = s + G j, j < kKept, are left in kept (0 past the
// row).
template <int G>
__device__ RowStats row_stats(const CeGroup<G>& grp, const float* z, int64_t cols,
                              double (&kept)[CeGroup<G>::kKept]) {
  float mx = -INFINITY;
  int64_t arg = INT64_MAX;  // lanes past the last column never win a tie
  for (int64_t k = grp.sub; k < cols; k += G) {
    // Strictly greater, as the CPU: within a lane k rises, so the first maximum is kept.
    if (k == grp.sub || z[k] > mx) {
      mx = z[k];
      arg = k;
    }
  }
#pragma unroll
  for (int off = G / 2; off > 0; off >>= 1) {
    const float om = __shfl_xor_sync(grp.mask, mx, off);
    const int64_t oa = __shfl_xor_sync(grp.mask, arg, off);
    if (om > mx || (om == mx && oa < arg)) {
      mx = om;
      arg = oa;
    }
  }
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < CeGroup<G>::kKept; ++j) {
    const int64_t k = grp.sub + j * G;
    kept[j] = k < cols ? exp(static_cast<double>(z[k]) - mx) : 0.0;
    sum += kept[j];
  }
  for (int64_t k = grp.sub + CeGroup<G>::kKept * G; k < cols; k += G) sum += exp(static_cast<double>(z[k]) - mx);
#pragma unroll
  for (int off = G / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(grp.mask, sum, off);
  return {mx, arg, log(sum)};
}

// The first row a group takes and the stride to its next: rows go to groups in launch order.
template <int G>
__device__ int64_t ce_first_row() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / G;
}
template <int G>
__device__ int64_t ce_row_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x / G;
}

// Loss only (no gradient): one group per listed row, its loss and hit into the workspace.
template <int G>
__global__ void ce_loss_kernel(ConstMatrixView logits, const int32_t* labels, const int64_t* rows, int64_t n_rows,
                               double* row_loss, int32_t* row_hit) {
  const CeGroup<G> grp;
  for (int64_t i = ce_first_row<G>(); i < n_rows; i += ce_row_stride<G>()) {
    const int64_t r = rows[i];
    const int32_t y = r >= 0 && r < logits.rows ? labels[r] : -1;
    if (y < 0 || y >= logits.cols) {  // group-uniform: every lane read the same r and y
      if (grp.sub == 0) {
        row_loss[i] = NAN;
        row_hit[i] = 0;
      }
      continue;
    }
    const float* z = logits.data + r * logits.ld;
    double kept[CeGroup<G>::kKept];
    const RowStats s = row_stats(grp, z, logits.cols, kept);
    if (grp.sub == 0) {
      row_loss[i] = s.log_sum - (static_cast<double>(z[y]) - s.max);
      row_hit[i] = s.arg == y ? 1 : 0;
    }
  }
}

// With the gradient, each logits row's statistics are computed once however often it is listed:
// first the listings of rows with a valid label are counted (an integer atomic: exact in any
// order), ...
__global__ void ce_count_kernel(const int32_t* labels, const int64_t* rows, int64_t n_rows, ConstMatrixView logits,
                                int32_t* multiplicity) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_rows; i += stride) {
    const int64_t r = rows[i];
    if (r < 0 || r >= logits.rows) continue;
    const int32_t y = labels[r];
    if (y >= 0 && y < logits.cols) atomicAdd(multiplicity + r, 1);
  }
}

// ... then one group per logits row writes its gradient (zeros for rows never listed; for a row
// listed k times, the CPU's per-listing float contribution added k times in float, as the CPU
// accumulates it) and, for a listed row, its loss and hit by row, which the reduction reads
// through the listing.
//
// Without multiplicity (softmax_cross_entropy_seeds_cuda) every row is listed once, its label
// labels[label_ids[r]] (labels[r] without ids); a row whose label is out of range gets a zero
// gradient and a NaN loss.
template <int G>
__global__ void ce_rows_kernel(ConstMatrixView logits, const int32_t* labels, const int64_t* label_ids, int64_t n_labels,
                               const int32_t* multiplicity, double grad_scale, MatrixView grad, double* row_loss,
                               int32_t* row_hit) {
  const CeGroup<G> grp;
  for (int64_t r = ce_first_row<G>(); r < logits.rows; r += ce_row_stride<G>()) {
    float* g = grad.data + r * grad.ld;
    int32_t listed = 1;
    int32_t y = -1;
    if (multiplicity != nullptr) {
      listed = multiplicity[r];
      if (listed > 0) y = labels[r];
    } else {  // group-uniform: every lane reads the same id and label
      const int64_t id = label_ids != nullptr ? label_ids[r] : r;
      if (id >= 0 && id < n_labels) y = labels[id];
      if (y < 0 || y >= logits.cols) {
        listed = 0;
        if (grp.sub == 0) {
          row_loss[r] = NAN;
          row_hit[r] = 0;
        }
      }
    }
    if (listed == 0) {
      for (int64_t k = grp.sub; k < grad.cols; k += G) g[k] = 0.0f;
      continue;
    }
    const float* z = logits.data + r * logits.ld;
    double kept[CeGroup<G>::kKept];
    const RowStats s = row_stats(grp, z, logits.cols, kept);
    const double inv_sum = exp(-s.log_sum);
    const auto write = [&](int64_t k, double p) {
      const float d = static_cast<float>((p - (k == y ? 1.0 : 0.0)) * grad_scale);
      float acc = 0.0f;
      for (int32_t j = 0; j < listed; ++j) acc += d;
      g[k] = acc;
    };
#pragma unroll
    for (int j = 0; j < CeGroup<G>::kKept; ++j) {
      const int64_t k = grp.sub + j * G;
      if (k < logits.cols) write(k, kept[j] * inv_sum);
    }
    for (int64_t k = grp.sub + CeGroup<G>::kKept * G; k < logits.cols; k += G) {
      write(k, exp(static_cast<double>(z[k]) - s.max - s.log_sum));
    }
    if (grp.sub == 0) {
      row_loss[r] = s.log_sum - (static_cast<double>(z[y]) - s.max);
      row_hit[r] = s.arg == y ? 1 : 0;
    }
  }
}

// Calls launch(std::integral_constant<int, G>) with the lanes per row for a class count: the
// smallest group whose kept exps cover the row (8 up to 64 classes, 16 up to 128), a whole warp
// past that.
template <typename Launch>
void with_ce_group(int64_t cols, Launch&& launch) {
  if (cols <= 64) return launch(std::integral_constant<int, 8>{});
  if (cols <= 128) return launch(std::integral_constant<int, 16>{});
  launch(std::integral_constant<int, 32>{});
}

constexpr int kReduceThreads = 256;

// Adds the listings' losses and hits in two launches: block b sums listings [b * chunk, (b + 1) *
// chunk) (thread t takes listings t, t + 256, ... of it in order, then a fixed tree), then one block
// sums the blocks' partials the same way, scaled by inv_n. The first pass reads listing i's values
// at i, or with by_row at its row by_row[i] (ce_rows_kernel's layout). The order depends only on n_rows: the same sum
// bit for bit on every run, and a million rows no longer wait on a single block.
template <typename Hit>
__global__ void __launch_bounds__(kReduceThreads)
    ce_reduce_kernel(const double* row_loss, const Hit* row_hit, const int64_t* by_row, const int32_t* multiplicity,
                     int64_t logits_rows, int64_t n_rows, int64_t chunk, double scale, double* loss_out,
                     int64_t* correct_out) {
  __shared__ double loss[kReduceThreads];
  __shared__ long long hits[kReduceThreads];
  double acc = 0.0;
  long long right = 0;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = min(n_rows, begin + chunk);
  for (int64_t i = begin + threadIdx.x; i < end; i += kReduceThreads) {
    if (by_row == nullptr) {
      acc += row_loss[i];
      right += row_hit[i];
    } else {  // listing i's row: its loss by row, or NaN when the row or its label is out of range
      const int64_t r = by_row[i];
      const bool valid = r >= 0 && r < logits_rows && multiplicity[r] > 0;
      acc += valid ? row_loss[r] : static_cast<double>(NAN);
      right += valid ? row_hit[r] : 0;
    }
  }
  loss[threadIdx.x] = acc;
  hits[threadIdx.x] = right;
  __syncthreads();
#pragma unroll
  for (int s = kReduceThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) {
      loss[threadIdx.x] += loss[threadIdx.x + s];
      hits[threadIdx.x] += hits[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    loss_out[blockIdx.x] = loss[0] * scale;
    if (correct_out != nullptr) correct_out[blockIdx.x] = hits[0];
  }
}

// Rows per first-pass block of the loss reduction, and the most blocks (the partials' room).
constexpr int64_t kReduceChunk = 8192;
constexpr int64_t kReduceMaxBlocks = 1024;
int64_t reduce_chunk(int64_t n_rows) {
  return std::max(kReduceChunk, (n_rows + kReduceMaxBlocks - 1) / kReduceMaxBlocks);
}

// Workspace sections, each starting on a 256-byte boundary.
size_t section(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

namespace {

std::atomic<bool> tuning_on{false};

// A GEMM dimension's size class: 64 at least, else rounded up to an eighth of the power of two
// below it (at most 12.5% more).
int64_t gemm_size_class(int64_t x) {
  if (x <= 64) return 64;
  const int64_t floor_pow2 = int64_t{1} << (63 - __builtin_clzll(static_cast<unsigned long long>(x)));
  const int64_t step = floor_pow2 / 8;
  return (x + step - 1) / step * step;
}

// The algorithm for one problem (shape, layouts, flags, alignment) on the current device: the
// heuristic's candidates (one, or kGemmTuneCandidates when it may be tuned), the one in use, and
// where tuning stands (it runs at the problem's second tunable call).
struct LtChoice {
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;
  int use = 0;
  bool seen = false;
  bool tuned = false;
};

// A cuBLASLt handle for the calling thread's current device, and the choice for each problem
// (asked once per problem: the query costs tens of microseconds on the host).
class LtState {
 public:
  LtState() = default;
  LtState(const LtState&) = delete;
  LtState& operator=(const LtState&) = delete;
  ~LtState() {
    if (handle_ != nullptr) (void)cublasLtDestroy(handle_);  // errors ignored: the context may be gone
  }
  cublasLtHandle_t handle() {
    int device = 0;
    GALE_CHECK_CUDA(cudaGetDevice(&device));
    if (device != device_) {
      if (handle_ != nullptr) (void)cublasLtDestroy(handle_);
      handle_ = nullptr;
      algos_.clear();
      GALE_CHECK_CUBLAS(cublasLtCreate(&handle_));
      device_ = device;
    }
    return handle_;
  }
  // m, n, k, lda, ldb, ldc, flags (transposes, epilogue, tf32; not beta), alignment.
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, size_t>;
  std::map<Key, LtChoice> algos_;
  // Sampled blocks bring new shapes every batch: past this many the choices start over (full-graph
  // training has a few dozen shapes).
  static constexpr size_t kMaxProblems = 4096;

 private:
  int device_ = -1;
  cublasLtHandle_t handle_ = nullptr;
};

thread_local LtState lt_state;

template <typename T, void (*Destroy)(T)>
struct LtOwned {
  T v = nullptr;
  ~LtOwned() {
    if (v != nullptr) Destroy(v);
  }
};
void destroy_desc(cublasLtMatmulDesc_t d) { (void)cublasLtMatmulDescDestroy(d); }
void destroy_layout(cublasLtMatrixLayout_t l) { (void)cublasLtMatrixLayoutDestroy(l); }
void destroy_pref(cublasLtMatmulPreference_t p) { (void)cublasLtMatmulPreferenceDestroy(p); }

size_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a % 16 == 0 ? 16 : a % 8 == 0 ? 8 : 4;
}

// One cuBLASLt product in Gale's row-major terms: column-major C^T = op(B)^T op(A)^T, so B is
// cuBLASLt's first operand and A its second (as gemm_cuda swaps them for cuBLAS).
struct LtProduct {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
  bool tf32 = false;
  const float* bias = nullptr;  // with the bias epilogue (then relu picks RELU_BIAS)
  bool relu = false;
};

// Median milliseconds of three runs of `run` (after one to warm up) on `stream`; waits for them.
template <typename Run>
float time_candidate(cudaStream_t stream, Run&& run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  GALE_CHECK_CUDA(cudaEventCreate(&start));
  GALE_CHECK_CUDA(cudaEventCreate(&stop));
  float ms[3] = {0, 0, 0};
  bool ok = run() == CUBLAS_STATUS_SUCCESS;
  for (int i = 0; ok && i < 3; ++i) {
    GALE_CHECK_CUDA(cudaEventRecord(start, stream));
    ok = run() == CUBLAS_STATUS_SUCCESS;
    GALE_CHECK_CUDA(cudaEventRecord(stop, stream));
    GALE_CHECK_CUDA(cudaEventSynchronize(stop));
    GALE_CHECK_CUDA(cudaEventElapsedTime(&ms[i], start, stop));
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  if (!ok) return -1.0f;  // a candidate that fails on this problem is never chosen
  std::sort(ms, ms + 3);
  return ms[1];
}

// p's operation: its compute type, the transposes (cuBLASLt's A is our b), and with a bias the
// bias (and ReLU) epilogue.
void describe_product(const LtProduct& p, LtOwned<cublasLtMatmulDesc_t, destroy_desc>& desc) {
  const cublasOperation_t op_b = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  GALE_CHECK_CUBLAS(
      cublasLtMatmulDescCreate(&desc.v, p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  GALE_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc.v, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)));
  GALE_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc.v, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)));
  if (p.bias != nullptr) {
    // The bias runs along C^T's rows, which is what cuBLASLt broadcasts: one value per column of C.
    const cublasLtEpilogue_t epilogue = p.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    GALE_CHECK_CUBLAS(
        cublasLtMatmulDescSetAttribute(desc.v, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    GALE_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc.v, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
  }
}

// Stored shapes (column-major rows x cols) of the operands as cuBLASLt reads them.
struct LtLayouts {
  LtOwned<cublasLtMatrixLayout_t, destroy_layout> a, b, c;  // cuBLASLt's A (our b), B (our a), C
};

// p's layouts with m rows and depth k (p's own, or its size class's).
void make_layouts(const LtProduct& p, int64_t m, int64_t k, LtLayouts& l) {
  GALE_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&l.a.v, CUDA_R_32F, p.trans_b ? k : p.n, p.trans_b ? p.n : k, p.ldb));
  GALE_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&l.b.v, CUDA_R_32F, p.trans_a ? m : k, p.trans_a ? k : m, p.lda));
  GALE_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&l.c.v, CUDA_R_32F, p.n, m, p.ldc));
}

// The heuristic's first `want` algorithms for the problem of `desc` and `l` within the workspace,
// best first; none when it has none.
std::vector<cublasLtMatmulHeuristicResult_t> ask_heuristic(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                                                           const LtLayouts& l, size_t workspace_bytes, int want) {
  LtOwned<cublasLtMatmulPreference_t, destroy_pref> pref;
  GALE_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref.v));
  GALE_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref.v, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace_bytes, sizeof(workspace_bytes)));
  std::vector<cublasLtMatmulHeuristicResult_t> found(static_cast<size_t>(want));
  int count = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, l.a.v, l.b.v, l.c.v, l.c.v, pref.v, want,
                                                           found.data(), &count);
  found.resize(st == CUBLAS_STATUS_SUCCESS ? static_cast<size_t>(count) : 0);
  return found;
}

// Times each of choice's candidates (run(i) launches candidate i) and uses the first within 2% of
// the fastest; a candidate that fails is never chosen.
template <typename Run>
void tune(LtChoice& choice, cudaStream_t stream, Run&& run) {
  std::vector<float> ms(choice.candidates.size());
  for (size_t i = 0; i < ms.size(); ++i) ms[i] = time_candidate(stream, [&] { return run(i); });
  float best = -1.0f;
  for (float t : ms)
    if (t >= 0.0f && (best < 0.0f || t < best)) best = t;
  for (size_t i = 0; i < ms.size() && best >= 0.0f; ++i) {
    if (ms[i] >= 0.0f && ms[i] <= best * 1.02f) {
      choice.use = static_cast<int>(i);
      break;
    }
  }
  choice.tuned = true;
}

// Runs p through cuBLASLt with the problem's chosen algorithm (tuning it first when due, see
// dense.hpp). Returns false, having done nothing, when cuBLASLt has no algorithm for it.
bool lt_matmul(const LtProduct& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const cublasLtHandle_t lt = lt_state.handle();
  LtOwned<cublasLtMatmulDesc_t, destroy_desc> desc;
  describe_product(p, desc);
  LtLayouts exact;
  make_layouts(p, p.m, p.k, exact);
  size_t aligned = std::min({alignment(p.a), alignment(p.b), alignment(p.c)});
  if (p.bias != nullptr) aligned = std::min(aligned, alignment(p.bias));
  const int flags = (p.trans_a ? 1 : 0) | (p.trans_b ? 2 : 0) | (p.bias != nullptr ? 4 : 0) | (p.relu ? 8 : 0) |
                    (p.tf32 ? 16 : 0);
  // Sampled blocks bring new row counts every batch, and asking the heuristic costs tens of
  // microseconds of host time (most of a mini-batch step's, measured): problems are keyed by their size
  // class instead (gemm_size_class: m, and k, rounded up to an eighth of a power of two where the
  // dimension is not a stored leading one), and the heuristic is asked once per class, for its
  // largest problem, so that the algorithm's workspace suffices for every problem of the class.
  const int64_t qm = p.trans_a ? p.m : gemm_size_class(p.m);
  const int64_t qk = (!p.trans_a || p.trans_b) ? p.k : gemm_size_class(p.k);
  const LtState::Key key{qm, p.n, qk, p.lda, p.ldb, p.ldc, flags, aligned};
  const double macs = static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
  const bool tuning = tuning_on.load(std::memory_order_relaxed) && macs >= kGemmTuneMacs;
  auto found = lt_state.algos_.find(key);
  if (found == lt_state.algos_.end()) {
    if (lt_state.algos_.size() >= LtState::kMaxProblems) lt_state.algos_.clear();
    LtChoice choice;
    LtLayouts query;
    if (qm != p.m || qk != p.k) make_layouts(p, qm, qk, query);
    choice.candidates = ask_heuristic(lt, desc.v, qm != p.m || qk != p.k ? query : exact, workspace_bytes,
                                      tuning ? kGemmTuneCandidates : 1);
    found = lt_state.algos_.emplace(key, std::move(choice)).first;
  }
  LtChoice& choice = found->second;
  if (choice.candidates.empty()) return false;  // no algorithm for this problem: the caller falls back
  const auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(lt, desc.v, &p.alpha, p.b, exact.a.v, p.a, exact.b.v, &p.beta, p.c, exact.c.v, p.c,
                          exact.c.v, &algo, workspace, workspace_bytes, stream);
  };
  const bool tunable = tuning && !choice.tuned && p.beta == 0.0f && choice.candidates.size() > 1;
  if (tunable && !choice.seen) {
    choice.seen = true;
  } else if (tunable) {
    tune(choice, stream, [&](size_t i) { return run(choice.candidates[i].algo); });
  }
  if (run(choice.candidates[static_cast<size_t>(choice.use)].algo) == CUBLAS_STATUS_SUCCESS) return true;
  // The class's algorithm does not take this member of it (cuBLASLt checks before it launches
  // anything): ask the heuristic for this very problem. The answer is not kept, so each such call
  // pays for its own question.
  const std::vector<cublasLtMatmulHeuristicResult_t> own = ask_heuristic(lt, desc.v, exact, workspace_bytes, 1);
  if (own.empty()) return false;
  GALE_CHECK_CUBLAS(run(own[0].algo));
  return true;
}

// out (in.cols x in.rows) = in transposed, through 32 x 32 tiles in shared memory (padded against
// bank conflicts) so that both the reads and the writes are runs along rows.
constexpr int kTile = 32;
constexpr int kTileRowsPerPass = 8;
__global__ void transpose_kernel(ConstMatrixView in, MatrixView out) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  for (int j = threadIdx.y; j < kTile; j += kTileRowsPerPass) {
    const int64_t row = static_cast<int64_t>(blockIdx.y) * kTile + j;
    if (row < in.rows && col < in.cols) tile[j][threadIdx.x] = in.data[row * in.ld + col];
  }
  __syncthreads();
  const int64_t out_col = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.x;
  for (int j = threadIdx.y; j < kTile; j += kTileRowsPerPass) {
    const int64_t out_row = static_cast<int64_t>(blockIdx.x) * kTile + j;
    if (out_row < out.rows && out_col < out.cols) out.data[out_row * out.ld + out_col] = tile[threadIdx.x][j];
  }
}

}  // namespace

void set_gemm_tuning(bool on) { tuning_on.store(on, std::memory_order_relaxed); }
bool gemm_tuning() { return tuning_on.load(std::memory_order_relaxed); }

void gemm_cuda(cublasHandle_t handle, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
               bool tf32, void* workspace, size_t workspace_bytes) {
  if (m == 0 || n == 0) return;
  cudaStream_t stream = nullptr;
  GALE_CHECK_CUBLAS(cublasGetStream(handle, &stream));
  if (k == 0) {
    scale_kernel<<<blocks_for(m * n), kThreads, 0, stream>>>(c, m, n, ldc, beta);
    check_launch();
    return;
  }
  if (workspace != nullptr) {  // cuBLASLt with the problem class's algorithm (lt_matmul)
    const LtProduct p{trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, tf32};
    if (lt_matmul(p, workspace, workspace_bytes, stream)) return;
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a row-major matrix read
  // column-major is its transpose: swap the operands and the sizes, keep each one's flag.
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  GALE_CHECK_CUBLAS(cublasGemmEx_64(handle, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda,
                                    &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
}

bool gemm_bias_cuda(cublasHandle_t handle, void* workspace, size_t workspace_bytes, bool trans_a, bool trans_b,
                    int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                    float* c, int64_t ldc, const float* bias, bool relu, bool tf32) {
  if (m == 0 || n == 0) return true;
  if (k == 0 || bias == nullptr) return false;
  cudaStream_t stream = nullptr;
  GALE_CHECK_CUBLAS(cublasGetStream(handle, &stream));
  const LtProduct p{trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc, tf32, bias, relu};
  return lt_matmul(p, workspace, workspace_bytes, stream);
}

void transpose_cuda(ConstMatrixView in, MatrixView out, cudaStream_t stream) {
  GALE_ASSERT(out.rows == in.cols && out.cols == in.rows);
  if (in.rows == 0 || in.cols == 0) return;
  const dim3 grid(static_cast<unsigned>((in.cols + kTile - 1) / kTile), static_cast<unsigned>((in.rows + kTile - 1) / kTile));
  transpose_kernel<<<grid, dim3(kTile, kTileRowsPerPass), 0, stream>>>(in, out);
  check_launch();
}

void add_bias_cuda(MatrixView out, const float* bias, cudaStream_t stream) {
  const bool vec4 = float4_rows(out.data, out.ld) && float4_rows(bias, 0);
  launch_map(out.rows, out.cols, vec4, AddBias<false>{out, bias}, stream);
}

void add_bias_relu_cuda(MatrixView out, const float* bias, cudaStream_t stream) {
  const bool vec4 = float4_rows(out.data, out.ld) && float4_rows(bias, 0);
  launch_map(out.rows, out.cols, vec4, AddBias<true>{out, bias}, stream);
}

void fill_block_cuda(MatrixView out, float value, cudaStream_t stream) {
  launch_map(out.rows, out.cols, float4_rows(out.data, out.ld), FillBlock{out, value}, stream);
}

void side_by_side_cuda(const ColumnBlock* blocks, int count, MatrixView out, cudaStream_t stream) {
  GALE_ASSERT(count >= 0 && count <= kMaxSideBySide);
  SideBySide op{};
  for (int b = 0; b < count; ++b) op.blocks[b] = blocks[b];
  op.count = count;
  op.out = out;
  // The blocks are read an element at a time (their widths, 47 say, break float4 rows); the
  // output is written in 16-byte stores where its rows allow.
  launch_map(out.rows, out.cols, float4_rows(out.data, out.ld), op, stream);
}

void axpy_cuda(ConstMatrixView x, float alpha, MatrixView y, cudaStream_t stream) {
  const bool vec4 = float4_rows(x.data, x.ld) && float4_rows(y.data, y.ld);
  launch_map(y.rows, y.cols, vec4, Axpy{x, alpha, y}, stream);
}

size_t column_sum_workspace_bytes(int64_t rows, int64_t cols) { return column_sums_workspace_bytes(rows, cols, 1); }

void column_sum_cuda(ConstMatrixView x, float* out, bool accumulate, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream) {
  column_sums<1>(x.rows, x.cols, MatrixValue{x}, SumInto{out, accumulate, 1.0}, workspace, workspace_bytes,
                 "column_sum_cuda", stream);
}

// ---- batch normalisation ----------------------------------------------------------------------
// The float expressions of dense_cpu.cpp's twins, with the _rn intrinsics so that nvcc does not
// contract them into FMAs; the column reductions are column_sum_cuda's, two sums in one pass.

namespace {

// x and x^2 in double (the square of a float is exact there), for the mean and the variance.
struct ValueAndSquare {
  ConstMatrixView x;
  __device__ Vals<2, double> load(int64_t r, int64_t c) const {
    const double v = x.data[r * x.ld + c];
    return {{v, v * v}};
  }
  __device__ void store(int64_t, int64_t, const Vals<2, double>&) const {}
};

// mean = sum / n, biased var = sum of squares / n - mean^2 (never below 0), in double.
struct MeanAndVariance {
  float* mean;
  float* var;
  double n;
  __device__ void operator()(int64_t c, const double* sum) const {
    const double m = sum[0] / n;
    mean[c] = static_cast<float>(m);
    var[c] = static_cast<float>(fmax(sum[1] / n - m * m, 0.0));
  }
};

// grad_out and grad_out * xhat, summed for beta's and gamma's gradients.
// grad_out through ReLU's backward when relu_bits is given (relu_mask's layout, `words` a row).
__device__ __forceinline__ bool relu_kept(const uint32_t* bits, int64_t words, int64_t r, int64_t c) {
  return bits == nullptr || ((bits[r * words + c / 32] >> (c % 32)) & 1u);
}

struct GradAndGradXhat {
  ConstMatrixView grad_out, x;
  const float* mean;
  const float* invstd;
  const uint32_t* relu_bits;
  int64_t words;
  __device__ Vals<2> load(int64_t r, int64_t c) const {
    const float g = relu_kept(relu_bits, words, r, c) ? grad_out.data[r * grad_out.ld + c] : 0.0f;
    const float xhat = __fmul_rn(__fsub_rn(x.data[r * x.ld + c], mean[c]), invstd[c]);
    return {{g, __fmul_rn(g, xhat)}};
  }
  __device__ void store(int64_t, int64_t, const Vals<2>&) const {}
};

// The sums as floats for the input gradient's pass, and added to beta's and gamma's gradients.
struct ParameterGradients {
  float* sum_g;
  float* sum_gx;
  float* grad_gamma;
  float* grad_beta;
  __device__ void operator()(int64_t c, const double* sum) const {
    sum_g[c] = static_cast<float>(sum[0]);
    sum_gx[c] = static_cast<float>(sum[1]);
    grad_gamma[c] = __fadd_rn(grad_gamma[c], sum_gx[c]);
    grad_beta[c] = __fadd_rn(grad_beta[c], sum_g[c]);
  }
};

// out[c] = numerator[c] / sqrt(var[c] + eps), numerator 1 where null (invstd) or gamma (the scale).
__global__ void bn_scale_kernel(const float* var, const float* numerator, float eps, int64_t cols, float* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  out[c] = __fdiv_rn(numerator != nullptr ? numerator[c] : 1.0f, __fsqrt_rn(__fadd_rn(var[c], eps)));
}

template <bool kRelu>
struct BnApply {
  ConstMatrixView x;
  MatrixView y;
  const float* mean;
  const float* scale;
  const float* beta;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    Pack<V> v = load<V>(at(x, r, c));
#pragma unroll
    for (int i = 0; i < V; ++i) {
      v.v[i] = __fadd_rn(__fmul_rn(__fsub_rn(v.v[i], mean[c + i]), scale[c + i]), beta[c + i]);
      if (kRelu) v.v[i] = v.v[i] > 0.0f ? v.v[i] : 0.0f;
    }
    store<V>(at(y, r, c), v);
  }
};

struct BnBackward {
  ConstMatrixView grad_out, x;
  MatrixView grad_x;
  const float* mean;
  const float* invstd;
  const float* gamma;
  const float* sum_g;
  const float* sum_gx;
  const uint32_t* relu_bits;
  int64_t words;
  float n;
  template <int V>
  __device__ void apply(int64_t r, int64_t c) const {
    const Pack<V> g = load<V>(at(grad_out, r, c));
    Pack<V> v = load<V>(at(x, r, c));
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const int64_t k = c + i;
      const float gk = relu_kept(relu_bits, words, r, k) ? g.v[i] : 0.0f;
      const float xhat = __fmul_rn(__fsub_rn(v.v[i], mean[k]), invstd[k]);
      const float inner = __fsub_rn(__fsub_rn(__fmul_rn(n, gk), sum_g[k]), __fmul_rn(xhat, sum_gx[k]));
      v.v[i] = __fmul_rn(__fdiv_rn(__fmul_rn(gamma[k], invstd[k]), n), inner);
    }
    store<V>(at(grad_x, r, c), v);
  }
};

__global__ void bn_running_kernel(const float* mean, const float* var, float unbias, float momentum, int64_t cols,
                                  float* running_mean, float* running_var) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float keep = __fsub_rn(1.0f, momentum);
  running_mean[c] = __fadd_rn(__fmul_rn(keep, running_mean[c]), __fmul_rn(momentum, mean[c]));
  running_var[c] = __fadd_rn(__fmul_rn(keep, running_var[c]), __fmul_rn(momentum, __fmul_rn(var[c], unbias)));
}

// The workspace: the partials of two column sums, then kBnColumnArrays float arrays of cols.
constexpr int64_t kBnColumnArrays = 3;
float* bn_columns(void* workspace, int64_t rows, int64_t cols, int64_t i) {
  return reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + column_sums_workspace_bytes(rows, cols, 2)) +
         i * cols;
}
void require_bn_workspace(int64_t rows, int64_t cols, size_t workspace_bytes, const char* op) {
  require(rows >= 1, std::string(op) + ": batch normalisation needs at least one row");
  const size_t needed = batch_norm_workspace_bytes(rows, cols);
  require(workspace_bytes >= needed, std::string(op) + ": workspace of " + std::to_string(workspace_bytes) +
                                         " bytes, " + std::to_string(needed) + " needed");
}

}  // namespace

size_t batch_norm_workspace_bytes(int64_t rows, int64_t cols) {
  return column_sums_workspace_bytes(rows, cols, 2) +
         static_cast<size_t>(kBnColumnArrays * std::max<int64_t>(cols, 0)) * sizeof(float);
}

void batch_norm_stats_cuda(ConstMatrixView x, float* mean, float* var, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  if (x.cols == 0) return;
  require_bn_workspace(x.rows, x.cols, workspace_bytes, "batch_norm_stats_cuda");
  column_sums<2>(x.rows, x.cols, ValueAndSquare{x}, MeanAndVariance{mean, var, static_cast<double>(x.rows)}, workspace,
                 workspace_bytes, "batch_norm_stats_cuda", stream);
}

void batch_norm_apply_cuda(ConstMatrixView x, const float* mean, const float* var, float eps, const float* gamma,
                           const float* beta, bool relu, MatrixView y, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  if (x.rows == 0 || x.cols == 0) return;
  require_bn_workspace(x.rows, x.cols, workspace_bytes, "batch_norm_apply_cuda");
  float* scale = bn_columns(workspace, x.rows, x.cols, 0);
  bn_scale_kernel<<<blocks_for(x.cols), kThreads, 0, stream>>>(var, gamma, eps, x.cols, scale);
  check_launch();
  const bool vec4 = float4_rows(x.data, x.ld) && float4_rows(y.data, y.ld);
  if (relu) return launch_map(x.rows, x.cols, vec4, BnApply<true>{x, y, mean, scale, beta}, stream);
  launch_map(x.rows, x.cols, vec4, BnApply<false>{x, y, mean, scale, beta}, stream);
}

void batch_norm_backward_cuda(ConstMatrixView grad_out, ConstMatrixView x, const float* mean, const float* var,
                              float eps, const float* gamma, const uint32_t* relu_bits, float* grad_gamma,
                              float* grad_beta, MatrixView grad_x, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  if (x.cols == 0) return;
  require_bn_workspace(x.rows, x.cols, workspace_bytes, "batch_norm_backward_cuda");
  float* invstd = bn_columns(workspace, x.rows, x.cols, 0);
  float* sum_g = bn_columns(workspace, x.rows, x.cols, 1);
  float* sum_gx = bn_columns(workspace, x.rows, x.cols, 2);
  bn_scale_kernel<<<blocks_for(x.cols), kThreads, 0, stream>>>(var, nullptr, eps, x.cols, invstd);
  check_launch();
  const int64_t words = relu_mask_words(x.cols);
  column_sums<2>(x.rows, x.cols, GradAndGradXhat{grad_out, x, mean, invstd, relu_bits, words},
                 ParameterGradients{sum_g, sum_gx, grad_gamma, grad_beta}, workspace, workspace_bytes,
                 "batch_norm_backward_cuda", stream);
  const bool vec4 = float4_rows(grad_out.data, grad_out.ld) && float4_rows(x.data, x.ld) &&
                    float4_rows(grad_x.data, grad_x.ld);
  launch_map(x.rows, x.cols, vec4,
             BnBackward{grad_out, x, grad_x, mean, invstd, gamma, sum_g, sum_gx, relu_bits, words,
                        static_cast<float>(x.rows)},
             stream);
}

void batch_norm_update_running_cuda(const float* mean, const float* var, int64_t rows, float momentum,
                                    float* running_mean, float* running_var, int64_t cols, cudaStream_t stream) {
  if (cols == 0) return;
  const float unbias = rows > 1 ? static_cast<float>(rows) / static_cast<float>(rows - 1) : 1.0f;
  bn_running_kernel<<<blocks_for(cols), kThreads, 0, stream>>>(mean, var, unbias, momentum, cols, running_mean,
                                                               running_var);
  check_launch();
}

void relu_forward_cuda(ConstMatrixView x, MatrixView out, cudaStream_t stream) {
  const bool vec4 = float4_rows(x.data, x.ld) && float4_rows(out.data, out.ld);
  launch_map(x.rows, x.cols, vec4, ReluForward{x, out}, stream);
}

void relu_backward_cuda(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in, cudaStream_t stream) {
  const bool vec4 = float4_rows(grad_out.data, grad_out.ld) && float4_rows(y.data, y.ld) &&
                    float4_rows(grad_in.data, grad_in.ld);
  launch_map(y.rows, y.cols, vec4, ReluBackward{grad_out, y, grad_in}, stream);
}

void relu_mask_cuda(ConstMatrixView y, uint32_t* bits, cudaStream_t stream) {
  const int64_t words = relu_mask_words(y.cols);
  if (y.rows == 0 || words == 0) return;
  if (float4_rows(y.data, y.ld)) {
    relu_mask4_kernel<<<blocks_for(y.rows * words * 8), kThreads, 0, stream>>>(y, bits, words);
  } else {
    relu_mask_kernel<<<blocks_for(y.rows * words, kWarpsPerMask), kThreads, 0, stream>>>(y, bits, words);
  }
  check_launch();
}

int64_t column_sum_chunk_rows(int64_t total_rows) {
  const int64_t rows = std::max<int64_t>(total_rows, 1), chunks = column_sum_chunks(rows);
  return (rows + chunks - 1) / chunks;
}

void relu_backward_sum_rows_cuda(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in, int64_t first_row,
                                 int64_t total_rows, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const int64_t rows = y.rows, cols = y.cols, chunk_rows = column_sum_chunk_rows(total_rows);
  require(first_row % chunk_rows == 0 && first_row + rows <= total_rows,
          "relu_backward_sum_rows_cuda: rows [" + std::to_string(first_row) + ", " + std::to_string(first_row + rows) +
              ") are not whole chunks of " + std::to_string(chunk_rows) + " within " + std::to_string(total_rows));
  require(workspace_bytes >= column_sums_workspace_bytes(total_rows, cols, 1),
          "relu_backward_sum_rows_cuda: workspace of " + std::to_string(workspace_bytes) + " bytes, " +
              std::to_string(column_sums_workspace_bytes(total_rows, cols, 1)) + " needed");
  if (rows == 0 || cols == 0) return;
  double* partial = static_cast<double*>(workspace) + (first_row / chunk_rows) * cols;
  column_sum_partials<1>(rows, cols, ReluValue{grad_out, y, grad_in}, chunk_rows, (rows + chunk_rows - 1) / chunk_rows,
                         partial, stream);
}

void column_sum_finish_cuda(int64_t total_rows, int64_t cols, float* out, bool accumulate, const void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
  if (cols == 0) return;
  require(workspace_bytes >= column_sums_workspace_bytes(total_rows, cols, 1),
          "column_sum_finish_cuda: workspace of " + std::to_string(workspace_bytes) + " bytes, " +
              std::to_string(column_sums_workspace_bytes(total_rows, cols, 1)) + " needed");
  column_sum_finish_kernel<1><<<blocks_for(cols), kThreads, 0, stream>>>(
      static_cast<const double*>(workspace), column_sum_chunks(total_rows), cols, SumInto{out, accumulate, 1.0});
  check_launch();
}

void relu_backward_mask_sum_cuda(ConstMatrixView grad_out, const uint32_t* bits, MatrixView grad_in, float* sums,
                                 void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  column_sums<1>(grad_out.rows, grad_out.cols, ReluMaskedValue{grad_out, bits, relu_mask_words(grad_out.cols), grad_in},
                 SumInto{sums, /*accumulate=*/false, 1.0}, workspace, workspace_bytes, "relu_backward_mask_sum_cuda",
                 stream);
}

void relu_backward_mask_cuda(ConstMatrixView grad_out, const uint32_t* bits, MatrixView grad_in, cudaStream_t stream) {
  const bool vec4 = float4_rows(grad_out.data, grad_out.ld) && float4_rows(grad_in.data, grad_in.ld);
  launch_map(grad_out.rows, grad_out.cols, vec4,
             ReluBackwardMask{grad_out, bits, relu_mask_words(grad_out.cols), grad_in}, stream);
}

void elu_forward_cuda(ConstMatrixView x, MatrixView out, cudaStream_t stream) {
  const bool vec4 = float4_rows(x.data, x.ld) && float4_rows(out.data, out.ld);
  launch_map(x.rows, x.cols, vec4, EluForward{x, out}, stream);
}

void elu_backward_cuda(ConstMatrixView grad_out, ConstMatrixView y, MatrixView grad_in, cudaStream_t stream) {
  const bool vec4 = float4_rows(grad_out.data, grad_out.ld) && float4_rows(y.data, y.ld) &&
                    float4_rows(grad_in.data, grad_in.ld);
  launch_map(y.rows, y.cols, vec4, EluBackward{grad_out, y, grad_in}, stream);
}

void dropout_forward_cuda(ConstMatrixView x, MatrixView out, float p, uint64_t key, cudaStream_t stream) {
  const float scale = 1.0f / (1.0f - p);
  const bool vec4 = float4_rows(x.data, x.ld) && float4_rows(out.data, out.ld);
  launch_map(x.rows, x.cols, vec4, Dropout{x, out, p, scale, key}, stream);
}

void dropout_backward_cuda(ConstMatrixView grad_out, MatrixView grad_in, float p, uint64_t key, cudaStream_t stream) {
  dropout_forward_cuda(grad_out, grad_in, p, key, stream);  // the same mask and scale
}

void adam_update_cuda(float* w, const float* g, float* m, float* v, int64_t n, const AdamParams& p,
                      cudaStream_t stream) {
  const AdamTensor t{w, g, m, v, n};
  adam_update_many_cuda(&t, 1, p, stream);  // one tensor of a step over several: the same kernel
}

void adam_update_many_cuda(const AdamTensor* tensors, int count, const AdamParams& p, cudaStream_t stream) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  for (int first = 0; first < count; first += kAdamTensorsPerLaunch) {
    AdamMany a{};
    a.count = std::min(kAdamTensorsPerLaunch, count - first);
    for (int i = 0; i < a.count; ++i) a.t[i] = tensors[first + i];
    const int64_t chunks = chunk_prefix(a.chunk_start, a.count, [&](int i) { return a.t[i].n; });
    if (chunks == 0) continue;
    a.beta1 = p.beta1;
    a.one_minus_beta1 = 1.0f - p.beta1;
    a.beta2 = p.beta2;
    a.one_minus_beta2 = 1.0f - p.beta2;
    a.eps = p.eps;
    a.weight_decay = p.weight_decay;
    a.step_size = static_cast<float>(p.lr / bc1);  // as adam_update_cuda: host, double, then float
    a.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    adam_many_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(a);
    check_launch();
  }
}

void zero_many_cuda(float* const* data, const int64_t* counts, int count, cudaStream_t stream) {
  for (int first = 0; first < count; first += kAdamTensorsPerLaunch) {
    ZeroMany z{};
    z.count = std::min(kAdamTensorsPerLaunch, count - first);
    for (int i = 0; i < z.count; ++i) {
      z.data[i] = data[first + i];
      z.n[i] = counts[first + i];
    }
    const int64_t chunks = chunk_prefix(z.chunk_start, z.count, [&](int i) { return z.n[i]; });
    if (chunks == 0) continue;
    zero_many_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(z);
    check_launch();
  }
}

size_t softmax_cross_entropy_workspace_bytes(int64_t logits_rows, int64_t n_rows) {
  // The per-listing (loss only) or per-row (with the gradient) losses and hits share one room.
  const size_t rows = static_cast<size_t>(std::max<int64_t>(0, logits_rows));
  const size_t n = std::max(static_cast<size_t>(std::max<int64_t>(0, n_rows)), rows);
  return section(n * sizeof(double)) + section(n * sizeof(int32_t)) + section(rows * sizeof(int32_t)) +
         2 * section(static_cast<size_t>(kReduceMaxBlocks) * 8);
}

namespace {

// The loss kernels' scratch, carved from one workspace of softmax_cross_entropy_workspace_bytes.
struct CeScratch {
  double* row_loss;
  int32_t* row_hit;
  int32_t* multiplicity;
  double* partial_loss;
  int64_t* partial_hits;
};
CeScratch ce_scratch(void* workspace, size_t workspace_bytes, int64_t logits_rows, int64_t n_rows, const char* what) {
  const size_t needed = softmax_cross_entropy_workspace_bytes(logits_rows, n_rows);
  require(workspace_bytes >= needed, std::string(what) + ": workspace of " + std::to_string(workspace_bytes) +
                                         " bytes, " + std::to_string(needed) + " needed");
  const size_t rows = static_cast<size_t>(std::max<int64_t>(0, logits_rows));
  const size_t room = std::max(static_cast<size_t>(n_rows), rows);
  auto* base = static_cast<unsigned char*>(workspace);
  CeScratch s{};
  s.row_loss = reinterpret_cast<double*>(base);
  base += section(room * sizeof(double));
  s.row_hit = reinterpret_cast<int32_t*>(base);
  base += section(room * sizeof(int32_t));
  s.multiplicity = reinterpret_cast<int32_t*>(base);
  base += section(rows * sizeof(int32_t));
  s.partial_loss = reinterpret_cast<double*>(base);
  s.partial_hits = reinterpret_cast<int64_t*>(base + section(static_cast<size_t>(kReduceMaxBlocks) * 8));
  return s;
}

// The listings' mean loss and hits into loss_out / correct_out: ce_reduce_kernel's two passes, or
// its first alone, scaled, when one block covers the listings (the same bits: the second pass
// would add that one partial to zeros).
void ce_reduce(const CeScratch& s, const int64_t* by_row, int64_t logits_rows, int64_t n_rows, double* loss_out,
               int64_t* correct_out, cudaStream_t stream) {
  const double inv_n = n_rows == 0 ? 0.0 : 1.0 / static_cast<double>(n_rows);
  const int64_t chunk = reduce_chunk(n_rows);
  const int64_t blocks = std::max<int64_t>(1, (n_rows + chunk - 1) / chunk);
  if (blocks == 1) {
    ce_reduce_kernel<int32_t><<<1, kReduceThreads, 0, stream>>>(s.row_loss, s.row_hit, by_row, s.multiplicity,
                                                                logits_rows, n_rows, chunk, inv_n, loss_out,
                                                                correct_out);
    check_launch();
    return;
  }
  ce_reduce_kernel<int32_t><<<static_cast<unsigned>(blocks), kReduceThreads, 0, stream>>>(
      s.row_loss, s.row_hit, by_row, s.multiplicity, logits_rows, n_rows, chunk, 1.0, s.partial_loss, s.partial_hits);
  check_launch();
  ce_reduce_kernel<int64_t><<<1, kReduceThreads, 0, stream>>>(s.partial_loss, s.partial_hits, nullptr, nullptr, 0,
                                                              blocks, blocks, inv_n, loss_out, correct_out);
  check_launch();
}

double ce_grad_scale(int64_t n_rows, int64_t grad_over) {
  if (grad_over > 0) return 1.0 / static_cast<double>(grad_over);
  return n_rows == 0 ? 0.0 : 1.0 / static_cast<double>(n_rows);
}

}  // namespace

void softmax_cross_entropy_cuda(ConstMatrixView logits, const int32_t* labels, const int64_t* rows, int64_t n_rows,
                                MatrixView grad, double* loss_out, int64_t* correct_out, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream, int64_t grad_over) {
  require(logits.cols > 0, "softmax_cross_entropy_cuda: logits need at least one column");
  require(n_rows >= 0, "softmax_cross_entropy_cuda: negative row count " + std::to_string(n_rows));
  require(loss_out != nullptr, "softmax_cross_entropy_cuda: loss_out is null");
  const bool want_grad = grad.data != nullptr;
  if (want_grad) {
    require(grad.rows == logits.rows && grad.cols == logits.cols,
            "softmax_cross_entropy_cuda: grad is " + std::to_string(grad.rows) + " x " + std::to_string(grad.cols) +
                ", logits " + std::to_string(logits.rows) + " x " + std::to_string(logits.cols));
  }
  const CeScratch s = ce_scratch(workspace, workspace_bytes, logits.rows, n_rows, "softmax_cross_entropy_cuda");
  const int64_t* by_row = nullptr;
  if (want_grad && logits.rows > 0) {
    const size_t logits_rows = static_cast<size_t>(logits.rows);
    GALE_CHECK_CUDA(cudaMemsetAsync(s.multiplicity, 0, logits_rows * sizeof(int32_t), stream));
    if (n_rows > 0) {
      ce_count_kernel<<<blocks_for(n_rows), kThreads, 0, stream>>>(labels, rows, n_rows, logits, s.multiplicity);
      check_launch();
    }
    with_ce_group(logits.cols, [&](auto group) {
      constexpr int G = decltype(group)::value;
      ce_rows_kernel<G><<<blocks_for(logits.rows, kThreads / G), kThreads, 0, stream>>>(
          logits, labels, nullptr, logits.rows, s.multiplicity, ce_grad_scale(n_rows, grad_over), grad, s.row_loss,
          s.row_hit);
    });
    check_launch();
    by_row = rows;
  } else if (n_rows > 0) {
    with_ce_group(logits.cols, [&](auto group) {
      constexpr int G = decltype(group)::value;
      ce_loss_kernel<G><<<blocks_for(n_rows, kThreads / G), kThreads, 0, stream>>>(logits, labels, rows, n_rows,
                                                                                   s.row_loss, s.row_hit);
    });
    check_launch();
  }
  ce_reduce(s, by_row, logits.rows, n_rows, loss_out, correct_out, stream);
}

void softmax_cross_entropy_seeds_cuda(ConstMatrixView logits, const int32_t* labels, const int64_t* label_ids,
                                      int64_t n_labels, MatrixView grad, double* loss_out, int64_t* correct_out,
                                      void* workspace, size_t workspace_bytes, cudaStream_t stream, int64_t grad_over) {
  require(logits.cols > 0, "softmax_cross_entropy_seeds_cuda: logits need at least one column");
  require(loss_out != nullptr, "softmax_cross_entropy_seeds_cuda: loss_out is null");
  require(grad.data != nullptr && grad.rows == logits.rows && grad.cols == logits.cols,
          "softmax_cross_entropy_seeds_cuda: grad is " + std::to_string(grad.rows) + " x " + std::to_string(grad.cols) +
              ", logits " + std::to_string(logits.rows) + " x " + std::to_string(logits.cols));
  const CeScratch s =
      ce_scratch(workspace, workspace_bytes, logits.rows, logits.rows, "softmax_cross_entropy_seeds_cuda");
  if (logits.rows > 0) {
    with_ce_group(logits.cols, [&](auto group) {
      constexpr int G = decltype(group)::value;
      ce_rows_kernel<G><<<blocks_for(logits.rows, kThreads / G), kThreads, 0, stream>>>(
          logits, labels, label_ids, n_labels, nullptr, ce_grad_scale(logits.rows, grad_over), grad, s.row_loss,
          s.row_hit);
    });
    check_launch();
  }
  ce_reduce(s, nullptr, logits.rows, logits.rows, loss_out, correct_out, stream);
}

}  // namespace gale::kernels
