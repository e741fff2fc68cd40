// `gale predict STORE --checkpoint D [--out predictions.npy] [--embeddings logits.npy]
//  [--device cpu|cuda[:N]|auto] [--gpu-mem-budget 8G] [--spmm K] [--tf32] [--host-mem-budget 8G]
//  [--io-engine auto|io_uring|pread] [--fanouts 15,10,5 [--batch-size 1024]]`.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>

#include "apps/commands.hpp"
#include "apps/stop_cleanup.hpp"
#include "engine/devices.hpp"
#include "engine/predict.hpp"
#include "kernels/error.hpp"

namespace gale::apps {

namespace po = boost::program_options;

namespace {

// The flags as given, before they become engine::PredictOptions (the ones that map straight onto a
// field are bound to `o` itself).
struct PredictFlags {
  engine::PredictOptions o;
  std::string device = "cpu", gpu_budget, spmm = "auto", host_budget, io_engine = "auto", fanouts;
  bool tf32 = false, verbose = false;
};

// The command's options, each bound to its field of `f`.
po::options_description describe_predict_flags(PredictFlags* f) {
  engine::PredictOptions& o = f->o;
  po::options_description desc("usage: gale predict STORE --checkpoint DIR|FILE [options]\n\noptions");
  desc.add_options()
      ("help,h", "show this help")
      ("store", po::value(&o.store), "store directory")
      ("checkpoint", po::value(&o.checkpoint), "checkpoint file, or a directory holding best.ckpt")
      ("out", po::value(&o.out), "class per node as int32 .npy (default predictions.npy)")
      ("embeddings", po::value(&o.embeddings), "also write the logits (N x classes f32 .npy)")
      ("threads", po::value(&o.threads), "CPU threads (0: all cores)")
      ("device", po::value(&f->device), "where the forward pass runs: cpu (default) | cuda | cuda:N | auto "
                                        "(a GPU holds the model, the whole graph and every layer's output)")
      ("gpu-mem-budget", po::value(&f->gpu_budget), "cap on the GPU memory Gale allocates, e.g. 8G (default: no cap)")
      ("spmm", po::value(&f->spmm), "aggregation kernel: auto (on the whole graph: the fastest of gar, gas and, with "
                                    "--tf32, tc, timed once per width; layer by layer: memory-aware) | fused-gar | "
                                    "fused-gas | memory-aware | tc (GPU; tc is TC-GNN's tensor-core SpMM in TF32), or "
                                    "sampled:S[:fastrand|:bucket], ES-SpMM's estimate from at most S entries a row "
                                    "(GCN, SAGE, GIN; CPU or GPU)")
      ("tf32", po::bool_switch(&f->tf32), "GPU GEMMs on TF32 tensor cores (faster, ~1e-3 relative error)")
      ("host-mem-budget", po::value(&f->host_budget), "cap on the host memory Gale keeps on purpose, e.g. 8G (default: "
                                                      "the smaller of MemAvailable and the cgroup's limit, less a "
                                                      "reserve); features beyond it are read from disk, layer by layer")
      ("io-engine", po::value(&f->io_engine), "reads of features on disk: auto | io_uring | pread")
      ("temp-dir", po::value(&o.temp_dir), "where layer outputs spill when they fit neither the GPU nor the host "
                                          "budget (default: the store's directory)")
      ("fanouts", po::value(&f->fanouts), "sampled inference: every node's prediction from mini-batches with these "
                                          "neighbour fanouts per hop, seeds' hop first (e.g. 15,10,5; -1: every "
                                          "neighbour), an estimate of the full neighbourhood's; fast when the "
                                          "features are on disk")
      ("batch-size", po::value(&o.batch_size), "sampled inference: nodes per mini-batch (default 1024)")
      ("verbose,v", po::bool_switch(&f->verbose), "also say which kernel --spmm auto chose, and what each measured");
  return desc;
}

// Refuses a missing STORE or --checkpoint, and an --out or --embeddings given as an empty path.
void check_paths(const engine::PredictOptions& o, const po::variables_map& vm) {
  if (o.store.empty()) throw InputError("predict: expected a STORE path");
  if (o.checkpoint.empty()) throw InputError("--checkpoint: expected a checkpoint file or directory");
  if (o.out.empty()) throw InputError("--out: expected a file path, found an empty one");
  if (vm.count("embeddings") && o.embeddings.empty())
    throw InputError("--embeddings: expected a file path, found an empty one");
}

// How the features are read: --host-mem-budget, --io-engine, and sampled inference's --fanouts, --batch-size.
void apply_reading_flags(const PredictFlags& f, const po::variables_map& vm, engine::PredictOptions* o) {
  if (!f.host_budget.empty()) {
    o->host_mem_budget = parse_host_budget(f.host_budget);
    o->host_mem_budget_text = f.host_budget;
  }
  o->io_engine = parse_io_engine(f.io_engine);
  if (vm.count("fanouts")) o->fanouts = parse_fanouts(f.fanouts);
  if (vm.count("batch-size") && o->fanouts.empty())
    throw InputError("--batch-size: sets sampled inference's batches; add --fanouts");
  if (o->batch_size < 1) throw InputError("--batch-size: expected at least 1, found " + std::to_string(o->batch_size));
}

// Where the forward pass runs and with which kernels; GPU-only flags refused on the CPU.
void apply_device_flags(const PredictFlags& f, const po::variables_map& vm, engine::PredictOptions* o) {
  o->device = parse_device(f.device);
  if (!f.gpu_budget.empty()) {
    o->gpu_mem_budget = parse_size(f.gpu_budget, "--gpu-mem-budget");
    if (o->gpu_mem_budget == 0) throw InputError("--gpu-mem-budget: expected a positive size such as 8G");
    o->gpu_mem_budget_text = f.gpu_budget;
  }
  o->exec.spmm = parse_inference_spmm(f.spmm, &o->exec.spmm_sample_width, &o->exec.spmm_sampling);
  o->exec.tf32 = f.tf32;
  const bool sampled = o->exec.spmm == kernels::SpmmKind::kSampled;
  if (o->device.is_cpu() && (vm.count("gpu-mem-budget") || (vm.count("spmm") && !sampled) || f.tf32))
    throw InputError("--gpu-mem-budget, --tf32 and --spmm other than sampled:S apply to a GPU: add --device cuda");
}

// The run's last line on stdout: what was written where, the test accuracy, how the forward ran.
void report_outcome(const PredictFlags& f, const engine::PredictReport& r) {
  const engine::PredictOptions& o = f.o;
  std::printf("predicted %lld nodes -> %s", static_cast<long long>(r.num_nodes), o.out.c_str());
  if (!o.embeddings.empty()) std::printf(", logits -> %s", o.embeddings.c_str());
  if (r.test_acc >= 0) std::printf(" (test_acc %.4f)", r.test_acc);
  std::printf("; forward %.3f s on %s", r.forward_seconds, engine::device_name(o.device).c_str());
  if (r.sampled) {
    std::printf(" (sampled inference with fanouts %s over %lld nodes in %lld batch%s; %s)", f.fanouts.c_str(),
                static_cast<long long>(r.num_nodes), static_cast<long long>(r.sampled_batches),
                r.sampled_batches == 1 ? "" : "es", r.features.c_str());
  } else if (r.layerwise_chunks > 0) {
    std::printf(" (layer by layer, %lld chunks of nodes a layer: the whole graph would not fit; %s)",
                static_cast<long long>(r.layerwise_chunks), r.features.c_str());
  } else if (!o.device.is_cpu()) {
    std::printf(" (graph and features there first: %.3f s)", r.prepare_seconds);
  }
  if (r.gpu_peak_bytes > 0) std::printf(", GPU peak %.2f GiB", static_cast<double>(r.gpu_peak_bytes) / (1ull << 30));
  std::printf("\n");
}

}  // namespace

int run_predict(const std::vector<std::string>& args) {
  PredictFlags f;
  engine::PredictOptions& o = f.o;
  o.out = "predictions.npy";
  const po::options_description desc = describe_predict_flags(&f);
  po::variables_map vm;
  if (!parse_store_command_line(args, desc, &vm)) return 0;
  check_paths(o, vm);
  apply_reading_flags(f, vm, &o);
  apply_device_flags(f, vm, &o);
  o.on_advice = [](const std::string& line) { std::fprintf(stderr, "gale predict: %s\n", line.c_str()); };
  const StopCleanup stop_cleanup;  // a stop signal removes the half-written outputs
  const engine::PredictReport r = engine::predict(o);
  if (f.verbose)
    for (const engine::SpmmAutoChoice& c : r.spmm_choices) std::fprintf(stderr, "%s\n", c.text().c_str());
  report_outcome(f, r);
  return 0;
}

}  // namespace gale::apps
