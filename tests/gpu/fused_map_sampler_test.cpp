// The GPU fused-map sampler (sampler/fused_map_sampler.cu) against the CPU NeighborSampler, which
// draws the same neighbours: on random graphs with hub rows, empty rows and degrees around the
// fanouts, every destination's sampled global ids must equal the CPU's, element for element, and
// every block must keep the Block conventions (dense local ids, destinations first and in order,
// distinct sources, indices consistent with src_ids). Topology is read from device memory and from
// mapped pinned host memory over UVA. Tests skip with a reason when no CUDA device is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "sampler/fused_map_sampler.hpp"
#include "sampler/neighbor_sampler.hpp"
#include "tests/gpu/cuda_fixture.hpp"

namespace gale::gpu_test {
// random_device.cu: out[i] = random_exponential(key, i) for i < n, on the device.
void random_exponential_on_device(uint64_t key, int64_t n, double* out, cudaStream_t stream);
}  // namespace gale::gpu_test

namespace gale::sampler {
namespace {

using kernels::CsrView;
using kernels::cuda::DeviceBuffer;
using kernels::cuda::MemoryPool;
using kernels::cuda::Stream;

// Host memory the GPU reads over UVA (cudaHostAllocMapped), freed with the object.
template <typename T>
class MappedHost {
 public:
  explicit MappedHost(const std::vector<T>& values) : size_(values.size()) {
    void* p = nullptr;
    GALE_CHECK_CUDA(cudaHostAlloc(&p, std::max<size_t>(size_, 1) * sizeof(T), cudaHostAllocMapped));
    host_ = static_cast<T*>(p);
    if (size_ > 0) std::memcpy(host_, values.data(), size_ * sizeof(T));
    void* d = nullptr;
    GALE_CHECK_CUDA(cudaHostGetDevicePointer(&d, host_, 0));
    device_ = static_cast<T*>(d);
  }
  ~MappedHost() { cudaFreeHost(host_); }
  MappedHost(const MappedHost&) = delete;
  MappedHost& operator=(const MappedHost&) = delete;
  T* device() const { return device_; }

 private:
  size_t size_;
  T* host_ = nullptr;
  T* device_ = nullptr;
};

struct Graph {
  int64_t n = 0;
  std::vector<int64_t> indptr;
  std::vector<int32_t> indices;
  CsrView csr() const { return {n, n, indptr.data(), indices.data(), nullptr}; }
  int64_t degree(int64_t v) const { return indptr[v + 1] - indptr[v]; }
};

// Distinct sorted in-neighbours per row. Node 0: every other node (a hub far above any fanout);
// node 1: ~n/3 nodes; every 7th row empty; every 5th row 30 to 99 neighbours (above 32, so
// fanouts beyond a warp meet rows both above and below them); the rest 0 to 24, around the
// fanouts 1, 3, 5, 10, 15.
Graph random_graph(int64_t n, uint64_t key) {
  Graph g;
  g.n = n;
  g.indptr.push_back(0);
  kernels::CounterRng rng(key);
  for (int64_t v = 0; v < n; ++v) {
    std::set<int32_t> nbrs;
    if (v == 0) {
      for (int32_t u = 1; u < n; ++u) nbrs.insert(u);
    } else if (v == 1) {
      for (int32_t u = 0; u < n; ++u)
        if (rng.below(3) == 0) nbrs.insert(u);
    } else if (v % 7 != 3) {
      const int64_t degree = v % 5 == 0 ? 30 + static_cast<int64_t>(rng.below(70)) : static_cast<int64_t>(rng.below(25));
      while (static_cast<int64_t>(nbrs.size()) < std::min(degree, n))
        nbrs.insert(static_cast<int32_t>(rng.below(static_cast<uint64_t>(n))));
    }
    g.indices.insert(g.indices.end(), nbrs.begin(), nbrs.end());
    g.indptr.push_back(static_cast<int64_t>(g.indices.size()));
  }
  return g;
}

// num distinct seeds: the hubs, an empty row, then random nodes.
std::vector<int64_t> random_seeds(int64_t n, int64_t num, uint64_t key) {
  std::vector<int64_t> seeds = {0, 3, 1};
  std::set<int64_t> used(seeds.begin(), seeds.end());
  kernels::CounterRng rng(key);
  while (static_cast<int64_t>(seeds.size()) < num) {
    const int64_t v = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
    if (used.insert(v).second) seeds.push_back(v);
  }
  seeds.resize(static_cast<size_t>(num));
  return seeds;
}

// Row -> the global ids of its sampled sources, in entry order.
std::map<int64_t, std::vector<int64_t>> rows_by_global_id(const Block& b) {
  std::map<int64_t, std::vector<int64_t>> rows;
  for (int64_t d = 0; d < b.num_dst(); ++d) {
    std::vector<int64_t>& row = rows[b.src_ids[d]];
    for (int64_t e = b.indptr[d]; e < b.indptr[d + 1]; ++e) row.push_back(b.src_ids[b.indices[e]]);
  }
  return rows;
}

// Checks the GPU batch (copied to the host) against the CPU's for the same seeds and key.
void expect_matches_cpu(const SampledBatch& gpu, const SampledBatch& cpu, const Graph& g, const std::vector<int>& fanouts,
                        const std::vector<int64_t>& seeds, const std::string& what) {
  ASSERT_EQ(gpu.blocks.size(), fanouts.size()) << what;
  ASSERT_EQ(cpu.blocks.size(), fanouts.size()) << what;
  const size_t layers = fanouts.size();
  for (size_t l = 0; l < layers; ++l) {
    const Block& b = gpu.blocks[l];
    const Block& c = cpu.blocks[l];
    const int fanout = fanouts[layers - 1 - l];
    const std::string at = what + ", block " + std::to_string(l);
    ASSERT_EQ(b.num_dst(), c.num_dst()) << at;
    ASSERT_EQ(b.num_src(), c.num_src()) << at;
    ASSERT_EQ(b.indices.size(), c.indices.size()) << at;
    ASSERT_EQ(b.indptr.front(), 0) << at;
    ASSERT_EQ(b.indptr.back(), static_cast<int64_t>(b.indices.size())) << at;

    // Destinations first and in order: the seeds for the last block, the next block's sources
    // (in the GPU's own order) for the others.
    const std::vector<int64_t> dsts(b.src_ids.begin(), b.src_ids.begin() + b.num_dst());
    if (l + 1 == layers) {
      EXPECT_EQ(dsts, seeds) << at;
    } else {
      EXPECT_EQ(dsts, gpu.blocks[l + 1].src_ids) << at;
    }
    // Distinct sources, the same set as the CPU's.
    const std::set<int64_t> src_set(b.src_ids.begin(), b.src_ids.end());
    EXPECT_EQ(src_set.size(), b.src_ids.size()) << at << ": repeated source";
    EXPECT_EQ(src_set, std::set<int64_t>(c.src_ids.begin(), c.src_ids.end())) << at;

    // Local ids dense: in range, and every source past the destinations is referenced.
    std::vector<char> referenced(static_cast<size_t>(b.num_src()), 0);
    for (int32_t s : b.indices) {
      ASSERT_GE(s, 0) << at;
      ASSERT_LT(s, b.num_src()) << at;
      referenced[static_cast<size_t>(s)] = 1;
    }
    for (int64_t s = b.num_dst(); s < b.num_src(); ++s)
      EXPECT_TRUE(referenced[static_cast<size_t>(s)]) << at << ": local id " << s << " is never used";

    // Per destination: the same sampled global ids in the same order as the CPU, real edges,
    // distinct, min(degree, fanout) of them.
    const auto gpu_rows = rows_by_global_id(b);
    const auto cpu_rows = rows_by_global_id(c);
    ASSERT_EQ(gpu_rows.size(), cpu_rows.size()) << at;
    for (const auto& [v, row] : gpu_rows) {
      const auto it = cpu_rows.find(v);
      ASSERT_NE(it, cpu_rows.end()) << at << ": destination " << v << " is not the CPU's";
      EXPECT_EQ(row, it->second) << at << ": destination " << v;
      const int64_t degree = g.degree(v);
      EXPECT_EQ(static_cast<int64_t>(row.size()), fanout < 0 ? degree : std::min<int64_t>(degree, fanout))
          << at << ": destination " << v;
      EXPECT_EQ(std::set<int64_t>(row.begin(), row.end()).size(), row.size()) << at << ": duplicate of " << v;
      const int32_t* first = g.indices.data() + g.indptr[v];
      const int32_t* last = g.indices.data() + g.indptr[v + 1];
      for (int64_t u : row)
        EXPECT_TRUE(std::binary_search(first, last, static_cast<int32_t>(u))) << at << ": " << u << " -> " << v;
    }
  }
}

enum class Topology { kDevice, kMappedHost };

class FusedMapSamplerTest : public gale::testing::CudaFixture<::testing::TestWithParam<Topology>> {
 protected:
  // The graph's arrays (and weights, when given) where the parameter says, as a device-readable
  // CsrView.
  CsrView place(const Graph& g, const std::vector<float>* weights = nullptr) {
    if (GetParam() == Topology::kDevice) {
      d_indptr_ = kernels::cuda::to_device(*pool_, g.indptr, *stream_);
      d_indices_ = kernels::cuda::to_device(*pool_, g.indices, *stream_);
      if (weights != nullptr) d_weights_ = kernels::cuda::to_device(*pool_, *weights, *stream_);
      return {g.n, g.n, d_indptr_.data(), d_indices_.data(), weights != nullptr ? d_weights_.data() : nullptr};
    }
    h_indptr_ = std::make_unique<MappedHost<int64_t>>(g.indptr);
    h_indices_ = std::make_unique<MappedHost<int32_t>>(g.indices);
    if (weights != nullptr) h_weights_ = std::make_unique<MappedHost<float>>(*weights);
    return {g.n, g.n, h_indptr_->device(), h_indices_->device(), weights != nullptr ? h_weights_->device() : nullptr};
  }

  SampledBatch sample_on_gpu(const FusedMapSampler& sampler, const std::vector<int64_t>& seeds, uint64_t key) {
    DeviceBuffer<int64_t> d_seeds = kernels::cuda::to_device(*pool_, seeds, *stream_);
    const DeviceSampledBatch batch =
        sampler.sample(d_seeds.data(), static_cast<int64_t>(seeds.size()), key, *stream_);
    return to_host_and_wait(batch, *stream_);
  }

  // Samples on both sides and compares; `weights` selects the weighted mode.
  void check(const Graph& g, const std::vector<int>& fanouts, int64_t num_seeds, uint64_t key,
             const std::vector<float>* weights = nullptr) {
    const Sampling sampling = weights != nullptr ? Sampling::kWeighted : Sampling::kUniform;
    const CsrView device_csr = place(g, weights);
    const FusedMapSampler gpu(device_csr, fanouts, *pool_, sampling);
    CsrView host_csr = g.csr();
    if (weights != nullptr) host_csr.weights = weights->data();
    const NeighborSampler cpu(host_csr, fanouts, sampling);
    const std::vector<int64_t> seeds = random_seeds(g.n, num_seeds, key);
    const SampledBatch expected = cpu.sample(seeds.data(), num_seeds, key);
    const SampledBatch got = sample_on_gpu(gpu, seeds, key);
    std::string what = weights != nullptr ? "weighted, fanouts" : "fanouts";
    for (int f : fanouts) what += " " + std::to_string(f);
    what += ", " + std::to_string(num_seeds) + " seeds, key " + std::to_string(key);
    expect_matches_cpu(got, expected, g, fanouts, seeds, what);
    // sample_input_nodes: the CPU's input nodes as a set, the seeds first and in order.
    const std::vector<int64_t> inputs = input_nodes_on_gpu(gpu, seeds, key);
    const std::vector<int64_t>& cpu_inputs = expected.input_nodes();
    ASSERT_EQ(inputs.size(), cpu_inputs.size()) << what << ", input nodes alone";
    EXPECT_TRUE(std::equal(seeds.begin(), seeds.end(), inputs.begin())) << what << ", input nodes alone";
    EXPECT_EQ(std::set<int64_t>(inputs.begin(), inputs.end()), std::set<int64_t>(cpu_inputs.begin(), cpu_inputs.end()))
        << what << ", input nodes alone";
  }

  std::vector<int64_t> input_nodes_on_gpu(const FusedMapSampler& sampler, const std::vector<int64_t>& seeds,
                                          uint64_t key) {
    DeviceBuffer<int64_t> d_seeds = kernels::cuda::to_device(*pool_, seeds, *stream_);
    const DeviceInputNodes inputs =
        sampler.sample_input_nodes(d_seeds.data(), static_cast<int64_t>(seeds.size()), key, *stream_);
    std::vector<int64_t> out(static_cast<size_t>(inputs.count));
    kernels::cuda::copy_to_host(out.data(), inputs.ids.data(), out.size(), *stream_);
    stream_->synchronize();
    return out;
  }

  DeviceBuffer<int64_t> d_indptr_;
  DeviceBuffer<int32_t> d_indices_;
  DeviceBuffer<float> d_weights_;
  std::unique_ptr<MappedHost<int64_t>> h_indptr_;
  std::unique_ptr<MappedHost<int32_t>> h_indices_;
  std::unique_ptr<MappedHost<float>> h_weights_;
};

TEST_P(FusedMapSamplerTest, ThreeHopsMatchTheCpuSampler) {
  const Graph g = random_graph(3001, 1);
  for (uint64_t key : {1u, 2u, 3u}) check(g, {15, 10, 5}, 257, key);
}

TEST_P(FusedMapSamplerTest, AllNeighboursThenThreeMatchTheCpuSampler) {
  const Graph g = random_graph(2003, 2);
  check(g, {-1, 3}, 61, 4);
  check(g, {3, -1}, 61, 5);
}

TEST_P(FusedMapSamplerTest, OneNeighbourPerNodeMatchesTheCpuSampler) {
  const Graph g = random_graph(1009, 3);
  check(g, {1}, 1009, 6);  // every node a seed
  check(g, {1, 1, 1, 1}, 5, 7);
}

// Fanouts of a warp and beyond: the picks no longer fit one register per lane.
TEST_P(FusedMapSamplerTest, FanoutsAboveAWarpMatchTheCpuSampler) {
  const Graph g = random_graph(2500, 4);
  check(g, {32, 33}, 101, 8);
  check(g, {50, 64}, 40, 9);
  check(g, {1000}, 30, 10);
}

TEST_P(FusedMapSamplerTest, LargeBatchMatchesTheCpuSampler) {
  const Graph g = random_graph(20011, 5);
  check(g, {15, 10, 5}, 4096, 11);
}

TEST_P(FusedMapSamplerTest, NoSeedsGiveEmptyBlocks) {
  const Graph g = random_graph(100, 6);
  const FusedMapSampler sampler(place(g), {5, 5}, *pool_);
  const DeviceSampledBatch batch = sampler.sample(nullptr, 0, 1, *stream_);
  ASSERT_EQ(batch.blocks.size(), 2u);
  for (const DeviceBlock& b : batch.blocks) {
    EXPECT_EQ(b.num_dst, 0);
    EXPECT_EQ(b.num_src, 0);
    EXPECT_EQ(b.num_edges, 0);
  }
  EXPECT_EQ(sampler.sample_input_nodes(nullptr, 0, 1, *stream_).count, 0);
}

// Node 0's 1999 in-neighbours, 10 drawn per key over 3000 keys: each should be drawn with
// probability 10 / 1999 per key. Pearson's statistic over the per-neighbour counts, each a sum
// of Bernoulli(p) indicators (so variance E (1 - p) rather than E), has 1998 degrees of freedom
// (the counts sum to a constant); its upper tail by the Wilson-Hilferty normal approximation.
TEST_P(FusedMapSamplerTest, NeighbourFrequenciesAreUniform) {
  const Graph g = random_graph(2000, 7);
  const FusedMapSampler sampler(place(g), {10}, *pool_);
  const int64_t degree = g.degree(0);
  ASSERT_EQ(degree, 1999);
  const int keys = 3000;
  std::vector<int64_t> counts(static_cast<size_t>(g.n), 0);
  const std::vector<int64_t> seed = {0};
  for (int k = 0; k < keys; ++k) {
    const SampledBatch b = sample_on_gpu(sampler, seed, static_cast<uint64_t>(1000 + k));
    const Block& block = b.blocks[0];
    ASSERT_EQ(block.indptr[1], 10);
    for (int64_t e = 0; e < 10; ++e) counts[static_cast<size_t>(block.src_ids[block.indices[e]])]++;
  }
  EXPECT_EQ(counts[0], 0);
  const double p = 10.0 / static_cast<double>(degree);
  const double expected = keys * p;
  double chi2 = 0;
  for (int64_t u = 1; u < g.n; ++u) {
    const double d = static_cast<double>(counts[static_cast<size_t>(u)]) - expected;
    chi2 += d * d / (expected * (1 - p));
  }
  const double dof = static_cast<double>(degree - 1);
  const double z = (std::cbrt(chi2 / dof) - (1 - 2 / (9 * dof))) / std::sqrt(2 / (9 * dof));
  const double p_value = 0.5 * std::erfc(z / std::sqrt(2.0));
  EXPECT_GT(p_value, 0.001) << "chi2 " << chi2 << " over " << dof << " degrees of freedom";
}

TEST_P(FusedMapSamplerTest, BadSeedsAreInputErrors) {
  const Graph g = random_graph(50, 8);
  const FusedMapSampler sampler(place(g), {3, 3}, *pool_);
  for (const std::vector<int64_t>& seeds :
       {std::vector<int64_t>{1, 50}, std::vector<int64_t>{-1}, std::vector<int64_t>{4, 2, 4}}) {
    DeviceBuffer<int64_t> d_seeds = kernels::cuda::to_device(*pool_, seeds, *stream_);
    EXPECT_THROW(sampler.sample(d_seeds.data(), static_cast<int64_t>(seeds.size()), 1, *stream_), InputError);
    EXPECT_THROW(sampler.sample_input_nodes(d_seeds.data(), static_cast<int64_t>(seeds.size()), 1, *stream_),
                 InputError);
  }
  // The stream is still usable after the errors.
  const std::vector<int64_t> good = {4, 2};
  EXPECT_EQ(sample_on_gpu(sampler, good, 1).num_seeds(), 2);
}

// A graph index outside the node range (a damaged topology) is an error even in the last hop,
// whose picks no later count kernel looks at, and the map's lookup does not hang on it.
TEST_P(FusedMapSamplerTest, DamagedTopologyIsAnInputError) {
  for (int32_t bad : {-1, 10, 1 << 30}) {
    Graph g = random_graph(10, 17);
    g.indices[static_cast<size_t>(g.indptr[0] + 2)] = bad;  // node 0 lists every other node
    for (const std::vector<int>& fanouts : {std::vector<int>{-1}, std::vector<int>{3, -1}}) {
      const FusedMapSampler sampler(place(g), fanouts, *pool_);
      const std::vector<int64_t> seeds = {0};
      DeviceBuffer<int64_t> d_seeds = kernels::cuda::to_device(*pool_, seeds, *stream_);
      EXPECT_THROW(sampler.sample(d_seeds.data(), 1, 1, *stream_), InputError) << "index " << bad;
      EXPECT_THROW(sampler.sample_input_nodes(d_seeds.data(), 1, 1, *stream_), InputError) << "index " << bad;
    }
  }
}

// Weights 0.01 to 100, log-uniform, plus runs of equal weights (every 8th row all 1s) where only
// the exponential variates order the entries.
std::vector<float> random_weights(const Graph& g, uint64_t key) {
  std::vector<float> w(g.indices.size());
  for (int64_t v = 0; v < g.n; ++v) {
    for (int64_t e = g.indptr[v]; e < g.indptr[v + 1]; ++e) {
      w[static_cast<size_t>(e)] =
          v % 8 == 5 ? 1.0f : std::pow(10.0f, 4.0f * kernels::random_uniform(key, static_cast<uint64_t>(e)) - 2.0f);
    }
  }
  return w;
}

TEST_P(FusedMapSamplerTest, WeightedDrawsMatchTheCpuSampler) {
  const Graph g = random_graph(3001, 10);
  const std::vector<float> weights = random_weights(g, 11);
  check(g, {15, 10, 5}, 257, 12, &weights);
  check(g, {1}, 500, 13, &weights);
  check(g, {-1, 2}, 17, 14, &weights);
  check(g, {40, 100}, 31, 15, &weights);
}

// Weights over six orders of magnitude: a few entries hold most of a row's weight, so the
// candidate select's first threshold often catches too few and grows, or the row takes the radix
// select; every path draws what the CPU draws.
TEST_P(FusedMapSamplerTest, WeightedSkewedWeightsMatchTheCpuSampler) {
  const Graph g = random_graph(3000, 21);
  std::vector<float> weights(g.indices.size());
  for (size_t e = 0; e < weights.size(); ++e)
    weights[e] = std::pow(10.0f, 6.0f * kernels::random_uniform(22, e) - 3.0f);
  check(g, {15, 10, 5}, 200, 23, &weights);
  check(g, {64, 3}, 50, 24, &weights);
  check(g, {65}, 50, 25, &weights);  // above the candidate select's takes: the radix select
  std::vector<float> flat(g.indices.size(), 0.5f);  // ties everywhere but in the exponentials
  check(g, {10, 10}, 100, 26, &flat);
}

TEST_P(FusedMapSamplerTest, WeightedBadWeightsAreInputErrors) {
  const Graph g = random_graph(50, 16);
  std::vector<float> weights(g.indices.size(), 1.0f);
  weights[7] = 0.0f;  // in node 0's row of 49 entries
  const FusedMapSampler sampler(place(g, &weights), {3}, *pool_, Sampling::kWeighted);
  const std::vector<int64_t> seeds = {0};
  DeviceBuffer<int64_t> d_seeds = kernels::cuda::to_device(*pool_, seeds, *stream_);
  EXPECT_THROW(sampler.sample(d_seeds.data(), 1, 1, *stream_), InputError);
  EXPECT_THROW(FusedMapSampler(place(g), {3}, *pool_, Sampling::kWeighted), InputError);  // no weights
}

// Blocks with weights: every entry carries the weight of the graph edge it was drawn from (every
// pick path: whole rows, up to a warp, beyond a warp, by weight), beside the same draws.
TEST_P(FusedMapSamplerTest, BlockWeightsAreTheSampledEdgesWeights) {
  const Graph g = random_graph(2500, 17);
  const std::vector<float> weights = random_weights(g, 18);
  EXPECT_THROW(FusedMapSampler(place(g), {3}, *pool_, Sampling::kUniform, /*block_weights=*/true), InputError);
  const CsrView device_csr = place(g, &weights);
  const std::vector<int> fanouts = {-1, 40, 5};
  const std::vector<int64_t> seeds = random_seeds(g.n, 64, 19);
  for (const Sampling mode : {Sampling::kUniform, Sampling::kWeighted}) {
    const FusedMapSampler with(device_csr, fanouts, *pool_, mode, /*block_weights=*/true);
    const FusedMapSampler without(device_csr, fanouts, *pool_, mode);
    const SampledBatch got = sample_on_gpu(with, seeds, 20);
    const SampledBatch plain = sample_on_gpu(without, seeds, 20);
    for (size_t l = 0; l < got.blocks.size(); ++l) {
      const Block& b = got.blocks[l];
      EXPECT_TRUE(plain.blocks[l].weights.empty());
      ASSERT_EQ(b.weights.size(), b.indices.size());
      int64_t checked = 0;
      for (int64_t d = 0; d < b.num_dst(); ++d) {
        const int64_t v = b.src_ids[d];
        const auto first = g.indices.begin() + g.indptr[v], last = g.indices.begin() + g.indptr[v + 1];
        for (int64_t e = b.indptr[d]; e < b.indptr[d + 1]; ++e) {
          const int32_t u = static_cast<int32_t>(b.src_ids[b.indices[e]]);
          const auto at = std::lower_bound(first, last, u);
          ASSERT_TRUE(at != last && *at == u) << v << " <- " << u;
          EXPECT_EQ(b.weights[e], weights[at - g.indices.begin()]) << v << " <- " << u;
          ++checked;
        }
      }
      EXPECT_GT(checked, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Topologies, FusedMapSamplerTest, ::testing::Values(Topology::kDevice, Topology::kMappedHost),
                         [](const ::testing::TestParamInfo<Topology>& info) {
                           return info.param == Topology::kDevice ? std::string("DeviceMemory")
                                                                  : std::string("MappedPinnedHost");
                         });

// Weighted sampling compares exponential variates computed on both sides: they must agree to the
// bit (kernels/random.hpp's reproducible_log), not just closely.
TEST(FusedMapSampler, DeviceExponentialVariatesEqualTheHostsBitForBit) {
  if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  MemoryPool pool(0);
  Stream stream(0);
  const int64_t n = 1 << 20;
  DeviceBuffer<double> d_out(pool, static_cast<size_t>(n), stream);
  gpu_test::random_exponential_on_device(77, n, d_out.data(), stream);
  const std::vector<double> gpu = kernels::cuda::to_host_and_wait(d_out.view(), stream);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double cpu = kernels::random_exponential(77, static_cast<uint64_t>(i));
    differ += std::memcmp(&cpu, &gpu[static_cast<size_t>(i)], sizeof(double)) != 0;
  }
  EXPECT_EQ(differ, 0) << "of " << n;
}

TEST(FusedMapSampler, BadFanoutsAndGraphsAreInputErrors) {
  if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  MemoryPool pool(0);
  const Graph g = random_graph(10, 9);
  EXPECT_THROW(FusedMapSampler(g.csr(), {}, pool), InputError);
  EXPECT_THROW(FusedMapSampler(g.csr(), {0}, pool), InputError);
  EXPECT_THROW(FusedMapSampler(g.csr(), {-2}, pool), InputError);
  CsrView rectangular = g.csr();
  rectangular.cols = 11;
  EXPECT_THROW(FusedMapSampler(rectangular, {2}, pool), InputError);
}

}  // namespace
}  // namespace gale::sampler
