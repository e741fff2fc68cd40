// tests/training/resume_checks.hpp — the never-lose-work checks that the CPU resume tests
// (resume_test.cpp) and the multi-GPU tests (tests/gpu/multi_gpu_test.cpp) share: a run stopped on
// request and resumed ends where a straight run ends, and interval checkpoints change nothing and
// survive a death inside an epoch. Both compare checkpoints byte for byte and losses exactly, so
// the options they are given must train deterministically (TrainOptions::deterministic, and on a
// GPU the CPU sampler).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/checkpoint.hpp"
#include "engine/trainer.hpp"
#include "tests/training/cora_store.hpp"

namespace gale::testing {

namespace fs = std::filesystem;
using engine::CheckpointState;
using engine::load_checkpoint;
using engine::train;
using engine::TrainOptions;
using engine::TrainResult;

inline std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("gale-resume-" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// One field of every line of a metrics file that has it.
inline std::vector<double> metric_column(const fs::path& file, const std::string& key) {
  std::vector<double> values;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains(key)) values.push_back(j.at(key).get<double>());
  }
  return values;
}

// Trains `o` for 4 epochs straight, then again with a stop requested by `arm` (given the flag),
// resumes the stopped run, and expects the same final checkpoint, loss and metrics lines.
template <typename Arm>
TrainResult check_stop_and_resume(TrainOptions o, const std::string& name, Arm&& arm) {
  o.store = testing::cora_store();
  o.deterministic = true;
  o.epochs = 4;
  const fs::path straight = fresh_dir(name + "-straight"), stopped = fresh_dir(name + "-stopped");
  o.checkpoint_dir = straight.string();
  o.metrics_path = (straight / "metrics.jsonl").string();
  const TrainResult a = train(o);

  std::atomic<int> stop{0};
  o.checkpoint_dir = stopped.string();
  o.metrics_path = (stopped / "metrics.jsonl").string();
  o.stop = &stop;
  TrainOptions first = o;
  arm(first, stop);
  const TrainResult s = train(first);
  EXPECT_EQ(s.stop_signal, SIGINT);

  stop.store(0);
  o.resume = true;
  int64_t resumed_epochs = -1, resumed_batches = -1;
  o.on_resume = [&](int64_t epochs_done, int64_t batches_done) {
    resumed_epochs = epochs_done;
    resumed_batches = batches_done;
  };
  const TrainResult b = train(o);
  EXPECT_EQ(b.stop_signal, 0);
  const bool inside = s.stopped_batches < s.stopped_of;  // else it stopped after the epoch
  EXPECT_EQ(resumed_epochs, inside ? s.stopped_epoch : s.stopped_epoch + 1);
  EXPECT_EQ(resumed_batches, inside ? s.stopped_batches : 0);
  EXPECT_EQ(a.last.loss, b.last.loss);
  EXPECT_EQ(a.best_valid_acc, b.best_valid_acc);
  const std::string x = read_bytes(straight / "latest.ckpt"), y = read_bytes(stopped / "latest.ckpt");
  EXPECT_FALSE(x.empty());
  EXPECT_TRUE(x == y) << "checkpoints after 4 epochs differ";
  // Every epoch has one line, the stopped one included (written when it completed), with the
  // same loss, and the run one final line.
  EXPECT_EQ(metric_column(straight / "metrics.jsonl", "loss"), metric_column(stopped / "metrics.jsonl", "loss"));
  EXPECT_EQ(metric_column(straight / "metrics.jsonl", "epoch").size(), 4u);
  EXPECT_EQ(metric_column(stopped / "metrics.jsonl", "epoch").size(), 4u);
  return s;
}

// Interval checkpoints (an interval of ~0: due at every step) on Cora for 3 epochs: training ends
// exactly where it ends without them (final checkpoint, loss, metrics lines), and a run that dies
// outright at step `die_at` of the second epoch (an exception out of the step, which no handler
// sees) loses only the steps since its last checkpoint: the resumed run ends bit for bit where the
// straight one does. Returns that last checkpoint.
inline CheckpointState check_interval_checkpoints(TrainOptions o, const std::string& name, int64_t die_at) {
  o.store = testing::cora_store();
  o.deterministic = true;
  o.epochs = 3;
  const fs::path straight = fresh_dir(name + "-straight"), split = fresh_dir(name + "-split"),
                 died = fresh_dir(name + "-died");
  o.checkpoint_dir = straight.string();
  o.metrics_path = (straight / "metrics.jsonl").string();
  const TrainResult a = train(o);

  o.checkpoint_interval_s = 1e-9;
  o.checkpoint_dir = split.string();
  o.metrics_path = (split / "metrics.jsonl").string();
  const TrainResult b = train(o);
  EXPECT_EQ(a.last.loss, b.last.loss);
  EXPECT_EQ(metric_column(straight / "metrics.jsonl", "loss"), metric_column(split / "metrics.jsonl", "loss"));
  EXPECT_TRUE(read_bytes(straight / "latest.ckpt") == read_bytes(split / "latest.ckpt"));

  o.checkpoint_dir = died.string();
  o.metrics_path = (died / "metrics.jsonl").string();
  TrainOptions dying = o;
  dying.on_step = [die_at](int64_t epoch, int64_t batch, int64_t) {
    if (epoch == 1 && batch == die_at) throw std::runtime_error("killed");
  };
  EXPECT_THROW(train(dying), std::exception);
  const CheckpointState c = load_checkpoint(died / "latest.ckpt");
  EXPECT_EQ(c.epoch, 0);

  o.resume = true;
  const TrainResult d = train(o);
  EXPECT_EQ(a.last.loss, d.last.loss);
  EXPECT_TRUE(read_bytes(straight / "latest.ckpt") == read_bytes(died / "latest.ckpt"));
  return c;
}

}  // namespace gale::testing
