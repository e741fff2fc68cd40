// `gale train --processes N`: gale starts a run's processes on this host itself, without mpirun.
// 2 processes of 1 CPU worker end bit for bit where 1 process of 2 workers ends; a signal to the
// launcher stops every process at the same step with a checkpoint, and --resume ends where a run
// never stopped ends; a process that is killed or stops answering ends the run within a bounded
// time with a distinct exit code, and none outlives the launcher; bad values exit 2 naming the flag.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/cli/background.hpp"

namespace gale {
namespace {

namespace fs = std::filesystem;

const std::string kGale = std::string(GALE_BINARY_DIR) + "/bin/gale";

using testing_support::read_file;

// One gale command in the background.
class Started : public testing_support::Background {
 public:
  Started(const std::string& args, const fs::path& log) : Background(kGale + " " + args, log) {}
};

// The pid of the started process of `rank` whose command line mentions `marker`, or -1.
pid_t rank_pid(int rank, const std::string& marker) {
  return testing_support::find_gale_process(marker, "GALE_LOCAL_RANK=" + std::to_string(rank));
}

class LocalProcesses : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = testing_support::fresh_dir_with_store(kGale, "gale-local", &dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string train(const std::string& more) const {
    return "train " + store_ + " -q --device cpu --fanouts 5,5 --batch-size 128 " + more;
  }
  static std::vector<nlohmann::json> epochs(const std::string& file) { return testing_support::metrics_epochs(file); }
  // A long run of 2 processes, once its first epoch is reported.
  std::unique_ptr<Started> long_run(const std::string& extra, const std::string& metrics) {
    auto run = std::make_unique<Started>(train("--processes 2 --epochs 1000000 --metrics " + metrics + " " + extra),
                                     dir_ / "run.log");
    EXPECT_GT(run->pid(), 0);
    for (int i = 0; i < 600 && epochs(metrics).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(epochs(metrics).empty()) << run->output();
    return run;
  }

  fs::path dir_;
  std::string store_;
};

TEST_F(LocalProcesses, TwoProcessesEndWhereTwoWorkersOfOneProcessEnd) {
  const std::string one = path("one.jsonl"), two = path("two.jsonl");
  const std::string common = " --deterministic --check-replicas --epochs 3 --metrics ";
  ASSERT_EQ(std::system((kGale + " " + train("--workers 2" + common + one) + " > /dev/null 2>&1").c_str()), 0);
  Started run(train("--processes 2" + common + two), dir_ / "log");
  ASSERT_EQ(run.wait(std::chrono::seconds(120)), 0) << run.output();
  const auto a = epochs(one), b = epochs(two);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);  // one metrics file, written once: rank 0 writes it
  for (size_t e = 0; e < a.size(); ++e) {
    EXPECT_EQ(a[e]["loss"].get<double>(), b[e]["loss"].get<double>()) << "epoch " << e;
    EXPECT_EQ(a[e]["replica_checksum"], b[e]["replica_checksum"]) << "epoch " << e;
    EXPECT_EQ(a[e]["input_nodes"], b[e]["input_nodes"]);
    EXPECT_EQ(b[e]["workers"], 2);
    EXPECT_EQ(b[e]["processes"], 2);
    EXPECT_EQ(b[e]["worker_seeds_per_s"].size(), 2u);
  }
  const std::string out = run.output();
  EXPECT_NE(out.find("best valid_acc"), std::string::npos) << out;
  EXPECT_EQ(out.find("best valid_acc"), out.rfind("best valid_acc")) << out;  // only rank 0 prints
  // Each process may run CPU workers of its own: 2 processes of 2 workers keep 4 identical replicas.
  Started four(train("--processes 2 --workers 2 --threads 1 --check-replicas --epochs 2 --metrics " + path("four.jsonl")),
           dir_ / "log4");
  ASSERT_EQ(four.wait(std::chrono::seconds(120)), 0) << four.output();
  const auto c = epochs(path("four.jsonl"));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1]["workers"], 4);
}

// Ctrl-C reaches the launcher (the processes it started are in process groups of their own): it
// passes the signal on once, every process stops after the same step with a checkpoint, and the
// resumed run ends bit for bit where a run that was never stopped ends.
TEST_F(LocalProcesses, SigintToTheLauncherStopsEveryProcessAndTheResumeIsExact) {
  const std::string ckpt = path("ckpt"), split = path("split.jsonl"), whole = path("whole.jsonl");
  const std::string common = "--processes 2 --deterministic --epochs 40 --metrics ";
  Started first(train(common + split + " --checkpoint-dir " + ckpt), dir_ / "log1");
  for (int i = 0; i < 600 && epochs(split).size() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(::kill(first.pid(), SIGINT), 0);
  EXPECT_EQ(first.wait(std::chrono::seconds(120)), 130) << first.output();
  const std::string out = first.output();
  EXPECT_NE(out.find("gale: stopped by SIGINT"), std::string::npos) << out;
  EXPECT_EQ(out.find("gale: stopped by SIGINT"), out.rfind("gale: stopped by SIGINT")) << out;
  EXPECT_LT(epochs(split).size(), 40u) << "the run was not interrupted in time";
  EXPECT_TRUE(fs::exists(ckpt + "/latest.ckpt"));
  Started rest(train(common + split + " --resume --checkpoint-dir " + ckpt), dir_ / "log2");
  ASSERT_EQ(rest.wait(std::chrono::seconds(180)), 0) << rest.output();
  Started once(train(common + whole), dir_ / "log3");
  ASSERT_EQ(once.wait(std::chrono::seconds(180)), 0) << once.output();
  ASSERT_EQ(epochs(whole).size(), 40u);
  testing_support::expect_same_last_epoch(split, whole);
}

TEST_F(LocalProcesses, KillingAProcessEndsTheRunWithinAMinute) {
  const std::string metrics = path("kill.jsonl");
  auto run = long_run("", metrics);
  const pid_t victim = rank_pid(1, metrics);
  ASSERT_GT(victim, 0) << run->output();
  const int code = testing_support::signal_and_wait(*run, victim, SIGKILL);
  EXPECT_EQ(code, 137) << run->output();
  EXPECT_NE(run->output().find("process 1 was killed by signal 9"), std::string::npos) << run->output();
  EXPECT_EQ(rank_pid(0, metrics), -1) << "rank 0 outlived the run";
}

TEST_F(LocalProcesses, AProcessThatStopsAnsweringTimesOutWithExitCode5) {
  const std::string metrics = path("stop.jsonl");
  auto run = long_run("--comm-timeout 3", metrics);
  const pid_t victim = rank_pid(1, metrics);
  testing_support::expect_silent_rank_times_out(*run, victim);  // alive but silent
  EXPECT_EQ(rank_pid(1, metrics), -1) << "the stopped process outlived the run";
}

// The launcher killed outright: the processes it started get SIGTERM, stop and end.
TEST_F(LocalProcesses, NoProcessOutlivesItsLauncher) {
  const std::string metrics = path("orphan.jsonl");
  auto run = long_run("", metrics);
  ASSERT_GT(rank_pid(0, metrics), 0);
  ASSERT_EQ(::kill(run->pid(), SIGKILL), 0);
  run->wait(std::chrono::seconds(10));
  bool gone = false;
  for (int i = 0; i < 600 && !gone; ++i) {
    gone = rank_pid(0, metrics) == -1 && rank_pid(1, metrics) == -1;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(gone) << "a started process outlived its launcher by a minute";
}

// A process that fails stops the run with its error and exit code, once; bad values exit 2 naming
// the flag, before any process starts.
TEST_F(LocalProcesses, AFailingProcessOrABadValueEndsTheRunWithItsCode) {
  Started bad_layers(train("--processes 2 --layers 3 --epochs 2"), dir_ / "log1");  // 3 layers, 2 fanouts
  EXPECT_EQ(bad_layers.wait(std::chrono::seconds(60)), 2) << bad_layers.output();
  EXPECT_NE(bad_layers.output().find("--fanouts"), std::string::npos) << bad_layers.output();
  // Refused before any process starts: one line, the launcher's, not a started rank's.
  EXPECT_EQ(bad_layers.output().find('\n'), bad_layers.output().size() - 1) << bad_layers.output();
  EXPECT_EQ(bad_layers.output().find("rank "), std::string::npos) << bad_layers.output();
  Started missing("train " + path("missing.gale") + " -q --device cpu --fanouts 5,5 --processes 2 --metrics " + path("m.jsonl"),
              dir_ / "log2");
  EXPECT_EQ(missing.wait(std::chrono::seconds(60)), 2) << missing.output();
  EXPECT_NE(missing.output().find("missing.gale"), std::string::npos) << missing.output();
  EXPECT_FALSE(fs::exists(path("m.jsonl")));
  const std::pair<std::string, std::string> bad[] = {
      {"--processes 0", "--processes: expected a number of processes (1 to 1024) or per-gpu, found '0'"},
      {"--processes two", "--processes: expected a number of processes (1 to 1024) or per-gpu, found 'two'"},
      {"--processes per-gpu", "--processes per-gpu: one process per GPU needs --gpus"},
  };
  for (const auto& [flag, message] : bad) {
    Started r(train(flag + " --epochs 1 --metrics " + path("bad.jsonl")), dir_ / "log3");
    EXPECT_EQ(r.wait(std::chrono::seconds(60)), 2) << flag;
    EXPECT_NE(r.output().find(message), std::string::npos) << r.output();
    EXPECT_EQ(r.output().find('\n'), r.output().size() - 1) << "one line: " << r.output();
    EXPECT_FALSE(fs::exists(path("bad.jsonl")));
  }
  Started full("train " + store_ + " -q --device cpu --processes 2 --epochs 1", dir_ / "log4");
  EXPECT_EQ(full.wait(std::chrono::seconds(60)), 2);
  EXPECT_NE(full.output().find("a full-graph run trains in one"), std::string::npos) << full.output();
}

}  // namespace
}  // namespace gale
