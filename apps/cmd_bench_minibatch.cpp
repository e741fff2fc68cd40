// `gale bench sample|gather|pipeline`: the mini-batch pipeline's stages timed one at a time, then
// together.
//
//   sample    the neighbour samplers alone: GpuBatches (FastGL's fused-map sampler, its blocks'
//             operands built on the GPU) and the CPU NeighborSampler (its blocks' host operands),
//             per batch, the host waiting for the device after each.
//   gather    BatchFeatures' tiered feature gather alone, for each GPU room for the features and
//             with and without the match, on batches sampled once beforehand.
//   pipeline  engine::train's mini-batch epochs with evaluation off: epoch, sample, IO, compute and
//             wait seconds, host-to-GPU bytes, rows by tier and the GPU peak per epoch.
//
// Batches are the trainer's: the training split (every node when the store has none) shuffled as
// scheduler::EpochPlan does for epoch 0 (then 1, 2, ... when more batches are asked for than an
// epoch has), each keyed derive_key(derive_key(seed, epoch), batch) as engine::train keys them.
// Benchmarks are programs, never assertions on time (shared/STYLE.md).
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "apps/bench_store.hpp"
#include "apps/commands.hpp"
#include "engine/batch_features.hpp"
#include "engine/devices.hpp"
#include "engine/processes.hpp"
#include "engine/gpu_batches.hpp"
#include "engine/graph.hpp"
#include "engine/trainer.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "sampler/neighbor_sampler.hpp"
#include "scheduler/epoch_plan.hpp"
#include "storage/store.hpp"

#if GALE_WITH_CUDA
#include "kernels/cuda/runtime.hpp"
#endif

namespace gale::apps {

namespace po = boost::program_options;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// "gpu,cpu" -> {"gpu", "cpu"}, each checked against `allowed`; throws InputError naming `flag`.
std::vector<std::string> parse_names(const std::string& text, const std::string& flag,
                                     const std::vector<std::string>& allowed) {
  std::vector<std::string> out;
  for (const std::string& name : split_list(text)) {
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      std::string expected;
      for (size_t i = 0; i < allowed.size(); ++i)
        expected += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
      throw InputError(flag + ": expected " + expected + ", found '" + name + "'");
    }
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

// GPU 0, or a DeviceError saying what needed it (`what`) and how to do without (`hint`).
Device require_gpu(const std::string& what, const std::string& hint) {
#if GALE_WITH_CUDA
  try {
    kernels::cuda::require_device(0);
  } catch (const DeviceError& e) {
    throw DeviceError(what + " needs a GPU: " + e.what() + hint);
  }
  return Device::cuda(0);
#else
  throw DeviceError(what + " needs a GPU: this build has no CUDA backend" + hint);
#endif
}

// The trainer's batches, one after another: batch i of the sequence is batch i mod B of epoch
// i / B's plan (B batches per epoch), with the trainer's key.
class BatchSequence {
 public:
  BatchSequence(const storage::Store& store, int64_t batch_size, uint64_t seed) : batch_size_(batch_size), seed_(seed) {
    if (store.has_split("train")) seeds_ = store.split("train");
    from_split_ = !seeds_.empty();
    if (!from_split_) {
      seeds_.resize(static_cast<size_t>(store.num_nodes()));
      std::iota(seeds_.begin(), seeds_.end(), int64_t{0});
    }
    if (seeds_.empty()) throw InputError("the store has no nodes to sample from");
  }

  struct Batch {
    const int64_t* seeds;
    int64_t n;
    uint64_t key;
  };

  Batch operator[](int64_t i) {
    const int64_t per_epoch = (static_cast<int64_t>(seeds_.size()) + batch_size_ - 1) / batch_size_;
    const int64_t epoch = i / per_epoch, b = i % per_epoch;
    if (!plan_ || epoch_ != epoch) {
      plan_.emplace(seeds_, batch_size_, seed_, epoch);
      epoch_ = epoch;
    }
    const uint64_t epoch_key = kernels::derive_key(seed_, static_cast<uint64_t>(epoch));
    return {plan_->batch(b), plan_->batch_length(b), kernels::derive_key(epoch_key, static_cast<uint64_t>(b))};
  }

  // "train split (153431 nodes)" / "all 1024 nodes (no train split)".
  std::string describe() const {
    return from_split_ ? "train split (" + std::to_string(seeds_.size()) + " nodes)"
                       : "all " + std::to_string(seeds_.size()) + " nodes (no train split)";
  }
  int64_t num_seeds() const { return static_cast<int64_t>(seeds_.size()); }

 private:
  std::vector<int64_t> seeds_;
  bool from_split_ = false;
  int64_t batch_size_;
  uint64_t seed_;
  std::optional<scheduler::EpochPlan> plan_;
  int64_t epoch_ = -1;
};

// Keys in the order written (the table's), not sorted.
using Json = nlohmann::ordered_json;

void print_json(const Json& row) {
  std::printf("%s\n", row.dump().c_str());
  std::fflush(stdout);
}

// The flags `gale bench sample` and `gale bench gather` share: which graph, which batches, the
// output format.
struct BatchFlags {
  std::string store_path, generate, fanouts_text = "15,10,5";
  int64_t batch_size = 1024;
  int batches = 50, warmup = 5;
  uint64_t seed = 0;
  bool json = false;

  // `per`: what --batches counts per ("sampler", "setting"); `json_help`: what a JSON row is.
  void add_to(po::options_description& desc, const std::string& per, const std::string& json_help) {
    desc.add_options()
        ("help,h", "show this help")
        ("store", po::value(&store_path), "store directory")
        ("generate", po::value(&generate), "build this generated graph in a temporary store (deleted after)")
        ("fanouts", po::value(&fanouts_text), "neighbours per hop, seeds' hop first (default 15,10,5)")
        ("batch-size", po::value(&batch_size), "training seeds per batch (default 1024)")
        ("batches", po::value(&batches), ("timed batches per " + per + " (default 50)").c_str())
        ("warmup", po::value(&warmup), "untimed batches first (default 5)")
        ("seed", po::value(&seed), "shuffling and sampling seed (default 0)")
        ("json", po::bool_switch(&json), json_help.c_str());
  }
};

// --fanouts, then --batch-size, --batches and --warmup: the checks sample and gather share, in
// that order. Returns the fanouts.
std::vector<int> check_batch_flags(const BatchFlags& f) {
  std::vector<int> fanouts = parse_fanouts(f.fanouts_text);
  if (f.batch_size < 1) throw InputError("--batch-size: expected at least 1, found " + std::to_string(f.batch_size));
  if (f.batches < 1) throw InputError("--batches: expected at least 1, found " + std::to_string(f.batches));
  if (f.warmup < 0) throw InputError("--warmup: expected 0 or more, found " + std::to_string(f.warmup));
  return fanouts;
}

// The store flags checked (BenchStore::check), then GPU 0 when `gpu_what` names what needs it (the
// CPU when it is empty): in that order, so that a bad --generate spec is reported as such on a
// machine without a GPU.
Device check_store_and_gpu(const BatchFlags& f, const std::string& bench, const std::string& gpu_what,
                           const std::string& hint) {
  BenchStore::check(f.store_path, f.generate, bench);
  return gpu_what.empty() ? Device::cpu() : require_gpu(gpu_what, hint);
}

// What sample and gather time on: the graph (`label` as printed), the trainer's batches over it and
// the GPU (the CPU when sample runs none of its GPU samplers).
struct BenchGraph {
  const std::string& label;
  const storage::Store& store;
  BatchSequence& sequence;
  Device gpu;
};

// The edges of a batch's blocks, summed.
int64_t total_nnz(const std::vector<engine::GraphOperand>& graphs) {
  int64_t nnz = 0;
  for (const engine::GraphOperand& g : graphs) nnz += g.nnz();
  return nnz;
}

// ---------------------------------------------------------------------------------------------
// gale bench sample

// `gale bench sample`'s flags: the batch flags, then which samplers run and how they draw.
struct SampleFlags : BatchFlags {
  std::string samplers_text = "gpu,cpu", topology = "auto", sampling_text = "uniform";
  int concurrent = 8;
};

// The options of `gale bench sample`, bound to `f`.
po::options_description describe_sample_flags(SampleFlags* f) {
  po::options_description desc(
      "usage: gale bench sample STORE|--generate SPEC [options]\n\n"
      "Times the neighbour samplers per mini-batch of training seeds: the GPU fused-map sampler\n"
      "(sampling and building the blocks' operands on GPU 0, waiting for the device after each batch)\n"
      "and the CPU sampler (sampling and building the blocks' host operands). Median ms per batch\n"
      "after --warmup batches, sampled edges and input nodes per batch, million edges per second.\n"
      "The read-ahead's two ways of learning a batch's input nodes on the GPU, --concurrent batches at\n"
      "once from as many threads (ms per batch = a round's wall time / its batches): gpu-blocks samples\n"
      "the blocks and copies the input nodes to the host; gpu-inputs samples the input nodes alone\n"
      "(GpuBatches::sample_input_nodes, no GPU cache to leave out).\n\n"
      "options");
  f->add_to(desc, "sampler", "one JSON object per sampler instead of the table");
  desc.add_options()
      ("samplers", po::value(&f->samplers_text), "comma separated, from gpu, gpu-blocks, gpu-inputs, cpu (default gpu,cpu)")
      ("concurrent", po::value(&f->concurrent), "batches at once for gpu-blocks and gpu-inputs (default 8, the read-ahead's)")
      ("topology", po::value(&f->topology),
       "GPU sampler's graph: gpu (in GPU memory) | host (pinned host memory, read over UVA) | "
       "auto (on the GPU when it fits a quarter of 90% of its memory, as training decides; default)")
      ("neighbor-sampling", po::value(&f->sampling_text),
       "uniform (default) | weighted (in proportion to the store's edge weights, as gale train's flag)");
  return desc;
}

// What the sample flags ask for, once checked.
struct SamplePlan {
  std::vector<int> fanouts;
  std::vector<std::string> samplers;
  sampler::Sampling sampling = sampler::Sampling::kUniform;
  bool with_gpu = false;  // a sampler other than cpu runs: GPU 0 is needed
};

// Checks the sample flags (an InputError naming the first bad one) and turns them into a SamplePlan.
SamplePlan check_sample_flags(const SampleFlags& f) {
  SamplePlan p;
  p.fanouts = check_batch_flags(f);
  p.samplers = parse_names(f.samplers_text, "--samplers", {"gpu", "gpu-blocks", "gpu-inputs", "cpu"});
  if (f.concurrent < 1) throw InputError("--concurrent: expected at least 1, found " + std::to_string(f.concurrent));
  if (f.sampling_text != "uniform" && f.sampling_text != "weighted")
    throw InputError("--neighbor-sampling: expected uniform or weighted, found '" + f.sampling_text + "'");
  p.sampling = f.sampling_text == "weighted" ? sampler::Sampling::kWeighted : sampler::Sampling::kUniform;
  if (f.topology != "gpu" && f.topology != "host" && f.topology != "auto")
    throw InputError("--topology: expected gpu, host or auto, found '" + f.topology + "'");
  p.with_gpu = std::any_of(p.samplers.begin(), p.samplers.end(), [](const std::string& n) { return n != "cpu"; });
  return p;
}

// One sampler's measurements over the timed batches: ms, sampled edges (none for the read-ahead's
// ways, which build no blocks' operands) and input nodes per batch; the device and where its graph
// lives.
struct SamplerTimes {
  std::string name, device = "cpu", where;
  std::vector<double> times, edges, inputs;
};

// The read-ahead's ways (gpu-blocks, gpu-inputs), a round of --concurrent batches at a time from as
// many threads; each batch of a round counts the round's wall time over its batches.
void time_read_ahead(const SampleFlags& f, const BenchGraph& g, const engine::GpuBatches& gpu_sampler,
                     SamplerTimes* t) {
  const std::string& name = t->name;
  const int total = f.warmup + f.batches;
  for (int i = 0; i < total; i += f.concurrent) {
    const int n = std::min(f.concurrent, total - i);
    std::vector<int64_t> counts(static_cast<size_t>(n)), keys(static_cast<size_t>(n));
    std::vector<std::vector<int64_t>> seeds(static_cast<size_t>(n));  // sequence[] reuses its plan
    for (int j = 0; j < n; ++j) {
      const BatchSequence::Batch b = g.sequence[i + j];
      seeds[static_cast<size_t>(j)].assign(b.seeds, b.seeds + b.n);
      keys[static_cast<size_t>(j)] = static_cast<int64_t>(b.key);
    }
    const auto t0 = Clock::now();
    tbb::parallel_for(0, n, [&](int j) {
      const std::vector<int64_t>& b = seeds[static_cast<size_t>(j)];
      const auto key = static_cast<uint64_t>(keys[static_cast<size_t>(j)]);
      const auto len = static_cast<int64_t>(b.size());
      counts[static_cast<size_t>(j)] =
          name == "gpu-inputs"
              ? static_cast<int64_t>(gpu_sampler.sample_input_nodes(b.data(), len, key, nullptr).size())
              : static_cast<int64_t>(
                    gpu_sampler.sample(b.data(), len, key, /*input_nodes_on_host=*/true).input_nodes_host().size());
    });
    const double ms = ms_since(t0) / n;
    for (int j = 0; j < n; ++j) {
      if (i + j < f.warmup) continue;
      t->times.push_back(ms);
      t->inputs.push_back(static_cast<double>(counts[static_cast<size_t>(j)]));
    }
  }
}

// The gpu sampler, batch by batch: the blocks sampled and their operands built on the GPU, the
// host waiting for the device after each.
void time_gpu_sampler(const BatchFlags& f, const BenchGraph& g, const engine::GpuBatches& gpu_sampler,
                      SamplerTimes* t) {
  const int total = f.warmup + f.batches;
  for (int i = 0; i < total; ++i) {
    const BatchSequence::Batch b = g.sequence[i];
    const auto t0 = Clock::now();
    engine::GpuBatch batch = gpu_sampler.sample(b.seeds, b.n, b.key, /*input_nodes_on_host=*/false);
    const engine::GpuBatch::Operands ops = gpu_sampler.operands(batch, /*edge_map=*/false);
    engine::synchronize(g.gpu);
    const double ms = ms_since(t0);
    if (i < f.warmup) continue;
    t->times.push_back(ms);
    t->edges.push_back(static_cast<double>(total_nnz(ops.graphs)));
    t->inputs.push_back(static_cast<double>(ops.input_nodes.rows()));
  }
}

// The CPU sampler, batch by batch: the blocks sampled and their host operands built.
void time_cpu_sampler(const BatchFlags& f, const SamplePlan& p, const BenchGraph& g, SamplerTimes* t) {
  const sampler::NeighborSampler cpu_sampler(g.store.csr(), p.fanouts, p.sampling);
  const int total = f.warmup + f.batches;
  for (int i = 0; i < total; ++i) {
    const BatchSequence::Batch b = g.sequence[i];
    const auto t0 = Clock::now();
    const sampler::SampledBatch batch = cpu_sampler.sample(b.seeds, b.n, b.key);
    std::vector<engine::GraphOperand> graphs;
    graphs.reserve(batch.blocks.size());
    for (const sampler::Block& block : batch.blocks)
      graphs.emplace_back(block.csr(), block.src_ids.data(), g.store.indptr());
    const double ms = ms_since(t0);
    if (i < f.warmup) continue;
    t->times.push_back(ms);
    t->edges.push_back(static_cast<double>(total_nnz(graphs)));
    t->inputs.push_back(static_cast<double>(batch.input_nodes().size()));
  }
}

// Times the sampler `name` over --warmup, then --batches batches (the GPU's built for it here).
SamplerTimes time_sampler(const SampleFlags& f, const SamplePlan& p, const BenchGraph& g, const std::string& name) {
  SamplerTimes t;
  t.name = name;
  if (name == "cpu") {
    t.where = "host memory";
    time_cpu_sampler(f, p, g, &t);
    return t;
  }
  t.device = engine::device_name(g.gpu);
  const uint64_t topology_bytes = f.topology == "gpu"    ? std::numeric_limits<uint64_t>::max()
                                  : f.topology == "host" ? 0
                                                         : engine::GpuBatches::topology_room(g.gpu, 0);
  const engine::GpuBatches gpu_sampler(g.store, g.gpu, p.fanouts, topology_bytes, p.sampling);
  t.where = gpu_sampler.describe();
  if (name == "gpu") time_gpu_sampler(f, g, gpu_sampler, &t);
  else time_read_ahead(f, g, gpu_sampler, &t);
  return t;
}

// The table's header: the device, the graph, the batches and the column names.
void print_sample_header(const SampleFlags& f, const SamplePlan& p, const BenchGraph& g) {
  std::printf("device: %s\ngraph: %s, %lld nodes, %lld edges\n",
              p.with_gpu ? engine::device_name(g.gpu).c_str() : "cpu", g.label.c_str(),
              static_cast<long long>(g.store.num_nodes()), static_cast<long long>(g.store.num_edges()));
  std::printf("seeds: %s, batch size %lld, fanouts %s, %s draws; median of %d batches after %d warm-up\n",
              g.sequence.describe().c_str(), static_cast<long long>(f.batch_size), f.fanouts_text.c_str(),
              f.sampling_text.c_str(), f.batches, f.warmup);
  std::printf("%-10s %10s %13s %13s %10s  %s\n", "sampler", "ms/batch", "edges/batch", "inputs/batch", "Medges/s",
              "topology");
}

// One sampler's result: a JSON object with --json, else a row of the table.
void print_sample_row(const SampleFlags& f, const SamplePlan& p, const BenchGraph& g, const SamplerTimes& t) {
  const double ms = median(t.times);
  const double medges = ms > 0 ? mean(t.edges) / (ms * 1e3) : 0.0;
  if (f.json) {
    print_json({{"bench", "sample"}, {"device", t.device}, {"graph", g.label}, {"nodes", g.store.num_nodes()},
                {"edges", g.store.num_edges()}, {"sampler", t.name}, {"topology", t.where},
                {"fanouts", p.fanouts}, {"sampling", f.sampling_text}, {"batch_size", f.batch_size},
                {"seeds", g.sequence.num_seeds()},
                {"batches", f.batches}, {"warmup", f.warmup}, {"ms_per_batch", ms},
                {"edges_per_batch", mean(t.edges)}, {"input_nodes_per_batch", mean(t.inputs)},
                {"medges_per_s", medges}});
  } else {
    std::printf("%-10s %10.3f %13.0f %13.0f %10.1f  %s\n", t.name.c_str(), ms, mean(t.edges), mean(t.inputs), medges,
                t.where.c_str());
    std::fflush(stdout);
  }
}

// `gale bench sample`: each sampler timed, then its row printed.
int bench_sample(const std::vector<std::string>& args) {
  SampleFlags f;
  const po::options_description desc = describe_sample_flags(&f);
  po::variables_map vm;
  if (!parse_store_command_line(args, desc, &vm)) return 0;
  const SamplePlan p = check_sample_flags(f);
  const Device gpu = check_store_and_gpu(f, "bench sample", p.with_gpu ? "bench sample: the gpu sampler" : "",
                                         "; --samplers cpu runs without one");

  const BenchStore source(f.store_path, f.generate, "bench sample");
  const storage::Store store = storage::Store::open(source.path());
  if (p.sampling == sampler::Sampling::kWeighted && store.weights() == nullptr)
    throw InputError("--neighbor-sampling weighted: " + source.label() + " has no edge weights (graph/weights.npy; "
                     "--generate takes weights=uniform)");
  BatchSequence sequence(store, f.batch_size, f.seed);
  const BenchGraph g{source.label(), store, sequence, gpu};
  if (!f.json) print_sample_header(f, p, g);
  for (const std::string& name : p.samplers) print_sample_row(f, p, g, time_sampler(f, p, g, name));
  return 0;
}

// ---------------------------------------------------------------------------------------------
// gale bench gather

// `gale bench gather`'s flags: the batch flags, then the settings to time.
struct GatherFlags : BatchFlags {
  std::string sizes_text = "all", match_text = "on,off";
};

// The options of `gale bench gather`, bound to `f`.
po::options_description describe_gather_flags(GatherFlags* f) {
  po::options_description desc(
      "usage: gale bench gather STORE|--generate SPEC [options]\n\n"
      "Times the tiered feature gather of mini-batches on GPU 0 (engine/batch_features.hpp): the batches\n"
      "are sampled once on the GPU, then for each room for the features on the GPU and each match\n"
      "setting every batch's input features are gathered (the host waiting for the device after each).\n"
      "Median ms per batch after --warmup batches, GB/s of delivered feature bytes, host-to-GPU GB\n"
      "per batch and rows per batch by tier (previous batch, GPU-resident, GPU cache, pinned host).\n\n"
      "options");
  f->add_to(desc, "setting", "one JSON object per setting instead of the table");
  desc.add_options()
      ("feature-gpu-mem", po::value(&f->sizes_text),
       "room for features on the GPU, comma separated sizes such as all,256M,1M (default all); "
       "less than all keeps a cache of hot nodes there and every row in pinned host memory")
      ("match", po::value(&f->match_text), "reuse the previous batch's rows on the GPU: comma separated on, off "
                                           "(default on,off)");
  return desc;
}

// What the gather flags ask for, once checked.
struct GatherPlan {
  std::vector<int> fanouts;
  // Each room as the user wrote it ("all" is resolved once the store is open).
  std::vector<std::pair<std::string, std::optional<uint64_t>>> rooms;
  std::vector<bool> matches;
};

// Checks the gather flags (an InputError naming the first bad one) and turns them into a GatherPlan.
GatherPlan check_gather_flags(const GatherFlags& f) {
  GatherPlan p;
  p.fanouts = check_batch_flags(f);
  for (const std::string& item : split_list(f.sizes_text)) {
    if (item == "all") p.rooms.emplace_back(item, std::nullopt);
    else p.rooms.emplace_back(item, parse_size(item, "--feature-gpu-mem"));
  }
  for (const std::string& m : parse_names(f.match_text, "--match", {"on", "off"})) p.matches.push_back(m == "on");
  return p;
}

// Every batch's input nodes on the GPU, and where the sampler's graph lived.
struct SampledInputs {
  std::vector<engine::Tensor> inputs;
  std::string topology;
};

// The --warmup and --batches batches' input nodes, sampled once (the operands built, then only the
// ids kept).
SampledInputs sample_inputs(const BatchFlags& f, const GatherPlan& p, const BenchGraph& g) {
  SampledInputs s;
  const engine::GpuBatches gpu_sampler(g.store, g.gpu, p.fanouts, engine::GpuBatches::topology_room(g.gpu, 0));
  s.topology = gpu_sampler.describe();
  const int total = f.warmup + f.batches;
  for (int i = 0; i < total; ++i) {
    const BatchSequence::Batch b = g.sequence[i];
    engine::GpuBatch batch = gpu_sampler.sample(b.seeds, b.n, b.key, /*input_nodes_on_host=*/false);
    s.inputs.push_back(gpu_sampler.operands(batch, /*edge_map=*/false).input_nodes);
  }
  engine::synchronize(g.gpu);
  return s;
}

// One setting: the room for the features on the GPU (as written, and in bytes) and the match.
struct GatherSetting {
  std::string room_text;
  uint64_t gpu_bytes;
  bool match;
};

// One setting's measurements over the timed batches, and where its features were placed.
struct GatherTimes {
  double ms = 0;  // median per batch
  engine::FeatureLoadStats stats;
  std::string placement;
};

// Gathers every batch's input features through `features`, the host waiting for the device after
// each; the warm-up batches are left out of the times and the stats.
GatherTimes time_gather(const BatchFlags& f, const Device& gpu, const std::vector<engine::Tensor>& inputs,
                        engine::BatchFeatures* features) {
  std::vector<double> times;
  const int total = f.warmup + f.batches;
  for (int i = 0; i < total; ++i) {
    if (i == f.warmup) features->take_stats();  // count the timed f.batches only
    const auto t0 = Clock::now();
    const engine::Tensor x = features->load_async(inputs[static_cast<size_t>(i)]).take();
    engine::synchronize(gpu);
    const double ms = ms_since(t0);
    if (i >= f.warmup) times.push_back(ms);
  }
  GatherTimes t;
  t.stats = features->take_stats();
  t.ms = median(times);
  t.placement = features->describe();
  return t;
}

// The table's header: the device, the graph and its features, the batches and the column names.
void print_gather_header(const GatherFlags& f, const BenchGraph& g, const std::string& topology, uint64_t all_bytes) {
  std::printf("device: %s\ngraph: %s, %lld nodes, %lld edges, %lld features (%.2f GiB)\n",
              engine::device_name(g.gpu).c_str(), g.label.c_str(), static_cast<long long>(g.store.num_nodes()),
              static_cast<long long>(g.store.num_edges()), static_cast<long long>(g.store.feature_dim()),
              static_cast<double>(all_bytes) / static_cast<double>(1ULL << 30));
  std::printf("seeds: %s, batch size %lld, fanouts %s, sampled on the GPU (%s); median of %d batches after %d "
              "warm-up\n",
              g.sequence.describe().c_str(), static_cast<long long>(f.batch_size), f.fanouts_text.c_str(),
              topology.c_str(), f.batches, f.warmup);
  std::printf("rows per batch by tier: previous batch, GPU-resident, GPU cache, pinned host\n");
  std::printf("%-11s %-5s %10s %9s %12s %10s %10s %10s %10s  %s\n", "feature_gpu", "match", "ms/batch", "GB/s",
              "h2d_GB/batch", "rows_prev", "rows_dev", "rows_cache", "rows_host", "placement");
}

// One setting's result: a JSON object with --json, else a row of the table.
void print_gather_row(const GatherFlags& f, const GatherPlan& p, const BenchGraph& g, const GatherSetting& setting,
                      const GatherTimes& t) {
  const engine::FeatureLoadStats& s = t.stats;
  const double per_batch = 1.0 / f.batches;
  const double ms = t.ms;
  const double delivered = static_cast<double>(s.rows) * static_cast<double>(s.row_bytes) * per_batch;
  const double gbps = ms > 0 ? delivered / (ms * 1e6) : 0.0;
  const double h2d_gb = static_cast<double>(s.host_to_gpu_bytes()) * per_batch / 1e9;
  if (f.json) {
    print_json({{"bench", "gather"}, {"device", engine::device_name(g.gpu)}, {"graph", g.label},
                {"nodes", g.store.num_nodes()}, {"feature_dim", g.store.feature_dim()},
                {"feature_gpu_mem", setting.room_text}, {"feature_gpu_bytes", setting.gpu_bytes},
                {"match", setting.match}, {"placement", t.placement}, {"fanouts", p.fanouts},
                {"batch_size", f.batch_size}, {"batches", f.batches}, {"warmup", f.warmup}, {"ms_per_batch", ms},
                {"gbps", gbps}, {"host_to_gpu_gb_per_batch", h2d_gb},
                {"rows_per_batch", static_cast<double>(s.rows) * per_batch},
                {"rows_previous_per_batch", static_cast<double>(s.previous) * per_batch},
                {"rows_device_per_batch", static_cast<double>(s.device) * per_batch},
                {"rows_cache_per_batch", static_cast<double>(s.cache) * per_batch},
                {"rows_host_per_batch", static_cast<double>(s.host) * per_batch}});
  } else {
    std::printf("%-11s %-5s %10.3f %9.1f %12.4f %10.0f %10.0f %10.0f %10.0f  %s\n", setting.room_text.c_str(),
                setting.match ? "on" : "off", ms, gbps, h2d_gb, static_cast<double>(s.previous) * per_batch,
                static_cast<double>(s.device) * per_batch, static_cast<double>(s.cache) * per_batch,
                static_cast<double>(s.host) * per_batch, t.placement.c_str());
    std::fflush(stdout);
  }
}

// `gale bench gather`: each setting's BatchFeatures lives until its row is printed.
int bench_gather(const std::vector<std::string>& args) {
  GatherFlags f;
  const po::options_description desc = describe_gather_flags(&f);
  po::variables_map vm;
  if (!parse_store_command_line(args, desc, &vm)) return 0;
  const GatherPlan p = check_gather_flags(f);
  const Device gpu = check_store_and_gpu(f, "bench gather", "bench gather", "");

  const BenchStore source(f.store_path, f.generate, "bench gather");
  const storage::Store store = storage::Store::open(source.path());
  if (!store.has_features())
    throw InputError(source.path() + ": the store has no features.npy; bench gather needs them");
  const int64_t row_bytes = store.feature_dim() * static_cast<int64_t>(sizeof(float));
  const uint64_t all_bytes = static_cast<uint64_t>(store.num_nodes()) * static_cast<uint64_t>(row_bytes);
  BatchSequence sequence(store, f.batch_size, f.seed);
  const BenchGraph g{source.label(), store, sequence, gpu};
  const SampledInputs sampled = sample_inputs(f, p, g);

  if (!f.json) print_gather_header(f, g, sampled.topology, all_bytes);
  for (const auto& [room_text, room] : p.rooms) {
    const uint64_t gpu_bytes = room ? *room : all_bytes;
    for (const bool match : p.matches) {
      engine::BatchFeatures features(store, gpu, gpu_bytes, match);
      const GatherTimes t = time_gather(f, gpu, sampled.inputs, &features);
      print_gather_row(f, p, g, {room_text, gpu_bytes, match}, t);
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// gale bench pipeline

// `gale bench pipeline`'s flags as given (the ones that map straight onto a TrainOptions field are
// bound to `o` itself), before they become the run's options.
struct PipelineFlags {
  engine::TrainOptions o;
  std::string store_path, generate, model = "sage", fanouts_text = "15,10,5", device_text = "auto", budget,
      feature_gpu, sampler_text = "auto", spmm = "auto", gpus_text;
  int layers = 3, heads = 4, epochs = 3, warmup = 1, cpu_workers = 0;
  int64_t hidden = 256;
  bool json = false, no_match = false;
};

// The options of `gale bench pipeline`, bound to `f`.
po::options_description describe_pipeline_flags(PipelineFlags* f) {
  engine::TrainOptions& o = f->o;
  po::options_description desc(
      "usage: gale bench pipeline STORE|--generate SPEC [options]\n\n"
      "Times mini-batch training epochs end to end (engine::train: sampling, feature gather, forward,\n"
      "backward, Adam at lr 0.003; no dropout, no evaluation): per epoch after --warmup epochs and\n"
      "their median, wall seconds and the seconds of each stage (sampling summed over batches, GPU\n"
      "IO-stream time, compute, compute waiting for a batch), host-to-GPU GB, feature rows by tier\n"
      "and the peak GPU memory.\n\n"
      "options");
  desc.add_options()
      ("help,h", "show this help")
      ("store", po::value(&f->store_path), "store directory")
      ("generate", po::value(&f->generate), "build this generated graph in a temporary store (deleted after)")
      ("model", po::value(&f->model), "gcn | sage | gin | gat (default sage)")
      ("layers", po::value(&f->layers), "GNN layers, one per fanout (default 3)")
      ("hidden", po::value(&f->hidden), "hidden width; GAT: per head (default 256)")
      ("heads", po::value(&f->heads), "GAT heads in hidden layers (default 4)")
      ("fanouts", po::value(&f->fanouts_text), "neighbours per hop, seeds' hop first (default 15,10,5)")
      ("batch-size", po::value(&o.batch_size), "training seeds per batch (default 1024)")
      ("epochs", po::value(&f->epochs), "timed epochs (default 3)")
      ("warmup", po::value(&f->warmup), "untimed epochs first (default 1)")
      ("device", po::value(&f->device_text), "cpu | cuda | cuda:N | auto (default)")
      ("gpus", po::value(&f->gpus_text), "data-parallel on these GPUs, one worker each: all | 0,1,... (--batch-size per GPU)")
      ("workers", po::value(&f->cpu_workers), "data-parallel CPU workers (--device cpu)")
      ("gpu-mem-budget", po::value(&f->budget), "cap on the GPU memory Gale allocates, e.g. 8G")
      ("feature-gpu-mem", po::value(&f->feature_gpu), "room for features on the GPU, e.g. 2G (default: half the budget)")
      ("reorder-window", po::value(&o.reorder_window), "reorder each window of this many batches for reuse (0: off)")
      ("prefetch", po::value(&o.prefetch), "mini-batches prepared ahead per worker (default 2; 8 when a GPU's "
                                           "batches are staged from disk)")
      ("no-match", po::bool_switch(&f->no_match), "do not reuse the previous batch's features on the GPU")
      ("sampler", po::value(&f->sampler_text), "auto (the GPU's when training there) | gpu | cpu")
      ("spmm", po::value(&f->spmm), "GPU aggregation kernel: auto | fused-gar | fused-gas | memory-aware")
      ("tf32", po::bool_switch(&o.exec.tf32), "GEMMs on TF32 tensor cores")
      ("seed", po::value(&o.seed), "initialisation, sampling and shuffling seed (default 0)")
      ("json", po::bool_switch(&f->json), "one JSON object per timed epoch and one for the median instead of the table");
  return desc;
}

// The model's shape, the fanouts and the run's counts checked (the fanouts parsed into `o`).
void check_pipeline_shape(const PipelineFlags& f, const po::variables_map& vm, engine::TrainOptions* o) {
  if (f.model != "gcn" && f.model != "sage" && f.model != "gin" && f.model != "gat")
    throw InputError("--model: expected gcn, sage, gin or gat, found '" + f.model + "'");
  if (f.layers < 1) throw InputError("--layers: expected at least 1, found " + std::to_string(f.layers));
  if (f.hidden < 1) throw InputError("--hidden: expected at least 1, found " + std::to_string(f.hidden));
  if (f.heads < 1) throw InputError("--heads: expected at least 1, found " + std::to_string(f.heads));
  o->fanouts = parse_fanouts(f.fanouts_text);
  if (static_cast<int>(o->fanouts.size()) != f.layers)
    throw InputError("--fanouts: expected one fanout per layer (" + std::to_string(f.layers) + "), found '" +
                     f.fanouts_text + "'");
  if (o->batch_size < 1) throw InputError("--batch-size: expected at least 1, found " + std::to_string(o->batch_size));
  if (f.epochs < 1) throw InputError("--epochs: expected at least 1, found " + std::to_string(f.epochs));
  if (f.warmup < 0) throw InputError("--warmup: expected 0 or more, found " + std::to_string(f.warmup));
  if (vm.count("prefetch") && o->prefetch < 1)
    throw InputError("--prefetch: expected at least 1, found " + std::to_string(o->prefetch));
  if (o->reorder_window < 0) throw InputError("--reorder-window: expected 0 (off) or more");
}

// Where the run trains and what it may use there: devices and workers, then the store flags
// (BenchStore::check) before the device is required, then the memory budgets, the sampler and the
// aggregation kernel.
void apply_pipeline_placement(const PipelineFlags& f, const po::variables_map& vm, engine::TrainOptions* o) {
  if (asks_for_several_gpus(f.gpus_text, "")) engine::load_kernels_eagerly();  // as train does
  o->device = parse_device(f.device_text);
  o->devices = parse_workers(f.gpus_text, f.cpu_workers, vm.count("workers") > 0, vm.count("device") > 0, &o->device);
  BenchStore::check(f.store_path, f.generate, "bench pipeline");
  engine::require(o->device);
  if (!f.budget.empty()) {
    o->gpu_mem_budget = parse_size(f.budget, "--gpu-mem-budget");
    if (o->gpu_mem_budget == 0) throw InputError("--gpu-mem-budget: expected a positive size such as 8G");
    o->gpu_mem_budget_text = f.budget;
  }
  if (!f.feature_gpu.empty()) {
    o->feature_gpu_bytes = parse_size(f.feature_gpu, "--feature-gpu-mem");
    if (o->feature_gpu_bytes == 0) throw InputError("--feature-gpu-mem: expected a positive size such as 2G");
  }
  if (f.sampler_text == "gpu" || f.sampler_text == "cpu") {
    o->gpu_sampler = f.sampler_text == "gpu";
    if (o->gpu_sampler && o->device.is_cpu())
      throw InputError("--sampler gpu: needs --device cuda (training on the CPU)");
  } else if (f.sampler_text != "auto") {
    throw InputError("--sampler: expected auto, gpu or cpu, found '" + f.sampler_text + "'");
  }
  o->exec.spmm = parse_spmm_kind(f.spmm);
}

// What the benchmark fixes: the model without dropout, Adam at lr 0.003, mini-batch epochs (the
// warm-up's, then the timed ones) and no evaluation.
void set_pipeline_run(const PipelineFlags& f, engine::TrainOptions* o) {
  o->match = !f.no_match;
  o->model.model = f.model;
  o->model.layers = f.layers;
  o->model.hidden = f.hidden;
  o->model.heads = f.heads;
  o->model.dropout = 0.0f;
  o->model.attn_dropout = 0.0f;
  o->model.activation = f.model == "gat" ? engine::Activation::kElu : engine::Activation::kRelu;
  o->full_graph = false;
  o->lr = 0.003f;
  o->epochs = f.warmup + f.epochs;
  o->eval = engine::TrainOptions::Eval::kNone;
}

// What every row says of the run besides its metrics.
struct PipelineLabels {
  std::string device;  // the device, "xN" for N workers, and the processes under mpirun
  std::string graph;
  const char* sampler;
};

// The run's labels, from its options once the store is in place.
PipelineLabels pipeline_labels(const engine::TrainOptions& o, const BenchStore& source) {
  const engine::Processes& procs = engine::Processes::get();
  const std::string device = engine::device_name(o.device) +
                             (o.devices.size() > 1 ? " x" + std::to_string(o.devices.size()) : "") +
                             (procs.distributed() ? ", " + std::to_string(procs.size()) + " processes" : "");
  return {device, source.label(), o.device.is_cpu() || !o.gpu_sampler ? "cpu" : "gpu"};
}

// The table's header: the device, the graph, the run's settings and the column names.
void print_pipeline_header(const PipelineFlags& f, const PipelineLabels& l) {
  const engine::TrainOptions& o = f.o;
  std::printf("device: %s\ngraph: %s\n", l.device.c_str(), l.graph.c_str());
  std::printf("%s, %d layers, hidden %lld, fanouts %s, batch size %lld, %s sampler, match %s, reorder window %d, "
              "prefetch %s, %s; %d epochs after %d warm-up\n",
              f.model.c_str(), f.layers, static_cast<long long>(f.hidden), f.fanouts_text.c_str(),
              static_cast<long long>(o.batch_size), l.sampler, o.match ? "on" : "off", o.reorder_window,
              o.prefetch > 0 ? std::to_string(o.prefetch).c_str() : "auto", o.exec.tf32 ? "tf32" : "fp32", f.epochs,
              f.warmup);
  std::printf("feature rows by tier: previous batch, GPU-resident, GPU cache, pinned host\n");
  std::printf("%-6s %7s %8s %8s %8s %9s %8s %8s %11s %11s %11s %11s %8s\n", "epoch", "batches", "epoch_s", "sample_s",
              "io_s", "compute_s", "wait_s", "h2d_GB", "rows_prev", "rows_device", "rows_cache", "rows_host",
              "peak_GiB");
}

// One epoch's row, a JSON object with --json: `epoch` is 1-based among the timed epochs, or 0 for
// the median row.
void print_epoch_row(const PipelineFlags& f, const PipelineLabels& l, int64_t epoch, const engine::EpochMetrics& m) {
  const engine::TrainOptions& o = f.o;
  const double h2d_gb = static_cast<double>(m.host_to_gpu_bytes) / 1e9;
  const double peak_gib = static_cast<double>(m.gpu_peak_bytes) / static_cast<double>(1ULL << 30);
  if (f.json) {
    Json row = {{"bench", "pipeline"}, {"device", l.device}, {"graph", l.graph}, {"model", f.model},
                {"layers", f.layers}, {"hidden", f.hidden}, {"fanouts", o.fanouts},
                {"batch_size", o.batch_size}, {"sampler", l.sampler}, {"match", o.match},
                {"reorder_window", o.reorder_window}, {"prefetch", o.prefetch}, {"tf32", o.exec.tf32},
                {"batches", m.batches}, {"epoch_s", m.epoch_s},
                {"sample_s", m.sample_s}, {"io_s", m.io_s}, {"compute_s", m.compute_s},
                {"wait_s", m.wait_s}, {"host_to_gpu_gb", h2d_gb}, {"feature_rows", m.feature_rows},
                {"rows_previous", m.rows_previous}, {"rows_device", m.rows_device},
                {"rows_cache", m.rows_cache}, {"rows_host", m.rows_host}, {"peak_gib", peak_gib},
                {"loss", m.loss}};
    if (epoch > 0) row["epoch"] = epoch;
    else row.update({{"median", true}, {"epochs", f.epochs}, {"warmup", f.warmup}});
    print_json(row);
  } else {
    std::printf("%-6s %7lld %8.3f %8.3f %8.3f %9.3f %8.3f %8.3f %11lld %11lld %11lld %11lld %8.2f\n",
                epoch > 0 ? std::to_string(epoch).c_str() : "median",
                static_cast<long long>(m.batches), m.epoch_s, m.sample_s, m.io_s, m.compute_s, m.wait_s, h2d_gb,
                static_cast<long long>(m.rows_previous), static_cast<long long>(m.rows_device),
                static_cast<long long>(m.rows_cache), static_cast<long long>(m.rows_host), peak_gib);
    std::fflush(stdout);
  }
}

// The median of each column on its own (not one epoch's row).
engine::EpochMetrics median_epoch(const std::vector<engine::EpochMetrics>& timed) {
  const auto column = [&](auto get) {
    std::vector<double> v;
    for (const engine::EpochMetrics& m : timed) v.push_back(static_cast<double>(get(m)));
    return median(v);
  };
  engine::EpochMetrics med;
  med.batches = static_cast<int64_t>(column([](const auto& m) { return m.batches; }));
  med.epoch_s = column([](const auto& m) { return m.epoch_s; });
  med.sample_s = column([](const auto& m) { return m.sample_s; });
  med.io_s = column([](const auto& m) { return m.io_s; });
  med.compute_s = column([](const auto& m) { return m.compute_s; });
  med.wait_s = column([](const auto& m) { return m.wait_s; });
  med.loss = column([](const auto& m) { return m.loss; });
  med.host_to_gpu_bytes = static_cast<int64_t>(column([](const auto& m) { return m.host_to_gpu_bytes; }));
  med.feature_rows = static_cast<int64_t>(column([](const auto& m) { return m.feature_rows; }));
  med.rows_previous = static_cast<int64_t>(column([](const auto& m) { return m.rows_previous; }));
  med.rows_device = static_cast<int64_t>(column([](const auto& m) { return m.rows_device; }));
  med.rows_cache = static_cast<int64_t>(column([](const auto& m) { return m.rows_cache; }));
  med.rows_host = static_cast<int64_t>(column([](const auto& m) { return m.rows_host; }));
  med.gpu_peak_bytes = static_cast<uint64_t>(column([](const auto& m) { return m.gpu_peak_bytes; }));
  return med;
}

// `gale bench pipeline`: engine::train's epochs, a row per timed epoch as it ends, then the median.
int bench_pipeline(const std::vector<std::string>& args) {
  PipelineFlags f;
  engine::TrainOptions& o = f.o;
  const po::options_description desc = describe_pipeline_flags(&f);
  po::variables_map vm;
  if (!parse_store_command_line(args, desc, &vm)) return 0;
  check_pipeline_shape(f, vm, &o);
  apply_pipeline_placement(f, vm, &o);
  set_pipeline_run(f, &o);

  const BenchStore source(f.store_path, f.generate, "bench pipeline");
  o.store = source.path();
  const PipelineLabels labels = pipeline_labels(o, source);
  // Under mpirun rank 0 reports for the run (engine::train calls back on rank 0 only).
  const bool lead = engine::Processes::get().rank() == 0;
  if (!f.json && lead) print_pipeline_header(f, labels);
  std::vector<engine::EpochMetrics> timed;
  engine::train(o, [&](const engine::EpochMetrics& m) {
    if (m.epoch < f.warmup) return;
    timed.push_back(m);
    print_epoch_row(f, labels, m.epoch - f.warmup + 1, m);
  });
  if (timed.empty()) return 0;  // another rank's process
  print_epoch_row(f, labels, 0, median_epoch(timed));
  return 0;
}

}  // namespace

int run_bench_minibatch(const std::string& name, const std::vector<std::string>& args) {
  if (name == "sample") return bench_sample(args);
  if (name == "gather") return bench_gather(args);
  if (name == "pipeline") return bench_pipeline(args);
  throw InternalError("run_bench_minibatch: unknown benchmark '" + name + "'");
}

}  // namespace gale::apps
