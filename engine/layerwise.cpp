#include "engine/layerwise.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <numeric>
#include <utility>

#include "engine/graph.hpp"
#include "kernels/error.hpp"
#include "sampler/neighbor_sampler.hpp"

namespace gale::engine {

std::vector<int64_t> layerwise_chunks(const int64_t* indptr, int64_t num_nodes, int64_t max_rows) {
  GALE_ASSERT(max_rows > 0);
  std::vector<int64_t> bounds{0};
  int64_t begin = 0;
  while (begin < num_nodes) {
    // The longest run [begin, end) with entries + nodes <= max_rows (at least one node): entries
    // + nodes of [begin, end) is indptr[end] - indptr[begin] + end - begin, non-decreasing in end.
    const int64_t base = indptr[begin] + begin;
    int64_t lo = begin + 1, hi = num_nodes;  // the answer lies in [lo, hi]
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (indptr[mid] + mid - base <= max_rows) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    bounds.push_back(lo);
    begin = lo;
  }
  return bounds;
}

Tensor gather_host_rows(const Tensor& table, const std::vector<int64_t>& ids) {
  GALE_ASSERT(table.device().is_cpu() && table.dtype() == DType::kF32);
  const int64_t n = static_cast<int64_t>(ids.size()), width = table.cols();
  Tensor out = Tensor::empty(n, width);
  const float* src = table.f32();
  float* dst = out.f32();
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 1024), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i)
      std::memcpy(dst + i * width, src + ids[static_cast<size_t>(i)] * width, static_cast<size_t>(width) * sizeof(float));
  });
  return out;
}

namespace {

// One chunk's block and, past the first layer, its source rows, prepared on the host.
struct Chunk {
  int64_t begin = 0, end = 0;
  sampler::Block block;
  std::unique_ptr<GraphOperand> graph;  // on the host
  Tensor rows;                          // layers after the first: the sources' rows (host)
};

}  // namespace

Tensor layerwise_logits(Model& model, const storage::Store& store, const InputRows& input_rows,
                        const LayerwiseOptions& options) {
  const int64_t n = store.num_nodes();
  const Device device = model.device();
  const std::vector<int64_t> bounds = layerwise_chunks(store.indptr(), n, options.max_rows);
  const sampler::NeighborSampler one_hop(store.csr(), {-1});
  Tensor previous;  // layer l - 1's outputs of every node, on the host
  for (size_t l = 0; l < model.num_layers(); ++l) {
    Tensor next = Tensor::empty(n, model.layer_out_dim(l));
    auto prepare = [&](size_t c) {
      Chunk chunk;
      chunk.begin = bounds[c];
      chunk.end = bounds[c + 1];
      std::vector<int64_t> seeds(static_cast<size_t>(chunk.end - chunk.begin));
      std::iota(seeds.begin(), seeds.end(), chunk.begin);
      sampler::SampledBatch batch = one_hop.sample(seeds.data(), static_cast<int64_t>(seeds.size()), 0);
      chunk.block = std::move(batch.blocks[0]);
      chunk.graph = std::make_unique<GraphOperand>(chunk.block.csr(), chunk.block.src_ids.data(), store.indptr());
      if (previous.defined()) chunk.rows = gather_host_rows(previous, chunk.block.src_ids);
      return chunk;
    };
    // The next chunk is sampled and gathered on the host while the device runs this one.
    std::future<Chunk> ahead;
    if (bounds.size() > 1) ahead = std::async(std::launch::async, prepare, 0);
    for (size_t c = 0; c + 1 < bounds.size(); ++c) {
      Chunk chunk = ahead.get();
      if (c + 2 < bounds.size()) ahead = std::async(std::launch::async, prepare, c + 1);
      const GraphOperand graph = chunk.graph->to(device, options.attention);
      Tensor x = chunk.rows.defined() ? chunk.rows.to(device) : input_rows(chunk.block.src_ids);
      chunk.rows = Tensor();
      const Tensor y = model.infer_layer(l, graph, std::move(x)).to(Device::cpu());
      GALE_ASSERT(y.rows() == chunk.end - chunk.begin && y.cols() == next.cols());
      std::memcpy(next.f32() + chunk.begin * next.cols(), y.f32(), y.nbytes());
    }
    previous = std::move(next);
  }
  return previous;
}

}  // namespace gale::engine
