#include "engine/train/metrics_log.hpp"

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <utility>

#include "engine/devices.hpp"
#include "kernels/error.hpp"

namespace gale::engine::train_parts {

namespace {

// An accuracy for the metrics file: --eval none measures none, so null, not 0.
template <typename T>
nlohmann::json accuracy(const TrainOptions& opt, T value) {
  return opt.eval != TrainOptions::Eval::kNone ? nlohmann::json(value) : nlohmann::json(nullptr);
}

// Every worker's seconds by stage: one list per stage, in rank order (as worker_seeds_per_s).
nlohmann::json worker_stages(const std::vector<WorkerStageSeconds>& workers) {
  const std::pair<const char*, double WorkerStageSeconds::*> stages[] = {
      {"prepare", &WorkerStageSeconds::prepare_s},     {"host_features", &WorkerStageSeconds::host_features_s},
      {"gpu_sample", &WorkerStageSeconds::gpu_sample_s},
      {"load", &WorkerStageSeconds::load_s},           {"io", &WorkerStageSeconds::io_s},
      {"compute", &WorkerStageSeconds::compute_s},     {"wait", &WorkerStageSeconds::wait_s},
      {"reorder", &WorkerStageSeconds::reorder_s},     {"allreduce", &WorkerStageSeconds::allreduce_s},
      {"allreduce_host", &WorkerStageSeconds::allreduce_host_s}, {"vote_wait", &WorkerStageSeconds::vote_wait_s},
      {"sum_wait", &WorkerStageSeconds::sum_wait_s},   {"fill", &WorkerStageSeconds::fill_s},
      {"drain", &WorkerStageSeconds::drain_s},
      {"wall", &WorkerStageSeconds::wall_s}};
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, field] : stages) {
    nlohmann::json values = nlohmann::json::array();
    for (const WorkerStageSeconds& w : workers) values.push_back(w.*field);
    j[name] = std::move(values);
  }
  return j;
}

}  // namespace

MetricsLog::MetricsLog(const TrainRun& run) : run_(run) {
  const TrainOptions& opt = run.opt();
  if (opt.metrics_path.empty() || !run.lead_process()) return;
  out_.open(opt.metrics_path, opt.resume ? std::ios::app : std::ios::trunc);
  if (!out_) throw InputError("--metrics " + opt.metrics_path + ": cannot open for writing");
}

void MetricsLog::epoch(const EpochMetrics& m, const FeaturePlacement& placement) {
  if (!out_.is_open()) return;
  const TrainOptions& opt = run_.opt();
  char lr_text[32];  // the rate is a float: its 7 significant digits, not a double's 17
  std::snprintf(lr_text, sizeof lr_text, "%.7g", m.lr);
  nlohmann::json j = {{"epoch", m.epoch},          {"loss", m.loss},         {"lr", std::strtod(lr_text, nullptr)},
                      {"train_acc", accuracy(opt, m.train_acc)},
                      {"valid_acc", accuracy(opt, m.valid_acc)}, {"test_acc", accuracy(opt, m.test_acc)}, {"epoch_s", m.epoch_s},
                      {"sample_s", m.sample_s},   {"io_s", m.io_s},           {"compute_s", m.compute_s},
                      {"wait_s", m.wait_s},
                      {"eval_s", m.eval_s},       {"batches", m.batches}};
  if (run_.lead_device().is_cuda()) {
    j["gpu_peak_bytes"] = m.gpu_peak_bytes;
    j["gpu_allocations"] = {{"calls", m.gpu_allocations}, {"reused", m.gpu_allocations_reused}};
    j["kernel_loading"] = kernel_loading();
  }
  if (!opt.full_graph) {
    j["input_nodes"] = m.input_nodes;
    j["reused_nodes"] = m.reused_nodes;
    j["reused_nodes_sampled_order"] = m.reused_nodes_sampled_order;
    j["reorder_s"] = m.reorder_s;
    j["worker_seeds_per_s"] = m.worker_seeds_per_s;
    j["worker_stage_s"] = worker_stages(m.worker_stages);
    j["worker_threads"] = placement.worker_threads;
    if (!placement.worker_cpus.empty()) j["worker_cpus"] = placement.worker_cpus;
  }
  if (run_.world() > 1) {
    j["workers"] = run_.world();
    if (run_.procs().distributed()) j["processes"] = run_.procs().size();
    j["seed_split"] = run_.seeds_by_partition() ? "partitions" : "slices";
    j["allreduce_s"] = m.allreduce_s;
    j["worker_allreduce_s"] = m.worker_allreduce_s;
    j["allreduce_host_s"] = m.allreduce_host_s;
    j["vote_wait_s"] = m.vote_wait_s;
    if (opt.check_replicas) j["replica_checksum"] = m.replica_checksum;
  }
  if (placement.tiers) {
    j["feature_rows"] = {{"total", m.feature_rows}, {"previous_batch", m.rows_previous}, {"gpu", m.rows_device},
                         {"gpu_cache", m.rows_cache}, {"host", m.rows_host}};
    j["host_to_gpu_bytes"] = m.host_to_gpu_bytes;
    j["placement"] = placement.description;
  }
  if (placement.disk) {
    j["features"] = "disk";
    j["placement"] = placement.description;
    j["disk_rows"] = m.disk_rows;
    j["host_cache_hits"] = m.host_cache_hits;
    j["disk_bytes_read"] = m.disk_bytes_read;
    j["useful_disk_bytes"] = m.useful_disk_bytes;
    j["disk_read_s"] = m.disk_read_s;
    j["disk_read_requests"] = m.disk_read_requests;
    j["needed_disk_bytes"] = m.needed_disk_bytes;
    j["read_ahead_hits"] = m.read_ahead_hits;
    j["read_ahead_windows"] = m.read_ahead_windows;
    j["read_ahead_wait_s"] = m.read_ahead_wait_s;
    j["read_ahead_sample_s"] = m.read_ahead_sample_s;
    j["read_ahead_reader_idle_s"] = m.read_ahead_reader_idle_s;
    j["read_ahead_reader_held_s"] = m.read_ahead_reader_held_s;
  }
  if (!m.spmm_choices.empty()) {
    nlohmann::json choice = nlohmann::json::object();
    for (const SpmmAutoChoice& c : m.spmm_choices) choice[c.key()] = kernels::spmm_kind_name(c.kind);
    j["spmm_choice"] = choice;
  }
  write(j.dump());
}

void MetricsLog::final(const TrainResult& result) {
  if (!out_.is_open()) return;
  const TrainOptions& opt = run_.opt();
  nlohmann::json j = {{"final", true},
                      {"best_valid_acc", accuracy(opt, result.best_valid_acc)},
                      {"test_acc_at_best_valid", accuracy(opt, result.test_acc_at_best_valid)},
                      {"best_epoch", accuracy(opt, result.best_epoch)},
                      {"epochs", opt.epochs},
                      {"epochs_trained", result.epochs_done},
                      {"stopped_early", result.stopped_early}};
  write(j.dump());
}

void MetricsLog::write(const std::string& line) {
  out_ << line << '\n';
  out_.flush();
  if (!out_) throw ResourceError("--metrics " + run_.opt().metrics_path + ": cannot write (disk full?)");
}

}  // namespace gale::engine::train_parts
