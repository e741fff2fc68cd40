// Feature tiers on the GPU: the tiered gather kernel against its CPU twin on fresh random inputs
// (every tier mixed in one batch, odd widths, output poisoned first), and BatchFeatures over a run
// of overlapping batches: every row equals the store's, whether the features are GPU-resident or
// split between a GPU cache of hot nodes and pinned host memory, with match on or off; the tier
// counters add up and match serves exactly the rows shared with the previous batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/batch_features.hpp"
#include "engine/device_context.hpp"
#include "engine/trainer.hpp"
#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/pinned.hpp"
#include "kernels/cuda/runtime.hpp"
#include "kernels/feature_gather.hpp"
#include "kernels/random.hpp"
#include "storage/feature_tiers.hpp"
#include "storage/preprocess.hpp"
#include "storage/store.hpp"
#include "tests/training/cora_store.hpp"

namespace gale {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

bool have_gpu() { return kernels::cuda::device_count() > 0; }

TEST(TieredGather, MatchesTheCpuTwinAcrossAllTiers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  using namespace kernels;
  cuda::MemoryPool pool(0);
  cuda::Stream stream(0);
  for (int64_t width : {1, 7, 32, 100, 129}) {
    for (const char* mode : {"cache+host", "resident", "cache+staged"}) {
      const bool resident = std::string(mode) == "resident", staged = std::string(mode) == "cache+staged";
      const uint64_t key = std::random_device{}();
      SCOPED_TRACE("width " + std::to_string(width) + " " + mode + " key " + std::to_string(key));
      const int64_t nodes = 5000, n = 3001, prev_n = 700, cached = 900;
      std::vector<float> all(static_cast<size_t>(nodes * width));
      for (size_t i = 0; i < all.size(); ++i) all[i] = random_uniform(key, i) - 0.5f;
      std::vector<int64_t> ids(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int64_t>(random_below(key + 1, i, nodes));
      std::vector<float> prev(static_cast<size_t>(prev_n * width));
      for (size_t i = 0; i < prev.size(); ++i) prev[i] = random_uniform(key + 2, i) + 10.0f;
      std::vector<int32_t> prev_rows(static_cast<size_t>(n), -1), slot(static_cast<size_t>(nodes), -1);
      for (int64_t i = 0; i < n; ++i)
        if (i % 3 == 0) prev_rows[i] = static_cast<int32_t>(random_below(key + 3, i, prev_n));
      std::vector<float> cache(static_cast<size_t>(cached * width));
      for (int64_t c = 0; c < cached; ++c) {
        const int64_t v = (c * 7) % nodes;
        slot[v] = static_cast<int32_t>(c);
        std::copy(all.begin() + v * width, all.begin() + (v + 1) * width, cache.begin() + c * width);
      }
      // Staged (features on disk): only the rows no faster tier holds, in batch order, and each
      // batch row's place among them (-1 for the rest).
      std::vector<int32_t> host_rows(static_cast<size_t>(n), -1);
      std::vector<float> rows_staged;
      if (staged) {
        for (int64_t i = 0; i < n; ++i) {
          if (prev_rows[i] >= 0 || slot[ids[i]] >= 0) continue;
          host_rows[i] = static_cast<int32_t>(rows_staged.size() / width);
          rows_staged.insert(rows_staged.end(), all.begin() + ids[i] * width, all.begin() + (ids[i] + 1) * width);
        }
      }
      const std::vector<float>& host_side = staged ? rows_staged : all;
      cuda::PinnedBuffer host(std::max<size_t>(1, host_side.size()) * sizeof(float));
      std::copy(host_side.begin(), host_side.end(), static_cast<float*>(host.host()));
      cuda::PinnedBuffer host_rows_pinned(host_rows.size() * sizeof(int32_t));
      std::copy(host_rows.begin(), host_rows.end(), static_cast<int32_t*>(host_rows_pinned.host()));
      auto ids_d = cuda::to_device(pool, ids, stream);
      auto prev_d = cuda::to_device(pool, prev, stream);
      auto rows_d = cuda::to_device(pool, prev_rows, stream);
      auto slot_d = cuda::to_device(pool, slot, stream);
      auto cache_d = cuda::to_device(pool, cache, stream);
      auto all_d = cuda::to_device(pool, all, stream);
      std::vector<float> want(static_cast<size_t>(n * width), kNaN);
      cuda::DeviceBuffer<float> out_d = cuda::to_device(pool, want, stream);
      std::vector<int64_t> counts(kFeatureTiers, 0);
      auto counts_d = cuda::to_device(pool, counts, stream);

      TieredGatherArgs a;
      a.ids = ids.data();
      a.n = n;
      a.prev_rows = prev_rows.data();
      a.prev = {prev.data(), prev_n, width, width};
      if (resident) {
        a.device = {all.data(), nodes, width, width};
      } else {
        a.cache_slot = slot.data();
        a.cache = {cache.data(), cached, width, width};
        a.host = {host_side.data(), static_cast<int64_t>(host_side.size()) / width, width, width};
        if (staged) a.host_rows = host_rows.data();
      }
      a.out = {want.data(), n, width, width};
      a.counters = counts.data();
      tiered_gather_cpu(a);

      TieredGatherArgs d = a;
      d.ids = ids_d.data();
      d.prev_rows = rows_d.data();
      d.prev.data = prev_d.data();
      if (resident) {
        d.device.data = all_d.data();
      } else {
        d.cache_slot = slot_d.data();
        d.cache.data = cache_d.data();
        d.host.data = static_cast<const float*>(host.device());
        if (staged) d.host_rows = static_cast<const int32_t*>(host_rows_pinned.device());
      }
      d.out.data = out_d.data();
      d.counters = counts_d.data();
      tiered_gather_cuda(d, stream);
      const std::vector<float> got = cuda::to_host_and_wait(out_d.view(), stream);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
      EXPECT_EQ(cuda::to_host_and_wait(counts_d.view(), stream), counts);
      EXPECT_EQ(counts[kTierPrevious] + counts[kTierDevice] + counts[kTierCache] + counts[kTierHost], n);
      if (!resident) EXPECT_GT(counts[kTierCache], 0);
      if (staged) EXPECT_EQ(counts[kTierHost] * width, static_cast<int64_t>(rows_staged.size()));
    }
  }
}

class GpuBatchFeatures : public ::testing::TestWithParam<std::tuple<bool, bool>> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  }
};

TEST_P(GpuBatchFeatures, RowsEqualTheStoreAndMatchServesTheSharedRows) {
  const auto [resident, match] = GetParam();
  const storage::Store store = storage::Store::open(testing::cora_store());
  const int64_t n = store.num_nodes(), d = store.feature_dim();
  std::vector<float> all(static_cast<size_t>(n * d));
  store.read_features(0, n, all.data());
  const uint64_t bytes = resident ? uint64_t{1} << 32 : static_cast<uint64_t>(n) * 4 + 300 * static_cast<uint64_t>(d) * 4;
  engine::BatchFeatures bf(store, Device::cuda(0), bytes, match);
  EXPECT_EQ(bf.resident(), resident) << bf.describe();
  int64_t shared_total = 0, rows_total = 0;
  std::vector<int64_t> prev;
  for (int b = 0; b < 6; ++b) {
    // Overlapping batches: half of each is drawn from the previous one.
    std::vector<int64_t> nodes;
    std::unordered_set<int64_t> seen;
    for (int i = 0; i < 500; ++i) {
      const int64_t v = (!prev.empty() && i % 2 == 0) ? prev[kernels::random_below(b, i, prev.size())]
                                                      : static_cast<int64_t>(kernels::random_below(b + 100, i, n));
      if (seen.insert(v).second) nodes.push_back(v);
    }
    if (!prev.empty()) {
      const std::unordered_set<int64_t> p(prev.begin(), prev.end());
      for (int64_t v : nodes) shared_total += p.count(v);
    }
    const engine::Tensor x = bf.load(nodes);
    const std::vector<float> got = x.to_vector();
    for (size_t i = 0; i < nodes.size(); ++i)
      ASSERT_EQ(0, std::memcmp(got.data() + i * d, all.data() + nodes[i] * d, static_cast<size_t>(d) * 4)) << "row " << i;
    rows_total += static_cast<int64_t>(nodes.size());
    prev = nodes;
  }
  const engine::FeatureLoadStats s = bf.take_stats();
  EXPECT_EQ(s.rows, rows_total);
  EXPECT_EQ(s.previous + s.device + s.cache + s.host, rows_total);
  EXPECT_EQ(s.previous, match && !resident ? shared_total : 0);  // all rows on the GPU: nothing to save
  if (resident) EXPECT_EQ(s.host, 0);
  if (!resident) EXPECT_GT(s.host, 0);
}

// Features on disk behind a GPU cache: the host stages each batch's rows the cache lacks (read
// through the disk tier) and the gather reads them over UVA. Rows equal the store's with match on
// or off, through load_async, load and the layer-wise load in parts; exactly the batch's uncached
// rows are staged; the GPU caches the hottest rows, the host cache skips them; the pinned buffers
// are charged to the host budget and returned.
TEST(GpuBatchFeaturesStaged, RowsEqualTheStoreThroughTheDiskTier) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  const storage::Store store = storage::Store::open(testing::cora_store());
  const int64_t n = store.num_nodes(), d = store.feature_dim();
  std::vector<float> all(static_cast<size_t>(n * d));
  store.read_features(0, n, all.data());
  const std::vector<int64_t> hottest = storage::hottest_nodes(store, 300);
  for (const bool match : {false, true}) {
    SCOPED_TRACE(match ? "match on" : "match off");
    kernels::cuda::MemoryBudget budget(uint64_t{1} << 30, "--host-mem-budget");
    {
      storage::HostFeatures::Options ho;
      ho.budget = &budget;
      ho.force_disk = true;
      ho.read_ahead_bytes = 0;
      ho.skip_hottest = 300;
      storage::HostFeatures host(store, ho);
      ASSERT_TRUE(host.on_disk());
      for (int64_t v : hottest) EXPECT_FALSE(host.disk()->is_cached(v)) << "the host cache skips the GPU's rows";
      engine::BatchFeatures bf(store, Device::cuda(0), static_cast<uint64_t>(n) * 4 + 300 * static_cast<uint64_t>(d) * 4,
                               match, host, &budget);
      ASSERT_TRUE(bf.staged()) << bf.describe();
      int64_t on_gpu = 0;
      for (int64_t v = 0; v < n; ++v) on_gpu += bf.on_gpu(v);
      EXPECT_EQ(on_gpu, 300);
      for (int64_t v : hottest) EXPECT_TRUE(bf.on_gpu(v));
      const engine::BatchFeatures::RowReader read = [&](const int64_t* ids, int64_t k, float* out) {
        host.read_rows(ids, k, out);
      };
      const uint64_t before = budget.in_use();
      int64_t staged_total = 0, rows_total = 0;
      std::vector<int64_t> prev;
      auto expect_rows = [&](const engine::Tensor& x, const std::vector<int64_t>& nodes, const char* how) {
        const std::vector<float> got = x.to_vector();
        for (size_t i = 0; i < nodes.size(); ++i)
          ASSERT_EQ(0, std::memcmp(got.data() + i * d, all.data() + nodes[i] * d, static_cast<size_t>(d) * 4))
              << how << ": row " << i;
      };
      for (int b = 0; b < 6; ++b) {
        std::vector<int64_t> nodes;
        std::unordered_set<int64_t> seen;
        for (int i = 0; i < 500; ++i) {
          const int64_t v = (!prev.empty() && i % 2 == 0) ? prev[kernels::random_below(b, i, prev.size())]
                                                          : static_cast<int64_t>(kernels::random_below(b + 200, i, n));
          if (seen.insert(v).second) nodes.push_back(v);
        }
        const engine::StagedRows staged = bf.stage(nodes, read);
        int64_t uncached = 0;
        for (int64_t v : nodes) uncached += !bf.on_gpu(v);
        EXPECT_EQ(staged.rows(), uncached);
        staged_total += staged.rows();
        rows_total += static_cast<int64_t>(nodes.size());
        const engine::Tensor ids = engine::Tensor::from_host(nodes.data(), static_cast<int64_t>(nodes.size()), 1,
                                                             DType::kI64, Device::cuda(0));
        expect_rows(bf.load_async(ids, &staged).take(), nodes, "load_async");
        prev = nodes;
      }
      EXPECT_GT(budget.in_use(), before) << "the pinned buffers are charged";
      const engine::FeatureLoadStats s = bf.take_stats();
      EXPECT_EQ(s.rows, rows_total);
      EXPECT_EQ(s.previous + s.cache + s.host, rows_total);
      EXPECT_EQ(s.device, 0);
      if (match) EXPECT_LE(s.host, staged_total);
      else EXPECT_EQ(s.host, staged_total);
      EXPECT_GT(s.cache, 0);

      // All of them at once, and through the layer-wise load (parts of kStageRows).
      std::vector<int64_t> every(static_cast<size_t>(n));
      for (int64_t v = 0; v < n; ++v) every[static_cast<size_t>(v)] = n - 1 - v;
      const engine::StagedRows staged = bf.stage(every, read);
      expect_rows(bf.load(every, &staged), every, "load");
      expect_rows(bf.load(every, read), every, "load in parts");
    }
    EXPECT_EQ(budget.in_use(), 0u) << "everything charged is returned";
  }
}

// A second GPU's tiers (here a second set on the same GPU) share the first one's pinned host copy,
// and a cache with preferred nodes holds them ahead of hotter ones; rows still equal the store.
TEST(GpuFeatureTiers, SharedHostTierAndPreferredCache) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  const storage::Store store = storage::Store::open(testing::cora_store());
  const int64_t n = store.num_nodes(), d = store.feature_dim();
  using namespace kernels;
  // The engine's pool: this binary's other tests create the device's one pool through it.
  engine::DeviceContext& ctx = engine::DeviceContext::get(0);
  cuda::MemoryPool& pool = ctx.pool();
  cuda::Stream& stream = ctx.io_stream();
  const uint64_t bytes = static_cast<uint64_t>(n) * 4 + 100 * static_cast<uint64_t>(d) * 4;  // 100 cached rows
  const storage::FeatureTiers first(store, pool, stream, bytes);
  std::vector<uint8_t> preferred(static_cast<size_t>(n), 0);
  for (int64_t v = 1; v < n; v += 7) preferred[static_cast<size_t>(v)] = 1;  // 387 nodes, more than the cache
  storage::FeatureTiers second(store, pool, stream, bytes, nullptr, first.host_tier(), &preferred);
  ASSERT_NE(first.host_tier(), nullptr);
  EXPECT_EQ(second.host_tier(), first.host_tier()) << "one pinned copy for both";
  EXPECT_EQ(second.cached_rows(), 100);
  // Gather preferred nodes only: every one of the first 100 hottest preferred nodes is a cache hit,
  // so hits = 100 and the other preferred nodes come from the shared host tier.
  std::vector<int64_t> ids;
  for (int64_t v = 1; v < n; v += 7) ids.push_back(v);
  cuda::DeviceBuffer<int64_t> ids_d(pool, ids.size(), stream);
  cuda::copy_to_device(ids_d.data(), ids.data(), ids.size(), stream);
  cuda::DeviceBuffer<float> out(pool, ids.size() * static_cast<size_t>(d), stream);
  second.gather(ids_d.data(), static_cast<int64_t>(ids.size()), nullptr, {},
                {out.data(), static_cast<int64_t>(ids.size()), d, d}, stream);
  const std::vector<float> got = cuda::to_host_and_wait(out.view(), stream);
  std::vector<float> want(static_cast<size_t>(d));
  for (size_t i = 0; i < ids.size(); ++i) {
    store.read_features(ids[i], ids[i] + 1, want.data());
    ASSERT_EQ(0, std::memcmp(got.data() + i * d, want.data(), static_cast<size_t>(d) * 4)) << "row " << i;
  }
  const storage::FeatureTierStats st = second.take_stats(stream);
  EXPECT_EQ(st.rows[kTierCache], 100);
  EXPECT_EQ(st.rows[kTierHost], static_cast<int64_t>(ids.size()) - 100);
}

INSTANTIATE_TEST_SUITE_P(Placements, GpuBatchFeatures, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "resident" : "cache_and_host") +
                                  (std::get<1>(info.param) ? "_match" : "_nomatch");
                         });

// Mini-batch SAGE on Cora with the features kept in host memory (a budget that leaves them only a
// small GPU cache) learns as well as with them on the GPU, and crosses far fewer bytes with match.
TEST(GpuMiniBatch, HostResidentFeaturesLearnAsWell) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  engine::TrainOptions o;
  o.store = testing::cora_store();
  o.device = Device::cuda(0);
  o.model.model = "sage";
  o.model.layers = 2;
  o.model.hidden = 16;
  o.epochs = 60;
  o.full_graph = false;
  o.fanouts = {10, 10};
  o.batch_size = 64;
  o.seed = 1;
  const engine::TrainResult resident = engine::train(o);
  engine::TrainOptions host = o;
  host.feature_gpu_bytes = 64 << 10;  // room for the slot table and a handful of hot rows only
  const engine::TrainResult from_host = engine::train(host);
  std::printf("  resident: test %.3f; host-resident (batched eval): test %.3f, host-to-GPU bytes last epoch %lld\n",
              resident.test_acc_at_best_valid, from_host.test_acc_at_best_valid,
              static_cast<long long>(from_host.last.host_to_gpu_bytes));
  EXPECT_GE(resident.test_acc_at_best_valid, 0.75);
  EXPECT_GE(from_host.test_acc_at_best_valid, 0.75);
  EXPECT_EQ(resident.last.rows_previous, 0);  // every row on the GPU: the match stays off
  EXPECT_GT(from_host.last.rows_previous, 0);  // rows in host memory: the match reuses some
  EXPECT_GT(from_host.last.rows_host, 0);
}

}  // namespace
}  // namespace gale
