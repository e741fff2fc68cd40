// `gale train STORE [options]`: options (command line, then --config FILE) -> engine::train.
#include <signal.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "apps/commands.hpp"
#include "engine/devices.hpp"
#include "engine/local_processes.hpp"
#include "engine/ops.hpp"
#include "engine/processes.hpp"
#include "engine/trainer.hpp"
#include "kernels/error.hpp"

namespace gale::apps {

namespace po = boost::program_options;

namespace {

// One line per epoch; on a terminal a bar with rate and ETA redrawn in place.
class Progress {
 public:
  Progress(bool tty, bool evaluated) : tty_(tty), evaluated_(evaluated) {}
  void epoch(const engine::EpochMetrics& m) {
    elapsed_ += m.epoch_s;
    ++done_;
    const double rate = elapsed_ > 0 ? done_ / elapsed_ : 0;
    const double eta = rate > 0 ? (m.epochs - m.epoch - 1) / rate : 0;
    if (tty_) {
      constexpr int kWidth = 24;
      const int filled = static_cast<int>(kWidth * (m.epoch + 1) / std::max<int64_t>(1, m.epochs));
      std::string bar(static_cast<size_t>(filled), '#');
      bar.resize(kWidth, '.');
      char line[256];
      char accs[64] = " (no eval)";
      if (evaluated_) std::snprintf(accs, sizeof accs, " train %.3f valid %.3f test %.3f", m.train_acc, m.valid_acc, m.test_acc);
      std::snprintf(line, sizeof line, "[%s] epoch %lld/%lld loss %.4f%s  %.2f ep/s ETA %.0fs", bar.c_str(),
                    static_cast<long long>(m.epoch + 1), static_cast<long long>(m.epochs), m.loss, accs, rate, eta);
      line_ = line;
      std::fprintf(stderr, "\r%s \x1b[K", line_.c_str());
      if (m.epoch + 1 == m.epochs) std::fputc('\n', stderr);
    } else {
      char accs[80] = " (no eval)";
      if (evaluated_)
        std::snprintf(accs, sizeof accs, " train_acc %.4f valid_acc %.4f test_acc %.4f", m.train_acc, m.valid_acc,
                      m.test_acc);
      std::fprintf(stderr, "epoch %lld/%lld loss %.4f%s time %.3fs\n", static_cast<long long>(m.epoch + 1),
                   static_cast<long long>(m.epochs), m.loss, accs, m.epoch_s);
    }
    std::fflush(stderr);
  }
  // On a terminal, a mini-batch epoch shows its steps after the last epoch's summary (redrawn at
  // most 4 times a second).
  void step(int64_t epoch, int64_t epochs, int64_t batch, int64_t batches) {
    if (!tty_) return;
    const auto now = std::chrono::steady_clock::now();
    if (batch + 1 < batches && now - last_step_ < std::chrono::milliseconds(250)) return;
    last_step_ = now;
    if (line_.empty()) {
      std::fprintf(stderr, "\repoch %lld/%lld batch %lld/%lld \x1b[K", static_cast<long long>(epoch + 1),
                   static_cast<long long>(epochs), static_cast<long long>(batch + 1), static_cast<long long>(batches));
    } else {  // the epoch after the summary's
      std::fprintf(stderr, "\r%s | batch %lld/%lld \x1b[K", line_.c_str(), static_cast<long long>(batch + 1),
                   static_cast<long long>(batches));
    }
    std::fflush(stderr);
  }

 private:
  bool tty_;
  bool evaluated_;  // false with --eval none: no accuracy to show
  double elapsed_ = 0;
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point last_step_{};
  std::string line_;  // the last epoch's summary, kept on the line while the next one runs
};

// SIGINT / SIGTERM during training: the first asks the trainer to stop at its next step and
// checkpoint there (TrainOptions::stop); a second one stops the process at once, with the
// signal's default action (the last checkpoint on disk is whole either way: they are renamed into
// place).
std::atomic<int> stop_requested{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler stores into it");

extern "C" void on_stop_signal(int sig) {
  if (stop_requested.load() != 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  stop_requested.store(sig);
  static const char kNote[] = "\ngale: stopping at the next training step (again to stop at once)\n";
  const ssize_t ignored = ::write(STDERR_FILENO, kNote, sizeof kNote - 1);
  (void)ignored;
}

// Installs on_stop_signal for SIGINT and SIGTERM while it lives; puts the old handlers back.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // reads and waits carry on; the trainer looks at the flag between steps
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// The whole file as text ("" when it cannot be read).
std::string read_text(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// ":LINE" of the INI line an option error is about, or "" when none matches: Boost names the key
// ("section.key" under a [section]), or for a line without '=' gives the line itself.
std::string config_line(const std::string& file, const po::error_with_option_name& e) {
  const auto* syntax = dynamic_cast<const po::invalid_config_file_syntax*>(&e);
  std::string key = syntax != nullptr ? syntax->tokens() : e.get_option_name();
  key.erase(0, key.find_first_not_of('-'));
  if (key.find('.') != std::string::npos) key = key.substr(key.rfind('.') + 1);
  const auto trim = [](std::string t) {
    t.erase(0, t.find_first_not_of(" \t\r"));
    t.erase(t.find_last_not_of(" \t\r") + 1);
    return t;
  };
  std::ifstream in(file);
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const size_t eq = line.find('=');
    if ((eq != std::string::npos && trim(line.substr(0, eq)) == key) || trim(line) == key)
      return ":" + std::to_string(line_no);
  }
  return "";
}

// The flags as given, before they become engine::TrainOptions (the ones that map straight onto a
// field are bound to `o` itself).
struct TrainFlags {
  engine::TrainOptions o;
  std::string model = "sage", activation, device = "auto", fanouts, config, spmm = "auto", gpu_budget;
  bool tf32 = false, tune_gemm = false, stack_operands = false, no_match = false;
  std::string eval = "auto", feature_gpu, sampler = "auto", gpus, checkpoint_interval, host_budget, io_engine = "auto",
              read_ahead = "auto", cache_rank = "degree";
  std::string edge_weights = "auto", neighbor_sampling = "uniform", norm = "none", lr_schedule = "constant";
  float min_lr = 0.0f;
  int cpu_workers = 0;
  std::string processes;
  int layers = 2;
  int64_t hidden = 16, epochs = 200;
  int heads = 8;
  float dropout = -1, attn_dropout = 0.6f, lr = -1;
  bool full_graph = false, quiet = false, verbose = false;
};

po::options_description describe_train_flags(TrainFlags* f) {
  engine::TrainOptions& o = f->o;
  po::options_description desc("usage: gale train STORE [options]\n\noptions");
  desc.add_options()
      ("help,h", "show this help")
      ("store", po::value(&o.store), "store directory")
      ("config", po::value(&f->config), "read options from an INI file (command line wins)")
      ("device", po::value(&f->device), "cpu | cuda | cuda:N | auto (the first GPU when present)")
      ("gpu-mem-budget", po::value(&f->gpu_budget), "cap on the GPU memory Gale allocates, e.g. 8G (default: no cap)")
      ("host-mem-budget", po::value(&f->host_budget), "cap on the host memory Gale keeps on purpose, e.g. 8G (default: "
                                                    "the smaller of MemAvailable and the cgroup's limit, less a reserve); "
                                                    "features beyond it are read from the store's features.npy on disk")
      ("io-engine", po::value(&f->io_engine), "reads of features on disk: auto (io_uring, else a pread thread pool) | "
                                           "io_uring | pread")
      ("temp-dir", po::value(&o.temp_dir), "where layer-wise evaluation's outputs spill when they fit neither the GPU "
                                          "nor the host budget (default: the store's directory)")
      ("read-ahead", po::value(&f->read_ahead), "features on disk: host memory for the windows of rows read ahead of "
                                             "the batches, taken from the host cache, e.g. 512M; auto (a third of "
                                             "the features' share) | 0 (each batch reads its own rows)")
      ("cache-rank", po::value(&f->cache_rank), "features on disk: what ranks the rows the GPU and host caches hold: "
                                             "degree (in-degree, the default) | sampled (how often one pre-sampled "
                                             "epoch's batches read each node)")
      ("spmm", po::value(&f->spmm), "GPU aggregation kernel: auto (on the whole graph: the fastest of gar, gas and, with "
       "--tf32, tc, timed once per width; sampled blocks: memory-aware) | fused-gar | fused-gas | memory-aware | tc "
       "(TC-GNN's tensor-core SpMM in TF32, full-graph only)")
      ("tf32", po::bool_switch(&f->tf32), "GPU GEMMs on TF32 tensor cores (faster, ~1e-3 relative error)")
      ("tune-gemm", po::bool_switch(&f->tune_gemm), "GPU GEMMs: time cuBLASLt's candidates once per large repeated shape "
                                                 "and keep the fastest (faster; runs may then differ in the last bits)")
      ("stack-operands", po::bool_switch(&f->stack_operands), "full-graph SAGE: operands side by side for one GEMM instead of two "
                                                           "where that costs memory: the first layer's [A x | x] (one more copy of "
                                                           "the features on the GPU), a MaxK hidden layer's input gradients")
      ("gpus", po::value(&f->gpus), "data-parallel training on these GPUs, one worker each: all | 0,1,... (mini-batch)")
      ("workers", po::value(&f->cpu_workers), "data-parallel CPU workers (--device cpu, mini-batch)")
      ("processes", po::value(&f->processes), "start the run as N processes on this host, without mpirun: N | per-gpu (one "
                                           "per GPU of --gpus, the faster layout on one host); each takes its share of "
                                           "--gpus, or --workers CPU workers of its own")
      ("check-replicas", po::bool_switch(&o.check_replicas), "compare the workers' weight checksums after every epoch")
      ("comm-timeout", po::value(&o.comm_timeout_s), "under mpirun: seconds a gradient sum or exchange may wait for the "
                                                     "other processes before the run ends (exit code 5)")
      ("edge-weights", po::value(&f->edge_weights), "auto (use the store's edge weights when it has them, except GAT) | use | "
                                                  "ignore: GCN normalises by weighted degrees, SAGE averages and GIN sums "
                                                  "weighted messages")
      ("sampler", po::value(&f->sampler), "mini-batch neighbour sampler: auto (the GPU's when training there) | gpu | cpu")
      ("neighbor-sampling", po::value(&f->neighbor_sampling), "mini-batch: uniform (default) | weighted (neighbours drawn "
                                                            "in proportion to the store's edge weights)")
      ("no-match", po::bool_switch(&f->no_match), "mini-batch on a GPU: do not reuse the previous batch's features")
      ("reorder-window", po::value(&o.reorder_window), "mini-batch: reorder each window of this many batches for reuse (0: off)")
      ("feature-gpu-mem", po::value(&f->feature_gpu), "mini-batch on a GPU: room for features there, e.g. 2G (default: half the budget); "
                                                    "too small for all of them keeps a cache of hot nodes and the rest in pinned host memory")
      ("eval", po::value(&f->eval), "auto | full (whole-graph inference) | batched (the same, layer by layer over chunks of nodes) | sampled (mini-batch inference with the training fanouts over at most 2^17 nodes a split; auto's choice beyond memory) | none")
      ("model", po::value(&f->model), "gcn | sage | gin | gat (default sage)")
      ("layers", po::value(&f->layers), "number of GNN layers (default 2)")
      ("hidden", po::value(&f->hidden), "hidden width (GAT: per head; default 16)")
      ("heads", po::value(&f->heads), "GAT attention heads in hidden layers (default 8)")
      ("activation", po::value(&f->activation), "relu | elu | maxk:K (MaxK-GNN; default: elu for GAT, else relu)")
      ("norm", po::value(&f->norm), "none (default) | batch: batch normalisation after each hidden layer, before its "
                                 "activation (running statistics for evaluation)")
      ("dropout", po::value(&f->dropout), "dropout on every layer's input (default 0.5, GAT 0.6)")
      ("attn-dropout", po::value(&f->attn_dropout), "GAT attention dropout (default 0.6)")
      ("gin-mlp-layers", po::value(&o.model.gin_mlp_layers), "GIN: 1 (Linear) or 2 (Linear-ReLU-Linear; the default)")
      ("gin-eps", po::value(&o.model.gin_eps), "GIN: weight (1 + eps) of a node's own features (default 0)")
      ("lr", po::value(&f->lr), "Adam learning rate (default 0.01, GAT 0.005)")
      ("lr-schedule", po::value(&f->lr_schedule), "constant (default) | cosine (to --min-lr over --epochs) | step:N:F "
                                               "(times F every N epochs) | plateau:P:F (times F once more than P epochs "
                                               "in a row have not raised the best validation accuracy)")
      ("min-lr", po::value(&f->min_lr), "the rate a schedule never goes below (default 0)")
      ("weight-decay", po::value(&o.weight_decay), "L2 weight decay (default 5e-4)")
      ("epochs", po::value(&f->epochs), "training epochs (default 200)")
      ("patience", po::value(&o.patience), "stop early once this many epochs in a row have not raised the best "
                                           "validation accuracy (0: off, the default)")
      ("full-graph", po::bool_switch(&f->full_graph), "train on the whole graph (the default without --fanouts)")
      ("fanouts", po::value(&f->fanouts), "mini-batch neighbour fanouts per hop, seeds' hop first: 10,10")
      ("batch-size", po::value(&o.batch_size), "training seeds per mini-batch (default 1024)")
      ("prefetch", po::value(&o.prefetch), "mini-batches prepared ahead per worker (default 2; 8 when a GPU's "
                                           "batches are staged from disk)")
      ("seed", po::value(&o.seed), "seed for initialisation, dropout, sampling and shuffling (default 0)")
      ("deterministic", po::bool_switch(&o.deterministic), "bit-identical reruns (one CPU thread)")
      ("threads", po::value(&o.threads), "CPU threads (0: all cores)")
      ("checkpoint-dir", po::value(&o.checkpoint_dir), "write latest.ckpt / best.ckpt here every epoch")
      ("checkpoint-interval", po::value(&f->checkpoint_interval),
       "also checkpoint inside an epoch this often: 600, 30s, 10m, 2h (mini-batch, no "
       "--reorder-window; at most that much work is lost to a kill)")
      ("resume", po::bool_switch(&o.resume), "continue from --checkpoint-dir/latest.ckpt")
      ("overwrite-checkpoints", po::bool_switch(&o.overwrite_checkpoints),
       "start over in a --checkpoint-dir that holds an earlier run's checkpoints, replacing them")
      ("metrics", po::value(&o.metrics_path), "write one JSON object per epoch to this file")
      ("quiet,q", po::bool_switch(&f->quiet), "no per-epoch progress")
      ("verbose,v", po::bool_switch(&f->verbose), "also say which kernel --spmm auto chose, and what each measured");
  return desc;
}

// --config FILE's options, under the command line's (which `vm` already holds).
void read_config_file(const std::string& file, const po::options_description& desc, po::variables_map* vm) {
  if (std::filesystem::is_directory(file)) throw InputError("--config " + file + ": a directory, expected an INI file");
  std::ifstream in(file);
  if (!in) throw InputError("--config " + file + ": cannot open");
  try {
    const po::parsed_options parsed = po::parse_config_file(in, desc);
    for (const po::option& opt : parsed.options)
      if (opt.string_key == "config")
        throw InputError("--config " + file + ": sets 'config' itself; one config file is read, not a chain");
    po::store(parsed, *vm);
  } catch (const po::error_with_option_name& e) {
    const std::vector<std::string> text = {read_text(file)};
    throw InputError("--config " + file + config_line(file, e) + ": " + option_error_text(e, text));
  } catch (const po::error& e) {
    throw InputError("--config " + file + ": " + option_error_text(e, {read_text(file)}));
  }
}

// The model's flags, with GAT's defaults where it has its own.
void apply_model_flags(const TrainFlags& f, const po::variables_map& vm, engine::TrainOptions* o) {
  if (f.model != "gcn" && f.model != "sage" && f.model != "gin" && f.model != "gat")
    throw InputError("--model: expected gcn, sage, gin or gat, found '" + f.model + "'");
  const bool gat = f.model == "gat";
  o->model.model = f.model;
  o->model.layers = f.layers;
  o->model.hidden = f.hidden;
  o->model.heads = f.heads;
  o->model.dropout = vm.count("dropout") ? f.dropout : (gat ? 0.6f : 0.5f);
  o->model.attn_dropout = f.attn_dropout;
  engine::parse_activation(!f.activation.empty() ? f.activation : gat ? "elu" : "relu", &o->model);
  o->model.norm = engine::parse_norm(f.norm);
  o->lr = vm.count("lr") ? f.lr : (gat ? 0.005f : 0.01f);
  o->lr_schedule = engine::parse_lr_schedule(f.lr_schedule);
  o->lr_schedule.min_lr = f.min_lr;
  o->epochs = f.epochs;
}

// Where the run trains and what it may use there: devices and workers, memory budgets, the disk
// tier's reads. Before anything starts CUDA (parse_device does for auto), the kernels are loaded
// eagerly for several GPUs: the driver reads that setting once.
void apply_placement_flags(const TrainFlags& f, const po::variables_map& vm, engine::TrainOptions* o) {
  if (asks_for_several_gpus(f.gpus, f.processes)) engine::load_kernels_eagerly();
  o->device = parse_device(f.device);
  if (!f.gpu_budget.empty()) {
    o->gpu_mem_budget = parse_size(f.gpu_budget, "--gpu-mem-budget");
    if (o->gpu_mem_budget == 0) throw InputError("--gpu-mem-budget: expected a positive size such as 8G");
    o->gpu_mem_budget_text = f.gpu_budget;
  }
  if (!f.host_budget.empty()) {
    o->host_mem_budget = parse_host_budget(f.host_budget);
    o->host_mem_budget_text = f.host_budget;
  }
  o->io_engine = parse_io_engine(f.io_engine);
  if (f.read_ahead != "auto") o->read_ahead_bytes = parse_size(f.read_ahead, "--read-ahead");
  if (f.cache_rank == "sampled") o->cache_rank = engine::TrainOptions::CacheRank::kSampled;
  else if (f.cache_rank != "degree") throw InputError("--cache-rank: expected degree or sampled, found '" + f.cache_rank + "'");
  o->exec.spmm = parse_spmm_kind(f.spmm);
  o->match = !f.no_match;
  o->devices = parse_workers(f.gpus, f.cpu_workers, vm.count("workers") > 0, vm.count("device") > 0, &o->device);
}

// The flags read after the run's layout is known: GPU-only flags refused on a CPU run by name,
// the sampler, edge weights, the feature cache, evaluation and GEMM precision.
void apply_run_flags(const TrainFlags& f, const po::variables_map& vm, engine::TrainOptions* o) {
  // On a run put on the CPU by name, GPU-only options would do nothing: say so, as predict does.
  // (--device auto on a machine without a GPU keeps them, so one command line serves both.)
  if (o->device.is_cpu() && (vm.count("device") > 0 || vm.count("workers") > 0)) {
    const std::pair<bool, const char*> gpu_only[] = {{f.tf32, "--tf32"},
                                                     {f.tune_gemm, "--tune-gemm"},
                                                     {!f.gpu_budget.empty(), "--gpu-mem-budget"},
                                                     {!f.feature_gpu.empty(), "--feature-gpu-mem"}};
    for (const auto& [given, flag] : gpu_only)
      if (given) throw InputError(std::string(flag) + ": applies to a GPU; this run trains on the CPU (--device cpu)");
  }
  if (f.sampler == "gpu" || f.sampler == "cpu") {
    o->gpu_sampler = f.sampler == "gpu";
    if (o->gpu_sampler && o->device.is_cpu()) throw InputError("--sampler gpu: needs --device cuda (training on the CPU)");
  } else if (f.sampler != "auto") {
    throw InputError("--sampler: expected auto, gpu or cpu, found '" + f.sampler + "'");
  }
  if (f.edge_weights == "auto") o->edge_weights = engine::TrainOptions::EdgeWeights::kAuto;
  else if (f.edge_weights == "use") o->edge_weights = engine::TrainOptions::EdgeWeights::kUse;
  else if (f.edge_weights == "ignore") o->edge_weights = engine::TrainOptions::EdgeWeights::kIgnore;
  else throw InputError("--edge-weights: expected auto, use or ignore, found '" + f.edge_weights + "'");
  if (f.neighbor_sampling == "uniform") o->sampling = sampler::Sampling::kUniform;
  else if (f.neighbor_sampling == "weighted") o->sampling = sampler::Sampling::kWeighted;
  else throw InputError("--neighbor-sampling: expected uniform or weighted, found '" + f.neighbor_sampling + "'");
  if (!f.feature_gpu.empty()) {
    o->feature_gpu_bytes = parse_size(f.feature_gpu, "--feature-gpu-mem");
    if (o->feature_gpu_bytes == 0) throw InputError("--feature-gpu-mem: expected a positive size such as 2G");
  }
  using Eval = engine::TrainOptions::Eval;
  if (f.eval == "auto") o->eval = Eval::kAuto;
  else if (f.eval == "full") o->eval = Eval::kFull;
  else if (f.eval == "batched") o->eval = Eval::kBatched;
  else if (f.eval == "sampled") o->eval = Eval::kSampled;
  else if (f.eval == "none") o->eval = Eval::kNone;
  else throw InputError("--eval: expected auto, full, batched, sampled or none, found '" + f.eval + "'");
  // (A library caller's full-graph run evaluates the whole graph whatever it asks.)
  if ((o->eval == Eval::kBatched || o->eval == Eval::kSampled) && f.fanouts.empty())
    throw InputError(std::string("--eval ") + f.eval + ": needs --fanouts (mini-batch training)");
  o->exec.tf32 = f.tf32;
  o->exec.stack_operands = f.stack_operands;
  if (f.tune_gemm && o->deterministic)
    throw InputError("--tune-gemm: cannot be combined with --deterministic (the tuned GEMMs may differ between runs)");
}

// Says on stderr whether the store's edge weights shape the aggregations: easy to miss.
void tell_edge_weights(const engine::TrainOptions& o) {
  const storage::Store store = storage::Store::open(o.store);
  if (store.weights() == nullptr) return;
  std::fprintf(stderr, "%s\n",
               engine::uses_edge_weights(o.edge_weights, store, o.model.model)
                   ? "edge weights: the aggregations use the store's (--edge-weights ignore to train without them)"
               : o.model.model == "gat" ? "edge weights: not used (GAT weighs neighbours by attention)"
                                        : "edge weights: not used (--edge-weights ignore)");
}

// The trainer's hooks that show progress: steps and epochs, the features' placement, a resume.
void show_progress(Progress* progress, engine::TrainOptions* o) {
  if (!o->full_graph)
    o->on_step = [progress, epochs = o->epochs](int64_t epoch, int64_t batch, int64_t batches) {
      progress->step(epoch, epochs, batch, batches);
    };
  if (engine::Processes::get().rank() == 0)
    o->on_placement = [](const std::string& placement) { std::fprintf(stderr, "features: %s\n", placement.c_str()); };
  o->on_resume = [](int64_t epochs_done, int64_t batches_done) {
    if (batches_done > 0)
      std::fprintf(stderr, "resuming inside epoch %lld after its first %lld batches\n",
                   static_cast<long long>(epochs_done + 1), static_cast<long long>(batches_done));
    else
      std::fprintf(stderr, "resuming after epoch %lld\n", static_cast<long long>(epochs_done));
  };
}

// The run's last lines and exit code: where a stop by signal left it (128 + the signal, as the
// shell reports a death by it), an early stop, the accuracy reached.
int report_outcome(const engine::TrainOptions& o, const engine::TrainResult& r) {
  const bool lead = engine::Processes::get().rank() == 0;  // under mpirun every process has the same result
  if (r.stop_signal != 0) {
    if (lead) {
      const std::string where =
          r.stopped_batches < r.stopped_of
              ? "inside epoch " + std::to_string(r.stopped_epoch + 1) + " after " + std::to_string(r.stopped_batches) +
                    " of " + std::to_string(r.stopped_of) + " batches"
              : "after epoch " + std::to_string(r.stopped_epoch + 1) + " of " + std::to_string(o.epochs);
      const std::string saved =
          o.checkpoint_dir.empty()
              ? "nothing saved (no --checkpoint-dir)"
              : (std::filesystem::path(o.checkpoint_dir) / "latest.ckpt").string() +
                    " holds it: run the same command with --resume to go on";
      std::fprintf(stderr, "gale: stopped by %s %s; %s\n", r.stop_signal == SIGTERM ? "SIGTERM" : "SIGINT",
                   where.c_str(), saved.c_str());
    }
    return 128 + r.stop_signal;
  }
  if (lead && r.stopped_early)
    std::fprintf(stderr, "stopped early after epoch %lld of %lld: %lld epochs without a better %s accuracy (--patience)\n",
                 static_cast<long long>(r.epochs_done), static_cast<long long>(o.epochs),
                 static_cast<long long>(o.patience), r.selects_on_train ? "training" : "validation");
  if (lead && o.eval == engine::TrainOptions::Eval::kNone)
    std::printf("trained %lld epochs, last loss %.4f (--eval none: no accuracy measured)\n",
                static_cast<long long>(r.last.epoch + 1), r.last.loss);
  else if (lead)
    std::printf("best valid_acc %.4f at epoch %lld, test_acc %.4f\n", r.best_valid_acc,
                static_cast<long long>(r.best_epoch + 1), r.test_acc_at_best_valid);
  return 0;
}

}  // namespace

int run_train(const std::vector<std::string>& args) {
  TrainFlags f;
  engine::TrainOptions& o = f.o;
  const po::options_description desc = describe_train_flags(&f);
  po::positional_options_description pos;
  pos.add("store", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, pos, &vm, /*notify=*/false)) return 0;
  if (vm.count("config")) read_config_file(vm["config"].as<std::string>(), desc, &vm);
  po::notify(vm);

  if (o.store.empty()) throw InputError("train: expected a STORE path");
  for (const char* flag : {"checkpoint-dir", "metrics"})
    if (vm.count(flag) && vm[flag].as<std::string>().empty())
      throw InputError(std::string("--") + flag + ": expected a path, found an empty one");
  apply_model_flags(f, vm, &o);
  if (vm.count("prefetch") && o.prefetch < 1)
    throw InputError("--prefetch: expected at least 1, found " + std::to_string(o.prefetch));
  if (!f.fanouts.empty()) {
    if (f.full_graph) throw InputError("--fanouts and --full-graph: choose one");
    o.full_graph = false;
    o.fanouts = parse_fanouts(f.fanouts);
  }
  apply_placement_flags(f, vm, &o);
  if (!f.checkpoint_interval.empty()) o.checkpoint_interval_s = parse_duration(f.checkpoint_interval, "--checkpoint-interval");
  apply_run_flags(f, vm, &o);
  // Every value check that needs neither the store nor a device, as a library caller gets them;
  // before any process starts, so that a bad value is one line from the launcher.
  engine::check_train_options(o);
  if (!f.processes.empty()) {
    const int count = parse_processes(f.processes, o.devices, o.full_graph);
    // The processes started run this same command line; only the one the user started launches.
    if (count > 1 && !engine::local::started_by_launcher()) {
      std::vector<std::string> command{"train"};
      command.insert(command.end(), args.begin(), args.end());
      return engine::local::launch(count, command);
    }
  }
  engine::ops::set_gemm_tuning(f.tune_gemm);

  const bool show = !f.quiet;
  Progress progress(show && ::isatty(STDERR_FILENO), o.eval != engine::TrainOptions::Eval::kNone);
  if (show && engine::Processes::get().rank() == 0) tell_edge_weights(o);
  stop_requested.store(0);
  o.stop = &stop_requested;
  if (show) show_progress(&progress, &o);
  engine::TrainResult r;
  {
    const StopSignals signals;
    size_t choices_shown = 0;
    r = engine::train(o, [&](const engine::EpochMetrics& m) {
      for (; f.verbose && choices_shown < m.spmm_choices.size(); ++choices_shown)
        std::fprintf(stderr, "%s%s\n", ::isatty(STDERR_FILENO) ? "\r\x1b[K" : "", m.spmm_choices[choices_shown].text().c_str());
      if (show) progress.epoch(m);
    });
  }
  return report_outcome(o, r);
}

}  // namespace gale::apps
