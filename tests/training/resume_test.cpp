// Never lose work: a run stopped after 5 epochs and resumed for 5 more ends bit for bit where
// 10 straight epochs end, in full-graph and mini-batch training; so does a run stopped on request
// (TrainOptions::stop, what gale train sets on SIGINT / SIGTERM) inside a mini-batch epoch or
// after a full-graph one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/checkpoint.hpp"
#include "engine/trainer.hpp"
#include "kernels/error.hpp"
#include "tests/training/cora_store.hpp"
#include "tests/training/resume_checks.hpp"

namespace gale::engine {
namespace {

namespace fs = std::filesystem;
using testing::check_interval_checkpoints;
using testing::check_stop_and_resume;
using testing::fresh_dir;
using testing::read_bytes;

// Mini-batch GraphSAGE on Cora with small fanouts and batches: a dozen steps per epoch.
TrainOptions minibatch_sage() {
  TrainOptions o;
  o.model.model = "sage";
  o.full_graph = false;
  o.fanouts = {5, 5};
  o.batch_size = 32;
  return o;
}

void check_resume_is_bit_identical(TrainOptions o, const std::string& name) {
  o.store = testing::cora_store();
  o.deterministic = true;
  const fs::path straight = fresh_dir(name + "-straight"), split = fresh_dir(name + "-split");

  o.epochs = 10;
  o.checkpoint_dir = straight.string();
  o.metrics_path = (straight / "metrics.jsonl").string();
  const TrainResult a = train(o);

  o.epochs = 5;
  o.checkpoint_dir = split.string();
  o.metrics_path = (split / "metrics.jsonl").string();
  train(o);
  o.epochs = 10;
  o.resume = true;
  const TrainResult b = train(o);
  EXPECT_EQ(b.epochs_run, 5);

  EXPECT_EQ(a.last.loss, b.last.loss);
  EXPECT_EQ(a.best_valid_acc, b.best_valid_acc);
  EXPECT_EQ(a.test_acc_at_best_valid, b.test_acc_at_best_valid);
  const std::string x = read_bytes(straight / "latest.ckpt"), y = read_bytes(split / "latest.ckpt");
  ASSERT_FALSE(x.empty());
  EXPECT_TRUE(x == y) << "checkpoints after 10 epochs differ";
}

TEST(Resume, FiveThenFiveEqualsTenFullGraph) {
  TrainOptions o;
  o.model.model = "gcn";
  check_resume_is_bit_identical(o, "gcn");
}

TEST(Resume, FiveThenFiveEqualsTenMiniBatch) {
  TrainOptions o = minibatch_sage();
  check_resume_is_bit_identical(o, "sage-mb");
}

// Two data-parallel workers on the CPU: each replica must get its own copy of the checkpoint's
// tensors (they once shared them, and every step updated the weights twice).
TEST(Resume, FiveThenFiveEqualsTenWithTwoCpuWorkers) {
  TrainOptions o = minibatch_sage();
  o.devices = {Device::cpu(), Device::cpu()};
  check_resume_is_bit_identical(o, "sage-workers");
}

TEST(Resume, GatWithAttentionDropoutResumesExactly) {
  TrainOptions o;
  o.model.model = "gat";
  o.model.hidden = 8;
  o.model.heads = 4;
  o.model.activation = Activation::kElu;
  check_resume_is_bit_identical(o, "gat");
}

TEST(Resume, StoppedInsideAMiniBatchEpochResumesExactly) {
  TrainOptions o = minibatch_sage();
  int64_t batches = 0;
  const TrainResult s = check_stop_and_resume(o, "stop-mb", [&](TrainOptions& first, std::atomic<int>& stop) {
    first.on_step = [&stop, &batches](int64_t epoch, int64_t batch, int64_t of) {
      batches = of;
      if (epoch == 1 && batch == 2) stop.store(SIGINT);  // after the third step of the second epoch
    };
  });
  EXPECT_EQ(s.stopped_epoch, 1);
  EXPECT_EQ(s.stopped_batches, 3);
  EXPECT_EQ(s.stopped_of, batches);
  EXPECT_EQ(s.epochs_run, 1);
}

// Several workers stop inside the epoch too, all after the same step: the flag seen after step 1
// goes into step 2's gradient sums and is read two steps later, so the steps 0-4 are trained.
// Each worker's loss sum is saved and goes on where it left off.
TEST(Resume, TwoWorkersStopInsideAnEpochTogetherAndResumeExactly) {
  TrainOptions o = minibatch_sage();
  o.batch_size = 8;  // enough steps that the stop lands inside the epoch
  o.devices = {Device::cpu(), Device::cpu()};
  const TrainResult s = check_stop_and_resume(o, "stop-workers", [](TrainOptions& first, std::atomic<int>& stop) {
    first.on_step = [&stop](int64_t epoch, int64_t batch, int64_t) {
      if (epoch == 1 && batch == 1) stop.store(SIGINT);
    };
  });
  EXPECT_EQ(s.stopped_epoch, 1);
  EXPECT_EQ(s.stopped_batches, 5);
  EXPECT_LT(s.stopped_batches, s.stopped_of);
  EXPECT_EQ(s.epochs_run, 1);
}

// A flag raised in the last steps of an epoch is read only after it ends: the workers stop after
// the epoch, as one.
TEST(Resume, TwoWorkersFlaggedAtTheEpochsEndStopAfterIt) {
  TrainOptions o = minibatch_sage();
  o.devices = {Device::cpu(), Device::cpu()};
  const TrainResult s = check_stop_and_resume(o, "stop-workers-end", [](TrainOptions& first, std::atomic<int>& stop) {
    first.on_step = [&stop](int64_t epoch, int64_t batch, int64_t of) {
      if (epoch == 1 && batch == of - 1) stop.store(SIGINT);
    };
  });
  EXPECT_EQ(s.stopped_epoch, 1);
  EXPECT_EQ(s.stopped_batches, s.stopped_of);
  EXPECT_EQ(s.epochs_run, 2);
}

// Trains *o on Cora with a SIGTERM raised after step `flag_after` of the first epoch, expects the
// run to stop inside it after `batches_done` batches, and returns its checkpoint; *o is left
// ready for a resume (no flag, no step hook).
CheckpointState stop_in_first_epoch(TrainOptions* o, const std::string& name, int64_t flag_after,
                                    int64_t batches_done) {
  o->store = testing::cora_store();
  o->epochs = 2;
  o->checkpoint_dir = fresh_dir(name).string();
  std::atomic<int> stop{0};
  o->stop = &stop;
  o->on_step = [&stop, flag_after](int64_t, int64_t batch, int64_t) {
    if (batch == flag_after) stop.store(SIGTERM);
  };
  const TrainResult s = train(*o);
  EXPECT_EQ(s.stop_signal, SIGTERM);
  o->stop = nullptr;
  o->on_step = nullptr;
  const CheckpointState c = load_checkpoint(fs::path(o->checkpoint_dir) / "latest.ckpt");
  EXPECT_EQ(c.epoch, -1);
  EXPECT_EQ(c.batches_done, batches_done);
  return c;
}

// A checkpoint from inside an epoch of two workers holds both workers' loss sums, and the epoch's
// batches were dealt to two: resuming it with one worker is refused, naming the file.
TEST(Resume, StoppedInsideAnEpochOfTwoWorkersNeedsTwo) {
  TrainOptions o = minibatch_sage();
  o.batch_size = 8;
  o.devices = {Device::cpu(), Device::cpu()};
  // Flagged after step 0, voted in step 1, read in step 3.
  const CheckpointState c = stop_in_first_epoch(&o, "stop-workers-two", 0, 4);
  ASSERT_EQ(c.partial_loss_sums.size(), 2u);
  EXPECT_GT(c.partial_loss_sums[0], 0.0);
  EXPECT_GT(c.partial_loss_sums[1], 0.0);
  o.resume = true;
  o.devices = {Device::cpu()};
  try {
    train(o);
    ADD_FAILURE() << "resumed with one worker";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("by a run with 2 workers"), std::string::npos) << e.what();
  }
}

TEST(Resume, StoppedAfterAFullGraphEpochResumesExactly) {
  TrainOptions o;
  o.model.model = "gcn";
  const TrainResult s = check_stop_and_resume(o, "stop-fg", [](TrainOptions&, std::atomic<int>& stop) {
    stop.store(SIGINT);  // before the first epoch: a full-graph run stops after it
  });
  EXPECT_EQ(s.stopped_epoch, 0);
  EXPECT_EQ(s.stopped_batches, 1);
  EXPECT_EQ(s.stopped_of, 1);
}

TEST(Resume, StopBeforeTheFirstStepSavesTheStartingState) {
  TrainOptions o = minibatch_sage();
  const TrainResult s = check_stop_and_resume(o, "stop-first", [](TrainOptions&, std::atomic<int>& stop) {
    stop.store(SIGINT);
  });
  EXPECT_EQ(s.stopped_epoch, 0);
  EXPECT_EQ(s.stopped_batches, 0);
  EXPECT_EQ(s.epochs_run, 0);
}

TEST(Resume, StoppedInsideAnEpochNeedsTheSameSchedule) {
  TrainOptions o = minibatch_sage();
  const CheckpointState c = stop_in_first_epoch(&o, "stop-window", 1, 2);
  ASSERT_EQ(c.partial_loss_sums.size(), 1u);
  EXPECT_GT(c.partial_loss_sums[0], 0.0);
  o.resume = true;
  o.reorder_window = 4;  // a match-reorder window trains the epoch's batches in another order
  EXPECT_THROW(train(o), InputError);
}

// One worker checkpoints from the step itself, after every step here.
TEST(Resume, IntervalCheckpointsSurviveADeathInsideAnEpoch) {
  const CheckpointState c = check_interval_checkpoints(minibatch_sage(), "interval", 4);
  EXPECT_EQ(c.batches_done, 4);  // the step that died was not saved: it is trained again
}

// Two workers agree on each interval checkpoint through their step's sums and end the epoch's
// pipeline after the same step; the trainer writes the checkpoint and goes on from there, so with
// the vote read kVoteLag = 2 steps late there is a checkpoint every 3 steps.
TEST(Resume, IntervalCheckpointsWithTwoWorkersSurviveADeathInsideAnEpoch) {
  TrainOptions o = minibatch_sage();
  o.batch_size = 8;
  o.devices = {Device::cpu(), Device::cpu()};
  const CheckpointState c = check_interval_checkpoints(o, "interval2", 7);
  EXPECT_EQ(c.batches_done, 6);  // segments of 3 steps: the checkpoints after steps 2 and 5
  EXPECT_EQ(c.partial_loss_sums.size(), 2u);
}

TEST(Resume, IntervalCheckpointsNeedADirectoryAndNoReorderWindow) {
  TrainOptions o = minibatch_sage();
  o.store = testing::cora_store();
  o.epochs = 1;
  o.checkpoint_interval_s = 60;
  EXPECT_THROW(train(o), InputError);  // no --checkpoint-dir
  o.checkpoint_dir = fresh_dir("interval-bad").string();
  o.reorder_window = 4;
  EXPECT_THROW(train(o), InputError);
  o.reorder_window = 0;
  o.full_graph = true;
  EXPECT_THROW(train(o), InputError);
}

TEST(Resume, ResumeWithAnotherModelIsRefused) {
  TrainOptions o;
  o.store = testing::cora_store();
  o.model.model = "gcn";
  o.epochs = 1;
  o.checkpoint_dir = fresh_dir("mismatch").string();
  train(o);
  o.model.hidden = 32;
  o.resume = true;
  o.epochs = 2;
  // An incompatible checkpoint (exit 3), naming what differs.
  try {
    train(o);
    ADD_FAILURE() << "resumed a checkpoint of another model";
  } catch (const CorruptStoreError& e) {
    EXPECT_NE(std::string(e.what()).find("hidden 16 there, 32 here"), std::string::npos) << e.what();
  }
  // Without --resume the earlier run's checkpoints are kept, unless told otherwise.
  o.resume = false;
  EXPECT_THROW(train(o), InputError);
  o.overwrite_checkpoints = true;
  EXPECT_NO_THROW(train(o));
}

// A state with one 2 x 3 parameter filled with `value`.
CheckpointState small_state(int64_t epoch, float value) {
  CheckpointState s;
  s.epoch = epoch;
  s.config_json = "{}";
  s.names = {"w"};
  for (auto* group : {&s.params, &s.adam_m, &s.adam_v}) {
    Tensor t = Tensor::empty(2, 3);
    t.fill(value);
    group->push_back(t);
  }
  return s;
}

TEST(CheckpointWriter, WritesWhatWasSubmittedInOrder) {
  const fs::path dir = fresh_dir("writer");
  {
    CheckpointWriter writer;
    for (int e = 0; e < 5; ++e) writer.submit(dir / "latest.ckpt", small_state(e, static_cast<float>(e)));
    writer.submit(dir / "best.ckpt", small_state(2, 2.0f));
    writer.wait();
    const CheckpointState latest = load_checkpoint(dir / "latest.ckpt");
    EXPECT_EQ(latest.epoch, 4);
    EXPECT_EQ(latest.params[0].to_vector(), std::vector<float>(6, 4.0f));
    EXPECT_EQ(load_checkpoint(dir / "best.ckpt").epoch, 2);
    writer.submit(dir / "latest.ckpt", small_state(5, 5.0f));
  }  // the destructor finishes the last one
  EXPECT_EQ(load_checkpoint(dir / "latest.ckpt").epoch, 5);
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos);
}

TEST(CheckpointWriter, AFailedWriteIsThrownOnceByTheNextCall) {
  const fs::path dir = fresh_dir("writer-fail");
  std::ofstream(dir / "file") << "x";  // a file where the checkpoint directory would go
  CheckpointWriter writer;
  writer.submit(dir / "file" / "latest.ckpt", small_state(0, 1.0f));
  EXPECT_THROW(writer.wait(), InputError);
  EXPECT_NO_THROW(writer.wait());
  writer.submit(dir / "ok.ckpt", small_state(1, 1.0f));
  EXPECT_NO_THROW(writer.wait());
  EXPECT_EQ(load_checkpoint(dir / "ok.ckpt").epoch, 1);
}

TEST(Checkpoint, FlippedByteIsReportedAsCorrupt) {
  TrainOptions o;
  o.store = testing::cora_store();
  o.epochs = 1;
  const fs::path dir = fresh_dir("corrupt");
  o.checkpoint_dir = dir.string();
  train(o);
  const fs::path file = dir / "latest.ckpt";
  std::string bytes = read_bytes(file);
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_THROW(load_checkpoint(file), CorruptStoreError);
  o.resume = true;
  o.epochs = 2;
  EXPECT_THROW(train(o), CorruptStoreError);
}

}  // namespace
}  // namespace gale::engine
