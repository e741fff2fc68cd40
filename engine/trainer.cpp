#include "engine/trainer.hpp"

#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <atomic>
#include <thread>
#include <xxhash.h>

#include "engine/batch_features.hpp"
#include "engine/checkpoint.hpp"
#include "engine/comm.hpp"
#include "engine/devices.hpp"
#include "engine/gpu_batches.hpp"
#include "engine/graph.hpp"
#include "engine/layerwise.hpp"
#include "engine/ops.hpp"
#include "engine/processes.hpp"
#include "kernels/error.hpp"
#include "kernels/random.hpp"
#include "kernels/graph_norms.hpp"
#include "kernels/threads.hpp"
#include "sampler/neighbor_sampler.hpp"
#include "scheduler/batch_pipeline.hpp"
#include "scheduler/epoch_plan.hpp"
#include "storage/store.hpp"

namespace gale::engine {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// What must match between a checkpoint and the run resuming from it.
std::string identity_json(const TrainOptions& o, const storage::Store& store) {
  const ModelConfig& m = o.model;
  nlohmann::json j = {
      {"model", m.model}, {"layers", m.layers}, {"in_dim", m.in_dim}, {"hidden", m.hidden},
      {"out_dim", m.out_dim}, {"heads", m.heads}, {"gin_mlp_layers", m.gin_mlp_layers},
      {"gin_eps", m.gin_eps}, {"activation", activation_name(m)},
      {"num_nodes", store.num_nodes()}, {"num_edges", store.num_edges()}, {"seed", o.seed},
      {"full_graph", o.full_graph}, {"fanouts", o.fanouts}, {"batch_size", o.batch_size}};
  // Named only when set, so that checkpoints written before these options resume as they were.
  if (m.edge_weights) j["edge_weights"] = true;
  if (m.norm != Norm::kNone) j["norm"] = norm_name(m.norm);
  if (o.sampling == sampler::Sampling::kWeighted) j["neighbor_sampling"] = "weighted";
  return j.dump();
}

// Accuracy of argmax(logits) over the listed rows (i64 ids on the logits' device); 0 for none.
double accuracy(const Tensor& logits, const Tensor& labels, const Tensor& rows) {
  if (rows.numel() == 0) return 0;
  const ops::LossResult r = ops::softmax_cross_entropy(logits, labels, rows, nullptr);
  return static_cast<double>(r.correct) / static_cast<double>(rows.numel());
}

Tensor ids_tensor(const std::vector<int64_t>& ids, const Device& device) {
  return Tensor::from_host(ids.data(), static_cast<int64_t>(ids.size()), 1, DType::kI64, device);
}

struct PreparedBatch {
  // Sampled on the CPU: the blocks and their operands on the host.
  sampler::SampledBatch batch;
  std::vector<std::unique_ptr<GraphOperand>> graphs;
  // Sampled on the GPU: the blocks stay there; the load stage turns them into operands and starts
  // the feature gather on the IO stream.
  GpuBatch gpu;
  std::optional<GpuBatch::Operands> ops;
  PendingFeatures x;
  std::vector<GraphOperand> on_device;  // graphs on the training device: the model's backward reads them
  Tensor features;
  std::vector<int32_t> labels;
  Tensor seeds;  // GPU-sampled: the seeds on the device, once forward has built the operands
};

// One data-parallel worker: a model replica on its device with its optimizer, its GPU sampler and
// feature tiers, and its communicator (none with a single worker).
struct Replica {
  Device dev;
  std::unique_ptr<Model> model;
  std::unique_ptr<Adam> adam;
  std::unique_ptr<GpuBatches> gpu_batches;
  std::unique_ptr<BatchFeatures> batch_features;
  std::unique_ptr<Communicator> comm;
  Tensor labels_all;  // every node's label on dev (the GPU path gathers a batch's from it)
};

// What a worker's epoch adds to the epoch's metrics.
struct WorkerEpoch {
  double loss_sum = 0;  // per-seed losses, summed
  int64_t seeds = 0;
  double wall_s = 0;
  scheduler::PipelineTimes times;
  double io_s = 0, allreduce_s = 0;
  // Host seconds the steps spent enqueueing the gradient sums, and waiting for the lagged read of
  // the stop votes (worker 0's are reported: where a worker's host, not its GPU, holds it up).
  double allreduce_host_s = 0, vote_wait_s = 0;
  FeatureLoadStats features;
  uint64_t checksum = 0;
  int stop = 0;  // TrainOptions::stop as this worker saw it after the epoch
  // Several workers: the pipeline ended early because the workers agreed on an interval
  // checkpoint (not a stop); the epoch goes on after it from times.consumed_end.
  bool checkpoint_break = false;
  // With several workers: every worker's record (record() below), in rank order, gathered after
  // the epoch, so rank 0 reports the whole run's counts.
  std::vector<uint64_t> everyone;

  // What a worker tells the others after an epoch, as 64-bit words (doubles by their bits).
  std::vector<uint64_t> record() const {
    auto bits = [](double v) {
      uint64_t u;
      std::memcpy(&u, &v, sizeof u);
      return u;
    };
    return {bits(loss_sum),
            static_cast<uint64_t>(seeds),
            bits(wall_s),
            static_cast<uint64_t>(features.rows),
            static_cast<uint64_t>(features.previous),
            static_cast<uint64_t>(features.device),
            static_cast<uint64_t>(features.cache),
            static_cast<uint64_t>(features.host),
            static_cast<uint64_t>(features.host_to_gpu_bytes()),
            static_cast<uint64_t>(times.reuse.nodes),
            static_cast<uint64_t>(times.reuse.reused),
            static_cast<uint64_t>(times.reuse.reused_sampled_order),
            bits(allreduce_s),
            static_cast<uint64_t>(stop)};
  }
};

double double_bits(uint64_t u) {
  double v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

// xxHash64 over a model's parameter values, in order (copied to the host).
uint64_t parameter_checksum(Model& model) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  for (Parameter* p : model.parameters()) {
    const std::vector<float> v = p->value.to_vector();
    XXH64_update(state, v.data(), v.size() * sizeof(float));
  }
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return h;
}

}  // namespace

LrSchedule parse_lr_schedule(const std::string& text) {
  LrSchedule s;
  s.text = text;
  if (text == "constant") return s;
  if (text == "cosine") {
    s.kind = LrSchedule::Kind::kCosine;
    return s;
  }
  const auto bad = [&] {
    return InputError("--lr-schedule: expected constant, cosine, step:N:F or plateau:P:F (N, P whole epochs, F in "
                      "(0, 1)), found '" + text + "'");
  };
  const size_t first = text.find(':'), second = text.find(':', first == std::string::npos ? first : first + 1);
  if (first == std::string::npos || second == std::string::npos) throw bad();
  const std::string kind = text.substr(0, first);
  if (kind == "step") s.kind = LrSchedule::Kind::kStep;
  else if (kind == "plateau") s.kind = LrSchedule::Kind::kPlateau;
  else throw bad();
  const std::string n = text.substr(first + 1, second - first - 1), f = text.substr(second + 1);
  size_t used = 0;
  try {
    s.epochs = std::stoll(n, &used);
    if (used != n.size()) throw bad();
    s.factor = std::stof(f, &used);
    if (used != f.size()) throw bad();
  } catch (const std::logic_error&) {
    throw bad();
  }
  if (s.epochs < (s.kind == LrSchedule::Kind::kStep ? 1 : 0) || !(s.factor > 0.0f && s.factor < 1.0f)) throw bad();
  return s;
}

double scheduled_lr(const LrSchedule& s, double lr, int64_t epoch, int64_t epochs, int64_t reductions) {
  double rate = lr;
  switch (s.kind) {
    case LrSchedule::Kind::kConstant: break;
    case LrSchedule::Kind::kCosine:
      rate = s.min_lr + (lr - s.min_lr) * 0.5 *
                            (1.0 + std::cos(std::acos(-1.0) * static_cast<double>(epoch) / static_cast<double>(std::max<int64_t>(epochs, 1))));
      break;
    case LrSchedule::Kind::kStep: rate = lr * std::pow(static_cast<double>(s.factor), static_cast<double>(epoch / s.epochs)); break;
    case LrSchedule::Kind::kPlateau: rate = lr * std::pow(static_cast<double>(s.factor), static_cast<double>(reductions)); break;
  }
  return std::max<double>(rate, s.min_lr);
}

bool uses_edge_weights(TrainOptions::EdgeWeights choice, const storage::Store& store, const std::string& model) {
  const bool weighted = store.weights() != nullptr;
  switch (choice) {
    case TrainOptions::EdgeWeights::kIgnore: return false;
    case TrainOptions::EdgeWeights::kAuto: return weighted && model != "gat";
    case TrainOptions::EdgeWeights::kUse:
      if (!weighted)
        throw InputError("--edge-weights use: " + store.path().string() + " has no edge weights (graph/weights.npy)");
      if (model == "gat")
        throw InputError("--edge-weights use: GAT weighs its neighbours by attention, not by edge weights; "
                         "use gcn, sage or gin, or --edge-weights ignore");
      return true;
  }
  return false;
}

TrainResult train(const TrainOptions& opt_in, const EpochCallback& on_epoch) {
  TrainOptions opt = opt_in;
  // This process's workers (its slice of --gpus when several processes share a host), and the
  // run's: `world` workers, this process's ranked from `first_rank`.
  Processes& procs = Processes::get();
  procs.set_timeout(opt.comm_timeout_s);
  const std::vector<Device> devices = place_devices(opt.devices.empty() ? std::vector<Device>{opt.device} : opt.devices,
                                                    procs.local_rank(), procs.local_size(), procs.host());
  const int workers = static_cast<int>(devices.size());
  const int world = workers * procs.size();
  const int first_rank = procs.rank() * workers;
  const bool lead_process = procs.rank() == 0;
  for (const Device& d : devices) {
    require(d);
    if (d.is_cpu() != devices[0].is_cpu()) throw InputError("--gpus: workers must all be GPUs or all the CPU");
    if (d.is_cuda() && std::count(devices.begin(), devices.end(), d) > 1)
      throw InputError("--gpus: GPU " + std::to_string(d.ordinal) + " is listed twice");
  }
  const Device dev = devices[0];  // rank 0: evaluation, checkpoints and metrics
  if (opt.epochs < 1) throw InputError("--epochs: expected at least 1, found " + std::to_string(opt.epochs));
  if (opt.patience < 0) throw InputError("--patience: expected 0 (off) or more epochs, found " + std::to_string(opt.patience));
  if (opt.patience > 0 && opt.eval == TrainOptions::Eval::kNone)
    throw InputError("--patience: stops when the validation accuracy stops rising, and --eval none measures none");
  if (opt.lr_schedule.kind == LrSchedule::Kind::kPlateau && opt.eval == TrainOptions::Eval::kNone)
    throw InputError("--lr-schedule plateau: lowers the rate when the validation accuracy stops rising, and --eval none "
                     "measures none");
  if (!(opt.lr_schedule.min_lr >= 0.0f && opt.lr_schedule.min_lr <= opt.lr))
    throw InputError("--min-lr: expected a value from 0 to --lr (" + std::to_string(opt.lr) + "), found " +
                     std::to_string(opt.lr_schedule.min_lr));
  if (opt.lr <= 0) throw InputError("--lr: expected a positive learning rate");
  if (opt.model.layers < 1) throw InputError("--layers: expected at least 1");
  if (opt.model.hidden < 1) throw InputError("--hidden: expected at least 1");
  if (!opt.full_graph && static_cast<int>(opt.fanouts.size()) != opt.model.layers)
    throw InputError("--fanouts: expected one fanout per layer (" + std::to_string(opt.model.layers) + "), found " +
                     std::to_string(opt.fanouts.size()));
  if (world > 1 && opt.full_graph)
    throw InputError(std::string(procs.distributed() ? "mpirun" : dev.is_cpu() ? "--workers" : "--gpus") +
                     ": several workers train mini-batches; give --fanouts");

  // Bound both thread pools: --threads, or one thread with --deterministic so results do not
  // depend on the machine's core count.
  const int threads = opt.deterministic ? 1 : opt.threads;
  std::optional<tbb::global_control> tbb_limit;
  if (threads > 0) {
    tbb_limit.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(threads));
    kernels::set_blas_threads(threads);
  }

  const storage::Store store = storage::Store::open(opt.store);
  if (!store.has_features()) throw InputError(opt.store + ": the store has no features.npy; training needs node features");
  if (!store.has_labels())
    throw InputError(opt.store + ": the store has no labels.npy; training needs node labels");
  if (store.num_classes() < 1)
    throw InputError(opt.store + ": labels.npy labels no node (every label is -1); training needs labelled nodes");
  const int32_t* labels = store.labels();
  auto labelled = [&](const std::string& name) {
    std::vector<int64_t> ids;
    for (int64_t v : store.split(name)) {
      if (labels[v] >= 0) ids.push_back(v);
    }
    return ids;
  };
  const std::vector<int64_t> train_ids = labelled("train");
  const std::vector<int64_t> valid_ids = labelled("valid");
  const std::vector<int64_t> test_ids = labelled("test");
  if (train_ids.empty()) throw InputError(opt.store + ": the store has no labelled training nodes (splits/train.npy)");
  if (!opt.full_graph) {
    if (opt.batch_size < 1) throw InputError("--batch-size: expected at least 1, found " + std::to_string(opt.batch_size));
    // More seeds than there are make the same single batch; buffers are sized by the batch.
    opt.batch_size = std::min<int64_t>(opt.batch_size, static_cast<int64_t>(train_ids.size()));
  }

  opt.model.in_dim = store.feature_dim();
  opt.model.out_dim = store.num_classes();
  opt.model.edge_weights = uses_edge_weights(opt.edge_weights, store, opt.model.model);
  if (opt.sampling == sampler::Sampling::kWeighted) {
    if (opt.full_graph) throw InputError("--neighbor-sampling weighted: draws mini-batch neighbours; give --fanouts");
    if (store.weights() == nullptr)
      throw InputError("--neighbor-sampling weighted: " + opt.store + " has no edge weights (graph/weights.npy)");
  }
  const int64_t n = store.num_nodes();
  if (procs.distributed()) {
    // Every process must train the same model on the same store with as many workers: compare
    // each one's worker count and a fingerprint of its options and store with rank 0's.
    const std::string mine = identity_json(opt, store) + "|" + std::to_string(opt.epochs) + "|" +
                             std::to_string(opt.patience) + "|" + std::to_string(opt.lr) + "|" +
                             opt.lr_schedule.text + "|" + std::to_string(opt.lr_schedule.min_lr) + "|" +
                             std::to_string(store.has_partition());
    const uint64_t fields[2] = {static_cast<uint64_t>(workers), XXH64(mine.data(), mine.size(), 0)};
    const std::vector<uint8_t> all = procs.all_gather(fields, sizeof fields, "comparing the processes' options");
    const auto* theirs = reinterpret_cast<const uint64_t*>(all.data());
    for (int p = 1; p < procs.size(); ++p) {
      if (theirs[2 * p] != theirs[0])
        throw InputError("mpirun: rank " + std::to_string(p) + " has " + std::to_string(theirs[2 * p]) +
                         " workers, rank 0 has " + std::to_string(theirs[0]) + " (every process needs as many GPUs)");
      if (theirs[2 * p + 1] != theirs[1])
        throw InputError("mpirun: rank " + std::to_string(p) + "'s model, options or store differ from rank 0's");
    }
  }
  const bool attention = opt.model.model == "gat";

  // The replicas: the same seed gives every one the same initial weights.
  std::vector<Replica> replicas(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    Replica& r = replicas[static_cast<size_t>(w)];
    r.dev = devices[static_cast<size_t>(w)];
    if (r.dev.is_cuda()) set_gpu_budget(r.dev, opt.gpu_mem_budget, opt.gpu_mem_budget_text);
    const UseDevice use(r.dev);
    r.model = std::make_unique<Model>(opt.model, opt.seed);
    r.model->to(r.dev);
    r.model->set_exec(opt.exec);
    r.model->set_constant_input(opt.full_graph);  // the resident features(), unchanged all run
    r.adam = std::make_unique<Adam>(r.model->parameters(), opt.lr, opt.weight_decay);
    r.labels_all = Tensor::from_host(labels, n, 1, DType::kI32, r.dev);
  }
  if (world > 1) {
    auto comms = dev.is_cpu() ? make_in_process_group(workers, &procs) : make_nccl_group(devices, &procs);
    for (int w = 0; w < workers; ++w) replicas[static_cast<size_t>(w)].comm = std::move(comms[static_cast<size_t>(w)]);
  }
  // This thread trains worker 0 (and runs evaluation and checkpoints) on devices[0]: make it the
  // current device for the whole run, so --device cuda:N launches its kernels there.
  const UseDevice use_lead(dev);
  Model& model = *replicas[0].model;
  Adam& adam = *replicas[0].adam;
  TrainResult result;
  result.best_valid_acc = -1;
  result.selects_on_train = valid_ids.empty();
  int64_t start_epoch = 0;
  // A checkpoint written inside an epoch: that epoch starts at this batch, with these losses.
  int64_t resume_batch = 0;
  std::vector<double> resume_loss_sums;  // each worker rank's
  // Mini-batch training without a match-reorder window stops between steps (TrainOptions::stop);
  // several workers agree on the step first (worker_epoch's votes).
  const bool step_stops = !opt.full_graph && opt.reorder_window <= 1;
  if (opt.checkpoint_interval_s < 0) throw InputError("--checkpoint-interval: expected 0 or more seconds");
  if (opt.checkpoint_interval_s > 0 && opt.checkpoint_dir.empty())
    throw InputError("--checkpoint-interval: needs --checkpoint-dir");
  if (opt.checkpoint_interval_s > 0 && !step_stops)
    throw InputError("--checkpoint-interval: checkpoints inside an epoch need mini-batch training without "
                     "--reorder-window");
  auto last_checkpoint = Clock::now();  // of this run: interval checkpoints count from it

  const std::string identity = identity_json(opt, store);
  const std::filesystem::path ckpt_dir = opt.checkpoint_dir;
  if (lead_process && !opt.resume && !opt.overwrite_checkpoints && !opt.checkpoint_dir.empty()) {
    for (const char* name : {"latest.ckpt", "best.ckpt"})
      if (std::filesystem::exists(ckpt_dir / name))
        throw InputError("--checkpoint-dir " + opt.checkpoint_dir + ": holds an earlier run's " + name +
                         "; pass --resume to continue that run, --overwrite-checkpoints to start over there, or "
                         "another directory");
  }
  if (opt.resume) {
    if (opt.checkpoint_dir.empty()) throw InputError("--resume: needs --checkpoint-dir");
    const auto file = ckpt_dir / "latest.ckpt";
    if (!std::filesystem::exists(file)) throw InputError("--resume: no checkpoint at " + file.string());
    CheckpointState s = load_checkpoint(file);
    if (s.config_json != identity) {
      // Name what differs: "hidden 16 there, 32 here".
      std::string diff;
      try {
        const nlohmann::json was = nlohmann::json::parse(s.config_json), now = nlohmann::json::parse(identity);
        for (auto it = now.begin(); it != now.end(); ++it) {
          const auto old = was.find(it.key());
          if (old != was.end() && *old == it.value()) continue;
          diff += (diff.empty() ? "" : ", ") + it.key() + " " + (old == was.end() ? "absent" : old->dump()) +
                  " there, " + it.value().dump() + " here";
        }
        for (auto it = was.begin(); it != was.end(); ++it)
          if (!now.contains(it.key()))
            diff += (diff.empty() ? "" : ", ") + it.key() + " " + it.value().dump() + " there, absent here";
      } catch (const nlohmann::json::exception&) {
        diff = "an unreadable description";
      }
      throw CorruptStoreError(file.string() + ": checkpoint of another model, store or batch setup (" + diff +
                              "); resume with the options it was written with, or use another --checkpoint-dir");
    }
    for (Replica& r : replicas) {
      const UseDevice use(r.dev);
      // Tensor::to keeps a tensor already on the device: every replica after the first takes its
      // own copy, or CPU replicas would share (and each step) one set of weights and moments.
      const bool first = &r == &replicas[0];
      auto own = [&](const Tensor& t) { return !first && t.device() == r.dev ? t.clone() : t.to(r.dev); };
      auto params = r.model->parameters();
      if (s.names.size() != params.size()) throw CorruptStoreError(file.string() + ": parameter count differs from the model");
      for (size_t i = 0; i < params.size(); ++i) {
        if (s.names[i] != params[i]->name || s.params[i].rows() != params[i]->value.rows() ||
            s.params[i].cols() != params[i]->value.cols())
          throw CorruptStoreError(file.string() + ": parameter " + s.names[i] + " does not match the model");
        params[i]->value = own(s.params[i]);
        r.adam->first_moments()[i] = own(s.adam_m[i]);
        r.adam->second_moments()[i] = own(s.adam_v[i]);
      }
      r.adam->set_steps(s.adam_steps);
      restore_buffers(s, r.model.get(), file);
    }
    result.best_valid_acc = s.best_valid_acc;
    result.test_acc_at_best_valid = s.test_acc_at_best_valid;
    result.best_epoch = s.best_epoch;
    result.improved_epoch = s.improved_epoch;
    result.lr_reductions = s.lr_reductions;
    result.lr_reduced_epoch = s.lr_reduced_epoch;
    start_epoch = s.epoch + 1;
    resume_batch = s.batches_done;
    resume_loss_sums = s.partial_loss_sums;
    if (resume_batch > 0 && (!step_stops || static_cast<int>(resume_loss_sums.size()) != world)) {
      const size_t n = resume_loss_sums.size();
      throw InputError(file.string() + ": stopped inside epoch " + std::to_string(start_epoch + 1) + " by a run with " +
                       (n == 1 ? std::string("one worker") : std::to_string(n) + " workers") +
                       " and no --reorder-window; resume it that way (the epoch's batches cannot be dealt out anew)");
    }
    if (opt.on_resume && lead_process) opt.on_resume(start_epoch, resume_batch);
  }
  // Checkpoints go to disk on the writer's thread while training goes on; every return below waits
  // for them (so a stopped run's message is true), and a failed write surfaces at the next save.
  CheckpointWriter writer;
  // A host copy of t that training will not write (Tensor::to keeps a host tensor as it is).
  auto host_copy = [](const Tensor& t) { return t.device().is_cpu() ? t.clone() : t.to(Device::cpu()); };
  // The state after `epoch`, or inside epoch + 1 after its first `batches_done` batches.
  auto save = [&](const std::filesystem::path& file, int64_t epoch, int64_t batches_done = 0,
                  std::vector<double> loss_sums = {}) {
    CheckpointState s;
    s.epoch = epoch;
    s.batches_done = batches_done;
    s.partial_loss_sums = std::move(loss_sums);
    s.adam_steps = adam.steps();
    s.best_valid_acc = result.best_valid_acc;
    s.test_acc_at_best_valid = result.test_acc_at_best_valid;
    s.best_epoch = result.best_epoch;
    s.improved_epoch = result.improved_epoch;
    s.lr_reductions = result.lr_reductions;
    s.lr_reduced_epoch = result.lr_reduced_epoch;
    s.config_json = identity;
    auto params = model.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      s.names.push_back(params[i]->name);
      s.params.push_back(host_copy(params[i]->value));
      s.adam_m.push_back(host_copy(adam.first_moments()[i]));
      s.adam_v.push_back(host_copy(adam.second_moments()[i]));
    }
    for (Buffer* b : model.buffers()) {
      s.buffer_names.push_back(b->name);
      s.buffers.push_back(host_copy(b->value));
    }
    writer.submit(file, std::move(s));
    last_checkpoint = Clock::now();
  };

  std::ofstream metrics;
  // An accuracy for the metrics file: --eval none measures none, so null, not 0.
  const auto acc = [measured = opt.eval != TrainOptions::Eval::kNone](auto v) {
    return measured ? nlohmann::json(v) : nlohmann::json(nullptr);
  };
  if (!opt.metrics_path.empty() && lead_process) {
    metrics.open(opt.metrics_path, opt.resume ? std::ios::app : std::ios::trunc);
    if (!metrics) throw InputError("--metrics " + opt.metrics_path + ": cannot open for writing");
  }

  std::unique_ptr<sampler::NeighborSampler> sampler;
  if (!opt.full_graph) {
    sampler = std::make_unique<sampler::NeighborSampler>(store.csr(), opt.fanouts, opt.sampling,
                                                         opt.model.edge_weights);
    for (Replica& r : replicas) {
      if (!r.dev.is_cuda()) continue;
      const UseDevice use(r.dev);
      // Features may take half of what the GPU budget (or 90% of the card) allows, the topology a
      // quarter (else the GPU sampler reads it from pinned host memory); the rest is for the
      // model, its activations and the batches' blocks.
      const uint64_t feature_bytes =
          opt.feature_gpu_bytes > 0 ? opt.feature_gpu_bytes : gpu_room(r.dev, opt.gpu_mem_budget) / 2;
      if (opt.gpu_sampler)
        r.gpu_batches = std::make_unique<GpuBatches>(store, r.dev, opt.fanouts,
                                                     GpuBatches::topology_room(r.dev, opt.gpu_mem_budget),
                                                     opt.sampling, opt.model.edge_weights);
      // Workers share one pinned host copy of the features; on a partitioned store each GPU's cache
      // holds its own parts' hot nodes first.
      std::vector<uint8_t> own;
      if (world > 1 && store.has_partition()) {
        const int rank = first_rank + static_cast<int>(&r - replicas.data());
        own.resize(static_cast<size_t>(n));
        for (int64_t v = 0; v < n; ++v) own[static_cast<size_t>(v)] = store.partition()[v] % world == rank;
      }
      r.batch_features = std::make_unique<BatchFeatures>(store, r.dev, feature_bytes, opt.match,
                                                         &r == &replicas[0] ? nullptr : replicas[0].batch_features.get(),
                                                         own.empty() ? nullptr : &own);
    }
  }
  const Replica& lead = replicas[0];
  // Eval::kAuto evaluates the whole graph at once when the features are all on the GPU (or this is
  // the CPU) and the whole graph's inference fits in half of what the GPU may hold beside them,
  // else layer by layer (engine/layerwise.hpp).
  const auto whole_graph_inference_fits = [&] {
    if (!lead.dev.is_cuda()) return true;
    if (lead.batch_features && !lead.batch_features->resident()) return false;
    return whole_graph_inference_bytes(n, store.num_edges(), store.feature_dim(), model.widest_dim(),
                                       attention ? std::max(1, opt.model.heads) : 0) <=
           gpu_room(lead.dev, opt.gpu_mem_budget) / 2;
  };
  const bool full_eval = opt.full_graph || opt.eval == TrainOptions::Eval::kFull ||
                         (opt.eval == TrainOptions::Eval::kAuto && whole_graph_inference_fits());

  // The whole graph, for full-graph training and full evaluation only (a graph that needs sampled
  // training may not fit on the device whole). Built on the host once, copied to the device once
  // (with the edge map only when attention needs it).
  std::optional<GraphOperand> full;
  Tensor all_features;
  auto full_graphs = [&]() {
    if (!full) full.emplace(GraphOperand(aggregation_csr(store, opt.model)).to(dev, attention));
    return std::vector<const GraphOperand*>(static_cast<size_t>(opt.model.layers), &*full);
  };
  auto features = [&]() -> const Tensor& {
    if (!all_features.defined()) {
      Tensor host = Tensor::empty(n, store.feature_dim());
      store.read_features(0, n, host.f32());
      all_features = host.to(dev);
    }
    return all_features;
  };
  const Tensor& labels_all = lead.labels_all;
  const Tensor train_rows = ids_tensor(train_ids, dev), valid_rows = ids_tensor(valid_ids, dev),
               test_rows = ids_tensor(test_ids, dev);

  // Sampled blocks of a batch of seeds as graph operands (each outer source's GCN norm from its
  // full-graph in-degree, weighted when the model is), still on the host.
  const std::vector<float> full_degree = !opt.full_graph && opt.model.edge_weights
                                             ? kernels::weighted_in_degree(store.csr())
                                             : std::vector<float>();
  auto prepare_blocks = [&](const Replica& r, PreparedBatch* p, const sampler::NeighborSampler& s, const int64_t* seeds,
                            int64_t len, uint64_t key) {
    p->batch = s.sample(seeds, len, key);
    for (const sampler::Block& block : p->batch.blocks)
      p->graphs.push_back(std::make_unique<GraphOperand>(block.csr(), block.src_ids.data(), store.indptr(),
                                                          /*with_transpose=*/true, full_degree.data()));
    if (!r.batch_features) {  // the CPU reads the features here, in parallel; a GPU gathers them later
      const auto& inputs = p->batch.input_nodes();
      p->features = Tensor::empty(static_cast<int64_t>(inputs.size()), store.feature_dim());
      store.read_feature_rows(inputs.data(), p->features.rows(), p->features.f32());
    }
  };
  // Training forward of a prepared batch on the replica's device (blocks copied there in order, on
  // the compute stream, or, sampled on the GPU, built there).
  auto forward_batch = [&](Replica& r, PreparedBatch* p, uint64_t key) {
    p->on_device.clear();
    if (r.gpu_batches && p->batch.blocks.empty()) {  // built by the load stage on the IO stream
      const Tensor x = p->x.take();                     // the compute stream waits for all of it here
      p->on_device = std::move(p->ops->graphs);
      p->seeds = std::move(p->ops->seeds);
      p->ops.reset();
      std::vector<const GraphOperand*> graphs;
      for (const auto& g : p->on_device) graphs.push_back(&g);
      return r.model->forward(graphs, x, /*training=*/true, key);
    }
    for (const auto& g : p->graphs) p->on_device.push_back(g->to(r.dev, attention));
    std::vector<const GraphOperand*> graphs;
    for (const auto& g : p->on_device) graphs.push_back(&g);
    const Tensor x = r.batch_features ? r.batch_features->load(p->batch.input_nodes()) : p->features.to(r.dev);
    return r.model->forward(graphs, x, /*training=*/true, key);
  };
  // Eval::kBatched: every node's logits by layer-wise inference (engine/layerwise.hpp), a chunk of
  // nodes at a time, sized on a GPU by what its budget leaves free when the evaluation starts; the
  // input features come through the batches' feature tiers.
  auto layerwise_eval_logits = [&]() {
    Replica& r = replicas[0];
    LayerwiseOptions lo;
    lo.attention = attention;
    if (r.dev.is_cuda())
      lo = layerwise_options_for(gpu_room_left(r.dev, opt.gpu_mem_budget), model.widest_dim(), attention);
    const InputRows input_rows = [&](const std::vector<int64_t>& ids) {
      if (r.batch_features) return r.batch_features->load(ids);
      Tensor host = Tensor::empty(static_cast<int64_t>(ids.size()), store.feature_dim());
      store.read_feature_rows(ids.data(), host.rows(), host.f32());
      return host.to(r.dev);
    };
    return layerwise_logits(*r.model, store, input_rows, lo);
  };

  // Several workers on a partitioned store draw their seeds from their own parts (balanced pools),
  // so a worker's batches share neighbours; otherwise each step is sliced across them.
  const bool by_partition = world > 1 && !opt.full_graph && store.has_partition();
  const std::vector<std::vector<int64_t>> seed_pools =
      by_partition ? scheduler::balance_seed_pools(train_ids, store.partition(), world)
                   : std::vector<std::vector<int64_t>>();
  auto epoch_plan = [&](int64_t epoch, int rank) {
    return by_partition ? scheduler::EpochPlan(seed_pools, opt.batch_size, opt.seed, epoch, rank)
                        : scheduler::EpochPlan(train_ids, opt.batch_size, opt.seed, epoch, world, rank);
  };

  // One worker's mini-batch epoch: its share of the epoch's steps through its own pipeline; the
  // gradients are summed over the workers as backward produces them.
  // A resumed epoch starts at first_batch with this worker's losses of the batches before it:
  // adding on to that sum in the same order keeps the epoch's loss bit for bit.
  auto worker_epoch = [&](int local, int64_t epoch, uint64_t epoch_key, int64_t first_batch, double loss_sum) {
    Replica& r = replicas[static_cast<size_t>(local)];
    const UseDevice use(r.dev);
    const auto t0 = Clock::now();
    WorkerEpoch out;
    out.loss_sum = loss_sum;
    const scheduler::EpochPlan plan = epoch_plan(epoch, first_rank + local);
    IoTimer io_timer(r.dev);
    Tensor batch_rows;  // 0, 1, ..., batch_size - 1: every logits row of a batch is a seed
    // Each step's mean loss and hit count (16 bytes per step), read once after the epoch: a step
    // never waits for the device, so the host queues the next while the GPU runs this one.
    Tensor step_losses = Tensor::empty(std::max<int64_t>(1, plan.num_batches()) * 16, 1, DType::kU8, r.dev);
    // sum + the per-seed losses of batches [from, to), added in plan order (the epoch's loss, and
    // with it a resumed epoch's, depends on that order).
    auto add_losses = [&](const Tensor& losses_on_device, double sum, int64_t from, int64_t to) {
      const Tensor losses = losses_on_device.to(Device::cpu());
      for (int64_t b = from; b < to; ++b) {
        if (plan.batch_length(b) == 0) continue;
        double loss;
        std::memcpy(&loss, losses.data<unsigned char>() + 16 * b, sizeof loss);
        sum += loss * static_cast<double>(plan.batch_length(b));
      }
      return sum;
    };
    const auto by_layer = r.model->parameters_by_layer();
    // Gradients travel in buckets of at least kBucketBytes, filled layer by layer as backward
    // finishes them (last layer first) and sent as soon as full, so a deep or wide model's sums
    // overlap the rest of its backward; the rest goes after backward. Every worker forms the same
    // buckets (they depend only on the parameters' sizes), so the calls match. A bucket is one
    // NCCL group call: fewer, larger sums wait for the other workers fewer times per step
    // (measured on 2 H200s, R-MAT 23: one sum per layer spent 0.19 s per epoch in NCCL).
    constexpr size_t kBucketBytes = size_t{4} << 20;
    std::vector<Tensor*> bucket;
    size_t bucket_bytes = 0;
    auto flush = [&] {
      if (bucket.empty()) return;
      const auto t_sum = Clock::now();
      r.comm->all_reduce_sum(bucket);
      out.allreduce_host_s += since(t_sum);
      bucket.clear();
      bucket_bytes = 0;
    };
    auto sum_layer = [&](const std::vector<Parameter*>& params) {
      for (Parameter* p : params) {
        bucket.push_back(&p->grad);
        bucket_bytes += p->grad.nbytes();
      }
      if (bucket_bytes >= kBucketBytes) flush();
    };
    // Several workers stop between steps only together, after the same step: each adds its stop
    // flag, and the run's first worker whether an interval checkpoint is due, to the step's gradient
    // sums ([stop, checkpoint], one more tensor in the last bucket). Every worker reads the sums
    // kVoteLag steps later (the copy long done, so the host never waits for the device) and ends
    // its pipeline after that step if either is not zero. The sums are the same bits everywhere,
    // so every worker ends after the same step; the trainer then stops, or checkpoints and goes
    // on with the epoch from there (as a resumed run would).
    // GALE_VOTE_LAG overrides the lag, for measuring what the bound on the host's run-ahead costs.
    static const int64_t kVoteLag = [] {
      const char* env = std::getenv("GALE_VOTE_LAG");
      return env != nullptr && std::atoll(env) > 0 ? static_cast<int64_t>(std::atoll(env)) : int64_t{2};
    }();
    const bool votes = r.comm != nullptr && step_stops;
    const bool votes_checkpoints = votes && lead_process && local == 0 && opt.checkpoint_interval_s > 0;
    std::atomic<int> agreed{0};
    std::optional<LaggedReads> vote_reads;
    std::vector<Tensor> vote_sums(static_cast<size_t>(kVoteLag + 1));
    Tensor vote_values[4];  // [stop, checkpoint] for index stop + 2 * checkpoint, copied on the device
    if (votes) {
      vote_reads.emplace(r.dev, static_cast<int>(kVoteLag + 1), 2);
      for (Tensor& v : vote_sums) v = Tensor::empty(1, 2, DType::kF32, r.dev);
      for (int i = 0; i < 4; ++i) {
        const float value[2] = {static_cast<float>(i & 1), static_cast<float>(i >> 1)};
        vote_values[i] = Tensor::from_host(value, 1, 2, DType::kF32, r.dev);
      }
    }
    out.times = scheduler::run_batch_pipeline<std::unique_ptr<PreparedBatch>>(
        plan.num_batches(), opt.prefetch,
        static_cast<int>(std::min<int64_t>(opt.reorder_window, std::max<int64_t>(1, plan.num_batches()))),  // a window past the epoch is the epoch
        [&](int64_t b) {
          const UseDevice use_here(r.dev);
          auto p = std::make_unique<PreparedBatch>();
          const int64_t len = plan.batch_length(b);
          if (len == 0) return p;  // a worker without seeds in the last step only joins the sums
          const uint64_t key = kernels::derive_key(epoch_key, static_cast<uint64_t>(b));
          if (r.gpu_batches) {  // the node sets leave the GPU only for the match-reorder window
            p->gpu = r.gpu_batches->sample(plan.batch(b), len, key, opt.reorder_window > 1);
            return p;
          }
          prepare_blocks(r, p.get(), *sampler, plan.batch(b), len, key);
          p->labels.resize(static_cast<size_t>(len));
          for (int64_t i = 0; i < len; ++i) p->labels[i] = labels[plan.batch(b)[i]];
          return p;
        },
        [&](const std::unique_ptr<PreparedBatch>& p) -> const std::vector<int64_t>& {
          static const std::vector<int64_t> none;  // a worker's empty slice
          if (r.gpu_batches) return p->gpu.input_nodes_host();
          return p->batch.blocks.empty() ? none : p->batch.input_nodes();
        },
        [&](int64_t b, std::unique_ptr<PreparedBatch>& p) {  // in training order, ahead of the step
          if (!r.gpu_batches || plan.batch_length(b) == 0) return;
          const UseDevice use_here(r.dev);
          io_timer.begin();
          p->ops = r.gpu_batches->operands(p->gpu, attention);
          p->x = r.batch_features->load_async(p->ops->input_nodes);
          io_timer.end();
        },
        [&](int64_t b, std::unique_ptr<PreparedBatch>& p) {
          const UseDevice use_here(r.dev);
          r.model->zero_grad();
          const int64_t len = plan.batch_length(b);
          if (len > 0) {
            Tensor logits =
                forward_batch(r, p.get(), kernels::derive_key(epoch_key ^ 0xb47c4ULL, static_cast<uint64_t>(b)));
            if (!batch_rows.defined() || batch_rows.rows() < len) {
              std::vector<int64_t> rows(static_cast<size_t>(std::max(len, opt.batch_size)));
              for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
              batch_rows = ids_tensor(rows, r.dev);
            }
            Tensor grad = Tensor::empty(len, logits.cols(), DType::kF32, r.dev);
            const Tensor batch_labels = p->seeds.defined()
                                            ? ops::gather_rows(r.labels_all, p->seeds)
                                            : Tensor::from_host(p->labels.data(), len, 1, DType::kI32, r.dev);
            ops::softmax_cross_entropy_async(logits, batch_labels, batch_rows.rows_slice(0, len), &grad, &step_losses, b);
            out.seeds += len;
            logits = Tensor();
            // The loss of a step is the mean over every worker's seeds: weigh this worker's mean.
            const int64_t step = plan.step_length(b);
            if (step != len) ops::axpy(grad, static_cast<float>(len) / static_cast<float>(step) - 1.0f, &grad);
            r.model->backward(std::move(grad), r.comm ? Model::GradHook(sum_layer) : Model::GradHook());
          } else {
            for (size_t l = by_layer.size(); l-- > 0;) sum_layer(by_layer[l]);  // the same sums, of zeros
          }
          const int slot = static_cast<int>(b % (kVoteLag + 1));
          if (votes) {
            const bool stop = opt.stop != nullptr && opt.stop->load() != 0;
            const bool due = votes_checkpoints && since(last_checkpoint) >= opt.checkpoint_interval_s;
            ops::copy(vote_values[(stop ? 1 : 0) + (due ? 2 : 0)], &vote_sums[static_cast<size_t>(slot)]);
            bucket.push_back(&vote_sums[static_cast<size_t>(slot)]);
          }
          if (r.comm) {
            flush();
            r.comm->wait();
          }
          if (votes) {
            vote_reads->copy(slot, vote_sums[static_cast<size_t>(slot)]);
            if (b - kVoteLag >= first_batch && b + 1 < plan.num_batches()) {
              const auto t_read = Clock::now();
              const float* sums = vote_reads->read(static_cast<int>((b - kVoteLag) % (kVoteLag + 1)));
              out.vote_wait_s += since(t_read);
              if (sums[0] > 0.0f || sums[1] > 0.0f) {
                out.checkpoint_break = sums[0] == 0.0f;
                agreed.store(1);
              }
            }
          }
          r.adam->step();
          if (local == 0 && opt.on_step) opt.on_step(epoch, b, plan.num_batches());
          if (opt.checkpoint_interval_s > 0 && !r.comm && b + 1 < plan.num_batches() &&
              since(last_checkpoint) >= opt.checkpoint_interval_s)
            save(ckpt_dir / "latest.ckpt", epoch - 1, b + 1, {add_losses(step_losses, loss_sum, first_batch, b + 1)});
        },
        scheduler::PipelineRange{first_batch, !step_stops ? nullptr : votes ? &agreed : opt.stop});
    out.loss_sum = add_losses(step_losses, out.loss_sum, first_batch, out.times.consumed_end);
    if (r.batch_features) out.features = r.batch_features->take_stats();
    out.io_s = io_timer.take_seconds();
    if (r.comm) out.allreduce_s = r.comm->take_seconds();
    synchronize(r.dev);
    out.wall_s = since(t0);
    if (r.comm) {
      // Every worker's counts to every worker (rank 0 reports them), and with --check-replicas
      // each one's weight checksum after the record.
      out.stop = opt.stop ? opt.stop->load() : 0;
      std::vector<uint64_t> mine = out.record();
      if (opt.check_replicas) mine.push_back(parameter_checksum(*r.model));
      out.everyone = r.comm->all_gather(mine);
      if (opt.check_replicas) {
        const size_t words = mine.size();
        for (int w = 1; w < world; ++w) {
          if (out.everyone[w * words + words - 1] != out.everyone[words - 1])
            throw InternalError("--check-replicas: after epoch " + std::to_string(epoch + 1) + " worker " +
                                std::to_string(w) + "'s weights differ from worker 0's");
        }
        out.checksum = out.everyone[words - 1];
      }
    }
    return out;
  };

  // Early stopping: `epoch` has gone opt.patience epochs past the last rise of the best accuracy.
  const auto patience_spent = [&](int64_t epoch) {
    return opt.patience > 0 && result.improved_epoch >= 0 && epoch - result.improved_epoch >= opt.patience;
  };
  result.epochs_done = start_epoch;
  // A resumed run that had already stopped early (after a whole epoch) trains no more.
  result.stopped_early = resume_batch == 0 && start_epoch < opt.epochs && patience_spent(start_epoch - 1);
  for (int64_t epoch = start_epoch; epoch < opt.epochs && !result.stopped_early; ++epoch) {
    const auto t_epoch = Clock::now();
    EpochMetrics m;
    m.epoch = epoch;
    m.epochs = opt.epochs;
    m.lr = scheduled_lr(opt.lr_schedule, opt.lr, epoch, opt.epochs, result.lr_reductions);
    for (Replica& r : replicas) r.adam->set_lr(static_cast<float>(m.lr));
    const uint64_t epoch_key = kernels::derive_key(opt.seed, static_cast<uint64_t>(epoch));
    const int64_t first_batch = epoch == start_epoch ? resume_batch : 0;
    int stop_signal = 0;  // agreed by every worker after a mini-batch epoch with several of them

    for (const Replica& r : replicas) reset_gpu_peak(r.dev);
    GpuAllocationCounts allocations_before;
    for (const Replica& r : replicas) {
      const GpuAllocationCounts c = gpu_allocation_counts(r.dev);
      allocations_before.calls += c.calls;
      allocations_before.reused += c.reused;
    }
    if (opt.full_graph) {
      const Tensor& x = features();
      const auto t0 = Clock::now();
      model.zero_grad();
      Tensor logits = model.forward(full_graphs(), x, /*training=*/true, epoch_key);
      Tensor grad = Tensor::empty(logits.rows(), logits.cols(), DType::kF32, dev);
      m.loss = ops::softmax_cross_entropy(logits, labels_all, train_rows, &grad).loss;
      logits = Tensor();
      model.backward(std::move(grad));
      adam.step();
      synchronize(dev);
      m.compute_s = since(t0);
      m.batches = 1;
    } else {
      // Every worker runs its epoch on its own thread (rank 0 on this one). A worker that fails
      // aborts the group, so the others stop at their next sum instead of waiting for it forever.
      // Several workers run it in segments when they agree on an interval checkpoint: each segment
      // ends after the same step, the checkpoint is written, and the next goes on from there with
      // each worker's loss sum so far, exactly as a run resumed from that checkpoint would.
      std::vector<WorkerEpoch> done(static_cast<size_t>(workers));
      int64_t segment_first = first_batch;
      // Each worker rank's sum of the losses before segment_first (a resumed epoch's from the checkpoint).
      std::vector<double> priors(static_cast<size_t>(world), 0.0);
      if (epoch == start_epoch && !resume_loss_sums.empty()) priors = resume_loss_sums;
      std::vector<int64_t> rank_seeds(static_cast<size_t>(world), 0);
      std::vector<double> rank_wall(static_cast<size_t>(world), 0.0), rank_allreduce(static_cast<size_t>(world), 0.0);
      std::vector<double> worker_loss_sums;  // by rank, over the epoch so far
      m.batches = epoch_plan(epoch, 0).num_batches();
      for (;;) {
        std::vector<std::exception_ptr> failed(static_cast<size_t>(workers));
        std::atomic<int> first_failure{-1};  // set before the abort, so the cause wins over its echoes
        auto run = [&](int w) {
          Replica& r = replicas[static_cast<size_t>(w)];
          try {
            done[static_cast<size_t>(w)] =
                worker_epoch(w, epoch, epoch_key, segment_first, priors[static_cast<size_t>(first_rank + w)]);
          } catch (const std::exception& e) {
            failed[static_cast<size_t>(w)] = std::current_exception();
            int none = -1;
            first_failure.compare_exchange_strong(none, w);
            if (r.comm)
              r.comm->abort("stopped because worker " + std::to_string(first_rank + w) + " (" + r.dev.name() + ") failed: " + e.what());
          }
        };
        std::vector<std::thread> pool;
        for (int w = 1; w < workers; ++w) pool.emplace_back(run, w);
        run(0);
        for (std::thread& t : pool) t.join();
        if (const int w = first_failure.load(); w >= 0) {
          if (workers == 1) std::rethrow_exception(failed[0]);
          const std::string where =
              "worker " + std::to_string(first_rank + w) + " (" + replicas[static_cast<size_t>(w)].dev.name() + "): ";
          try {
            std::rethrow_exception(failed[static_cast<size_t>(w)]);
          } catch (const Error& e) {
            throw Error(where + e.what(), e.code());
          } catch (const std::exception& e) {
            throw InternalError(where + e.what());
          }
        }
        const WorkerEpoch& w0 = done[0];
        // Every worker of the run (the records gathered after the segment), or the only one.
        const std::vector<uint64_t> records = w0.everyone.empty() ? w0.record() : w0.everyone;
        const size_t words = records.size() / static_cast<size_t>(world);
        worker_loss_sums.clear();
        for (int w = 0; w < world; ++w) {
          const uint64_t* rec = records.data() + static_cast<size_t>(w) * words;
          worker_loss_sums.push_back(double_bits(rec[0]));  // each worker's sum goes on from its prior
          rank_seeds[static_cast<size_t>(w)] += static_cast<int64_t>(rec[1]);
          rank_wall[static_cast<size_t>(w)] += double_bits(rec[2]);
          m.feature_rows += static_cast<int64_t>(rec[3]);
          m.rows_previous += static_cast<int64_t>(rec[4]);
          m.rows_device += static_cast<int64_t>(rec[5]);
          m.rows_cache += static_cast<int64_t>(rec[6]);
          m.rows_host += static_cast<int64_t>(rec[7]);
          m.host_to_gpu_bytes += static_cast<int64_t>(rec[8]);
          m.input_nodes += static_cast<int64_t>(rec[9]);
          m.reused_nodes += static_cast<int64_t>(rec[10]);
          m.reused_nodes_sampled_order += static_cast<int64_t>(rec[11]);
          rank_allreduce[static_cast<size_t>(w)] += double_bits(rec[12]);
          stop_signal = std::max(stop_signal, static_cast<int>(rec[13]));
        }
        m.sample_s += w0.times.prepare_s;
        m.io_s += w0.io_s;
        m.compute_s += w0.times.consume_s;
        m.wait_s += w0.times.wait_s;
        m.allreduce_s += w0.allreduce_s;
        m.allreduce_host_s += w0.allreduce_host_s;
        m.vote_wait_s += w0.vote_wait_s;
        m.reorder_s += w0.times.reorder_s;
        m.replica_checksum = w0.checksum;
        const int64_t end = w0.times.consumed_end;
        if (end >= m.batches) break;
        // Ended between steps (step_stops), every worker after the same one.
        if (!opt.checkpoint_dir.empty() && lead_process) save(ckpt_dir / "latest.ckpt", epoch - 1, end, worker_loss_sums);
        if (w0.checkpoint_break) {  // an agreed interval checkpoint: the epoch goes on
          segment_first = end;
          priors = worker_loss_sums;
          continue;
        }
        // With several processes the signal may have reached another one only.
        result.stop_signal = std::max(stop_signal, opt.stop != nullptr ? opt.stop->load() : 0);
        result.stopped_epoch = epoch;
        result.stopped_batches = end;
        result.stopped_of = m.batches;
        writer.wait();
        return result;
      }
      double loss_sum = 0;
      for (int w = 0; w < world; ++w) {
        loss_sum += worker_loss_sums[static_cast<size_t>(w)];
        const double wall = rank_wall[static_cast<size_t>(w)];
        m.worker_seeds_per_s.push_back(wall > 0 ? static_cast<double>(rank_seeds[static_cast<size_t>(w)]) / wall : 0.0);
        m.worker_allreduce_s.push_back(rank_allreduce[static_cast<size_t>(w)]);
      }
      m.loss = loss_sum / static_cast<double>(train_ids.size());
      if (m.input_nodes == 0) {  // GPU-sampled without a window: the node sets never left the GPU
        m.input_nodes = m.feature_rows;
        m.reused_nodes = m.reused_nodes_sampled_order = m.rows_previous;
      }
    }

    // Evaluation in inference mode (no dropout), full-neighbourhood, on worker 0 (every replica
    // holds the same weights): over the whole graph at once, or layer by layer over chunks of
    // nodes when the graph's features do not all fit on the GPU.
    const auto t_eval = Clock::now();
    if (opt.eval == TrainOptions::Eval::kNone) {
      // No evaluation: the accuracies stay 0 and the last epoch counts as the best.
    } else if (full_eval) {
      Tensor logits = model.forward(full_graphs(), features(), /*training=*/false, 0);
      m.train_acc = accuracy(logits, labels_all, train_rows);
      m.valid_acc = accuracy(logits, labels_all, valid_rows);
      m.test_acc = accuracy(logits, labels_all, test_rows);
    } else {
      const Tensor logits = layerwise_eval_logits();  // on the host
      const Tensor labels_host = Tensor::from_host(labels, n, 1, DType::kI32, Device::cpu());
      m.train_acc = accuracy(logits, labels_host, ids_tensor(train_ids, Device::cpu()));
      m.valid_acc = accuracy(logits, labels_host, ids_tensor(valid_ids, Device::cpu()));
      m.test_acc = accuracy(logits, labels_host, ids_tensor(test_ids, Device::cpu()));
      if (lead.batch_features) replicas[0].batch_features->take_stats();  // evaluation's reads are not the epoch's
    }
    m.eval_s = since(t_eval);
    for (const Replica& r : replicas) {
      m.gpu_peak_bytes = std::max(m.gpu_peak_bytes, gpu_peak_bytes(r.dev));
      const GpuAllocationCounts c = gpu_allocation_counts(r.dev);
      m.gpu_allocations += c.calls;
      m.gpu_allocations_reused += c.reused;
    }
    m.gpu_allocations -= allocations_before.calls;
    m.gpu_allocations_reused -= allocations_before.reused;
    // Ties go to the later epoch, as in PyG's reference script (`va >= best_val`).
    const double select = valid_ids.empty() ? m.train_acc : m.valid_acc;
    if (select > result.best_valid_acc) result.improved_epoch = epoch;
    // Every process evaluates its own replica; rank 0's bookkeeping holds for all, so that a
    // last-bit difference in another's accuracy cannot set its rate or its stop apart.
    if (procs.distributed() && (opt.patience > 0 || opt.lr_schedule.kind == LrSchedule::Kind::kPlateau))
      procs.broadcast(&result.improved_epoch, sizeof result.improved_epoch, "agreeing on the best epoch");
    if (opt.lr_schedule.kind == LrSchedule::Kind::kPlateau &&
        epoch - std::max(result.improved_epoch, result.lr_reduced_epoch) > opt.lr_schedule.epochs) {
      ++result.lr_reductions;
      result.lr_reduced_epoch = epoch;
    }
    if (select >= result.best_valid_acc) {
      result.best_valid_acc = select;
      result.test_acc_at_best_valid = m.test_acc;
      result.best_epoch = epoch;
      if (!opt.checkpoint_dir.empty() && lead_process) save(ckpt_dir / "best.ckpt", epoch);
    }
    m.epoch_s = since(t_epoch);
    if (!opt.checkpoint_dir.empty() && lead_process) save(ckpt_dir / "latest.ckpt", epoch);

    if (metrics.is_open()) {
      char lr_text[32];  // the rate is a float: its 7 significant digits, not a double's 17
      std::snprintf(lr_text, sizeof lr_text, "%.7g", m.lr);
      nlohmann::json j = {{"epoch", epoch},          {"loss", m.loss},         {"lr", std::strtod(lr_text, nullptr)},
                          {"train_acc", acc(m.train_acc)},
                          {"valid_acc", acc(m.valid_acc)}, {"test_acc", acc(m.test_acc)}, {"epoch_s", m.epoch_s},
                          {"sample_s", m.sample_s},   {"io_s", m.io_s},           {"compute_s", m.compute_s},
                          {"wait_s", m.wait_s},
                          {"eval_s", m.eval_s},       {"batches", m.batches}};
      if (devices[0].is_cuda()) {
        j["gpu_peak_bytes"] = m.gpu_peak_bytes;
        j["gpu_allocations"] = {{"calls", m.gpu_allocations}, {"reused", m.gpu_allocations_reused}};
      }
      if (!opt.full_graph) {
        j["input_nodes"] = m.input_nodes;
        j["reused_nodes"] = m.reused_nodes;
        j["reused_nodes_sampled_order"] = m.reused_nodes_sampled_order;
        j["reorder_s"] = m.reorder_s;
        j["worker_seeds_per_s"] = m.worker_seeds_per_s;
      }
      if (world > 1) {
        j["workers"] = world;
        if (procs.distributed()) j["processes"] = procs.size();
        j["seed_split"] = by_partition ? "partitions" : "slices";
        j["allreduce_s"] = m.allreduce_s;
        j["worker_allreduce_s"] = m.worker_allreduce_s;
        j["allreduce_host_s"] = m.allreduce_host_s;
        j["vote_wait_s"] = m.vote_wait_s;
        if (opt.check_replicas) j["replica_checksum"] = m.replica_checksum;
      }
      if (lead.batch_features) {
        j["feature_rows"] = {{"total", m.feature_rows}, {"previous_batch", m.rows_previous}, {"gpu", m.rows_device},
                             {"gpu_cache", m.rows_cache}, {"host", m.rows_host}};
        j["host_to_gpu_bytes"] = m.host_to_gpu_bytes;
        j["placement"] = lead.batch_features->describe() +
                         (lead.gpu_batches ? "; " + lead.gpu_batches->describe() : "; CPU sampler");
      }
      metrics << j.dump() << '\n';
      metrics.flush();
      if (!metrics) throw ResourceError("--metrics " + opt.metrics_path + ": cannot write (disk full?)");
    }
    result.last = m;
    ++result.epochs_run;
    result.epochs_done = epoch + 1;
    if (on_epoch && lead_process) on_epoch(m);
    if (world == 1 && opt.stop) stop_signal = opt.stop->load();
    if (stop_signal != 0 && epoch + 1 < opt.epochs) {
      result.stop_signal = stop_signal;
      result.stopped_epoch = epoch;
      result.stopped_batches = result.stopped_of = m.batches;
      writer.wait();
      return result;
    }
    if (epoch + 1 < opt.epochs && patience_spent(epoch)) result.stopped_early = true;
  }

  if (metrics.is_open()) {
    nlohmann::json j = {{"final", true},
                        {"best_valid_acc", acc(result.best_valid_acc)},
                        {"test_acc_at_best_valid", acc(result.test_acc_at_best_valid)},
                        {"best_epoch", acc(result.best_epoch)},
                        {"epochs", opt.epochs},
                        {"epochs_trained", result.epochs_done},
                        {"stopped_early", result.stopped_early}};
    metrics << j.dump() << '\n';
    metrics.flush();
    if (!metrics) throw ResourceError("--metrics " + opt.metrics_path + ": cannot write (disk full?)");
  }
  writer.wait();
  return result;
}

}  // namespace gale::engine
