// Several processes under mpirun: 2 processes of 1 worker end bit for bit where 1 process of 2
// workers ends; a rank that fails, is killed, or stops answering ends the whole run within a bounded
// time, with a message naming the rank and a distinct exit code, never a hang.
// Built twice: gale_mpi_tests on the CPU device (the code path GPUs take, with MPI standing in for
// NCCL; CTest label workers, in CI), and gale_gpu_mpi_tests (GALE_MPI_TEST_GPUS) with one GPU per
// worker and NCCL between the processes (labels gpu, multi_gpu; skipped without enough GPUs).
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/devices.hpp"
#include "tests/cli/background.hpp"

namespace gale {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The binary under test: $GALE when set (a bundle on a GPU machine), else this build's.
const std::string kGale = std::getenv("GALE") ? std::getenv("GALE") : std::string(GALE_BINARY_DIR) + "/bin/gale";

using testing_support::read_file;

// One mpirun, started in the background with its output in a file.
class Launch : public testing_support::Background {
 public:
  // --bind-to none: each process runs threads (sampling, the pipeline) beyond its first core.
  Launch(const std::string& mpirun_args, const fs::path& log)
      : Background("mpirun --oversubscribe --bind-to none " + mpirun_args, log) {}
};

// The pid of the gale process of `rank` whose command line mentions `marker`, or -1.
pid_t rank_pid(int rank, const std::string& marker) {
  return testing_support::find_gale_process(marker, "OMPI_COMM_WORLD_RANK=" + std::to_string(rank));
}

#if GALE_MPI_TEST_GPUS
constexpr bool kGpus = true;
#else
constexpr bool kGpus = false;
#endif

class Mpi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
#if GALE_MPI_TEST_GPUS
    // The tests pair 2 processes of 1 GPU with 1 process of 2 GPUs: on a host of more GPUs the
    // runs see the first two (`--gpus all`), and a test that needs more passes them with -x.
    all_gpus_ = engine::gpu_count();  // counted before the variable narrows what children see
    const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
    std::stringstream visible(env != nullptr ? env : "");
    for (std::string id; std::getline(visible, id, ',');) gpu_ids_.push_back(id);
    if (gpu_ids_.empty())
      for (int g = 0; g < all_gpus_; ++g) gpu_ids_.push_back(std::to_string(g));
    if (all_gpus_ > 2) ::setenv("CUDA_VISIBLE_DEVICES", first_gpus(2).c_str(), 1);
#endif
    // Open MPI refuses to start as root (CI's containers) without these.
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    // Shared-memory transport without the kernel's cross-memory attach, which containers forbid.
    ::setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
  }
  void SetUp() override {
#if GALE_MPI_TEST_GPUS
    if (all_gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs";
#endif
    store_ = testing_support::fresh_dir_with_store(kGale, "gale-mpi", &dir_);
    ASSERT_EQ(std::system("mpirun --version > /dev/null 2>&1"), 0) << "mpirun (openmpi-bin) is not installed";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // `workers` per process: CPU workers, or this many of the host's GPUs for each process.
  static std::string workers(int n) {
#if GALE_MPI_TEST_GPUS
    return "--gpus all" + std::string(n == 1 ? "" : " --threads 1");
#else
    return "--device cpu --workers " + std::to_string(n);
#endif
  }
  std::string train(const std::string& more) const {
    return kGale + " train " + store_ + " -q --fanouts 5,5 --batch-size 128 " + more;
  }
  // Each line of a metrics file that reports an epoch.
  static std::vector<nlohmann::json> epochs(const std::string& file) { return testing_support::metrics_epochs(file); }
  // Starts a long run of 2 processes and waits for its first epoch; `extra` goes to both ranks.
  std::unique_ptr<Launch> long_run(const std::string& extra, const std::string& metrics) {
    auto run = std::make_unique<Launch>("-np 2 " + train(workers(1) + " --epochs 1000000 --metrics " + metrics + " " + extra),
                                        dir_ / "run.log");
    EXPECT_TRUE(run->started());
    for (int i = 0; i < 600 && epochs(metrics).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(epochs(metrics).empty()) << run->output();
    return run;
  }

  // A deterministic 40-epoch run of 2 processes (metrics split.jsonl, checkpoints in ckpt, `extra`
  // for it), sent `signal` at rank 1 once `after` epochs are reported; then the same command with
  // --resume, and a run never interrupted (whole.jsonl). Returns the interrupted run's output.
  std::string interrupt_and_resume(const std::string& extra, int signal, size_t after) {
    const std::string ckpt = path("ckpt"), split = path("split.jsonl"), whole = path("whole.jsonl");
    // On GPUs the CPU sampler: the GPU sampler numbers a block's nodes in the order its threads
    // reach them, so its runs differ in the last bits.
    const std::string common = workers(1) + (kGpus ? " --sampler cpu" : "") + " --deterministic --epochs 40 --metrics ";
    Launch first("-np 2 " + train(common + split + " --checkpoint-dir " + ckpt + " " + extra), dir_ / "log1");
    EXPECT_TRUE(first.started());
    for (int i = 0; i < 600 && epochs(split).size() < after; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const pid_t rank1 = rank_pid(1, split);
    EXPECT_GT(rank1, 0) << first.output();
    if (rank1 > 0) EXPECT_EQ(::kill(rank1, signal), 0);
    EXPECT_NE(first.wait(std::chrono::seconds(120)), 0) << first.output();
    EXPECT_LT(epochs(split).size(), 40u) << "the run was not interrupted in time";
    Launch rest("-np 2 " + train(common + split + " --resume --checkpoint-dir " + ckpt), dir_ / "log2");
    EXPECT_EQ(rest.wait(std::chrono::seconds(180)), 0) << rest.output();
    Launch once("-np 2 " + train(common + whole), dir_ / "log3");
    EXPECT_EQ(once.wait(std::chrono::seconds(180)), 0) << once.output();
    EXPECT_EQ(epochs(whole).size(), 40u);
    return first.output();
  }

  fs::path dir_;
  std::string store_;
  // The first n of the GPUs this test process saw, as CUDA_VISIBLE_DEVICES lists them.
  static std::string first_gpus(int n) {
    std::string out;
    for (size_t i = 0; i < gpu_ids_.size() && static_cast<int>(i) < n; ++i) out += (i ? "," : "") + gpu_ids_[i];
    return out;
  }
  static inline int all_gpus_ = 0;  // the GPUs this test process saw before narrowing its children's view
  static inline std::vector<std::string> gpu_ids_;
};

TEST_F(Mpi, TwoProcessesEndWhereTwoWorkersOfOneProcessEnd) {
  const std::string one = path("one.jsonl"), two = path("two.jsonl");
#if GALE_MPI_TEST_GPUS
  // The GPU sampler numbers a block's nodes in the order its threads reach them, so two runs sum
  // in different orders (and would drop different rows): no dropout, losses to float tolerance.
  const std::string common = " --dropout 0 --check-replicas --epochs 3 --metrics ";
#else
  const std::string common = " --deterministic --check-replicas --epochs 3 --metrics ";
#endif
  // One process with 2 workers (on a GPU host: both GPUs), then 2 processes of 1 (one GPU each).
  ASSERT_EQ(std::system((train(workers(2) + common + one) + " > /dev/null 2>&1").c_str()), 0);
  Launch run("-np 2 " + train(workers(1) + common + two), dir_ / "log");
  ASSERT_EQ(run.wait(std::chrono::seconds(120)), 0) << run.output();
  const auto a = epochs(one), b = epochs(two);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t e = 0; e < a.size(); ++e) {
#if GALE_MPI_TEST_GPUS
    EXPECT_NEAR(a[e]["loss"].get<double>(), b[e]["loss"].get<double>(), 1e-3 * a[e]["loss"].get<double>()) << "epoch " << e;
#else
    // Same seeds per worker, same sums in the same order: the same bits.
    EXPECT_EQ(a[e]["loss"].get<double>(), b[e]["loss"].get<double>()) << "epoch " << e;
    EXPECT_EQ(a[e]["replica_checksum"], b[e]["replica_checksum"]) << "epoch " << e;
    EXPECT_EQ(a[e]["input_nodes"], b[e]["input_nodes"]);  // both processes' counts reach rank 0
#endif
    EXPECT_EQ(b[e]["workers"], 2);
    EXPECT_EQ(b[e]["processes"], 2);
    EXPECT_EQ(b[e]["worker_seeds_per_s"].size(), 2u);
  }
  // One result line: only rank 0 prints.
  const std::string out = run.output();
  EXPECT_NE(out.find("best valid_acc"), std::string::npos) << out;
  EXPECT_EQ(out.find("best valid_acc"), out.rfind("best valid_acc")) << out;
}

#if GALE_MPI_TEST_GPUS
// `gale train --processes per-gpu` without mpirun: one process per GPU, started by gale itself,
// ends where one process of both GPUs ends (to float tolerance, as above), replicas identical.
TEST_F(Mpi, ProcessesStartedByGaleEndWhereOneProcessOfTwoGpusEnds) {
  const std::string one = path("one.jsonl"), two = path("two.jsonl");
  const std::string common = " --dropout 0 --check-replicas --epochs 3 --metrics ";
  ASSERT_EQ(std::system((train(workers(2) + common + one) + " > /dev/null 2>&1").c_str()), 0);
  testing_support::Background run(train("--gpus all --processes per-gpu" + common + two), dir_ / "log");
  ASSERT_EQ(run.wait(std::chrono::seconds(120)), 0) << run.output();
  const auto a = epochs(one), b = epochs(two);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t e = 0; e < a.size(); ++e) {
    EXPECT_NEAR(a[e]["loss"].get<double>(), b[e]["loss"].get<double>(), 1e-3 * a[e]["loss"].get<double>()) << "epoch " << e;
    EXPECT_EQ(b[e]["processes"], 2);
    EXPECT_EQ(b[e]["workers"], 2);
  }
}
#endif

#if GALE_MPI_TEST_GPUS
// A run on several GPUs has CUDA load every kernel up front (engine::load_kernels_eagerly), in one
// process and in each process of several; a run on one GPU keeps CUDA's lazy loading, and so does a
// run whose user set CUDA_MODULE_LOADING.
TEST_F(Mpi, RunsOnSeveralGpusLoadKernelsEagerlyAndOthersAsTheyWere) {
  const auto loading = [&](const std::string& prefix, const std::string& options) {
    const std::string metrics = path("loading.jsonl");
    fs::remove(metrics);
    const std::string command = prefix + train(options + " --epochs 1 --metrics " + metrics);
    EXPECT_EQ(std::system((command + " > " + path("loading.log") + " 2>&1").c_str()), 0) << read_file(path("loading.log"));
    const auto rows = epochs(metrics);
    return rows.empty() ? std::string("no epoch") : rows.front().value("kernel_loading", std::string("absent"));
  };
  EXPECT_EQ(loading("", "--gpus all"), "eager");
  EXPECT_EQ(loading("", "--gpus 0,1"), "eager");
  EXPECT_EQ(loading("", "--gpus all --processes per-gpu"), "eager");
  EXPECT_EQ(loading("mpirun -np 2 --oversubscribe --bind-to none ", "--gpus all"), "eager");
  EXPECT_EQ(loading("", "--gpus 1"), "lazy");
  EXPECT_EQ(loading("", "--device cuda"), "lazy");
  EXPECT_EQ(loading("CUDA_MODULE_LOADING=LAZY ", "--gpus 0,1"), "lazy");
}
#endif

#if !GALE_MPI_TEST_GPUS
// Rank 0 writes the checkpoints; on --resume every rank reads them and the run goes on as if it
// had never stopped.
TEST_F(Mpi, ResumeContinuesTheSameRun) {
  const std::string ckpt = path("ckpt"), split = path("split.jsonl"), whole = path("whole.jsonl");
  const std::string common = workers(1) + " --deterministic --metrics ";
  Launch first("-np 2 " + train(common + split + " --epochs 2 --checkpoint-dir " + ckpt), dir_ / "log1");
  ASSERT_EQ(first.wait(std::chrono::seconds(120)), 0) << first.output();
  Launch rest("-np 2 " + train(common + split + " --epochs 4 --resume --checkpoint-dir " + ckpt), dir_ / "log2");
  ASSERT_EQ(rest.wait(std::chrono::seconds(120)), 0) << rest.output();
  Launch once("-np 2 " + train(common + whole + " --epochs 4"), dir_ / "log3");
  ASSERT_EQ(once.wait(std::chrono::seconds(120)), 0) << once.output();
  const auto a = epochs(split), b = epochs(whole);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t e = 0; e < a.size(); ++e) EXPECT_EQ(a[e]["loss"].get<double>(), b[e]["loss"].get<double>()) << "epoch " << e;
}
#endif

// Early stopping and a plateau schedule under mpirun: rank 0's last rise of the validation accuracy
// holds for every process, so they lower the rate and stop after the same epoch (a process left
// training alone would hang the run), with batch normalisation's per-replica statistics too.
TEST_F(Mpi, EarlyStoppingAndPlateauScheduleAgreeAcrossProcesses) {
  const std::string metrics = path("m.jsonl");
  Launch run("-np 2 " + train(workers(1) + " --epochs 300 --patience 4 --lr-schedule plateau:1:0.5 --norm batch --metrics " +
                              metrics),
             dir_ / "log");
  ASSERT_EQ(run.wait(std::chrono::seconds(180)), 0) << run.output();
  std::ifstream in(metrics);
  nlohmann::json last;
  for (std::string line; std::getline(in, line);) last = nlohmann::json::parse(line);
  EXPECT_EQ(last["stopped_early"], true) << last.dump();
  EXPECT_LT(last["epochs_trained"].get<int64_t>(), 300);
  const auto all = epochs(metrics);
  EXPECT_LT(all.back()["lr"].get<double>(), 0.01);  // lowered at least once
  const std::string out = run.output();
  EXPECT_NE(out.find("stopped early after epoch"), std::string::npos) << out;
}

// `gale bench pipeline` under mpirun: rank 0 reports the run's epochs once.
TEST_F(Mpi, BenchPipelineReportsOnceForTheRun) {
  Launch run("-np 2 " + kGale + " bench pipeline " + store_ + " " + workers(1) +
                 " --layers 2 --fanouts 5,5 --hidden 16 --epochs 1 --warmup 0 --json",
             dir_ / "log");
  ASSERT_EQ(run.wait(std::chrono::seconds(120)), 0) << run.output();
  std::istringstream out(run.output());
  int rows = 0;
  for (std::string line; std::getline(out, line);) {
    if (line.empty() || line[0] != '{') continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_NE(j["device"].get<std::string>().find("2 processes"), std::string::npos) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 2) << run.output();  // the epoch and the median
}

TEST_F(Mpi, TwoProcessesOfTwoWorkersKeepIdenticalReplicas) {
#if GALE_MPI_TEST_GPUS
  if (all_gpus_ < 4) GTEST_SKIP() << "needs 4 GPUs";
  const std::string gpus = "-x CUDA_VISIBLE_DEVICES=" + first_gpus(4) + " ";
#else
  const std::string gpus;
#endif
  const std::string metrics = path("m.jsonl");
  Launch run(gpus + "-np 2 " + train(workers(2) + (kGpus ? "" : " --threads 1") + " --check-replicas --epochs 2 --metrics " + metrics),
             dir_ / "log");
  ASSERT_EQ(run.wait(std::chrono::seconds(120)), 0) << run.output();
  const auto e = epochs(metrics);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[1]["workers"], 4);
  EXPECT_EQ(e[1]["worker_seeds_per_s"].size(), 4u);
}

TEST_F(Mpi, ARankThatFailsStopsTheRunWithItsError) {
  // MPMD: rank 1 is given a store that does not exist; rank 0 would wait for it at the first exchange.
  const auto t0 = Clock::now();
  Launch run("-np 1 " + train(workers(1) + " --epochs 3") + " : -np 1 " + kGale + " train " + path("missing.gale") +
                 " -q --fanouts 5,5 --epochs 3 " + workers(1),
             dir_ / "log");
  const int code = run.wait(std::chrono::seconds(90));
  EXPECT_EQ(code, 2) << run.output();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(60));
  EXPECT_NE(run.output().find("rank 1 ("), std::string::npos) << run.output();
  EXPECT_NE(run.output().find("missing.gale"), std::string::npos) << run.output();
}

// gale train --processes starts the processes itself: under mpirun, which already did, it is refused.
TEST_F(Mpi, ProcessesUnderMpirunIsRefused) {
  Launch run("-np 1 " + train(workers(1) + " --epochs 1 --processes 2"), dir_ / "log");
  EXPECT_EQ(run.wait(std::chrono::seconds(60)), 2) << run.output();
  EXPECT_NE(run.output().find("--processes: this run was started by mpirun"), std::string::npos) << run.output();
}

TEST_F(Mpi, RanksWithDifferentOptionsAreRefused) {
  Launch run("-np 1 " + train(workers(1) + " --epochs 3") + " : -np 1 " + train(workers(1) + " --epochs 4"),
             dir_ / "log");
  EXPECT_EQ(run.wait(std::chrono::seconds(90)), 2) << run.output();
  EXPECT_NE(run.output().find("rank 1's model, options or store differ from rank 0's"), std::string::npos) << run.output();
}

// SIGTERM to rank 1 alone: its stop vote travels with a step's gradient sums, so rank 0 stops
// after the same step (inside the epoch unless the signal lands in its last two steps), rank 0
// names the stop, and --resume ends bit for bit where a run that was never stopped ends.
TEST_F(Mpi, SigtermToOneRankStopsBothAndTheResumeIsExact) {
  const std::string out = interrupt_and_resume("", SIGTERM, 1);
  EXPECT_NE(out.find("stopped by SIGTERM"), std::string::npos) << out;
  const auto a = epochs(path("split.jsonl")), b = epochs(path("whole.jsonl"));
  ASSERT_EQ(a.size(), 40u);
  for (size_t e = 0; e < a.size(); ++e) EXPECT_EQ(a[e]["loss"].get<double>(), b[e]["loss"].get<double>()) << "epoch " << e;
}

// A lost node: SIGKILL to rank 1 of a run that checkpoints every few steps (--checkpoint-interval,
// agreed by both ranks through their gradient sums). The run ends; --resume goes on from the last
// checkpoint, usually inside an epoch, and ends bit for bit where a run that was never killed ends.
TEST_F(Mpi, AKilledRunResumesFromItsIntervalCheckpointExactly) {
  interrupt_and_resume("--checkpoint-interval 0.001", SIGKILL, 2);
  ASSERT_GE(epochs(path("split.jsonl")).size(), 40u);  // epochs trained after the last checkpoint, before the kill, report twice
  testing_support::expect_same_last_epoch(path("split.jsonl"), path("whole.jsonl"));
}

TEST_F(Mpi, KillingARankEndsTheOthersWithinAMinute) {
  const std::string metrics = path("kill.jsonl");
  auto run = long_run("", metrics);
  const pid_t victim = rank_pid(1, metrics);
  ASSERT_GT(victim, 0) << run->output();
  const int code = testing_support::signal_and_wait(*run, victim, SIGKILL);
  EXPECT_NE(code, 0) << run->output();
  EXPECT_NE(code, -1) << "the run still goes on 90 s after its rank 1 was killed";
  EXPECT_NE(run->output().find("rank 1"), std::string::npos) << run->output();
  EXPECT_EQ(rank_pid(0, metrics), -1) << "rank 0 outlived the run";
}

TEST_F(Mpi, ARankThatStopsAnsweringTimesOutWithExitCode5) {
  const std::string metrics = path("stop.jsonl");
  auto run = long_run("--comm-timeout 3", metrics);
  const pid_t victim = rank_pid(1, metrics);
  testing_support::expect_silent_rank_times_out(*run, victim);  // alive but silent: mpirun alone would wait forever
  EXPECT_EQ(rank_pid(1, metrics), -1) << "the stopped rank outlived the run";
}

}  // namespace
}  // namespace gale
