#include "engine/gpu_batches.hpp"

#include <tbb/parallel_for.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>

#include "engine/devices.hpp"
#include "kernels/error.hpp"
#include "kernels/feature_gather.hpp"
#include "kernels/graph_norms.hpp"
#if GALE_WITH_CUDA
#include "engine/device_context.hpp"
#include "kernels/cuda/buffer.hpp"
#include "kernels/cuda/pinned.hpp"
#include "sampler/fused_map_sampler.hpp"
#endif

namespace gale::engine {

struct GpuBatch::Impl {
  int64_t num_seeds = 0, num_input = 0;
  std::vector<int64_t> input_host;
#if GALE_WITH_CUDA
  kernels::cuda::DeviceBuffer<int64_t> seeds;
  sampler::DeviceSampledBatch sampled;
  std::unique_ptr<kernels::cuda::Event> ready;  // recorded on the sampling stream after the last hop
#endif
};

GpuBatch::GpuBatch() = default;
GpuBatch::~GpuBatch() = default;
GpuBatch::GpuBatch(GpuBatch&&) noexcept = default;
GpuBatch& GpuBatch::operator=(GpuBatch&&) noexcept = default;
int64_t GpuBatch::num_seeds() const { return impl_ ? impl_->num_seeds : 0; }
int64_t GpuBatch::num_input_nodes() const { return impl_ ? impl_->num_input : 0; }
const std::vector<int64_t>& GpuBatch::input_nodes_host() const {
  static const std::vector<int64_t> none;
  return impl_ ? impl_->input_host : none;
}

namespace {

std::string mib(uint64_t bytes) {
  char buf[64];
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  } else {
    std::snprintf(buf, sizeof buf, "%.0f MiB", static_cast<double>(bytes) / (1 << 20));
  }
  return buf;
}

}  // namespace

struct GpuBatches::Impl {
  Device device;
  uint64_t topology_bytes = 0;
  bool on_gpu = false;
#if GALE_WITH_CUDA
  kernels::cuda::DeviceBuffer<int64_t> indptr;
  kernels::cuda::DeviceBuffer<int32_t> indices;
  kernels::cuda::DeviceBuffer<float> weights, degree;
  kernels::cuda::PinnedBuffer pinned;  // indptr, indices, then weights and degree when needed
  kernels::CsrView graph;              // device-accessible
  const float* full_degree = nullptr;  // device-accessible: weighted in-degrees (block weights)
  std::unique_ptr<sampler::FusedMapSampler> sampler;
  // Sampling streams: one per concurrent sample() call, created on demand and reused.
  std::mutex mutex;
  std::deque<kernels::cuda::Stream> streams;
  std::vector<kernels::cuda::Stream*> idle;

  kernels::cuda::Stream* acquire() {
    std::lock_guard<std::mutex> lock(mutex);
    if (idle.empty()) {
      streams.emplace_back(device.ordinal);
      // A batch's sampling allocates a few dozen buffers on its stream: kept blocks spare the
      // driver's allocator calls (kernels/cuda/runtime.hpp).
      if (std::getenv("GALE_NO_BLOCK_CACHE") == nullptr)
        DeviceContext::get(device.ordinal).pool().cache_frees_on(streams.back());
      return &streams.back();
    }
    kernels::cuda::Stream* s = idle.back();
    idle.pop_back();
    return s;
  }
  ~Impl() {
    if (streams.empty()) return;
    kernels::cuda::MemoryPool& pool = DeviceContext::get(device.ordinal).pool();
    for (const kernels::cuda::Stream& stream : streams) pool.stop_caching(stream);
  }
  void release(kernels::cuda::Stream* s) {
    std::lock_guard<std::mutex> lock(mutex);
    idle.push_back(s);
  }
  // A sampling stream, held for one call.
  struct StreamLease {
    explicit StreamLease(Impl& impl) : s(impl), stream(impl.acquire()) {}
    ~StreamLease() { s.release(stream); }
    StreamLease(const StreamLease&) = delete;
    StreamLease& operator=(const StreamLease&) = delete;
    Impl& s;
    kernels::cuda::Stream* const stream;
  };
#endif
};

GpuBatches::GpuBatches(const storage::Store& store, const Device& device, std::vector<int> fanouts,
                       uint64_t topology_gpu_bytes, sampler::Sampling sampling, bool block_weights)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.device = device;
  if (!device.is_cuda()) throw InternalError("GpuBatches: needs a CUDA device, given " + device.name());
#if GALE_WITH_CUDA
  const kernels::CsrView host = store.csr();
  const int64_t n = host.rows, nnz = host.nnz();
  const bool weights = sampling == sampler::Sampling::kWeighted || block_weights;
  if (weights && host.weights == nullptr)
    throw InputError(store.path().string() + ": the store has no edge weights (graph/weights.npy)");
  std::vector<float> degree;
  if (block_weights) degree = kernels::weighted_in_degree(host);
  const size_t indptr_bytes = static_cast<size_t>(n + 1) * sizeof(int64_t);
  const size_t indices_bytes = static_cast<size_t>(nnz) * sizeof(int32_t);
  const size_t weights_bytes = weights ? static_cast<size_t>(nnz) * sizeof(float) : 0;
  const size_t degree_bytes = degree.size() * sizeof(float);
  s.topology_bytes = indptr_bytes + indices_bytes + weights_bytes + degree_bytes;
  s.on_gpu = s.topology_bytes <= topology_gpu_bytes;
  DeviceContext& ctx = DeviceContext::get(device.ordinal);
  const float* graph_weights = nullptr;
  if (s.on_gpu) {
    s.indptr = kernels::cuda::to_device(ctx.pool(), host.indptr, static_cast<size_t>(n + 1), ctx.stream());
    s.indices = kernels::cuda::to_device(ctx.pool(), host.indices, static_cast<size_t>(nnz), ctx.stream());
    if (weights) {
      s.weights = kernels::cuda::to_device(ctx.pool(), host.weights, static_cast<size_t>(nnz), ctx.stream());
      graph_weights = s.weights.data();
    }
    if (block_weights) {
      s.degree = kernels::cuda::to_device(ctx.pool(), degree, ctx.stream());
      s.full_degree = s.degree.data();
    }
    ctx.synchronize();  // the sampling streams read these; they are not ordered after the compute stream
    s.graph = {n, n, s.indptr.data(), s.indices.data(), graph_weights};
  } else {
    s.pinned = kernels::cuda::PinnedBuffer(s.topology_bytes, nullptr, "the graph's topology in pinned host memory");
    auto* dst = static_cast<unsigned char*>(s.pinned.host());
    // Read the store's pages in parallel.
    auto copy = [](unsigned char* to, const void* from, size_t bytes) {
      constexpr size_t kChunk = size_t{64} << 20;
      const auto* src = static_cast<const unsigned char*>(from);
      tbb::parallel_for(size_t{0}, (bytes + kChunk - 1) / kChunk, [&](size_t c) {
        const size_t off = c * kChunk;
        std::memcpy(to + off, src + off, std::min(kChunk, bytes - off));
      });
    };
    std::memcpy(dst, host.indptr, indptr_bytes);
    copy(dst + indptr_bytes, host.indices, indices_bytes);
    if (weights) copy(dst + indptr_bytes + indices_bytes, host.weights, weights_bytes);
    if (block_weights) std::memcpy(dst + indptr_bytes + indices_bytes + weights_bytes, degree.data(), degree_bytes);
    auto* base = static_cast<unsigned char*>(s.pinned.device());
    if (weights) graph_weights = reinterpret_cast<const float*>(base + indptr_bytes + indices_bytes);
    if (block_weights) s.full_degree = reinterpret_cast<const float*>(base + indptr_bytes + indices_bytes + weights_bytes);
    s.graph = {n, n, reinterpret_cast<const int64_t*>(base), reinterpret_cast<const int32_t*>(base + indptr_bytes),
               graph_weights};
  }
  s.sampler = std::make_unique<sampler::FusedMapSampler>(s.graph, std::move(fanouts), ctx.pool(), sampling, block_weights);
#else
  (void)store, (void)fanouts, (void)topology_gpu_bytes, (void)sampling, (void)block_weights;
  throw DeviceError("this build has no CUDA backend");
#endif
}

GpuBatches::~GpuBatches() = default;

uint64_t GpuBatches::topology_room(const Device& device, uint64_t gpu_mem_budget) {
  return gpu_room(device, gpu_mem_budget) / 4;
}

bool GpuBatches::topology_on_gpu() const { return impl_->on_gpu; }

std::string GpuBatches::describe() const {
  return impl_->on_gpu ? "GPU sampler, topology on the GPU (" + mib(impl_->topology_bytes) + ")"
                       : "GPU sampler, topology in pinned host memory (" + mib(impl_->topology_bytes) + "), read over UVA";
}

GpuBatch GpuBatches::sample(const int64_t* seeds, int64_t n, uint64_t key, bool input_nodes_on_host) const {
  GpuBatch out;
  out.impl_ = std::make_unique<GpuBatch::Impl>();
#if GALE_WITH_CUDA
  Impl& s = *impl_;
  GpuBatch::Impl& b = *out.impl_;
  kernels::cuda::DeviceGuard guard(s.device.ordinal);
  const Impl::StreamLease lease(s);
  kernels::cuda::Stream* stream = lease.stream;
  kernels::cuda::MemoryPool& pool = DeviceContext::get(s.device.ordinal).pool();
  b.num_seeds = n;
  b.seeds = kernels::cuda::DeviceBuffer<int64_t>(pool, static_cast<size_t>(n), *stream);
  kernels::cuda::copy_to_device(b.seeds.data(), seeds, static_cast<size_t>(n), *stream);
  b.sampled = s.sampler->sample(b.seeds.data(), n, key, *stream);
  b.num_input = b.sampled.num_input_nodes();
  b.ready = std::make_unique<kernels::cuda::Event>(s.device.ordinal);
  b.ready->record(*stream);
  if (input_nodes_on_host) {
    b.input_host.resize(static_cast<size_t>(b.num_input));
    kernels::cuda::copy_to_host(b.input_host.data(), b.sampled.input_nodes(), b.input_host.size(), *stream);
    stream->synchronize();
  }
#else
  (void)seeds, (void)n, (void)key, (void)input_nodes_on_host;
#endif
  return out;
}

std::vector<int64_t> GpuBatches::sample_input_nodes(const int64_t* seeds, int64_t n, uint64_t key,
                                                   const int32_t* cache_slot) const {
  std::vector<int64_t> out;
#if GALE_WITH_CUDA
  Impl& s = *impl_;
  kernels::cuda::DeviceGuard guard(s.device.ordinal);
  const Impl::StreamLease lease(s);
  kernels::cuda::Stream* stream = lease.stream;
  kernels::cuda::MemoryPool& pool = DeviceContext::get(s.device.ordinal).pool();
  kernels::cuda::DeviceBuffer<int64_t> seeds_device(pool, static_cast<size_t>(n), *stream);
  kernels::cuda::copy_to_device(seeds_device.data(), seeds, static_cast<size_t>(n), *stream);
  const sampler::DeviceInputNodes inputs = s.sampler->sample_input_nodes(seeds_device.data(), n, key, *stream);
  if (cache_slot == nullptr) {
    out.resize(static_cast<size_t>(inputs.count));
    kernels::cuda::copy_to_host(out.data(), inputs.ids.data(), out.size(), *stream);
  } else if (inputs.count > 0) {
    // The rows the GPU cache lacks, picked on the GPU: a batch's ~160K input ids (R-MAT 25) leave
    // the ~6K the host must find.
    const size_t scratch_bytes = kernels::uncached_ids_scratch_bytes(inputs.count);
    kernels::cuda::DeviceBuffer<unsigned char> scratch(pool, scratch_bytes, *stream);
    kernels::cuda::DeviceBuffer<int64_t> picked(pool, static_cast<size_t>(inputs.count) + 1, *stream);
    int64_t* count = picked.data() + inputs.count;
    kernels::uncached_ids_cuda(cache_slot, inputs.ids.data(), inputs.count, picked.data(), count, scratch.data(),
                               scratch_bytes, *stream);
    int64_t uncached = 0;
    kernels::cuda::copy_to_host(&uncached, count, 1, *stream);
    stream->synchronize();
    out.resize(static_cast<size_t>(uncached));
    kernels::cuda::copy_to_host(out.data(), picked.data(), out.size(), *stream);
  }
  stream->synchronize();
#else
  (void)seeds, (void)n, (void)key, (void)cache_slot;
#endif
  return out;
}

GpuBatch::Operands GpuBatches::operands(GpuBatch& batch, bool edge_map) const {
  if (!batch.impl_) throw InternalError("GpuBatches::operands: the batch was already consumed");
  GpuBatch::Operands o;
#if GALE_WITH_CUDA
  const Impl& s = *impl_;
  GpuBatch::Impl& b = *batch.impl_;
  kernels::cuda::Stream& io = DeviceContext::get(s.device.ordinal).io_stream();
  io.wait(*b.ready);
  for (const sampler::DeviceBlock& block : b.sampled.blocks)
    o.graphs.push_back(GraphOperand::from_device_block(s.device, block.csr(), block.num_edges, block.src_ids.data(),
                                                       s.graph.indptr, edge_map, s.full_degree));
  o.input_nodes = Tensor::empty_io(b.num_input, 1, DType::kI64, s.device);
  kernels::cuda::copy_on_device(o.input_nodes.data<int64_t>(), b.sampled.input_nodes(), static_cast<size_t>(b.num_input), io);
  o.seeds = Tensor::empty_io(b.num_seeds, 1, DType::kI64, s.device);
  kernels::cuda::copy_on_device(o.seeds.data<int64_t>(), b.seeds.data(), static_cast<size_t>(b.num_seeds), io);
  // Free the sampler's buffers on the IO stream, after the copies and kernels above read them.
  for (sampler::DeviceBlock& block : b.sampled.blocks) {
    block.indptr.set_stream(io);
    block.indices.set_stream(io);
    block.src_ids.set_stream(io);
  }
  b.seeds.set_stream(io);
#else
  (void)edge_map;
#endif
  batch.impl_.reset();
  return o;
}

}  // namespace gale::engine
