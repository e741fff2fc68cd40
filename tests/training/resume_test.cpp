// Never lose work: a run stopped after 5 epochs and resumed for 5 more ends bit for bit where
// 10 straight epochs end, in full-graph and mini-batch training.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/checkpoint.hpp"
#include "engine/trainer.hpp"
#include "kernels/error.hpp"
#include "tests/training/cora_store.hpp"

namespace gale::engine {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("gale-resume-" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
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
  TrainOptions o;
  o.model.model = "sage";
  o.full_graph = false;
  o.fanouts = {5, 5};
  o.batch_size = 32;
  check_resume_is_bit_identical(o, "sage-mb");
}

TEST(Resume, GatWithAttentionDropoutResumesExactly) {
  TrainOptions o;
  o.model.model = "gat";
  o.model.hidden = 8;
  o.model.heads = 4;
  o.model.activation = Activation::kElu;
  check_resume_is_bit_identical(o, "gat");
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
  EXPECT_THROW(train(o), InputError);
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
