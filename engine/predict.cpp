#include "engine/predict.hpp"

#include <tbb/global_control.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "engine/checkpoint.hpp"
#include "engine/devices.hpp"
#include "engine/graph.hpp"
#include "engine/layerwise.hpp"
#include "engine/model.hpp"
#include "engine/ops.hpp"
#include "engine/sampled_inference.hpp"
#include "kernels/cuda/budget.hpp"
#include "kernels/error.hpp"
#include "kernels/threads.hpp"
#include "storage/host_features.hpp"
#include "storage/host_memory.hpp"
#include "storage/npy.hpp"
#include "storage/store.hpp"
#include "storage/temp_paths.hpp"

namespace gale::engine {

namespace {

namespace fs = std::filesystem;

// An output file, checked before any work: its directory exists, it is not the other output, and it
// overwrites nothing the command reads (the store's files, the checkpoint).
void check_output(const std::string& path, const char* flag, const PredictOptions& o, const fs::path& checkpoint) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(path, ec);
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) throw InputError(std::string(flag) + " " + path + ": no directory " + dir.string());
  if (fs::is_directory(path, ec)) throw InputError(std::string(flag) + " " + path + ": a directory, expected a file path");
  // The file is replaced by a rename: a device, a FIFO or a socket would be replaced, not written.
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    throw InputError(std::string(flag) + " " + path + ": exists and is not a regular file");
  const fs::path store = fs::weakly_canonical(o.store, ec);
  const auto [s_end, p_it] = std::mismatch(store.begin(), store.end(), p.begin(), p.end());
  if (s_end == store.end())
    throw InputError(std::string(flag) + " " + path + ": inside the store being read; write it elsewhere");
  if (p == fs::weakly_canonical(checkpoint, ec))
    throw InputError(std::string(flag) + " " + path + ": the checkpoint being read; write it elsewhere");
}

// Removes a temporary output (if it is there) and forgets it.
void discard(const fs::path& tmp) {
  std::error_code ignore;
  fs::remove(tmp, ignore);
  storage::unregister_temp(tmp);
}

// Writes an array to a hidden temporary beside `path` (not renamed yet), named for this host and
// pid and registered (storage/temp_paths.hpp), so that a stop signal removes it, and the next run
// what a killed one left: a failure leaves no partial file.
std::string write_npy_beside(const std::string& path, DType dtype, std::vector<int64_t> shape, const void* data,
                             size_t bytes) {
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = "." + p.filename().string() + ".tmp-";
  storage::remove_stale_temps(dir, prefix);
  const fs::path tmp = dir / storage::temp_name(prefix);
  std::optional<storage::NpyWriter> w;
  {
    const auto lock = storage::lock_temps();  // registered before it exists, created before a stop removes it
    storage::register_temp(tmp);
    try {
      w.emplace(tmp.string(), dtype, std::move(shape));
    } catch (...) {
      discard(tmp);
      throw;
    }
  }
  try {
    w->write(data, bytes);
    w->finish();
  } catch (...) {
    w.reset();
    discard(tmp);
    throw;
  }
  return tmp.string();
}

// The model a checkpoint describes, checked against the store and the kernels asked for.
ModelConfig checkpoint_config(const CheckpointState& state, const std::filesystem::path& file,
                              const storage::Store& store, const PredictOptions& o) {
  nlohmann::json id;
  ModelConfig config;
  try {
    id = nlohmann::json::parse(state.config_json);
    config.model = id.at("model").get<std::string>();
    config.layers = id.at("layers").get<int>();
    config.in_dim = id.at("in_dim").get<int64_t>();
    config.hidden = id.at("hidden").get<int64_t>();
    config.out_dim = id.at("out_dim").get<int64_t>();
    config.heads = id.at("heads").get<int>();
    config.gin_mlp_layers = id.at("gin_mlp_layers").get<int>();
    config.gin_eps = id.at("gin_eps").get<float>();
    parse_activation(id.at("activation").get<std::string>(), &config);
    config.edge_weights = id.value("edge_weights", false);
    config.norm = parse_norm(id.value("norm", std::string("none")));
  } catch (const nlohmann::json::exception& e) {
    throw CorruptStoreError(file.string() + ": malformed model description: " + e.what());
  }
  if (id.value("num_nodes", int64_t{-1}) != store.num_nodes() || config.in_dim != store.feature_dim())
    throw CorruptStoreError(file.string() + ": checkpoint was trained on another store (" +
                            std::to_string(id.value("num_nodes", int64_t{-1})) + " nodes of " +
                            std::to_string(config.in_dim) + " features there, " + std::to_string(store.num_nodes()) +
                            " of " + std::to_string(store.feature_dim()) + " here)");

  if (o.exec.spmm == kernels::SpmmKind::kTensorCore && config.model == "gat")
    throw InputError("--spmm tc: aggregates gcn, sage and gin; " + file.string() + " holds a gat model");
  if (o.exec.spmm == kernels::SpmmKind::kSampled && (config.model == "gat" || config.activation == Activation::kMaxK))
    throw InputError("--spmm sampled: samples the aggregations of gcn, sage and gin with relu; " + file.string() +
                     " holds a " + config.model + (config.activation == Activation::kMaxK ? " with maxk" : "") + " model");
  if (!o.fanouts.empty() && o.exec.spmm == kernels::SpmmKind::kTensorCore)
    throw InputError("--spmm tc: aggregates a whole graph translated once; sampled inference (--fanouts) aggregates "
                     "blocks that change every batch");
  if (!o.fanouts.empty() && static_cast<int>(o.fanouts.size()) != config.layers)
    throw InputError("--fanouts: expected one fanout per layer of " + file.string() + " (" +
                     std::to_string(config.layers) + "), found " + std::to_string(o.fanouts.size()));
  return config;
}

// Seconds from `t` to now.
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// What each way of computing the logits works with, as infer_logits set it up.
struct Inference {
  Model& model;
  const storage::Store& store;
  const PredictOptions& o;
  kernels::cuda::MemoryBudget& budget;
  const storage::HostFeatures& host;
  const InputRows& host_rows;
  uint64_t x_bytes;  // the whole feature matrix
  std::chrono::steady_clock::time_point start;
  PredictReport* report;
};

// Just before a layer-wise pass: advises --fanouts (o.on_advice) when features are on disk and tables spill.
// Layer by layer, a layer's output table that the budget cannot hold spills to a scratch file and
// is read back at random (R-MAT 21 in 2 GB: 337 s an evaluation); sampled inference spills
// nothing but samples a neighbourhood per node (a 200K-node SBM on 2 busy CPU cores, nothing
// spilled: 195 s sampled against 12 s layer by layer), so it is advised only when tables spill.
void advise_sampled_inference(const Inference& in) {
  const uint64_t table_bytes =
      static_cast<uint64_t>(in.store.num_nodes()) * static_cast<uint64_t>(in.model.widest_dim()) * sizeof(float);
  const uint64_t used = in.budget.in_use() + storage::HostFeatures::kStagingReserve;  // the reads' staging to come
  if (in.host.on_disk() && in.o.on_advice && used + table_bytes > in.budget.limit())
    in.o.on_advice("the features are on disk and the layers' tables (" + kernels::cuda::format_bytes(table_bytes) +
                   " each) exceed --host-mem-budget, so they spill to disk: --fanouts (e.g. 15,10,5) predicts by "
                   "sampled mini-batch inference instead, which spills nothing (an estimate, like gale train's "
                   "--eval sampled)");
}

// The logits layer by layer over chunks of nodes (after any advice), its chunks and time in the report.
Tensor layerwise_pass(const Inference& in, const LayerwiseOptions& lo) {
  advise_sampled_inference(in);
  Tensor logits = layerwise_logits(in.model, in.store, in.host_rows, lo);
  in.report->layerwise_chunks =
      static_cast<int64_t>(layerwise_chunks(in.store.indptr(), in.store.num_nodes(), lo.max_rows).size()) - 1;
  in.report->forward_seconds = seconds_since(in.start);
  return logits;
}

// The logits from one forward over the whole graph on the CPU, the feature matrix read whole.
Tensor whole_graph_on_cpu(const Inference& in) {
  const ModelConfig& config = in.model.config();
  const int64_t n = in.store.num_nodes();
  in.budget.charge(in.x_bytes);  // the whole matrix, for the forward's lifetime
  Tensor x = Tensor::empty(n, in.store.feature_dim());
  in.store.read_features(0, n, x.f32());
  const GraphOperand graph(aggregation_csr(in.store, config));
  const std::vector<const GraphOperand*> graphs(static_cast<size_t>(config.layers), &graph);
  Tensor logits = in.model.forward(graphs, x, /*training=*/false, 0);
  in.report->forward_seconds = seconds_since(in.start);
  in.budget.release(in.x_bytes);
  return logits;
}

// The logits from one forward over the whole graph on the GPU, graph and features copied there first.
Tensor whole_graph_on_gpu(const Inference& in) {
  const ModelConfig& config = in.model.config();
  const int64_t n = in.store.num_nodes();
  in.budget.charge(in.x_bytes);  // the host copy, until it is on the GPU
  Tensor x = Tensor::empty(n, in.store.feature_dim());
  in.store.read_features(0, n, x.f32());
  const GraphOperand graph =
      GraphOperand(aggregation_csr(in.store, config)).to(in.o.device, /*edge_map=*/config.model == "gat");
  const std::vector<const GraphOperand*> graphs(static_cast<size_t>(config.layers), &graph);
  const Tensor x_device = x.to(in.o.device);
  x = Tensor();
  in.budget.release(in.x_bytes);
  synchronize(in.o.device);
  const auto ready = std::chrono::steady_clock::now();
  in.report->prepare_seconds = std::chrono::duration<double>(ready - in.start).count();
  const Tensor on_device = in.model.forward(graphs, x_device, /*training=*/false, 0);
  Tensor logits = on_device.to(Device::cpu());
  in.report->forward_seconds = seconds_since(ready);
  in.report->spmm_choices = spmm_auto_choices(graph.id());
  return logits;
}

// The logits on a GPU (the model moved there): the whole graph at once when it fits, else layer by layer.
Tensor logits_on_gpu(const Inference& in, bool x_fits) {
  const ModelConfig& config = in.model.config();
  const bool attention = config.model == "gat";
  const UseDevice use(in.o.device);
  reset_gpu_peak(in.o.device);
  in.model.to(in.o.device);
  const uint64_t free = gpu_room_left(in.o.device, in.o.gpu_mem_budget);
  Tensor logits;
  if (!x_fits || whole_graph_inference_bytes(in.store.num_nodes(), in.store.num_edges(), in.store.feature_dim(),
                                             in.model.widest_dim(), attention ? config.heads : 0) +
                         kLibraryReserveBytes >
                     free) {
    LayerwiseOptions lo = layerwise_options_for(free, in.model.widest_dim(), attention);
    lo.host_budget = &in.budget;  // the layers' host tables; beyond it they spill to --temp-dir
    lo.spill_dir = spill_dir_for(in.o.temp_dir, in.store);
    logits = layerwise_pass(in, lo);
  } else {
    logits = whole_graph_on_gpu(in);
  }
  in.report->gpu_peak_bytes = gpu_peak_bytes(in.o.device);
  return logits;
}

// Every node's logits on the host. Over the whole graph at once (on a GPU when its inference fits
// in what the GPU may hold: the budget, or 90% of the card) when every feature fits the host budget
// beside the topology; else layer by layer over chunks of nodes (engine/layerwise.hpp), each chunk's
// input rows read through the host's features (from memory, or the disk tier).
Tensor infer_logits(Model& model, const storage::Store& store, const PredictOptions& o, PredictReport* report) {
  const int64_t n = store.num_nodes();
  const auto budget = storage::make_host_budget(o.host_mem_budget, o.host_mem_budget_text);
  storage::HostFeatures::Options ho;
  ho.budget = budget.get();
  ho.engine = o.io_engine;
  storage::HostFeatures host(store, ho);  // checks the rows it keeps in memory, page by page
  report->features = host.describe();
  const uint64_t x_bytes = static_cast<uint64_t>(n) * static_cast<uint64_t>(store.feature_dim()) * sizeof(float);
  const bool x_fits = !host.on_disk() && budget->in_use() + x_bytes <= budget->limit();
  const auto start = std::chrono::steady_clock::now();
  const InputRows host_rows = host_input_rows(
      [&](const int64_t* ids, int64_t count, float* out) { host.read_rows(ids, count, out); }, store.feature_dim(),
      o.device, budget.get());
  const Inference in{model, store, o, *budget, host, host_rows, x_bytes, start, report};
  if (!o.device.is_cpu()) return logits_on_gpu(in, x_fits);
  if (x_fits) return whole_graph_on_cpu(in);
  LayerwiseOptions lo;
  lo.host_budget = budget.get();
  return layerwise_pass(in, lo);
}

// Every node's logits from its full neighbourhood (infer_logits), by the checkpoint's model.
Tensor full_neighbourhood_logits(const CheckpointState& state, const std::filesystem::path& file,
                                 const ModelConfig& config, const storage::Store& store, const PredictOptions& o,
                                 PredictReport* report) {
  // The GPU's budget for the prediction's life, declared before the model so that its weights on
  // the GPU are freed before the device is given back.
  const DeviceBudgetLease gpu_budget({o.device}, o.gpu_mem_budget, o.gpu_mem_budget_text,
                                     "the prediction from " + file.string());
  Model model(config, 0);
  model.set_exec(o.exec);
  restore_weights(state, &model, file);
  return infer_logits(model, store, o, report);
}

// Each row's argmax (the first of equal maxima).
std::vector<int32_t> argmax_rows(const Tensor& logits) {
  std::vector<int32_t> out(static_cast<size_t>(logits.rows()));
  for (int64_t v = 0; v < logits.rows(); ++v) {
    const float* row = logits.f32() + v * logits.cols();
    out[static_cast<size_t>(v)] = static_cast<int32_t>(std::max_element(row, row + logits.cols()) - row);
  }
  return out;
}

// Writes --out and --embeddings beside their paths first and renames them only when both are
// whole: a failure leaves neither (and the files they replace as they were). A symlink is written
// through: its target is the file replaced.
void write_outputs(const PredictOptions& o, const std::vector<int32_t>& pred, const Tensor& logits) {
  const int64_t n = static_cast<int64_t>(pred.size());
  std::vector<std::pair<std::string, std::string>> done;  // (temporary, final)
  const auto target = [](const std::string& path) {
    fs::path p = path;
    std::error_code ec;
    for (int hops = 0; hops < 40 && fs::is_symlink(p, ec); ++hops) {  // a link to a link: follow on
      const fs::path to = fs::read_symlink(p, ec);
      if (ec) break;
      p = to.is_absolute() ? to : p.parent_path() / to;
    }
    return p.string();
  };
  try {
    if (!o.out.empty()) {
      const std::string to = target(o.out);
      done.emplace_back(write_npy_beside(to, DType::kI32, {n}, pred.data(), pred.size() * sizeof(int32_t)), to);
    }
    if (!o.embeddings.empty()) {
      const std::string to = target(o.embeddings);
      done.emplace_back(write_npy_beside(to, DType::kF32, {n, logits.cols()}, logits.f32(), logits.nbytes()), to);
    }
  } catch (...) {
    for (const auto& [tmp, path] : done) discard(tmp);
    throw;
  }
  const auto lock = storage::lock_temps();  // a stop signal waits for the renames
  for (const auto& [tmp, path] : done) {
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
      for (const auto& [t, p] : done) discard(t);
      throw InputError(path + ": cannot write: " + ec.message());
    }
  }
  for (const auto& [tmp, path] : done) storage::unregister_temp(tmp);
}

}  // namespace

PredictReport predict(const PredictOptions& o) {
  std::optional<tbb::global_control> limit;
  if (o.threads > 0) {
    limit.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(o.threads));
    kernels::set_blas_threads(o.threads);
  }
  require(o.device);  // before any reading: a GPU this build or machine lacks fails at once
  std::filesystem::path file = o.checkpoint;
  if (std::filesystem::is_directory(file)) file /= "best.ckpt";
  if (!std::filesystem::exists(file)) throw InputError("--checkpoint: no checkpoint at " + file.string());
  if (!o.out.empty()) check_output(o.out, "--out", o, file);
  if (!o.embeddings.empty()) {
    check_output(o.embeddings, "--embeddings", o, file);
    std::error_code ec;
    if (!o.out.empty() && fs::weakly_canonical(o.out, ec) == fs::weakly_canonical(o.embeddings, ec))
      throw InputError("--embeddings " + o.embeddings + ": the same file as --out; give them different paths");
  }
  const CheckpointState state = load_checkpoint(file);
  const storage::Store store = storage::Store::open(o.store);
  if (!store.has_features()) throw InputError(o.store + ": the store has no features.npy");
  const ModelConfig config = checkpoint_config(state, file, store, o);
  PredictReport report;
  const int64_t n = store.num_nodes();
  std::vector<int32_t> pred;
  Tensor logits;  // with --embeddings, or from the full neighbourhood's forward
  if (o.fanouts.empty()) {
    logits = full_neighbourhood_logits(state, file, config, store, o, &report);
    pred = argmax_rows(logits);
  } else {
    SampledPredictions sampled = sampled_predictions(state, file, config, o, /*keep_logits=*/!o.embeddings.empty(), &report);
    pred = std::move(sampled.classes);
    logits = std::move(sampled.logits);
  }
  report.num_nodes = n;
  if (store.has_labels() && store.has_split("test")) {
    int64_t correct = 0, total = 0;
    for (int64_t v : store.split("test")) {
      if (store.labels()[v] < 0) continue;
      ++total;
      correct += pred[v] == store.labels()[v];
    }
    if (total > 0) report.test_acc = static_cast<double>(correct) / static_cast<double>(total);
  }
  // Outputs are indexed by the user's original node ids, also when the store reordered nodes.
  const int64_t* original = store.relabel();
  const bool write_logits = !o.embeddings.empty();
  Tensor out_logits = write_logits ? logits : Tensor();
  if (original) {
    std::vector<int32_t> by_original(pred.size());
    for (int64_t s = 0; s < n; ++s) by_original[original[s]] = pred[s];
    pred.swap(by_original);
    if (write_logits) {
      out_logits = Tensor::empty(n, logits.cols());
      for (int64_t s = 0; s < n; ++s)
        std::copy(logits.f32() + s * logits.cols(), logits.f32() + (s + 1) * logits.cols(),
                  out_logits.f32() + original[s] * logits.cols());
    }
  }
  logits = Tensor();
  write_outputs(o, pred, out_logits);
  return report;
}

}  // namespace gale::engine
