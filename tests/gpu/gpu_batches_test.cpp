// Mini-batches sampled on the GPU and turned into operands there (engine/gpu_batches.hpp), and the
// kernels that path adds, each against its CPU reference on fresh random inputs:
//   - graph_norms_cuda vs graph_norms, bit for bit (blocks with empty rows and hubs; the full
//     graph's indptr in device memory and in mapped pinned host memory);
//   - the match map (match_rows_cuda, match_advance_cuda) vs its CPU twins over a run of batches;
//   - uncached_ids_cuda vs uncached_ids_cpu; GpuBatches::sample_input_nodes vs the CPU sampler's
//     input nodes less a random cache's rows;
//   - GraphOperand::from_device_block vs the host GraphOperand of the same block;
//   - GpuBatches vs the CPU NeighborSampler on an R-MAT store: per destination the same global
//     sources in the same order, the same CSC and norms keyed by global id, seeds and input nodes
//     as sampled; topology on the GPU and in pinned host memory; batches sampled from several
//     threads at once.
// Skips with a reason when no CUDA device is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "engine/device_context.hpp"
#include "engine/devices.hpp"
#include "engine/gpu_batches.hpp"
#include "engine/graph.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/feature_gather.hpp"
#include "kernels/graph_norms.hpp"
#include "kernels/random.hpp"
#include "sampler/neighbor_sampler.hpp"
#include "storage/preprocess.hpp"
#include "storage/store.hpp"
#include "tests/gpu/random_inputs.hpp"

namespace gale::engine {
namespace {

bool have_gpu() { return kernels::cuda::device_count() > 0; }

// Copies n elements from a device (or mapped) pointer, after everything on the compute and IO
// streams.
template <typename T>
std::vector<T> fetch(const T* p, int64_t n) {
  synchronize(Device::cuda(0));
  std::vector<T> out(static_cast<size_t>(n));
  if (n > 0) GALE_CHECK_CUDA(cudaMemcpy(out.data(), p, out.size() * sizeof(T), cudaMemcpyDefault));
  return out;
}

template <typename T>
Tensor upload(const std::vector<T>& v, DType dtype) {
  return Tensor::from_host(v.data(), static_cast<int64_t>(v.size()), 1, dtype, Device::cuda(0));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A block over `cols` sources drawn from a full graph of `nodes` nodes with random degrees (hubs
// included): src_ids distinct, and the full graph's indptr.
struct RandomBlock {
  kernels::testing::Graph g;
  std::vector<int64_t> src_ids, full_indptr;
};

RandomBlock random_block(uint64_t key, int64_t rows, int64_t cols, int64_t nodes) {
  RandomBlock b;
  b.g = kernels::testing::random_graph(key, rows, cols, 700);
  std::vector<int64_t> perm(static_cast<size_t>(nodes));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = nodes - 1; i > 0; --i)
    std::swap(perm[i], perm[kernels::random_below(key ^ 0x51, static_cast<uint64_t>(i), static_cast<uint64_t>(i + 1))]);
  b.src_ids.assign(perm.begin(), perm.begin() + cols);
  b.full_indptr.push_back(0);
  for (int64_t v = 0; v < nodes; ++v) {
    int64_t d = static_cast<int64_t>(kernels::random_below(key ^ 0x77, static_cast<uint64_t>(v), 40));
    if (v % 97 == 5) d = 5000;
    b.full_indptr.push_back(b.full_indptr.back() + d);
  }
  return b;
}

class GpuBatchesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  }
};

struct Norms {
  std::vector<float> dst, src, self, inv;
};

Norms cpu_norms(const kernels::CsrView& csr, const int64_t* ids, const int64_t* full) {
  Norms n;
  n.dst.assign(static_cast<size_t>(csr.rows), -1.0f);
  n.self = n.inv = n.dst;
  n.src.assign(static_cast<size_t>(csr.cols), -1.0f);
  kernels::graph_norms({csr, ids, full, n.dst.data(), n.src.data(), n.self.data(), n.inv.data()});
  return n;
}

TEST_F(GpuBatchesTest, GraphNormsMatchTheCpuBitForBit) {
  DeviceContext& ctx = DeviceContext::get(0);
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {37, 37}, {300, 2000}, {5000, 40000}}) {
    for (const bool mapped : {false, true}) {
      const RandomBlock b = random_block(static_cast<uint64_t>(rows * 31 + cols), rows, cols, cols + 777);
      const bool square = rows == cols;
      const Norms want = cpu_norms(b.g.csr(), square ? nullptr : b.src_ids.data(), square ? nullptr : b.full_indptr.data());
      const Tensor indptr = upload(b.g.indptr, DType::kI64), indices = upload(b.g.indices, DType::kI32);
      const Tensor ids = upload(b.src_ids, DType::kI64);
      Tensor full = upload(b.full_indptr, DType::kI64);
      int64_t* mapped_full = nullptr;
      if (mapped) {
        GALE_CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&mapped_full), b.full_indptr.size() * 8, cudaHostAllocMapped));
        std::memcpy(mapped_full, b.full_indptr.data(), b.full_indptr.size() * 8);
      }
      auto poisoned = [&](int64_t n) {
        Tensor t = Tensor::empty(n, 1, DType::kF32, Device::cuda(0));
        t.fill(std::numeric_limits<float>::quiet_NaN());
        return t;
      };
      Tensor dst = poisoned(rows), src = poisoned(cols), self = poisoned(rows), inv = poisoned(rows);
      const kernels::CsrView csr{rows, cols, indptr.data<int64_t>(), indices.data<int32_t>(), nullptr};
      kernels::graph_norms_cuda({csr, square ? nullptr : ids.data<int64_t>(),
                                 square ? nullptr : (mapped ? mapped_full : full.data<int64_t>()), dst.f32(), src.f32(),
                                 self.f32(), inv.f32()},
                                ctx.stream());
      EXPECT_TRUE(same_bits(fetch(dst.f32(), rows), want.dst)) << rows << "x" << cols;
      EXPECT_TRUE(same_bits(fetch(src.f32(), cols), want.src)) << rows << "x" << cols;
      EXPECT_TRUE(same_bits(fetch(self.f32(), rows), want.self)) << rows << "x" << cols;
      EXPECT_TRUE(same_bits(fetch(inv.f32(), rows), want.inv)) << rows << "x" << cols;
      if (mapped_full) cudaFreeHost(mapped_full);
    }
  }
}

TEST_F(GpuBatchesTest, GraphNormsRefuseMissingIds) {
  const RandomBlock b = random_block(3, 10, 20, 30);
  float out[20];
  EXPECT_THROW(kernels::graph_norms_cuda({b.g.csr(), nullptr, nullptr, out, out, out, out}, nullptr), InputError);
  EXPECT_THROW(kernels::graph_norms({b.g.csr(), nullptr, nullptr, out, out, out, out}), InputError);
}

TEST_F(GpuBatchesTest, MatchMapFollowsItsCpuTwinOverARunOfBatches) {
  DeviceContext& ctx = DeviceContext::get(0);
  constexpr int64_t kNodes = 50000;
  std::vector<int32_t> row_of(kNodes, -1);
  Tensor row_of_gpu = upload(row_of, DType::kI32);
  std::vector<int64_t> prev;
  Tensor prev_gpu;
  for (uint64_t step = 0; step < 6; ++step) {
    // Distinct ids, overlapping the previous batch in part.
    std::vector<int64_t> ids;
    for (int64_t v = 0; v < kNodes; ++v)
      if (kernels::random_below(step + 11, static_cast<uint64_t>(v), 7) == 0) ids.push_back(v);
    std::shuffle(ids.begin(), ids.end(), std::mt19937_64(step));
    const int64_t n = static_cast<int64_t>(ids.size());
    std::vector<int32_t> rows(ids.size());
    kernels::match_rows_cpu(row_of.data(), ids.data(), n, rows.data());
    kernels::match_advance_cpu(row_of.data(), prev.data(), static_cast<int64_t>(prev.size()), ids.data(), n);

    const Tensor ids_gpu = upload(ids, DType::kI64);
    Tensor rows_gpu = Tensor::empty(n, 1, DType::kI32, Device::cuda(0));
    kernels::match_rows_cuda(row_of_gpu.data<int32_t>(), ids_gpu.data<int64_t>(), n, rows_gpu.data<int32_t>(), ctx.stream());
    kernels::match_advance_cuda(row_of_gpu.data<int32_t>(), prev_gpu.defined() ? prev_gpu.data<int64_t>() : nullptr,
                                static_cast<int64_t>(prev.size()), ids_gpu.data<int64_t>(), n, ctx.stream());
    EXPECT_EQ(fetch(rows_gpu.data<int32_t>(), n), rows) << "step " << step;
    EXPECT_EQ(fetch(row_of_gpu.data<int32_t>(), kNodes), row_of) << "step " << step;
    if (step > 0) EXPECT_GT(std::count_if(rows.begin(), rows.end(), [](int32_t r) { return r >= 0; }), 0);
    prev = ids;
    prev_gpu = ids_gpu;
  }
}

// uncached_ids_cuda (CUB's stable select) vs uncached_ids_cpu: the same ids in the same order, for
// caches holding none, some and all of the nodes.
TEST_F(GpuBatchesTest, UncachedIdsFollowTheirCpuTwin) {
  DeviceContext& ctx = DeviceContext::get(0);
  constexpr int64_t kNodes = 70000;
  for (uint64_t step = 0; step < 4; ++step) {
    std::vector<int32_t> slot(kNodes, -1);
    int32_t rows = 0;
    for (int64_t v = 0; v < kNodes; ++v)
      if (step == 3 || (step > 0 && kernels::random_below(step + 31, static_cast<uint64_t>(v), 3 * step) == 0))
        slot[static_cast<size_t>(v)] = rows++;
    std::vector<int64_t> ids;
    for (int64_t v = 0; v < kNodes; ++v)
      if (kernels::random_below(step + 5, static_cast<uint64_t>(v), 4) != 0) ids.push_back(v);
    std::shuffle(ids.begin(), ids.end(), std::mt19937_64(step));
    const int64_t n = static_cast<int64_t>(ids.size());
    std::vector<int64_t> want(ids.size());
    want.resize(static_cast<size_t>(kernels::uncached_ids_cpu(slot.data(), ids.data(), n, want.data())));

    const Tensor slot_gpu = upload(slot, DType::kI32), ids_gpu = upload(ids, DType::kI64);
    // -1 everywhere first: the kernel writes the selected ids and the count, and nothing between
    // (and compute-sanitizer's initcheck sees no read of unwritten memory in the fetch below).
    Tensor out = upload(std::vector<int64_t>(static_cast<size_t>(n) + 1, -1), DType::kI64);
    Tensor scratch = Tensor::empty(static_cast<int64_t>(kernels::uncached_ids_scratch_bytes(n)), 1, DType::kU8, Device::cuda(0));
    kernels::uncached_ids_cuda(slot_gpu.data<int32_t>(), ids_gpu.data<int64_t>(), n, out.data<int64_t>(),
                               out.data<int64_t>() + n, scratch.data<uint8_t>(), kernels::uncached_ids_scratch_bytes(n),
                               ctx.stream());
    const std::vector<int64_t> got = fetch(out.data<int64_t>(), n + 1);
    ASSERT_EQ(got[static_cast<size_t>(n)], static_cast<int64_t>(want.size())) << "step " << step;
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << "step " << step;
    EXPECT_TRUE(std::all_of(got.begin() + static_cast<int64_t>(want.size()), got.end() - 1, [](int64_t v) { return v == -1; }))
        << "step " << step << ": written past the count";
    if (step == 0) EXPECT_EQ(static_cast<int64_t>(want.size()), n);
    if (step == 3) EXPECT_TRUE(want.empty());
  }
}

TEST_F(GpuBatchesTest, DeviceBlockOperandEqualsTheHostOperand) {
  for (const bool edge_map : {false, true}) {
    const RandomBlock b = random_block(edge_map ? 5 : 6, 700, 5000, 9000);
    const GraphOperand host(b.g.csr(), b.src_ids.data(), b.full_indptr.data());
    const Tensor indptr = upload(b.g.indptr, DType::kI64), indices = upload(b.g.indices, DType::kI32);
    const Tensor ids = upload(b.src_ids, DType::kI64), full = upload(b.full_indptr, DType::kI64);
    const int64_t nnz = b.g.nnz();
    synchronize(Device::cuda(0));  // the uploads ran on the compute stream; the operand is built on the IO stream
    const GraphOperand dev = GraphOperand::from_device_block(
        Device::cuda(0), {700, 5000, indptr.data<int64_t>(), indices.data<int32_t>(), nullptr}, nnz, ids.data<int64_t>(),
        full.data<int64_t>(), edge_map);
    ASSERT_EQ(dev.num_dst(), 700);
    ASSERT_EQ(dev.num_src(), 5000);
    ASSERT_EQ(dev.nnz(), nnz);
    EXPECT_NE(dev.csr().indptr, indptr.data<int64_t>()) << "the operand owns a copy of the CSR";
    EXPECT_EQ(fetch(dev.csr().indptr, 701), b.g.indptr);
    EXPECT_EQ(fetch(dev.csr().indices, nnz), b.g.indices);
    const kernels::CsrView hc = host.csc(), dc = dev.csc();
    EXPECT_EQ(fetch(dc.indptr, 5001), std::vector<int64_t>(hc.indptr, hc.indptr + 5001));
    EXPECT_EQ(fetch(dc.indices, nnz), std::vector<int32_t>(hc.indices, hc.indices + nnz));
    if (edge_map) {
      EXPECT_EQ(fetch(dev.csc_edge(), nnz), std::vector<int64_t>(host.csc_edge(), host.csc_edge() + nnz));
    } else {
      EXPECT_THROW(dev.csc_edge(), InternalError);
    }
    EXPECT_TRUE(same_bits(fetch(dev.dst_norm(), 700), std::vector<float>(host.dst_norm(), host.dst_norm() + 700)));
    EXPECT_TRUE(same_bits(fetch(dev.src_norm(), 5000), std::vector<float>(host.src_norm(), host.src_norm() + 5000)));
    EXPECT_TRUE(same_bits(fetch(dev.self_norm(), 700), std::vector<float>(host.self_norm(), host.self_norm() + 700)));
    EXPECT_TRUE(same_bits(fetch(dev.inv_degree(), 700), std::vector<float>(host.inv_degree(), host.inv_degree() + 700)));
  }
}

// A weighted block (weighted aggregation): the weights copied, the CSC's permuted as the host's,
// and GCN's weighted degrees (outer sources' from full_degree) bit for bit.
TEST_F(GpuBatchesTest, WeightedDeviceBlockOperandEqualsTheHostOperand) {
  const RandomBlock b = random_block(7, 700, 5000, 9000);
  const int64_t nnz = b.g.nnz();
  std::vector<float> weights(static_cast<size_t>(nnz)), full_degree(9000);
  for (int64_t e = 0; e < nnz; ++e) weights[e] = 0.1f + 3.0f * kernels::random_uniform(21, static_cast<uint64_t>(e));
  for (int64_t v = 0; v < 9000; ++v) full_degree[v] = 40.0f * kernels::random_uniform(22, static_cast<uint64_t>(v));
  kernels::CsrView csr = b.g.csr();
  csr.weights = weights.data();
  const GraphOperand host(csr, b.src_ids.data(), b.full_indptr.data(), /*with_transpose=*/true, full_degree.data());
  const Tensor indptr = upload(b.g.indptr, DType::kI64), indices = upload(b.g.indices, DType::kI32);
  const Tensor ids = upload(b.src_ids, DType::kI64), full = upload(b.full_indptr, DType::kI64);
  const Tensor w = upload(weights, DType::kF32), degree = upload(full_degree, DType::kF32);
  synchronize(Device::cuda(0));
  const GraphOperand dev = GraphOperand::from_device_block(
      Device::cuda(0), {700, 5000, indptr.data<int64_t>(), indices.data<int32_t>(), w.data<float>()}, nnz,
      ids.data<int64_t>(), full.data<int64_t>(), /*edge_map=*/false, degree.data<float>());
  ASSERT_TRUE(dev.weighted());
  EXPECT_NE(dev.csr().weights, w.data<float>()) << "the operand owns a copy of the weights";
  EXPECT_TRUE(same_bits(fetch(dev.csr().weights, nnz), weights));
  const kernels::CsrView hc = host.csc(), dc = dev.csc();
  EXPECT_EQ(fetch(dc.indices, nnz), std::vector<int32_t>(hc.indices, hc.indices + nnz));
  EXPECT_TRUE(same_bits(fetch(dc.weights, nnz), std::vector<float>(hc.weights, hc.weights + nnz)));
  EXPECT_TRUE(same_bits(fetch(dev.dst_norm(), 700), std::vector<float>(host.dst_norm(), host.dst_norm() + 700)));
  EXPECT_TRUE(same_bits(fetch(dev.src_norm(), 5000), std::vector<float>(host.src_norm(), host.src_norm() + 5000)));
  EXPECT_TRUE(same_bits(fetch(dev.self_norm(), 700), std::vector<float>(host.self_norm(), host.self_norm() + 700)));
  EXPECT_TRUE(same_bits(fetch(dev.inv_degree(), 700), std::vector<float>(host.inv_degree(), host.inv_degree() + 700)));
  // The weights changed the norms (the test would pass unweighted otherwise).
  const GraphOperand plain(b.g.csr(), b.src_ids.data(), b.full_indptr.data());
  EXPECT_NE(std::vector<float>(plain.src_norm(), plain.src_norm() + 5000),
            std::vector<float>(host.src_norm(), host.src_norm() + 5000));
}

// ---- GpuBatches on a store ----------------------------------------------------------------------

const storage::Store& rmat_store() {
  static const storage::Store store = [] {
    const auto dir = std::filesystem::temp_directory_path() / ("gale-gpu-batches-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    storage::PreprocessOptions o;
    o.output = (dir / "rmat.gale").string();
    o.generate = "rmat:scale=14,edge-factor=8,classes=5,feature-dim=8";
    storage::preprocess(o);
    return storage::Store::open(o.output);
  }();
  return store;
}

// Everything about a sampled block that does not depend on how local ids were numbered (the GPU
// numbers the sources beyond the destinations in whatever order its threads claim them, so a
// deeper block's destinations are in another order too), by global id: each destination's sources
// in order, each source's destinations (CSC), and the norms' bits.
struct BlockByGlobalId {
  std::map<int64_t, std::vector<int64_t>> sources;  // destination id -> source ids
  std::map<int64_t, std::vector<int64_t>> csc;      // source id -> destination ids
  std::map<int64_t, uint32_t> src_norm, dst_norm, inv_degree;
  std::map<int64_t, std::vector<uint32_t>> weights;  // destination id -> its entries' weights' bits
  // "" when equal, else the first part that differs.
  std::string difference(const BlockByGlobalId& o) const {
    if (sources != o.sources) return "destinations or their sources";
    if (weights != o.weights) return "edge weights";
    if (csc != o.csc) return "the transpose";
    if (src_norm != o.src_norm) return "src_norm";
    if (dst_norm != o.dst_norm) return "dst_norm";
    if (inv_degree != o.inv_degree) return "inv_degree";
    return "";
  }
};

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

BlockByGlobalId describe(const std::vector<int64_t>& indptr, const std::vector<int32_t>& indices,
                         const std::vector<int64_t>& csc_indptr, const std::vector<int32_t>& csc_indices,
                         const std::vector<int64_t>& src_ids, const std::vector<float>& src_norm,
                         const std::vector<float>& dst_norm, const std::vector<float>& inv_degree,
                         const std::vector<float>& weights) {
  BlockByGlobalId d;
  const int64_t rows = static_cast<int64_t>(indptr.size()) - 1;
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<int64_t>& s = d.sources[src_ids[i]];
    for (int64_t k = indptr[i]; k < indptr[i + 1]; ++k) s.push_back(src_ids[indices[k]]);
    if (!weights.empty())
      for (int64_t k = indptr[i]; k < indptr[i + 1]; ++k) d.weights[src_ids[i]].push_back(bits(weights[k]));
    d.dst_norm[src_ids[i]] = bits(dst_norm[i]);
    d.inv_degree[src_ids[i]] = bits(inv_degree[i]);
  }
  for (size_t j = 0; j < src_ids.size(); ++j) {
    std::vector<int64_t>& dsts = d.csc[src_ids[j]];
    for (int64_t k = csc_indptr[j]; k < csc_indptr[j + 1]; ++k) dsts.push_back(src_ids[csc_indices[k]]);
    std::sort(dsts.begin(), dsts.end());  // CSC order follows the local numbering of destinations
    d.src_norm[src_ids[j]] = bits(src_norm[j]);
  }
  return d;
}

BlockByGlobalId describe_host(const sampler::Block& block, const storage::Store& store,
                              const float* full_degree = nullptr) {
  const GraphOperand op(block.csr(), block.src_ids.data(), store.indptr(), /*with_transpose=*/true, full_degree);
  const int64_t rows = block.num_dst(), cols = block.num_src(), nnz = op.nnz();
  const kernels::CsrView csc = op.csc();
  return describe(block.indptr, block.indices, std::vector<int64_t>(csc.indptr, csc.indptr + cols + 1),
                  std::vector<int32_t>(csc.indices, csc.indices + nnz), block.src_ids,
                  std::vector<float>(op.src_norm(), op.src_norm() + cols),
                  std::vector<float>(op.dst_norm(), op.dst_norm() + rows),
                  std::vector<float>(op.inv_degree(), op.inv_degree() + rows), block.weights);
}

BlockByGlobalId describe_device(const GraphOperand& op, const std::vector<int64_t>& src_ids) {
  const int64_t rows = op.num_dst(), cols = op.num_src(), nnz = op.nnz();
  return describe(fetch(op.csr().indptr, rows + 1), fetch(op.csr().indices, nnz), fetch(op.csc().indptr, cols + 1),
                  fetch(op.csc().indices, nnz), src_ids, fetch(op.src_norm(), cols), fetch(op.dst_norm(), rows),
                  fetch(op.inv_degree(), rows), op.weighted() ? fetch(op.csr().weights, nnz) : std::vector<float>());
}

// Seeds of batch b: 300 distinct training-like ids.
std::vector<int64_t> seeds_of(uint64_t b, int64_t nodes) {
  std::vector<int64_t> all(static_cast<size_t>(nodes));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937_64(b + 100));
  all.resize(300);
  return all;
}

// The operands of a GPU-sampled batch equal the CPU sampler's blocks made operands on the host.
// With `weights` (block weights, in that sampling mode) the entries' weights and GCN's weighted
// degrees too.
void expect_like_cpu(const GpuBatches& gpu, GpuBatch batch, const std::vector<int64_t>& seeds, uint64_t key,
                     const storage::Store& store, const std::vector<int>& fanouts, bool weights = false,
                     sampler::Sampling sampling = sampler::Sampling::kUniform) {
  const sampler::NeighborSampler cpu(store.csr(), fanouts, sampling, weights);
  const std::vector<float> degree = weights ? kernels::weighted_in_degree(store.csr()) : std::vector<float>();
  const sampler::SampledBatch want = cpu.sample(seeds.data(), static_cast<int64_t>(seeds.size()), key);
  ASSERT_EQ(batch.num_seeds(), static_cast<int64_t>(seeds.size()));
  ASSERT_EQ(batch.num_input_nodes(), want.blocks.front().num_src());
  GpuBatch::Operands o = gpu.operands(batch, /*edge_map=*/false);
  ASSERT_EQ(o.graphs.size(), want.blocks.size());
  EXPECT_EQ(fetch(o.seeds.data<int64_t>(), o.seeds.rows()), seeds);
  // Sources of layer l + 1's block are its destinations... the input layer's sources are the
  // features' rows; the source ids of every other block are the previous block's destinations.
  const std::vector<int64_t> input = fetch(o.input_nodes.data<int64_t>(), o.input_nodes.rows());
  std::vector<int64_t> src_ids = input;
  for (size_t l = 0; l < o.graphs.size(); ++l) {
    const GraphOperand& g = o.graphs[l];
    ASSERT_EQ(g.num_dst(), want.blocks[l].num_dst()) << "layer " << l;
    ASSERT_EQ(g.num_src(), want.blocks[l].num_src()) << "layer " << l;
    EXPECT_EQ(g.weighted(), weights) << "layer " << l;
    EXPECT_EQ(describe_device(g, src_ids).difference(describe_host(want.blocks[l], store, weights ? degree.data() : nullptr)),
              "")
        << "layer " << l;
    src_ids.resize(static_cast<size_t>(g.num_dst()));  // the next block's sources: this one's destinations
  }
  std::vector<int64_t> a = input, b = want.input_nodes();
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
}

TEST_F(GpuBatchesTest, SampledOperandsEqualTheCpuSamplersWithTopologyOnTheGpuAndOnTheHost) {
  const storage::Store& store = rmat_store();
  const std::vector<int> fanouts = {10, 5, 3};
  for (const uint64_t topology_bytes : {uint64_t{1} << 34, uint64_t{0}}) {
    const GpuBatches gpu(store, Device::cuda(0), fanouts, topology_bytes);
    EXPECT_EQ(gpu.topology_on_gpu(), topology_bytes > 0) << gpu.describe();
    for (uint64_t b = 0; b < 3; ++b) {
      const std::vector<int64_t> seeds = seeds_of(b, store.num_nodes());
      GpuBatch batch = gpu.sample(seeds.data(), 300, 1000 + b, /*input_nodes_on_host=*/b == 1);
      if (b == 1) EXPECT_EQ(static_cast<int64_t>(batch.input_nodes_host().size()), batch.num_input_nodes());
      if (b != 1) EXPECT_TRUE(batch.input_nodes_host().empty());
      expect_like_cpu(gpu, std::move(batch), seeds, 1000 + b, store, fanouts);
    }
  }
}

// sample_input_nodes: the CPU sampler's input nodes of the same seeds and key, as a set, less the
// rows a GPU cache holds (a third of the nodes); all of them without a cache. Topology on the GPU
// and on the host; several threads at once.
TEST_F(GpuBatchesTest, InputNodesAloneAreTheCpuSamplersLessTheCachedRows) {
  const storage::Store& store = rmat_store();
  const std::vector<int> fanouts = {15, 10, 5};
  const sampler::NeighborSampler cpu(store.csr(), fanouts);
  std::vector<int32_t> slot(static_cast<size_t>(store.num_nodes()), -1);
  int32_t rows = 0;
  for (int64_t v = 0; v < store.num_nodes(); ++v)
    if (kernels::random_below(91, static_cast<uint64_t>(v), 3) == 0) slot[static_cast<size_t>(v)] = rows++;
  const Tensor slot_gpu = upload(slot, DType::kI32);
  for (const uint64_t topology_bytes : {uint64_t{1} << 34, uint64_t{0}}) {
    const GpuBatches gpu(store, Device::cuda(0), fanouts, topology_bytes);
    constexpr int kBatches = 8;
    std::vector<std::vector<int64_t>> all(kBatches), uncached(kBatches);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int b = t; b < kBatches; b += 4) {
          const std::vector<int64_t> seeds = seeds_of(static_cast<uint64_t>(b), store.num_nodes());
          all[b] = gpu.sample_input_nodes(seeds.data(), 300, 300 + b, nullptr);
          uncached[b] = gpu.sample_input_nodes(seeds.data(), 300, 300 + b, slot_gpu.data<int32_t>());
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int b = 0; b < kBatches; ++b) {
      const std::vector<int64_t> seeds = seeds_of(static_cast<uint64_t>(b), store.num_nodes());
      std::vector<int64_t> want = cpu.sample(seeds.data(), 300, 300 + b).input_nodes();
      std::vector<int64_t> want_uncached(want.size());
      want_uncached.resize(static_cast<size_t>(
          kernels::uncached_ids_cpu(slot.data(), want.data(), static_cast<int64_t>(want.size()), want_uncached.data())));
      const std::string at = gpu.describe() + ", batch " + std::to_string(b);
      EXPECT_TRUE(std::equal(seeds.begin(), seeds.end(), all[b].begin())) << at;
      for (auto* v : {&want, &want_uncached, &all[b], &uncached[b]}) std::sort(v->begin(), v->end());
      EXPECT_EQ(all[b], want) << at;
      EXPECT_EQ(uncached[b], want_uncached) << at;
      EXPECT_LT(uncached[b].size(), all[b].size()) << at;
    }
  }
}

// A weighted store (generated with weights=uniform): blocks with their weights, drawn uniformly and
// by weight, topology (weights and weighted degrees with it) on the GPU and in pinned host memory.
TEST_F(GpuBatchesTest, WeightedBlocksEqualTheCpuSamplersWithTheirWeightsAndDegrees) {
  const auto dir = std::filesystem::temp_directory_path() / ("gale-gpu-batches-w-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  storage::PreprocessOptions po;
  po.output = (dir / "rmat.gale").string();
  po.generate = "rmat:scale=13,edge-factor=8,classes=5,feature-dim=8,weights=uniform";
  storage::preprocess(po);
  const storage::Store store = storage::Store::open(po.output);
  ASSERT_NE(store.weights(), nullptr);
  EXPECT_THROW(GpuBatches(rmat_store(), Device::cuda(0), {3}, uint64_t{1} << 34, sampler::Sampling::kUniform, true),
               InputError);
  const std::vector<int> fanouts = {10, 5};
  for (const sampler::Sampling mode : {sampler::Sampling::kUniform, sampler::Sampling::kWeighted}) {
    for (const uint64_t topology_bytes : {uint64_t{1} << 34, uint64_t{0}}) {
      const GpuBatches gpu(store, Device::cuda(0), fanouts, topology_bytes, mode, /*block_weights=*/true);
      EXPECT_EQ(gpu.topology_on_gpu(), topology_bytes > 0) << gpu.describe();
      for (uint64_t b = 0; b < 2; ++b) {
        const std::vector<int64_t> seeds = seeds_of(b, store.num_nodes());
        GpuBatch batch = gpu.sample(seeds.data(), 300, 500 + b, /*input_nodes_on_host=*/false);
        expect_like_cpu(gpu, std::move(batch), seeds, 500 + b, store, fanouts, /*weights=*/true, mode);
      }
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_F(GpuBatchesTest, BatchesSampledFromSeveralThreadsAtOnceAreEachRight) {
  const storage::Store& store = rmat_store();
  const std::vector<int> fanouts = {15, 10};
  const GpuBatches gpu(store, Device::cuda(0), fanouts, uint64_t{1} << 34);
  constexpr int kBatches = 12;
  std::vector<GpuBatch> batches(kBatches);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int b = t; b < kBatches; b += 4) {
        const std::vector<int64_t> seeds = seeds_of(static_cast<uint64_t>(b), store.num_nodes());
        batches[b] = gpu.sample(seeds.data(), 300, 77 + b, false);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int b = 0; b < kBatches; ++b)
    expect_like_cpu(gpu, std::move(batches[b]), seeds_of(static_cast<uint64_t>(b), store.num_nodes()), 77 + b, store,
                    fanouts);
}

}  // namespace
}  // namespace gale::engine
