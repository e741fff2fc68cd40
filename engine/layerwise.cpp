#include "engine/layerwise.hpp"

#include <algorithm>
#include <cstring>
#include <future>
#include <numeric>
#include <utility>

#include "engine/devices.hpp"
#include "engine/graph.hpp"
#include "engine/ops.hpp"
#include "kernels/error.hpp"
#include "kernels/graph_norms.hpp"
#include "sampler/block.hpp"

namespace gale::engine {

uint64_t whole_graph_inference_bytes(int64_t nodes, int64_t entries, int64_t in_dim, int64_t widest, int heads) {
  const auto n = static_cast<uint64_t>(nodes), e = static_cast<uint64_t>(entries);
  return 16 * n + e * (12 + 8 * static_cast<uint64_t>(std::max(0, heads))) + 4 * n * static_cast<uint64_t>(in_dim) +
         12 * n * static_cast<uint64_t>(widest);
}

LayerwiseOptions layerwise_options_for(uint64_t room, int64_t widest, bool attention) {
  room = room > kLibraryReserveBytes ? room - kLibraryReserveBytes : 0;
  LayerwiseOptions o;
  o.attention = attention;
  o.max_rows = std::clamp<int64_t>(static_cast<int64_t>(room / 4 / (16 * static_cast<uint64_t>(std::max<int64_t>(1, widest)))),
                                   64, int64_t{1} << 22);
  o.device_table_bytes = room / 4 * 3;
  return o;
}

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

kernels::CsrView aggregation_csr(const storage::Store& store, const ModelConfig& config) {
  kernels::CsrView csr = store.csr();
  if (!config.edge_weights) {
    csr.weights = nullptr;
  } else if (csr.weights == nullptr) {
    throw InputError(store.path().string() + ": the model aggregates with edge weights, and the store has none "
                     "(graph/weights.npy)");
  }
  return csr;
}

namespace {

// The one-hop block of destinations [begin, end) with all of their in-neighbours: the
// destinations are the first sources (Block's convention), then every other in-neighbour in the
// order of its first entry. `local` (one entry per node, all -1) maps global ids to the block's
// while it is built, and is left all -1 again.
sampler::Block chunk_block(const kernels::CsrView& g, int64_t begin, int64_t end, std::vector<int32_t>* local) {
  sampler::Block b;
  const int64_t e0 = g.indptr[begin], e1 = g.indptr[end];
  b.indptr.resize(static_cast<size_t>(end - begin + 1));
  for (int64_t v = begin; v <= end; ++v) b.indptr[static_cast<size_t>(v - begin)] = g.indptr[v] - e0;
  b.src_ids.resize(static_cast<size_t>(end - begin));
  std::iota(b.src_ids.begin(), b.src_ids.end(), begin);
  int32_t* map = local->data();
  for (int64_t v = begin; v < end; ++v) map[v] = static_cast<int32_t>(v - begin);
  if (g.weights) b.weights.assign(g.weights + e0, g.weights + e1);
  b.indices.resize(static_cast<size_t>(e1 - e0));
  for (int64_t e = e0; e < e1; ++e) {
    const int32_t u = g.indices[e];
    if (map[u] < 0) {
      map[u] = static_cast<int32_t>(b.src_ids.size());
      b.src_ids.push_back(u);
    }
    b.indices[static_cast<size_t>(e - e0)] = map[u];
  }
  for (const int64_t u : b.src_ids) map[u] = -1;
  return b;
}

// One chunk's block, prepared on the host.
struct Chunk {
  int64_t begin = 0, end = 0;
  sampler::Block block;
  std::unique_ptr<GraphOperand> graph;  // on the host
};

}  // namespace

Tensor layerwise_logits(Model& model, const storage::Store& store, const InputRows& input_rows,
                        const LayerwiseOptions& options) {
  const int64_t n = store.num_nodes();
  const Device device = model.device();
  const std::vector<int64_t> bounds = layerwise_chunks(store.indptr(), n, options.max_rows);
  const kernels::CsrView csr = aggregation_csr(store, model.config());
  // A weighted chunk's outer sources take their GCN degrees from here.
  const std::vector<float> full_degree = csr.weights ? kernels::weighted_in_degree(csr) : std::vector<float>();
  std::vector<int32_t> local(static_cast<size_t>(n), -1);  // chunk_block's map (one chunk prepared at a time)
  // Layer l - 1's outputs of every node: a tensor on the model's device (the CPU's, or a GPU's when
  // they fit there), or, on a GPU, pinned host memory that its kernels gather from.
  Tensor previous;
  std::unique_ptr<MappedHostTable> previous_mapped;
  std::unique_ptr<kernels::cuda::BudgetCharge> previous_charge;
  for (size_t l = 0; l < model.num_layers(); ++l) {
    const int64_t width = model.layer_out_dim(l);
    const uint64_t read_bytes = device.is_cuda() && previous.defined() ? previous.nbytes() : 0;
    const bool mapped = device.is_cuda() && read_bytes + static_cast<uint64_t>(n * width) * sizeof(float) >
                                                options.device_table_bytes;
    Tensor next;
    std::unique_ptr<MappedHostTable> next_mapped;
    std::unique_ptr<kernels::cuda::BudgetCharge> next_charge;
    if (mapped) {
      next_mapped = std::make_unique<MappedHostTable>(device, n, width, options.host_budget, options.spill_dir);
    } else {
      if (device.is_cpu() && options.host_budget != nullptr) {  // this layer's table while the next is written
        next_charge = std::make_unique<kernels::cuda::BudgetCharge>(options.host_budget, static_cast<uint64_t>(n * width) * sizeof(float));
      }
      next = Tensor::empty(n, width, DType::kF32, device);
    }
    auto prepare = [&](size_t c) {
      Chunk chunk;
      chunk.begin = bounds[c];
      chunk.end = bounds[c + 1];
      chunk.block = chunk_block(csr, chunk.begin, chunk.end, &local);
      chunk.graph = std::make_unique<GraphOperand>(chunk.block.csr(), chunk.block.src_ids.data(), store.indptr(),
                                                   /*with_transpose=*/false, full_degree.data());
      return chunk;
    };
    // The next chunk's block is built on the host while this one runs.
    std::future<Chunk> ahead;
    if (bounds.size() > 1) ahead = std::async(std::launch::async, prepare, 0);
    for (size_t c = 0; c + 1 < bounds.size(); ++c) {
      Chunk chunk = ahead.get();
      if (c + 2 < bounds.size()) ahead = std::async(std::launch::async, prepare, c + 1);
      const GraphOperand graph = chunk.graph->to(device, options.attention);
      const std::vector<int64_t>& ids = chunk.block.src_ids;
      Tensor x;
      if (previous.defined() || previous_mapped) {
        const Tensor at = Tensor::from_host(ids.data(), static_cast<int64_t>(ids.size()), 1, DType::kI64, device);
        x = previous_mapped ? previous_mapped->gather(at) : ops::gather_rows(previous, at);
      } else {
        x = input_rows(ids);
      }
      const Tensor y = model.infer_layer(l, graph, std::move(x));
      GALE_ASSERT(y.rows() == chunk.end - chunk.begin && y.cols() == width);
      if (next_mapped) {
        next_mapped->write_rows(chunk.begin, y);
      } else {
        Tensor rows = next.rows_slice(chunk.begin, chunk.end);
        ops::copy(y, &rows);
      }
    }
    previous = std::move(next);
    previous_mapped = std::move(next_mapped);
    previous_charge = std::move(next_charge);
  }
  return previous_mapped ? previous_mapped->to_host() : previous.to(Device::cpu());
}

InputRows host_input_rows(HostRowReader read, int64_t dim, const Device& device,
                          kernels::cuda::MemoryBudget* host_budget) {
  return [read = std::move(read), dim, device, host_budget](const std::vector<int64_t>& ids) {
    const int64_t n = static_cast<int64_t>(ids.size());
    if (device.is_cpu() && n <= kHostPartRows) {
      Tensor rows = Tensor::empty(n, dim);
      const kernels::cuda::BudgetCharge charge(host_budget, static_cast<uint64_t>(rows.nbytes()));
      read(ids.data(), n, rows.f32());
      return rows;
    }
    Tensor out = Tensor::empty(n, dim, DType::kF32, device);
    const kernels::cuda::BudgetCharge charge(host_budget,
                                              static_cast<uint64_t>(std::min(n, kHostPartRows) * dim) * sizeof(float));
    Tensor part = Tensor::empty(std::min(n, kHostPartRows), dim);
    for (int64_t first = 0; first < n; first += kHostPartRows) {
      const int64_t len = std::min(kHostPartRows, n - first);
      Tensor host = part.rows_slice(0, len);
      read(ids.data() + first, len, host.f32());
      Tensor rows = out.rows_slice(first, first + len);
      ops::copy(device.is_cpu() ? host : host.to(device), &rows);
    }
    return out;
  };
}

std::filesystem::path spill_dir_for(const std::string& temp_dir, const storage::Store& store) {
  if (!temp_dir.empty()) return temp_dir;
  const std::filesystem::path parent = std::filesystem::absolute(store.path()).parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

}  // namespace gale::engine
