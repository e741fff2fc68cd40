// `gale bench train STORE|--generate SPEC [options]`: full-graph training epochs timed per model.
//
// The workload of bench/pyg_fullgraph.py (and ../shared/anchors/pyg_fullgraph_and_spmm.py), so the
// two compare side by side on the same store: each epoch is one optimizer step — forward over the
// whole graph, softmax cross-entropy over every labelled node, backward, Adam — with no dropout
// and no evaluation. Warm-up epochs first, then the median of the timed epochs (the host waits for
// the device at the end of each), the GPU time per op kind (aggregation, GEMM, other) averaged
// over the timed epochs, and the peak of the device's memory pool over the timed epochs (graph,
// features, parameters and activations: everything Gale allocates, as torch's
// max_memory_allocated counts for PyG). On a GPU, beside each epoch its roofline
// (engine/roofline.hpp): the epoch's lower bound from its ops' shapes at rates measured on this
// GPU after the model's epochs, and the epoch's efficiency against it. Benchmarks are programs,
// never assertions on time.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "apps/bench_store.hpp"
#include "apps/commands.hpp"
#include "engine/devices.hpp"
#include "engine/graph.hpp"
#include "engine/model.hpp"
#include "engine/ops.hpp"
#include "engine/roofline.hpp"
#include "kernels/error.hpp"
#include "storage/store.hpp"

namespace gale::apps {

namespace po = boost::program_options;

namespace {

using engine::Tensor;

struct Result {
  std::string model;
  double ms = 0, agg_ms = 0, gemm_ms = 0, other_ms = 0;
  double peak_gib = 0;
  bool has_bound = false;  // on a GPU
  engine::RooflineBound bound;
  std::string error;
  std::vector<engine::ops::OpProfile::Entry> ops;  // per op, summed over the timed epochs
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Workload {
  engine::GraphOperand graph;
  Tensor x, labels, rows;
};

Result time_model(const engine::ModelConfig& cfg, const Workload& w, const Device& dev, const engine::ops::ExecOptions& exec,
                  int warmup, int epochs, uint64_t seed) {
  Result r;
  r.model = cfg.model;
  engine::Model model(cfg, seed);
  model.to(dev);
  model.set_exec(exec);
  model.set_constant_input(true);  // w.x, as full-graph training's resident features
  engine::Adam adam(model.parameters(), 0.01f, 0.0f);
  const std::vector<const engine::GraphOperand*> graphs(static_cast<size_t>(cfg.layers), &w.graph);
  auto step = [&] {
    model.zero_grad();
    Tensor logits = model.forward(graphs, w.x, /*training=*/true, seed);
    Tensor grad = Tensor::empty(logits.rows(), logits.cols(), DType::kF32, dev);
    engine::ops::softmax_cross_entropy(logits, w.labels, w.rows, &grad);
    logits = Tensor();
    model.backward(std::move(grad));
    adam.step();
    engine::synchronize(dev);
  };
  for (int i = 0; i < warmup; ++i) step();
  engine::reset_gpu_peak(dev);
  std::vector<double> times;
  engine::ops::OpProfile profile;
  for (int i = 0; i < epochs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  r.ms = median(times);
  r.agg_ms = profile.ms(engine::ops::OpKind::kAggregation) / epochs;
  r.gemm_ms = profile.ms(engine::ops::OpKind::kGemm) / epochs;
  r.other_ms = profile.ms(engine::ops::OpKind::kOther) / epochs;
  r.ops = profile.table();
  r.peak_gib = static_cast<double>(engine::gpu_peak_bytes(dev)) / static_cast<double>(1ULL << 30);
  return r;
}

// The roofline of r's epoch on a GPU, with the rates `rates` lacks measured now that the model's
// memory is free (kept for the next model: each shape is measured once a run).
void add_bound(Result* r, const Device& dev, bool tf32, int epochs, engine::RooflineRates* rates) {
  if (!dev.is_cuda()) return;
  engine::measure_roofline_rates(r->ops, dev, tf32, rates);
  r->bound = engine::roofline_bound(r->ops, *rates, epochs);
  r->has_bound = true;
}

// What bound_ms is, under the table: once, as the rates are the run's.
void print_bound_note(const Device& dev, bool tf32, const engine::RooflineRates& rates) {
  if (!dev.is_cuda()) {
    std::printf("no roofline on the CPU\n");
    return;
  }
  std::printf("bound_ms: the epoch's lower bound on this GPU: each GEMM's FLOPs at the %s FLOP/s cuBLAS reached for "
              "its shape (%zu shapes timed), each aggregation's gathered rows at the rate GAR gathers rows that all "
              "hit the L2 (",
              tf32 ? "TF32" : "fp32", rates.gemm.size());
  for (size_t i = 0; i < rates.gather.size(); ++i)
    std::printf("%swidth %lld: %.0f GB/s", i ? ", " : "", static_cast<long long>(rates.gather[i].first),
                rates.gather[i].second / 1e9);
  std::printf(") or its indices, values and output at the copy bandwidth if that takes longer, other ops' bytes at "
              "the copy bandwidth (%.0f GB/s); eff = bound_ms / ms/epoch (reuse inside an SM, as the tensor-core "
              "SpMM's, can beat the aggregation floor)\n",
              rates.hbm_bytes_per_s / 1e9);
}

struct BenchTrainFlags {
  std::string store_path, generate, models_text = "gcn,sage,gin", device_text = "auto", spmm = "auto", budget,
      activation, norm = "none";
  int layers = 3, heads = 4, epochs = 5, warmup = 2;
  int64_t hidden = 256;
  float dropout = 0.0f;
  uint64_t seed = 0;
  bool json = false, tf32 = false, tune_gemm = false, stack_operands = false, op_table = false;
};

po::options_description describe_bench_train_flags(BenchTrainFlags* f) {
  po::options_description desc(
      "usage: gale bench train STORE [options]\n"
      "       gale bench train --generate rmat:scale=S,edge-factor=E,classes=C,feature-dim=D [options]\n\n"
      "Times full-graph training epochs (forward, loss over every labelled node, backward, Adam; no\n"
      "dropout, no evaluation), as bench/pyg_fullgraph.py does for PyG: median ms per epoch after\n"
      "--warmup epochs, GPU ms per op kind, and the peak of the GPU memory Gale allocated.\n\n"
      "options");
  desc.add_options()
      ("help,h", "show this help")
      ("store", po::value(&f->store_path), "store directory")
      ("generate", po::value(&f->generate), "build this generated graph in a temporary store (deleted after)")
      ("models", po::value(&f->models_text), "comma-separated: gcn, sage, gin, gat (default gcn,sage,gin)")
      ("layers", po::value(&f->layers), "GNN layers (default 3)")
      ("hidden", po::value(&f->hidden), "hidden width; GAT: per head (default 256)")
      ("heads", po::value(&f->heads), "GAT heads in hidden layers (default 4)")
      ("dropout", po::value(&f->dropout), "dropout on every layer's input (default 0, as the PyG anchor)")
      ("activation", po::value(&f->activation), "relu | elu | maxk:K (default: elu for GAT, else relu)")
      ("norm", po::value(&f->norm), "none | batch (batch normalisation after each hidden layer)")
      ("epochs", po::value(&f->epochs), "timed epochs (default 5)")
      ("warmup", po::value(&f->warmup), "untimed epochs first (default 2)")
      ("device", po::value(&f->device_text), "cpu | cuda | cuda:N | auto")
      ("spmm", po::value(&f->spmm), "GPU aggregation kernel: auto | fused-gar | fused-gas | memory-aware | tc")
      ("tf32", po::bool_switch(&f->tf32), "GEMMs on TF32 tensor cores")
      ("tune-gemm", po::bool_switch(&f->tune_gemm), "time cuBLASLt's candidates once per large GEMM shape, keep the fastest")
      ("stack-operands", po::bool_switch(&f->stack_operands), "SAGE: side-by-side operands that cost memory, one GEMM instead of "
                                                              "two (the first layer's [A x | x]; a MaxK hidden layer's input gradients)")
      ("gpu-mem-budget", po::value(&f->budget), "cap on the GPU memory Gale allocates, e.g. 8G")
      ("seed", po::value(&f->seed), "weight initialisation seed")
      ("json", po::bool_switch(&f->json), "one JSON object per model instead of the table")
      ("ops", po::bool_switch(&f->op_table), "also print the time of each op (name and shape) per epoch");
  return desc;
}

// The numbers' ranges, then --models as a list of known models.
std::vector<std::string> check_bench_train_flags(const BenchTrainFlags& f) {
  if (f.layers < 1) throw InputError("--layers: expected at least 1");
  if (f.hidden < 1) throw InputError("--hidden: expected at least 1");
  if (f.heads < 1) throw InputError("--heads: expected at least 1");
  if (f.epochs < 1) throw InputError("--epochs: expected at least 1, found " + std::to_string(f.epochs));
  if (f.warmup < 0) throw InputError("--warmup: expected 0 or more, found " + std::to_string(f.warmup));
  if (f.dropout < 0 || f.dropout >= 1) throw InputError("--dropout: expected a value in [0, 1)");
  std::vector<std::string> models;
  std::stringstream ss(f.models_text);
  for (std::string m; std::getline(ss, m, ',');) {
    if (m != "gcn" && m != "sage" && m != "gin" && m != "gat")
      throw InputError("--models: expected gcn, sage, gin or gat, found '" + m + "'");
    models.push_back(m);
  }
  if (models.empty()) throw InputError("--models: expected at least one model");
  return models;
}

// --gpu-mem-budget in bytes; 0 when not given.
uint64_t parse_gpu_budget(const std::string& text) {
  if (text.empty()) return 0;
  const uint64_t bytes = parse_size(text, "--gpu-mem-budget");
  if (bytes == 0) throw InputError("--gpu-mem-budget: expected a positive size such as 8G");
  return bytes;
}

// The store's graph (unweighted, as the issues' benchmarks define the models), features, labels
// and labelled rows on `dev`; an InputError when the store lacks features or labels.
Workload load_workload(const storage::Store& store, const BenchTrainFlags& f, const Device& dev, bool any_gat) {
  // A generated store is gone by the time a message is read: name the spec and what it lacks.
  const std::string what =
      f.generate.empty() ? f.store_path + ": the store has" : "--generate " + f.generate + ": the graph has";
  if (!store.has_features())
    throw InputError(what + " no features; training needs them" +
                     (f.generate.empty() ? "" : " (add feature-dim=D to the spec)"));
  if (!store.has_labels() || store.num_classes() < 1)
    throw InputError(what + " no labels; training needs them" + (f.generate.empty() ? "" : " (add classes=C to the spec)"));
  const int64_t n = store.num_nodes();
  std::vector<int64_t> labelled;
  for (int64_t v = 0; v < n; ++v) {
    if (store.labels()[v] >= 0) labelled.push_back(v);
  }
  kernels::CsrView csr = store.csr();
  csr.weights = nullptr;
  Workload w{engine::GraphOperand(csr).to(dev, any_gat), Tensor(), Tensor(), Tensor()};
  {
    Tensor host = Tensor::empty(n, store.feature_dim());
    store.read_features(0, n, host.f32());
    w.x = host.to(dev);
  }
  w.labels = Tensor::from_host(store.labels(), n, 1, DType::kI32, dev);
  w.rows = Tensor::from_host(labelled.data(), static_cast<int64_t>(labelled.size()), 1, DType::kI64, dev);
  return w;
}

void print_bench_train_header(const BenchTrainFlags& f, const std::string& device_name, const std::string& label,
                              const storage::Store& store, engine::Norm norm_kind, const Device& dev) {
  std::printf("device: %s\ngraph: %s, %lld nodes, %lld edges, %lld features, %lld classes\n", device_name.c_str(),
              label.c_str(), static_cast<long long>(store.num_nodes()), static_cast<long long>(store.num_edges()),
              static_cast<long long>(store.feature_dim()), static_cast<long long>(store.num_classes()));
  std::printf("%d layers, hidden %lld, %s, spmm %s, %s%s; median of %d epochs after %d warm-up\n", f.layers,
              static_cast<long long>(f.hidden), f.activation.empty() ? "relu (gat: elu)" : f.activation.c_str(),
              f.spmm.c_str(),
              f.tune_gemm ? (f.tf32 ? "tf32, tuned GEMMs" : "fp32, tuned GEMMs") : (f.tf32 ? "tf32" : "fp32"),
              f.stack_operands ? ", stacked operands" : "", f.epochs, f.warmup);
  if (norm_kind != engine::Norm::kNone) std::printf("batch normalisation after each hidden layer\n");
  std::printf("%-6s %10s %9s %9s %9s %9s%s\n", "model", "ms/epoch", "agg_ms", "gemm_ms", "other_ms", "peak_GiB",
              dev.is_cuda() ? "  bound_ms    eff" : "");
}

// Model m as the flags describe it, over the store's features and classes.
engine::ModelConfig bench_model_config(const std::string& m, const BenchTrainFlags& f, const storage::Store& store,
                                       engine::Norm norm_kind) {
  engine::ModelConfig cfg;
  cfg.model = m;
  cfg.layers = f.layers;
  cfg.in_dim = store.feature_dim();
  cfg.hidden = f.hidden;
  cfg.heads = f.heads;
  cfg.out_dim = store.num_classes();
  cfg.dropout = f.dropout;
  cfg.attn_dropout = 0.0f;
  cfg.activation = m == "gat" ? engine::Activation::kElu : engine::Activation::kRelu;
  if (!f.activation.empty()) engine::parse_activation(f.activation, &cfg);
  cfg.norm = norm_kind;
  return cfg;
}

void print_result_json(const Result& r, const engine::ModelConfig& cfg, const BenchTrainFlags& f,
                       const std::string& device_name) {
  nlohmann::json row = {{"side", "gale"}, {"model", r.model}, {"layers", f.layers}, {"hidden", f.hidden},
                        {"activation", engine::activation_name(cfg)},
                        {"device", device_name}, {"spmm", f.spmm}, {"tf32", f.tf32}, {"tune_gemm", f.tune_gemm},
                        {"stack_operands", f.stack_operands}, {"norm", f.norm}};
  if (r.model == "gat") row["heads"] = f.heads;
  if (r.error.empty()) {
    row.update({{"ms_per_epoch", r.ms}, {"agg_ms", r.agg_ms}, {"gemm_ms", r.gemm_ms}, {"other_ms", r.other_ms},
                {"peak_gib", r.peak_gib}});
    if (r.has_bound)
      row.update({{"bound_ms", r.bound.ms()}, {"bound_gemm_ms", r.bound.gemm_ms}, {"bound_agg_ms", r.bound.agg_ms},
                  {"bound_other_ms", r.bound.other_ms}, {"efficiency", engine::roofline_efficiency(r.bound, r.ms)}});
  } else {
    row.update({{"error", "out of memory"}, {"detail", r.error}});
  }
  std::printf("%s\n", row.dump().c_str());
}

void print_result_row(const Result& r, const BenchTrainFlags& f) {
  if (!r.error.empty()) {
    std::printf("%-6s failed: %s\n", r.model.c_str(), r.error.c_str());
    return;
  }
  std::printf("%-6s %10.2f %9.2f %9.2f %9.2f %9.2f", r.model.c_str(), r.ms, r.agg_ms, r.gemm_ms, r.other_ms,
              r.peak_gib);
  if (r.has_bound) std::printf(" %9.2f %5.1f%%", r.bound.ms(), 100.0 * engine::roofline_efficiency(r.bound, r.ms));
  std::printf("\n");
  if (f.op_table) {
    for (const auto& e : r.ops)
      std::printf("         %-40s %6.2f calls %9.3f ms per epoch\n", e.name.c_str(),
                  static_cast<double>(e.calls) / f.epochs, e.ms / f.epochs);
  }
}

}  // namespace

int run_bench_train(const std::vector<std::string>& args) {
  BenchTrainFlags f;
  const po::options_description desc = describe_bench_train_flags(&f);
  po::variables_map vm;
  if (!parse_store_command_line(args, desc, &vm)) return 0;
  const std::vector<std::string> models = check_bench_train_flags(f);
  const Device dev = parse_device(f.device_text);
  BenchStore::check(f.store_path, f.generate, "bench train");
  if (!f.activation.empty()) {  // before anything is printed: a bad value is the run's only line
    engine::ModelConfig probe;
    engine::parse_activation(f.activation, &probe);
  }
  const engine::Norm norm_kind = engine::parse_norm(f.norm);
  engine::require(dev);
  const engine::ops::ExecOptions exec{parse_spmm_kind(f.spmm), f.tf32, f.stack_operands};
  engine::ops::set_gemm_tuning(f.tune_gemm);
  const engine::DeviceBudgetLease gpu_budget({dev}, parse_gpu_budget(f.budget), f.budget, "gale bench train");

  const BenchStore source(f.store_path, f.generate, "bench train");
  const storage::Store store = storage::Store::open(source.path());
  const bool any_gat = std::find(models.begin(), models.end(), "gat") != models.end();
  const Workload w = load_workload(store, f, dev, any_gat);
  const std::string device_name = engine::device_name(dev);
  if (!f.json) print_bench_train_header(f, device_name, source.label(), store, norm_kind, dev);
  engine::RooflineRates rates;  // the roofline's, measured as the models need them
  for (const std::string& m : models) {
    const engine::ModelConfig cfg = bench_model_config(m, f, store, norm_kind);
    Result r;
    try {
      r = time_model(cfg, w, dev, exec, f.warmup, f.epochs, f.seed);
      add_bound(&r, dev, f.tf32, f.epochs, &rates);
    } catch (const ResourceError& e) {
      r.model = m;
      r.error = e.what();
    }
    if (f.json) print_result_json(r, cfg, f, device_name);
    else print_result_row(r, f);
    std::fflush(stdout);
  }
  if (!f.json) print_bound_note(dev, f.tf32, rates);
  return 0;
}

}  // namespace gale::apps
