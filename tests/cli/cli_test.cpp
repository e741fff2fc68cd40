// The command line as a user meets it: every bad input gets a one-line message naming the file,
// line or flag, its own exit code (2 input, 3 corrupt store, 4 resource / device), and leaves
// nothing half-written.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "storage/npy.hpp"
#include "storage/temp_paths.hpp"

namespace gale {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int code = -1;
  std::string out;  // stdout and stderr together
};

CliRun gale(const std::string& args) {
  const std::string cmd = std::string(GALE_BINARY_DIR) + "/bin/gale " + args + " 2>&1";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `gale args` in the background with its output in `log`: the process's pid (the shell execs it).
pid_t start_gale(const std::string& args, const std::string& log) {
  const std::string cmd = "exec " + std::string(GALE_BINARY_DIR) + "/bin/gale " + args + " > " + log + " 2>&1";
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = -1;
  if (::posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) != 0) return -1;
  return pid;
}

// Waits until `file` has at least n lines or the process has ended; true in the first case.
bool wait_for_lines(const std::string& file, int n, pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(file);
    int count = 0;
    for (std::string line; std::getline(in, line);) ++count;
    if (count >= n) return true;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The exit code of a background run (-1 when a signal killed it).
int finish(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -2;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string slurp(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gale-cli-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

 public:  // for the helpers below the fixture
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  // A small learnable store made by the built-in generator.
  std::string sbm_store() const {
    const std::string store = path("sbm.gale");
    const CliRun r = gale("preprocess --generate sbm:nodes=2000,classes=4,avg-degree=8,feature-dim=16,seed=3 -o " + store);
    EXPECT_EQ(r.code, 0) << r.out;
    return store;
  }
  // Leaves no store and no temporary directory beside it.
  void expect_nothing_written(const std::string& store) const {
    EXPECT_FALSE(fs::exists(store)) << store;
    for (const auto& e : fs::directory_iterator(fs::path(store).parent_path()))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
  fs::path dir_;
};

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST_F(Cli, HelpAndVersionSucceed) {
  EXPECT_EQ(gale("--help").code, 0);
  EXPECT_EQ(gale("train --help").code, 0);
  EXPECT_EQ(gale("--version").code, 0);
}

TEST_F(Cli, UnknownCommandIsUsageError) {
  const CliRun r = gale("trian x");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("trian"), std::string::npos) << r.out;
}

TEST_F(Cli, UnknownFlagIsNamed) {
  const CliRun r = gale("train " + path("x.gale") + " --epocs 3");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("epocs"), std::string::npos) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
}

// Including values a run must never swap for a default: NaN, infinities and negatives where they
// make no sense, empty paths, and a directory given as --config.
TEST_F(Cli, BadFlagValuesAreNamed) {
  const std::string store = sbm_store();
  fs::create_directories(path("conf.d"));
  for (const std::string& bad : std::vector<std::string>{
           "--fanouts 10,x", "--model gnn", "--device tpu", "--epochs 0", "--dropout 1.5", "--layers 2 --fanouts 10,10,10",
           "--deterministic --tune-gemm", "--lr nan", "--lr inf", "--lr -1", "--dropout -0.5", "--dropout nan",
           "--weight-decay nan", "--weight-decay -1", "--model gin --gin-eps nan", "--model gat --attn-dropout nan",
           "--checkpoint-dir ''", "--metrics ''", "--config " + path("conf.d"), "--hidden 99999999999",
           "--model gat --hidden 64 --heads 99999", "--device cpu --tf32", "--device cpu --gpu-mem-budget 8G",
           "--device cpu --fanouts 5,5 --feature-gpu-mem 1G", "--fanouts 5,5 --prefetch 0", "--cache-rank hot",
           "--batch-size -5", "--batch-size 0"}) {
    const CliRun r = gale("train " + store + " -q " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    const std::string flag = bad.substr(bad.rfind("--"), bad.find(' ', bad.rfind("--")) - bad.rfind("--"));
    EXPECT_NE(r.out.find(flag), std::string::npos) << bad << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
  }
}

TEST_F(Cli, PreprocessBadFlagValuesAreNamed) {
  write("e.tsv", "0\t1\n1\t2\n");
  for (const std::string& bad : std::vector<std::string>{"--split-fractions nan,0.1", "--split-fractions 0.5,nan",
                                                         "--split-fractions 0,0.1", "--temp-dir " + path("no-such-dir"),
                                                         "--temp-dir " + path("e.tsv")}) {
    const CliRun r = gale("preprocess " + path("e.tsv") + " -o " + path("s.gale") + " " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find(bad.substr(0, bad.find(' '))), std::string::npos) << bad << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
    expect_nothing_written(path("s.gale"));
  }
  EXPECT_FALSE(fs::exists(path("no-such-dir")));  // never created
}

TEST_F(Cli, BadWorkerFlagsAreNamed) {
  const std::string store = sbm_store();
  for (const std::string& bad : {"--device cpu --fanouts 5,5 --workers 0", "--device cpu --full-graph --workers 2",
                                 "--fanouts 5,5 --gpus x", "--fanouts 5,5 --gpus -1",
                                 "--fanouts 5,5 --workers 2 --gpus 0", "--fanouts 5,5 --gpus 0,0"}) {
    const CliRun r = gale("train " + store + " -q --epochs 1 " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    const bool named = r.out.find("--workers") != std::string::npos || r.out.find("--gpus") != std::string::npos;
    EXPECT_TRUE(named) << bad << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
  }
  // A GPU number past the machine's GPUs is exit 4 naming --gpus (not the --device it became).
  const CliRun missing = gale("train " + store + " -q --epochs 1 --fanouts 5,5 --gpus 0,63");
  EXPECT_EQ(missing.code, 4) << missing.out;
  EXPECT_NE(missing.out.find("--gpus 0,63: no CUDA device"), std::string::npos) << missing.out;
  EXPECT_EQ(lines(missing.out), 1) << missing.out;
}

TEST_F(Cli, NonPositiveCommTimeoutIsNamed) {
  const CliRun r = gale("train " + sbm_store() + " -q --device cpu --fanouts 5,5 --epochs 1 --comm-timeout 0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--comm-timeout"), std::string::npos) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
}

TEST_F(Cli, TwoCpuWorkersTrainAndReportEachOnesThroughput) {
  const std::string store = sbm_store();
  const std::string metrics = path("workers.jsonl");
  const CliRun r = gale("train " + store + " -q --device cpu --workers 2 --check-replicas --fanouts 5,5 --epochs 2 "
                        "--metrics " + metrics);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(metrics);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["workers"], 2);
  EXPECT_EQ(j["worker_seeds_per_s"].size(), 2u);
  EXPECT_EQ(j["worker_stage_s"]["compute"].size(), 2u);  // every stage, every worker
  EXPECT_EQ(j["worker_stage_s"]["wall"].size(), 2u);
  for (const char* part : {"fill", "drain"}) {  // of wait, and after the steps: within the worker's wall
    for (size_t w = 0; w < 2; ++w) {
      EXPECT_GE(j["worker_stage_s"][part][w].get<double>(), 0.0) << part;
      EXPECT_LE(j["worker_stage_s"][part][w].get<double>(), j["worker_stage_s"]["wall"][w].get<double>()) << part;
    }
  }
  EXPECT_LE(j["worker_stage_s"]["fill"][0].get<double>(), j["worker_stage_s"]["wait"][0].get<double>());
  EXPECT_EQ(j["worker_stage_s"]["sum_wait"], nlohmann::json::array({0.0, 0.0}));  // CPU workers' sums block: no stall
  EXPECT_EQ(j["worker_threads"], "shared");  // CPU workers keep TBB's arenas unless asked
  EXPECT_TRUE(j.contains("allreduce_s"));
  EXPECT_TRUE(j.contains("replica_checksum"));
}

TEST_F(Cli, BenchPipelineWithTwoCpuWorkers) {
  const CliRun r = gale("bench pipeline " + sbm_store() + " --device cpu --workers 2 --layers 2 --fanouts 5,5 "
                        "--hidden 16 --epochs 1 --warmup 0 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("cpu x2"), std::string::npos) << r.out;
}

TEST_F(Cli, NonNumericEdgeNamesFileAndLine) {
  write("edges.csv", "0,1\n1,2\nx3,4\n");
  const std::string store = path("bad.gale");
  const CliRun r = gale("preprocess " + path("edges.csv") + " -o " + store);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("edges.csv:3"), std::string::npos) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
  expect_nothing_written(store);
}

TEST_F(Cli, MissingInputIsInputError) {
  const std::string store = path("none.gale");
  const CliRun r = gale("preprocess " + path("nope.csv") + " -o " + store);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("nope.csv"), std::string::npos) << r.out;
  expect_nothing_written(store);
}

TEST_F(Cli, ExistingStoreIsNotReplacedWithoutForce) {
  const std::string store = sbm_store();
  const CliRun r = gale("preprocess --generate sbm:nodes=100,classes=2,avg-degree=4,feature-dim=4 -o " + store);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(gale("preprocess --generate sbm:nodes=100,classes=2,avg-degree=4,feature-dim=4 --force -o " + store).code, 0);
  EXPECT_NE(gale("info " + store).out.find("100"), std::string::npos);
}

TEST_F(Cli, InfoAndVerifyOnAGoodStore) {
  const std::string store = sbm_store();
  const CliRun r = gale("info " + store + " --verify");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2000"), std::string::npos) << r.out;
}

TEST_F(Cli, FlippedByteIsExitThreeOnVerify) {
  const std::string store = sbm_store();
  const fs::path f = fs::path(store) / "features.npy";
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(5000);
  io.put('\x7f');
  io.close();
  const CliRun r = gale("info " + store + " --verify");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("features.npy"), std::string::npos) << r.out;
}

// A byte flipped in the topology makes a value that is still a node id: only the page sums can tell,
// and every command that opens the store says where, in one line, with exit 3.
TEST_F(Cli, FlippedTopologyByteIsExitThreeNamingTheFileAndOffset) {
  const std::string store = sbm_store();
  {
    // Entry 100 of indices: v -> v ^ 1, still in [0, 2000).
    std::fstream io(fs::path(store) / "graph" / "indices.npy", std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(4096 + 4 * 100);
    const char c = static_cast<char>(io.get());
    io.seekp(4096 + 4 * 100);
    io.put(static_cast<char>(c ^ 1));
  }
  const std::string want = store + "/graph/indices.npy: page checksum mismatch at byte offset 4096 (page 1): the store is "
                                   "corrupt; run gale info --verify";
  for (const std::string& cmd : {"info " + store, "train " + store + " -q --epochs 1 --device cpu"}) {
    const CliRun r = gale(cmd);
    EXPECT_EQ(r.code, 3) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << cmd << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << cmd << ": " << r.out;
  }
}

// A store written before page sums opens as it did; --add-page-sums gives it the sums a fresh store
// has, in place, and --verify then checks every page.
TEST_F(Cli, AddPageSumsToAnOlderStoreThenVerify) {
  const std::string store = sbm_store();
  const std::string fresh_manifest = slurp(store + "/manifest.json");
  const CliRun checked = gale("info " + store + " --verify");
  EXPECT_EQ(checked.code, 0) << checked.out;
  EXPECT_NE(checked.out.find(" pages their page sums"), std::string::npos) << checked.out;
  // Strip them: no pages/, no sidecar entries, no key, version 1.
  fs::remove_all(fs::path(store) / "pages");
  nlohmann::json j = nlohmann::json::parse(fresh_manifest);
  j.erase("page_size");
  j["format_version"] = 1;
  for (auto it = j["files"].begin(); it != j["files"].end();) {
    if (it.key().rfind("pages/", 0) == 0) it = j["files"].erase(it);
    else ++it;
  }
  std::ofstream(store + "/manifest.json", std::ios::trunc) << j.dump(2) << "\n";
  const CliRun old = gale("info " + store + " --verify");
  EXPECT_EQ(old.code, 0) << old.out;
  EXPECT_NE(old.out.find("page sums  none"), std::string::npos) << old.out;
  EXPECT_NE(old.out.find("(no page sums: gale info --add-page-sums adds them)"), std::string::npos) << old.out;

  const CliRun add = gale("info " + store + " --add-page-sums");
  EXPECT_EQ(add.code, 0) << add.out;
  EXPECT_NE(add.out.find("page sums: added for "), std::string::npos) << add.out;
  EXPECT_EQ(slurp(store + "/manifest.json"), fresh_manifest);
  EXPECT_FALSE(fs::exists(store + "/manifest.json.tmp"));
  const CliRun again = gale("info " + store + " --add-page-sums");
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("already has them; nothing to do"), std::string::npos) << again.out;
  const CliRun verify = gale("info " + store + " --verify");
  EXPECT_EQ(verify.code, 0) << verify.out;
  EXPECT_NE(verify.out.find(" pages their page sums"), std::string::npos) << verify.out;
}

// `info --host-mem-budget` says where train would read the features from under that budget, and a
// store in node-id order that would go to disk is told that --relabel hot reads fewer pages.
TEST_F(Cli, InfoSaysWhereTheFeaturesLiveUnderAGivenBudget) {
  const std::string store = sbm_store();
  const CliRun roomy = gale("info " + store + " --host-mem-budget 1G");
  EXPECT_EQ(roomy.code, 0) << roomy.out;
  EXPECT_NE(roomy.out.find("placement  features in host memory under the --host-mem-budget 1 GiB (as given)"),
            std::string::npos) << roomy.out;
  EXPECT_EQ(roomy.out.find("--relabel hot"), std::string::npos) << roomy.out;
  const CliRun tight = gale("info " + store + " --host-mem-budget 64K");
  EXPECT_EQ(tight.code, 0) << tight.out;
  EXPECT_NE(tight.out.find("read from disk (the disk tier) beyond the --host-mem-budget"), std::string::npos) << tight.out;
  EXPECT_NE(tight.out.find("a store written with --relabel hot keeps the rows every epoch reads"), std::string::npos)
      << tight.out;
  // In-degree order gets the advice too: the training nodes' rows still fall on most pages.
  const std::string by_degree = path("degree-ordered.gale");
  ASSERT_EQ(gale("preprocess --generate sbm:nodes=2000,classes=4,avg-degree=8,feature-dim=16,seed=3 "
                 "--relabel degree -o " + by_degree).code, 0);
  const CliRun degree_info = gale("info " + by_degree + " --host-mem-budget 64K");
  EXPECT_EQ(degree_info.code, 0) << degree_info.out;
  EXPECT_NE(degree_info.out.find("relabelled yes, degree order"), std::string::npos) << degree_info.out;
  EXPECT_NE(degree_info.out.find("rows in in-degree order: a store written with --relabel hot"), std::string::npos)
      << degree_info.out;
  const std::string ordered = path("hot-ordered.gale");
  const CliRun relabel = gale("preprocess --generate sbm:nodes=2000,classes=4,avg-degree=8,feature-dim=16,seed=3 "
                              "--relabel hot -o " + ordered);
  ASSERT_EQ(relabel.code, 0) << relabel.out;
  EXPECT_EQ(relabel.out.find("note:"), std::string::npos) << "a store that fits the host needs no advice";
  const CliRun hot_first = gale("info " + ordered + " --host-mem-budget 64K");
  EXPECT_EQ(hot_first.code, 0) << hot_first.out;
  EXPECT_NE(hot_first.out.find("read from disk"), std::string::npos) << hot_first.out;
  EXPECT_EQ(hot_first.out.find("--relabel hot"), std::string::npos) << hot_first.out;
  EXPECT_NE(hot_first.out.find("relabelled yes, hot order"), std::string::npos) << hot_first.out;
  const CliRun unknown = gale("preprocess --generate sbm:nodes=2000,classes=4,avg-degree=8,seed=3 --relabel hottest -o " +
                              path("unknown-order.gale"));
  EXPECT_EQ(unknown.code, 2) << unknown.out;
  EXPECT_NE(unknown.out.find("--relabel: expected none, degree, hot or partition, found 'hottest'"), std::string::npos)
      << unknown.out;
  EXPECT_FALSE(fs::exists(path("unknown-order.gale")));
  const CliRun bad = gale("info " + store + " --host-mem-budget lots");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--host-mem-budget"), std::string::npos) << bad.out;
}

TEST_F(Cli, PartitionsAreWrittenReportedAndVerified) {
  const std::string store = path("p.gale");
  const CliRun made = gale("preprocess --generate sbm:nodes=2000,classes=4,avg-degree=8,seed=3 --partitions 4 -o " + store);
  EXPECT_EQ(made.code, 0) << made.out;
  EXPECT_NE(made.out.find("partitioned into 4 parts (metis), edge cut "), std::string::npos) << made.out;
  const CliRun info = gale("info " + store + " --verify");
  EXPECT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("partitions 4 (metis), nodes per part min "), std::string::npos) << info.out;
  // A small budget streams instead.
  const CliRun ldg = gale("preprocess --generate sbm:nodes=2000,classes=4,avg-degree=8,seed=3 --partitions 4 "
                          "--mem-budget 16K -o " + path("ldg.gale"));
  EXPECT_EQ(ldg.code, 0) << ldg.out;
  EXPECT_NE(ldg.out.find("partitioned into 4 parts (ldg)"), std::string::npos) << ldg.out;
  {
    std::fstream io(fs::path(store) / "partition.npy", std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(4096 + 4 * 100);
    io.put('\x01');
  }
  const CliRun bad = gale("info " + store + " --verify");
  EXPECT_EQ(bad.code, 3) << bad.out;
  EXPECT_NE(bad.out.find("partition.npy"), std::string::npos) << bad.out;
}

TEST_F(Cli, BadPartitionCountsAreExitTwoNamingTheFlag) {
  for (const std::string value : {"0", "x", "-2", "2001", "4x"}) {
    const std::string store = path("bad.gale");
    const CliRun r = gale("preprocess --generate sbm:nodes=2000,classes=4,avg-degree=8 --partitions " + value + " -o " + store);
    EXPECT_EQ(r.code, 2) << value << ": " << r.out;
    EXPECT_NE(r.out.find("--partitions"), std::string::npos) << value << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
    expect_nothing_written(store);
  }
}

TEST_F(Cli, TruncatedArrayIsExitThree) {
  const std::string store = sbm_store();
  fs::resize_file(fs::path(store) / "graph" / "indices.npy", 5000);
  for (const std::string& cmd : {"info " + store, "train " + store + " -q --epochs 1"}) {
    const CliRun r = gale(cmd);
    EXPECT_EQ(r.code, 3) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("indices.npy"), std::string::npos) << r.out;
  }
}

TEST_F(Cli, WrongVersionIsExitThree) {
  const std::string store = sbm_store();
  const fs::path m = fs::path(store) / "manifest.json";
  std::ifstream in(m);
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  j["format_version"] = 99;
  std::ofstream(m, std::ios::trunc) << j.dump(2);
  const CliRun r = gale("info " + store);
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("version"), std::string::npos) << r.out;
}

TEST_F(Cli, NotAStoreIsInputOrCorrupt) {
  const CliRun r = gale("info " + path("missing.gale"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("missing.gale: no such store directory"), std::string::npos) << r.out;
  write("edges.tsv", "0 1\n");
  const CliRun file = gale("train " + path("edges.tsv"));
  EXPECT_EQ(file.code, 2) << file.out;
  EXPECT_NE(file.out.find("edges.tsv: not a store"), std::string::npos) << file.out;
  EXPECT_EQ(lines(file.out), 1) << file.out;
}

// An earlier run's checkpoints are its work: a new run does not replace them unless told to, and
// --resume with other options names what differs (exit 3: an incompatible checkpoint).
TEST_F(Cli, CheckpointsOfAnEarlierRunAreNotReplacedSilently) {
  const std::string store = sbm_store();
  const std::string run = "train " + store + " -q --model gcn --epochs 1 --device cpu --checkpoint-dir " + path("ck");
  ASSERT_EQ(gale(run + " --hidden 8").code, 0);
  const std::string before = slurp(path("ck/best.ckpt"));
  const CliRun again = gale(run + " --hidden 16");
  EXPECT_EQ(again.code, 2) << again.out;
  EXPECT_NE(again.out.find("--checkpoint-dir " + path("ck") + ": holds an earlier run's latest.ckpt; pass --resume"),
            std::string::npos) << again.out;
  EXPECT_EQ(slurp(path("ck/best.ckpt")), before);
  const CliRun other = gale(run + " --hidden 16 --resume");
  EXPECT_EQ(other.code, 3) << other.out;
  EXPECT_NE(other.out.find("hidden 8 there, 16 here"), std::string::npos) << other.out;
  EXPECT_EQ(lines(other.out), 1) << other.out;
  EXPECT_EQ(gale(run + " --hidden 16 --overwrite-checkpoints").code, 0);
  EXPECT_NE(slurp(path("ck/best.ckpt")), before);
}

// A --checkpoint-dir that cannot take files is refused before the first epoch (it was found out when
// that epoch's checkpoint failed to write), and nothing is made.
TEST_F(Cli, CheckpointDirThatCannotBeWrittenIsRefusedBeforeTraining) {
  const std::string store = sbm_store();
  write("plain", "a file, not a directory\n");
  for (const auto& [dir, says] : std::vector<std::pair<std::string, std::string>>{
           {path("plain"), ": not a directory"}, {path("plain") + "/ck", ": " + path("plain") + " is not a directory"}}) {
    const CliRun r = gale("train " + store + " --model gcn --hidden 8 --epochs 1 --device cpu --checkpoint-dir " + dir);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("--checkpoint-dir " + dir + says), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("epoch 1/1"), std::string::npos) << r.out;  // before training, not after
    EXPECT_EQ(lines(r.out), 1) << r.out;
  }
  EXPECT_EQ(slurp(path("plain")), "a file, not a directory\n");
  // A directory still to be made, beneath one that exists, is made by the first checkpoint.
  ASSERT_EQ(gale("train " + store + " -q --model gcn --hidden 8 --epochs 1 --device cpu --checkpoint-dir " +
                 path("new/deeper")).code, 0);
  EXPECT_TRUE(fs::exists(path("new/deeper/best.ckpt")));
}

// predict checks its outputs before any work and writes both or neither.
TEST_F(Cli, PredictOutputsAreCheckedFirstAndWrittenTogether) {
  const std::string store = sbm_store();
  ASSERT_EQ(gale("train " + store + " -q --model gcn --hidden 8 --epochs 1 --device cpu --checkpoint-dir " + path("ck")).code, 0);
  const std::string predict = "predict " + store + " --checkpoint " + path("ck");
  const std::string manifest = slurp(store + "/manifest.json"), ckpt = slurp(path("ck/best.ckpt"));
  const std::pair<std::string, std::string> cases[] = {
      {" --out ''", "--out: expected a file path"},
      {" --out " + path("p.npy") + " --embeddings ''", "--embeddings: expected a file path"},
      {" --out " + path("same.npy") + " --embeddings " + path("same.npy"), "the same file as --out"},
      {" --out " + store + "/labels.npy", "inside the store being read"},
      {" --out " + path("ck/best.ckpt"), "the checkpoint being read"},
      {" --out " + path("p.npy") + " --embeddings " + path("no-dir/e.npy"), "--embeddings " + path("no-dir/e.npy") + ": no directory"},
  };
  for (const auto& [flags, expect] : cases) {
    const CliRun r = gale(predict + flags);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.out;
    EXPECT_NE(r.out.find(expect), std::string::npos) << flags << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
  }
  EXPECT_FALSE(fs::exists(path("p.npy")));
  EXPECT_FALSE(fs::exists(path("same.npy")));
  EXPECT_EQ(slurp(store + "/manifest.json"), manifest);
  EXPECT_EQ(slurp(path("ck/best.ckpt")), ckpt);
  EXPECT_EQ(gale("info " + store + " --verify").code, 0);
  const CliRun ok = gale(predict + " --out " + path("p.npy") + " --embeddings " + path("e.npy"));
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(fs::exists(path("p.npy")) && fs::exists(path("e.npy")));
}

// --eval none measures nothing, so it reports no accuracy.
// Outputs replace their paths by a rename, so a path that is not a regular file is refused (a
// device would be replaced, not written) and a symlink is written through.
TEST_F(Cli, PredictWritesRegularFilesAndThroughSymlinks) {
  const std::string store = sbm_store();
  ASSERT_EQ(gale("train " + store + " -q --model gcn --hidden 8 --epochs 1 --device cpu --checkpoint-dir " + path("ck")).code, 0);
  const std::string predict = "predict " + store + " --checkpoint " + path("ck") + " --out ";
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  const CliRun fifo = gale(predict + path("fifo"));
  EXPECT_EQ(fifo.code, 2) << fifo.out;
  EXPECT_NE(fifo.out.find("fifo: exists and is not a regular file"), std::string::npos) << fifo.out;
  EXPECT_TRUE(fs::is_fifo(path("fifo")));
  fs::create_symlink(path("real.npy"), path("link.npy"));
  const CliRun link = gale(predict + path("link.npy"));
  EXPECT_EQ(link.code, 0) << link.out;
  EXPECT_TRUE(fs::is_symlink(path("link.npy")));
  EXPECT_TRUE(fs::is_regular_file(path("real.npy")));
}

// What a killed run left beside its checkpoints and outputs (a temporary named for a dead pid on
// this host) is removed by the next run that writes there; one of a live process stays.
TEST_F(Cli, KilledRunsTemporaryCheckpointsAndOutputsAreRemovedNextTime) {
  const std::string store = sbm_store();
  const pid_t dead = ::fork();  // a pid that has just ended
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  // temp_name(prefix) is prefix + host + "-" + our pid + "-" + random: the same with another pid.
  const auto temp_of = [](const std::string& prefix, pid_t pid) {
    const std::string mine = storage::temp_name(prefix), ours = "-" + std::to_string(::getpid()) + "-";
    const size_t at = mine.rfind(ours);
    return mine.substr(0, at) + "-" + std::to_string(pid) + "-" + mine.substr(at + ours.size());
  };
  fs::create_directories(path("ck"));
  const std::string stale_ckpt = path("ck/" + temp_of(".latest.ckpt.tmp-", dead));
  const std::string live_ckpt = path("ck/" + temp_of(".latest.ckpt.tmp-", 1));  // init: alive
  const std::string stale_out = path(temp_of(".p.npy.tmp-", dead));
  for (const std::string& f : {stale_ckpt, live_ckpt, stale_out}) std::ofstream(f) << "half a file";
  const CliRun train = gale("train " + store + " -q --model gcn --hidden 8 --epochs 2 --device cpu --checkpoint-dir " + path("ck"));
  ASSERT_EQ(train.code, 0) << train.out;
  EXPECT_FALSE(fs::exists(stale_ckpt));
  EXPECT_TRUE(fs::exists(live_ckpt));
  const CliRun predict = gale("predict " + store + " --checkpoint " + path("ck") + " --out " + path("p.npy"));
  ASSERT_EQ(predict.code, 0) << predict.out;
  EXPECT_FALSE(fs::exists(stale_out));
  EXPECT_TRUE(fs::exists(path("p.npy")));
  for (const auto& e : fs::directory_iterator(path("ck")))
    if (e.path() != live_ckpt) EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST_F(Cli, EvalNoneReportsNoAccuracy) {
  const std::string store = sbm_store();
  const CliRun r = gale("train " + store + " -q --model sage --hidden 8 --fanouts 5,5 --epochs 1 --device cpu --eval none");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(--eval none: no accuracy measured)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("best valid_acc"), std::string::npos) << r.out;
}

TEST_F(Cli, CudaDeviceWithoutOneIsExitFour) {
  const std::string store = sbm_store();
  const CliRun r = gale("train " + store + " -q --epochs 1 --device cuda");
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("--device"), std::string::npos) << r.out;
}

TEST_F(Cli, PredictDeviceAndSpmmFlagsAreCheckedAndSampledRunsOnTheCpu) {
  const std::string store = sbm_store();
  ASSERT_EQ(gale("train " + store + " -q --model gcn --hidden 8 --epochs 1 --device cpu --checkpoint-dir " + path("ck")).code, 0);
  const CliRun gpu = gale("predict " + store + " --checkpoint " + path("ck") + " --out " + path("p.npy") + " --device cuda");
  if (gpu.code == 0) {  // this machine has a GPU: the prediction is there
    EXPECT_TRUE(fs::exists(path("p.npy")));
    fs::remove(path("p.npy"));
  } else {
    EXPECT_EQ(gpu.code, 4) << gpu.out;
    EXPECT_NE(gpu.out.find("--device"), std::string::npos) << gpu.out;
    EXPECT_FALSE(fs::exists(path("p.npy")));
  }
  const CliRun tf32 = gale("predict " + store + " --checkpoint " + path("ck") + " --out " + path("p.npy") + " --tf32");
  EXPECT_EQ(tf32.code, 2) << tf32.out;
  EXPECT_NE(tf32.out.find("--device cuda"), std::string::npos) << tf32.out;
  const CliRun spmm = gale("predict " + store + " --checkpoint " + path("ck") + " --device cpu --spmm gar");
  EXPECT_EQ(spmm.code, 2) << spmm.out;
  const CliRun bad = gale("predict " + store + " --checkpoint " + path("ck") + " --device gpu");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--device"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(path("p.npy")));
  // ES-SpMM's sampled estimate runs on the CPU too; its spelling is checked, and training refuses it.
  for (const char* bad_spmm : {"sampled", "sampled:0", "sampled:x", "sampled:4:often", "sampled:5000"}) {
    const CliRun r = gale("predict " + store + " --checkpoint " + path("ck") + " --out " + path("p.npy") +
                          " --spmm " + bad_spmm);
    EXPECT_EQ(r.code, 2) << bad_spmm << ": " << r.out;
    EXPECT_NE(r.out.find("--spmm"), std::string::npos) << r.out;
  }
  EXPECT_FALSE(fs::exists(path("p.npy")));
  const CliRun sampled = gale("predict " + store + " --checkpoint " + path("ck") + " --out " + path("s.npy") +
                              " --spmm sampled:4:bucket");
  EXPECT_EQ(sampled.code, 0) << sampled.out;
  EXPECT_TRUE(fs::exists(path("s.npy")));
  const CliRun train_sampled = gale("train " + store + " -q --epochs 1 --device cpu --spmm sampled:4");
  EXPECT_EQ(train_sampled.code, 2) << train_sampled.out;
  EXPECT_NE(train_sampled.out.find("gale predict"), std::string::npos) << train_sampled.out;
  ASSERT_EQ(gale("train " + store + " -q --model gat --hidden 4 --heads 2 --epochs 1 --device cpu --checkpoint-dir " +
                 path("gat")).code, 0);
  const CliRun gat = gale("predict " + store + " --checkpoint " + path("gat") + " --out " + path("g.npy") +
                          " --spmm sampled:4");
  EXPECT_EQ(gat.code, 2) << gat.out;
  EXPECT_NE(gat.out.find("gat"), std::string::npos) << gat.out;
  EXPECT_FALSE(fs::exists(path("g.npy")));
  // And on the CPU the same checkpoint predicts, reporting where the forward pass ran.
  const CliRun cpu = gale("predict " + store + " --checkpoint " + path("ck") + " --out " + path("p.npy"));
  EXPECT_EQ(cpu.code, 0) << cpu.out;
  EXPECT_NE(cpu.out.find("forward"), std::string::npos) << cpu.out;
  EXPECT_TRUE(fs::exists(path("p.npy")));
}

// TC-GNN's tensor-core SpMM translates a whole graph once: mini-batches, GAT and --deterministic are
// refused before anything runs; on the CPU full-graph training runs its TF32 twin.
TEST_F(Cli, TensorCoreSpmmIsForWholeGraphs) {
  const std::string store = sbm_store();
  const std::pair<std::string, std::string> refused[] = {{"--fanouts 5,5", "--full-graph"},
                                                         {"--model gat", "gat"},
                                                         {"--deterministic", "--deterministic"}};
  for (const auto& [flags, named] : refused) {
    const CliRun r = gale("train " + store + " -q --epochs 1 --device cpu --spmm tc " + flags);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.out;
    EXPECT_NE(r.out.find(named), std::string::npos) << r.out;
  }
  const CliRun typo = gale("train " + store + " -q --epochs 1 --device cpu --spmm tensor");
  EXPECT_EQ(typo.code, 2) << typo.out;
  EXPECT_NE(typo.out.find("memory-aware or tc"), std::string::npos) << typo.out;
  const CliRun twin = gale("train " + store + " -q --model gcn --hidden 8 --epochs 2 --device cpu --spmm tc --checkpoint-dir " +
                           path("tc"));
  EXPECT_EQ(twin.code, 0) << twin.out;
  const CliRun predict = gale("predict " + store + " --checkpoint " + path("tc") + " --out " + path("t.npy") +
                              " --device cpu --spmm tc");
  EXPECT_EQ(predict.code, 2) << predict.out;
  EXPECT_FALSE(fs::exists(path("t.npy")));
}

TEST_F(Cli, StoreWithoutFeaturesCannotTrain) {
  write("edges.txt", "# a comment\n0 1\n1 2\n2 0\n");
  const std::string store = path("plain.gale");
  ASSERT_EQ(gale("preprocess " + path("edges.txt") + " -o " + store).code, 0);
  const CliRun r = gale("train " + store + " -q --epochs 1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("features"), std::string::npos) << r.out;
}

// A store whose edge weights carry the classes and whose features barely do: 1000 nodes of 4
// classes, 8 edges each, half to the node's own class with weight 1, half across with weight 0.04.
std::string weighted_store(const Cli& t) {
  constexpr int64_t kNodes = 1000, kClasses = 4, kDim = 8;
  std::mt19937 rng(7);
  auto uniform = [&] { return static_cast<double>(rng()) / 4294967296.0; };
  std::vector<int32_t> labels(kNodes);
  for (auto& l : labels) l = static_cast<int32_t>(rng() % kClasses);
  std::vector<float> x(static_cast<size_t>(kNodes * kDim));
  for (int64_t v = 0; v < kNodes; ++v)
    for (int64_t d = 0; d < kDim; ++d)
      x[v * kDim + d] = static_cast<float>(uniform() * 2 - 1 + (d % kClasses == labels[v] ? 0.25 : 0.0));
  auto save = [&](const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
                  size_t bytes) {
    storage::NpyWriter w(t.path(name), dtype, std::move(shape));
    w.write(data, bytes);
    w.finish();
  };
  save("x.npy", DType::kF32, {kNodes, kDim}, x.data(), x.size() * 4);
  save("y.npy", DType::kI32, {kNodes}, labels.data(), labels.size() * 4);
  std::ostringstream edges;
  for (int64_t v = 0; v < kNodes; ++v) {
    for (int e = 0; e < 8; ++e) {
      const bool same = e % 2 == 0;
      int64_t u = static_cast<int64_t>(rng() % kNodes);
      while (u == v || (labels[u] == labels[v]) != same) u = static_cast<int64_t>(rng() % kNodes);
      edges << v << '\t' << u << '\t' << (same ? "1" : "0.04") << '\n';
    }
  }
  t.write("edges.tsv", edges.str());
  const std::string store = t.path("w.gale");
  const CliRun r = gale("preprocess " + t.path("edges.tsv") + " --undirected --features " + t.path("x.npy") +
                        " --labels " + t.path("y.npy") + " -o " + store);
  EXPECT_EQ(r.code, 0) << r.out;
  return store;
}

// The test accuracy of `gale train`'s last line ("... test_acc 0.9123"), or -1.
double test_acc(const std::string& out) {
  const size_t at = out.rfind("test_acc ");
  return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 9));
}

// A weighted edge list's weights reach GCN, SAGE and GIN (and say so), not GAT; they can be turned
// off; predict aggregates as the checkpoint's model was trained; weighted neighbour sampling.
TEST_F(Cli, EdgeWeightsShapeTheAggregationsWhenTheStoreHasThem) {
  const std::string store = weighted_store(*this);
  const CliRun info = gale("info " + store);
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_NE(info.out.find("weights    min 0.04  mean "), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("max 1  (0 not positive)"), std::string::npos) << info.out;
  const std::string common = " --device cpu --epochs 100 --hidden 32 --seed 1";
  for (const std::string model : {"gcn", "sage", "gin"}) {
    const CliRun used = gale("train " + store + common + " --model " + model + " --checkpoint-dir " + path(model));
    ASSERT_EQ(used.code, 0) << used.out;
    EXPECT_NE(used.out.find("edge weights: the aggregations use the store's"), std::string::npos) << used.out;
    const CliRun ignored = gale("train " + store + common + " -q --edge-weights ignore --model " + model);
    ASSERT_EQ(ignored.code, 0) << ignored.out;
    // The classes are in the weights: with them the model is far more accurate.
    EXPECT_GT(test_acc(used.out), test_acc(ignored.out) + 0.15) << model << "\n" << used.out << ignored.out;
    if (model != "gin") EXPECT_GT(test_acc(used.out), 0.85) << used.out;
    // predict builds the graph as the checkpoint's model was trained: the same test accuracy.
    const CliRun pred = gale("predict " + store + " --device cpu --checkpoint " + path(model) + " --out " +
                             path(model + ".npy"));
    ASSERT_EQ(pred.code, 0) << pred.out;
    EXPECT_NEAR(test_acc(pred.out), test_acc(used.out), 1e-4) << pred.out << used.out;
  }
  const CliRun resume = gale("train " + store + common + " -q --model gcn --edge-weights ignore --resume "
                             "--checkpoint-dir " + path("gcn"));
  EXPECT_EQ(resume.code, 3) << resume.out;
  EXPECT_NE(resume.out.find("edge_weights true there, absent here"), std::string::npos) << resume.out;

  const CliRun gat = gale("train " + store + " --device cpu --epochs 1 --model gat --hidden 4 --heads 2");
  ASSERT_EQ(gat.code, 0) << gat.out;
  EXPECT_NE(gat.out.find("edge weights: not used (GAT"), std::string::npos) << gat.out;
  const CliRun gat_use = gale("train " + store + " -q --device cpu --epochs 1 --model gat --edge-weights use");
  EXPECT_EQ(gat_use.code, 2) << gat_use.out;
  EXPECT_NE(gat_use.out.find("--edge-weights use: GAT"), std::string::npos) << gat_use.out;

  // Mini-batch, with neighbours drawn by weight.
  const CliRun mini = gale("train " + store + " -q --device cpu --epochs 30 --lr 0.03 --model sage --hidden 32 --fanouts 5,5 "
                           "--batch-size 128 --neighbor-sampling weighted --eval batched");
  ASSERT_EQ(mini.code, 0) << mini.out;
  EXPECT_GT(test_acc(mini.out), 0.6) << mini.out;  // chance 0.25, unweighted ~0.3
}

TEST_F(Cli, EdgeWeightFlagsAreNamed) {
  const std::string plain = sbm_store();
  const CliRun use = gale("train " + plain + " -q --device cpu --epochs 1 --edge-weights use");
  EXPECT_EQ(use.code, 2) << use.out;
  EXPECT_NE(use.out.find("--edge-weights use: " + plain + " has no edge weights"), std::string::npos) << use.out;
  const CliRun sampled = gale("train " + plain + " -q --device cpu --epochs 1 --fanouts 5,5 --neighbor-sampling weighted");
  EXPECT_EQ(sampled.code, 2) << sampled.out;
  EXPECT_NE(sampled.out.find("--neighbor-sampling weighted: " + plain + " has no edge weights"), std::string::npos)
      << sampled.out;
  const CliRun whole = gale("train " + plain + " -q --device cpu --epochs 1 --neighbor-sampling weighted");
  EXPECT_EQ(whole.code, 2) << whole.out;
  EXPECT_NE(whole.out.find("give --fanouts"), std::string::npos) << whole.out;
  for (const std::string bad : {"--edge-weights maybe", "--neighbor-sampling biased"}) {
    const CliRun r = gale("train " + plain + " -q --device cpu --epochs 1 " + bad);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(bad.substr(0, bad.find(' ')) + ": expected"), std::string::npos) << r.out;
  }
  // An unweighted store says nothing about weights.
  const CliRun quiet = gale("train " + plain + " --device cpu --epochs 1");
  EXPECT_EQ(quiet.code, 0) << quiet.out;
  EXPECT_EQ(quiet.out.find("edge weights"), std::string::npos) << quiet.out;
}

// --norm batch: training (full-graph and mini-batch) learns; the checkpoint carries the running
// statistics, so predict scores what training scored; a resume with another --norm is refused.
TEST_F(Cli, BatchNormTrainsAndItsRunningStatisticsReachPredict) {
  const std::string store = sbm_store();
  const std::string common = " --device cpu --hidden 16 --seed 2 --model gcn";
  const CliRun r = gale("train " + store + common + " -q --epochs 40 --norm batch --checkpoint-dir " + path("ck"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_GT(test_acc(r.out), 0.6) << r.out;  // chance is 0.25
  const CliRun pred = gale("predict " + store + " --device cpu --checkpoint " + path("ck") + " --out " + path("p.npy"));
  ASSERT_EQ(pred.code, 0) << pred.out;
  EXPECT_NEAR(test_acc(pred.out), test_acc(r.out), 1e-4) << pred.out << r.out;
  const CliRun other = gale("train " + store + common + " -q --epochs 41 --resume --checkpoint-dir " + path("ck"));
  EXPECT_EQ(other.code, 3) << other.out;
  EXPECT_NE(other.out.find("norm \"batch\" there, absent here"), std::string::npos) << other.out;
  const CliRun more = gale("train " + store + common + " -q --norm batch --epochs 42 --resume --checkpoint-dir " + path("ck"));
  EXPECT_EQ(more.code, 0) << more.out;
  const CliRun mini = gale("train " + store + " -q --device cpu --epochs 10 --model sage --hidden 32 --fanouts 5,5 "
                           "--batch-size 64 --norm batch --eval batched");
  ASSERT_EQ(mini.code, 0) << mini.out;
  EXPECT_GT(test_acc(mini.out), 0.5) << mini.out;
  const CliRun bad = gale("train " + store + " -q --device cpu --epochs 1 --norm layer");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_EQ(lines(bad.out), 1) << bad.out;
  EXPECT_NE(bad.out.find("--norm: expected none or batch, found 'layer'"), std::string::npos) << bad.out;
}

TEST_F(Cli, ConfigFileWithUnknownKeyIsNamed) {
  const std::string store = sbm_store();
  write("run.ini", "model = gcn\nepocs = 3\n");
  const CliRun r = gale("train " + store + " -q --config " + path("run.ini"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("epocs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("run.ini:2: "), std::string::npos) << r.out;
  write("bad.ini", "# comment\nhidden = abc\n");
  const CliRun value = gale("train " + store + " -q --config " + path("bad.ini"));
  EXPECT_EQ(value.code, 2) << value.out;
  EXPECT_NE(value.out.find("bad.ini:2: "), std::string::npos) << value.out;
  write("junk.ini", "model = gcn\n\njunk line\n");
  const CliRun junk = gale("train " + store + " -q --config " + path("junk.ini"));
  EXPECT_EQ(junk.code, 2) << junk.out;
  EXPECT_NE(junk.out.find("junk.ini:3: "), std::string::npos) << junk.out;
  write("section.ini", "[train]\nmodel = gcn\n");
  const CliRun section = gale("train " + store + " -q --config " + path("section.ini"));
  EXPECT_EQ(section.code, 2) << section.out;
  EXPECT_NE(section.out.find("section.ini:2: "), std::string::npos) << section.out;
  write("chain.ini", "config = " + path("run.ini") + "\n");
  const CliRun chain = gale("train " + store + " -q --config " + path("chain.ini"));
  EXPECT_EQ(chain.code, 2) << chain.out;
  EXPECT_NE(chain.out.find("chain.ini: sets 'config' itself"), std::string::npos) << chain.out;
  // Boost's messages fill in %placeholders% until none is left: text holding one looped forever
  // (found by fuzzing the config reader). Now one line at once, naming the line.
  write("placeholder.ini", "model = gcn\nbatch-size = %canonical_option%\n");
  const CliRun looped = gale("train " + store + " -q --config " + path("placeholder.ini"));
  EXPECT_EQ(looped.code, 2) << looped.out;
  EXPECT_NE(looped.out.find("placeholder.ini:2: "), std::string::npos) << looped.out;
  EXPECT_EQ(lines(looped.out), 1) << looped.out;
  const CliRun on_the_line = gale("train " + store + " -q --batch-size %canonical_option%");
  EXPECT_EQ(on_the_line.code, 2) << on_the_line.out;
  EXPECT_EQ(lines(on_the_line.out), 1) << on_the_line.out;
}

TEST_F(Cli, TrainWritesOneJsonObjectPerEpochAndAFinalOne) {
  const std::string store = sbm_store();
  write("run.ini", "model = gcn\nhidden = 32\n");
  const std::string metrics = path("run.jsonl");
  const CliRun r = gale("train " + store + " --config " + path("run.ini") + " --epochs 4 --metrics " + metrics +
                     " --checkpoint-dir " + path("ckpt"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(metrics);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 5u);
  for (int e = 0; e < 4; ++e) {
    for (const char* key : {"epoch", "loss", "train_acc", "valid_acc", "test_acc", "epoch_s"})
      EXPECT_TRUE(rows[e].contains(key)) << key;
    EXPECT_EQ(rows[e]["epoch"], e);
  }
  EXPECT_EQ(rows[4]["final"], true);
  EXPECT_TRUE(rows[4].contains("best_valid_acc"));
  EXPECT_TRUE(rows[4].contains("test_acc_at_best_valid"));
  EXPECT_TRUE(fs::exists(path("ckpt/latest.ckpt")));
  // Resume continues to 6 epochs.
  const CliRun again = gale("train " + store + " -q --config " + path("run.ini") + " --epochs 6 --resume --checkpoint-dir " +
                         path("ckpt"));
  EXPECT_EQ(again.code, 0) << again.out;
  // Predictions for every node from the best checkpoint, as an int32 .npy.
  const CliRun pred = gale("predict " + store + " --checkpoint " + path("ckpt") + " --out " + path("pred.npy") +
                        " --embeddings " + path("logits.npy"));
  ASSERT_EQ(pred.code, 0) << pred.out;
  const storage::NpyHeader h = storage::read_npy_header(path("pred.npy"));
  EXPECT_EQ(h.dtype, DType::kI32);
  ASSERT_EQ(h.shape.size(), 1u);
  EXPECT_EQ(h.shape[0], 2000);
  const storage::NpyHeader l = storage::read_npy_header(path("logits.npy"));
  EXPECT_EQ(l.shape, (std::vector<int64_t>{2000, 4}));
  const CliRun missing = gale("predict " + store + " --checkpoint " + path("nowhere"));
  EXPECT_EQ(missing.code, 2) << missing.out;
}

// The metrics file's lines.
std::vector<nlohmann::json> metric_rows(const std::string& file) {
  std::ifstream in(file);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// --patience ends the run once that many epochs in a row have not raised the best validation
// accuracy (a tie is no rise); the final metrics line says so, a resume of the stopped run trains
// no more, and a resume with more patience (or none) goes on.
TEST_F(Cli, PatienceStopsOnceTheValidationAccuracyStopsRising) {
  const std::string store = sbm_store();
  const std::string common = "train " + store + " --device cpu --model gcn --hidden 16 --epochs 2000 --checkpoint-dir " +
                             path("ck") + " --metrics " + path("m.jsonl");
  const CliRun r = gale(common + " -q --patience 10");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("stopped early after epoch "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("10 epochs without a better validation accuracy"), std::string::npos) << r.out;
  std::vector<nlohmann::json> rows = metric_rows(path("m.jsonl"));
  ASSERT_GE(rows.size(), 12u);
  const nlohmann::json final_row = rows.back();
  rows.pop_back();
  EXPECT_EQ(final_row["final"], true);
  EXPECT_EQ(final_row["stopped_early"], true);
  const int64_t trained = final_row["epochs_trained"].get<int64_t>();
  EXPECT_EQ(trained, static_cast<int64_t>(rows.size()));
  EXPECT_LT(trained, 2000);
  // The last strict rise of the running best is exactly `patience` epochs before the last epoch.
  double best = -1;
  int64_t rose = -1;
  for (const nlohmann::json& row : rows) {
    const double v = row["valid_acc"].get<double>();
    if (v > best) best = v, rose = row["epoch"].get<int64_t>();
  }
  EXPECT_EQ(trained - 1 - rose, 10);
  EXPECT_DOUBLE_EQ(final_row["best_valid_acc"].get<double>(), best);
  EXPECT_GT(final_row["test_acc_at_best_valid"].get<double>(), 0.5);  // chance is 0.25

  // Resumed with the same patience: nothing left to train, the same result.
  const CliRun again = gale(common + " -q --patience 10 --resume");
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("stopped early after epoch " + std::to_string(trained) + " of 2000"), std::string::npos)
      << again.out;
  rows = metric_rows(path("m.jsonl"));
  ASSERT_EQ(rows.size(), static_cast<size_t>(trained) + 2);
  EXPECT_EQ(rows.back()["epochs_trained"], trained);
  // Without patience it goes on to --epochs.
  const std::string more = "train " + store + " --device cpu --model gcn --hidden 16 --epochs " +
                           std::to_string(trained + 3) + " --checkpoint-dir " + path("ck") + " --metrics " +
                           path("m.jsonl") + " -q --resume";
  const CliRun on = gale(more);
  ASSERT_EQ(on.code, 0) << on.out;
  EXPECT_EQ(on.out.find("stopped early"), std::string::npos) << on.out;
  rows = metric_rows(path("m.jsonl"));
  ASSERT_EQ(rows.size(), static_cast<size_t>(trained) + 6);
  EXPECT_EQ(rows.back()["epochs_trained"], trained + 3);
  EXPECT_EQ(rows.back()["stopped_early"], false);
}

// --lr-schedule: each epoch's rate is in the metrics; cosine follows CosineAnnealingLR over the run;
// plateau halves the rate once more than P epochs in a row have not raised the best validation
// accuracy, and a run stopped and resumed goes on with its reductions, bit for bit.
TEST_F(Cli, LearningRateSchedulesFollowTorchsSchedulers) {
  const std::string store = sbm_store();
  const std::string common = "train " + store + " -q --device cpu --model gcn --hidden 16 --deterministic";
  const CliRun cosine = gale(common + " --epochs 20 --lr 0.02 --min-lr 0.002 --lr-schedule cosine --metrics " + path("c.jsonl"));
  ASSERT_EQ(cosine.code, 0) << cosine.out;
  std::vector<nlohmann::json> rows = metric_rows(path("c.jsonl"));
  ASSERT_EQ(rows.size(), 21u);
  for (int e = 0; e < 20; ++e) {
    const double want = 0.002 + (0.02 - 0.002) * 0.5 * (1 + std::cos(std::acos(-1.0) * e / 20));
    EXPECT_NEAR(rows[e]["lr"].get<double>(), want, 1e-6 * want) << "epoch " << e;
  }
  const CliRun step = gale(common + " --epochs 7 --lr-schedule step:3:0.1 --metrics " + path("s.jsonl"));
  ASSERT_EQ(step.code, 0) << step.out;
  rows = metric_rows(path("s.jsonl"));
  for (int e = 0; e < 7; ++e)
    EXPECT_NEAR(rows[e]["lr"].get<double>(), 0.01 * std::pow(0.1, e / 3), 1e-9) << "epoch " << e;

  const std::string plateau = common + " --lr-schedule plateau:2:0.5 --lr 0.05";
  const CliRun straight = gale(plateau + " --epochs 60 --metrics " + path("p.jsonl") + " --checkpoint-dir " + path("a"));
  ASSERT_EQ(straight.code, 0) << straight.out;
  rows = metric_rows(path("p.jsonl"));
  ASSERT_EQ(rows.size(), 61u);
  double best = -1, rate = 0.05;
  int64_t rose = -1, reduced = -1, reductions = 0;
  for (int e = 0; e < 60; ++e) {
    EXPECT_NEAR(rows[e]["lr"].get<double>(), rate, 1e-6 * rate) << "epoch " << e;
    const double v = rows[e]["valid_acc"].get<double>();
    if (v > best) best = v, rose = e;
    if (e - std::max(rose, reduced) > 2) rate *= 0.5, reduced = e, ++reductions;
  }
  EXPECT_GE(reductions, 2);  // the schedule did act
  const CliRun first = gale(plateau + " --epochs 30 --checkpoint-dir " + path("b"));
  ASSERT_EQ(first.code, 0) << first.out;
  const CliRun resumed = gale(plateau + " --epochs 60 --resume --checkpoint-dir " + path("b"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(resumed.out, straight.out);
  EXPECT_TRUE(slurp(path("a/latest.ckpt")) == slurp(path("b/latest.ckpt"))) << "final checkpoints differ";

  for (const std::string& bad : {std::string("--lr-schedule linear"), std::string("--lr-schedule step:0:0.5"),
                                 std::string("--lr-schedule plateau:5:1.5"), std::string("--lr-schedule step:3"),
                                 std::string("--lr-schedule plateau:3:0.5 --eval none"),
                                 std::string("--min-lr 0.5"), std::string("--min-lr -1")}) {
    const CliRun r = gale("train " + store + " -q --device cpu --epochs 2 " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
    EXPECT_NE(r.out.find(bad.substr(0, bad.find(' '))), std::string::npos) << r.out;
  }
}

TEST_F(Cli, PatienceFlagsAreNamed) {
  const std::string store = sbm_store();
  for (const std::string& bad : {std::string("--patience -1"), std::string("--patience 5 --eval none"),
                                 std::string("--patience x")}) {
    const CliRun r = gale("train " + store + " -q --device cpu --epochs 3 " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
    EXPECT_NE(r.out.find("--patience"), std::string::npos) << r.out;
  }
}

// --eval sampled: mini-batch inference with the training fanouts; a full-graph run has none.
TEST_F(Cli, SampledEvaluationNeedsFanoutsAndReportsAccuracy) {
  const std::string store = sbm_store();
  const std::pair<std::string, std::string> bad[] = {
      {"--eval sampled", "--eval sampled: needs --fanouts"},
      {"--fanouts 5,5 --eval sample", "expected auto, full, batched, sampled or none, found 'sample'"}};
  for (const auto& [args, why] : bad) {
    const CliRun b = gale("train " + store + " -q --device cpu --epochs 1 " + args);
    EXPECT_EQ(b.code, 2) << args << ": " << b.out;
    EXPECT_EQ(lines(b.out), 1) << b.out;
    EXPECT_NE(b.out.find(why), std::string::npos) << b.out;
  }
  const CliRun r = gale("train " + store + " -q --device cpu --model sage --hidden 16 --fanouts 5,5 --epochs 2 --eval sampled");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("best valid_acc"), std::string::npos) << r.out;
}

TEST_F(Cli, SbmDemoLearnsFarAboveChance) {
  const std::string store = sbm_store();
  const std::string metrics = path("m.jsonl");
  const CliRun r = gale("train " + store + " -q --model sage --hidden 32 --fanouts 10,10 --batch-size 64 --epochs 10 "
                     "--metrics " + metrics);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(metrics);
  nlohmann::json last;
  for (std::string line; std::getline(in, line);) last = nlohmann::json::parse(line);
  EXPECT_GT(last["test_acc_at_best_valid"].get<double>(), 0.5);  // chance is 0.25
}

// Never lose work: mini-batch SAGE trained straight, then again with `signal` sent after its
// third epoch (plus `settle_ms`), expected to end with `code`, then resumed: the resumed run must
// end bit for bit where the straight one did (--deterministic). Returns the stopped run's log.
std::string check_interrupted_run_resumes(Cli& t, const std::string& flags, int signal, int settle_ms, int code) {
  const std::string store = t.sbm_store();
  const std::string common = "train " + store + " -q --deterministic --model sage --hidden 32 --fanouts 5,5 "
                             "--batch-size 16 --epochs 40 " + flags + " --checkpoint-dir ";
  const CliRun straight = gale(common + t.path("a"));
  EXPECT_EQ(straight.code, 0) << straight.out;
  const pid_t pid = start_gale(common + t.path("b") + " --metrics " + t.path("b.jsonl"), t.path("b.log"));
  EXPECT_GT(pid, 0);
  if (pid <= 0 || !wait_for_lines(t.path("b.jsonl"), 3, pid)) {
    ADD_FAILURE() << "the run ended before it could be stopped: " << slurp(t.path("b.log"));
    return "";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
  EXPECT_EQ(::kill(pid, signal), 0);
  EXPECT_EQ(finish(pid), code) << slurp(t.path("b.log"));
  EXPECT_TRUE(fs::exists(t.path("b/latest.ckpt")));
  const CliRun resumed = gale(common + t.path("b") + " --resume");
  EXPECT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(resumed.out, straight.out);  // the best epoch and its accuracies
  EXPECT_TRUE(slurp(t.path("a/latest.ckpt")) == slurp(t.path("b/latest.ckpt"))) << "final checkpoints differ";
  return slurp(t.path("b.log"));
}

// Ctrl-C or a scheduler's SIGTERM: the first signal stops training at its next step with a
// checkpoint there and exit code 128 + the signal, mid-epoch included.
TEST_F(Cli, InterruptedMiniBatchRunResumesToTheUninterruptedResult) {
  const std::string log = check_interrupted_run_resumes(*this, "", SIGINT, 0, 130);
  EXPECT_NE(log.find("gale: stopped by SIGINT "), std::string::npos) << log;
  EXPECT_NE(log.find("--resume"), std::string::npos) << log;
}

// A stopped mini-batch run with batch normalisation resumes bit for bit: the checkpoint written
// inside the epoch holds the running statistics as they were at that step.
TEST_F(Cli, InterruptedRunWithBatchNormResumesToTheUninterruptedResult) {
  check_interrupted_run_resumes(*this, "--norm batch", SIGINT, 0, 130);
}

// SIGKILL cannot be caught: with --checkpoint-interval the run has checkpointed inside its epochs
// too (here after every few steps).
TEST_F(Cli, KilledRunWithACheckpointIntervalResumesToTheUninterruptedResult) {
  check_interrupted_run_resumes(*this, "--checkpoint-interval 0.02", SIGKILL, 30, -1);
}

TEST_F(Cli, CheckpointIntervalFlagsAreNamed) {
  const std::string store = sbm_store();
  for (const std::string& bad : {std::string("--checkpoint-interval 5x --fanouts 5,5 --checkpoint-dir ") + path("c"),
                                 std::string("--checkpoint-interval 10m --fanouts 5,5"),
                                 std::string("--checkpoint-interval 10m --checkpoint-dir ") + path("c")}) {
    const CliRun r = gale("train " + store + " -q --epochs 1 " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
    EXPECT_NE(r.out.find("--checkpoint-interval"), std::string::npos) << r.out;
  }
}

TEST_F(Cli, SigtermStopsFullGraphTrainingAfterTheEpochWithExit143) {
  const std::string store = sbm_store();
  const std::string common = "train " + store + " -q --model gcn --hidden 16 --checkpoint-dir " + path("ck");
  const pid_t pid = start_gale(common + " --epochs 1000000 --metrics " + path("m.jsonl"), path("log"));
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_lines(path("m.jsonl"), 2, pid)) << slurp(path("log"));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  ASSERT_EQ(finish(pid), 143) << slurp(path("log"));
  const std::string log = slurp(path("log"));
  EXPECT_NE(log.find("gale: stopped by SIGTERM after epoch "), std::string::npos) << log;
  // Every completed epoch has its line and no final line was written: the run is not over.
  std::ifstream in(path("m.jsonl"));
  int epochs = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_FALSE(j.contains("final"));
    ++epochs;
  }
  const CliRun more = gale(common + " --epochs " + std::to_string(epochs + 2) + " --resume --metrics " + path("m.jsonl"));
  ASSERT_EQ(more.code, 0) << more.out;
  std::ifstream again(path("m.jsonl"));
  int lines_now = 0;
  nlohmann::json last;
  for (std::string line; std::getline(again, line);) {
    last = nlohmann::json::parse(line);
    ++lines_now;
  }
  EXPECT_EQ(lines_now, epochs + 3);
  EXPECT_EQ(last["final"], true);
}

// SIGINT / SIGTERM while a store is being written (here a generated graph sorted on disk in runs)
// end the run with 128 + the signal's number and remove the temporary store and the sorted runs: no
// store and nothing else is left. A run killed outright (SIGKILL) leaves them, and the next run of
// the same store removes them.
TEST_F(Cli, StoppedPreprocessLeavesNoStoreAndNoTemporaryFiles) {
  const std::string store = path("big.gale"), runs = path("runs");
  const std::string args = "preprocess --generate sbm:nodes=300000,classes=4,avg-degree=24,feature-dim=8 --mem-budget 2M "
                           "--temp-dir " + runs + " -o " + store;
  fs::create_directories(runs);
  // Waits until the sort has written a run (and the store's temporary directory exists).
  const auto started = [&](pid_t pid) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      for (const auto& d : fs::directory_iterator(runs))
        if (!fs::is_empty(d.path())) return true;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  for (const int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig);
    const pid_t pid = start_gale(args, path("log"));
    ASSERT_GT(pid, 0);
    ASSERT_TRUE(started(pid)) << slurp(path("log"));
    ASSERT_EQ(::kill(pid, sig), 0);
    EXPECT_EQ(finish(pid), 128 + sig) << slurp(path("log"));
    const std::string log = slurp(path("log"));
    EXPECT_NE(log.find(std::string("gale: stopped by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM")), std::string::npos) << log;
    expect_nothing_written(store);
    EXPECT_TRUE(fs::is_empty(runs));
  }
  const pid_t pid = start_gale(args, path("log"));
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(started(pid)) << slurp(path("log"));
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  EXPECT_EQ(finish(pid), -1);
  EXPECT_FALSE(fs::is_empty(runs));
  const CliRun again = gale("preprocess " + path("missing.tsv") + " --temp-dir " + runs + " -o " + store);
  EXPECT_EQ(again.code, 2) << again.out;  // fails before sorting: the sorter's leftovers stay
  const CliRun ok = gale(args);
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(fs::is_empty(runs));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// Full-graph SAGE with the side-by-side operands that cost memory (the first layer's [A x | x],
// a MaxK hidden layer's input gradients) learns as well.
TEST_F(Cli, StackedOperandsTrainFullGraphSage) {
  const std::string store = sbm_store();
  for (const std::string activation : {"relu", "maxk:8"}) {
    const std::string metrics = path("stacked-" + activation.substr(0, 4) + ".jsonl");
    const CliRun r = gale("train " + store + " -q --model sage --layers 3 --hidden 32 --full-graph --epochs 30 "
                          "--stack-operands --activation " + activation + " --metrics " + metrics);
    ASSERT_EQ(r.code, 0) << r.out;
    std::ifstream in(metrics);
    nlohmann::json last;
    for (std::string line; std::getline(in, line);) last = nlohmann::json::parse(line);
    EXPECT_GT(last["test_acc_at_best_valid"].get<double>(), 0.5) << activation;  // chance is 0.25
  }
}

// The JSON objects among a run's output lines (the generator's progress goes to stderr beside them).
std::vector<nlohmann::json> json_rows(const std::string& out) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') rows.push_back(nlohmann::json::parse(line));
  return rows;
}

constexpr const char* kBenchGraph = "--generate rmat:scale=10,edge-factor=4";

TEST_F(Cli, BenchSampleOnTheCpuPrintsOneJsonRow) {
  const CliRun r = gale(std::string("bench sample ") + kBenchGraph + " --samplers cpu --batches 3 --warmup 1 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rows = json_rows(r.out);
  ASSERT_EQ(rows.size(), 1u) << r.out;
  for (const char* key : {"bench", "device", "sampler", "topology", "fanouts", "batch_size", "batches", "warmup",
                          "ms_per_batch", "edges_per_batch", "input_nodes_per_batch", "medges_per_s"})
    EXPECT_TRUE(rows[0].contains(key)) << key << ": " << r.out;
  EXPECT_EQ(rows[0]["bench"], "sample");
  EXPECT_EQ(rows[0]["sampler"], "cpu");
  EXPECT_EQ(rows[0]["device"], "cpu");
  EXPECT_EQ(rows[0]["batches"], 3);
  EXPECT_GT(rows[0]["edges_per_batch"].get<double>(), 0.0);
  // No train split in a generated graph without classes: every node is a seed, so a batch of
  // 1024 seeds reads at least its 1024 seeds' features.
  EXPECT_GE(rows[0]["input_nodes_per_batch"].get<double>(), 1024.0);
  EXPECT_EQ(rows[0]["sampling"], "uniform");
  // Weighted draws need a weighted graph, and say so.
  const CliRun weighted = gale(std::string("bench sample ") + kBenchGraph +
                               ",weights=uniform --samplers cpu --batches 2 --warmup 1 --json --neighbor-sampling weighted");
  ASSERT_EQ(weighted.code, 0) << weighted.out;
  const auto w = json_rows(weighted.out);
  ASSERT_EQ(w.size(), 1u) << weighted.out;
  EXPECT_EQ(w[0]["sampling"], "weighted");
  EXPECT_GT(w[0]["edges_per_batch"].get<double>(), 0.0);
  const CliRun plain = gale(std::string("bench sample ") + kBenchGraph + " --samplers cpu --neighbor-sampling weighted");
  EXPECT_EQ(plain.code, 2) << plain.out;
  EXPECT_NE(plain.out.find("has no edge weights"), std::string::npos) << plain.out;
}

TEST_F(Cli, BenchSampleTableNamesTheDevice) {
  const CliRun r = gale(std::string("bench sample ") + kBenchGraph + " --samplers cpu --batches 2 --warmup 0 --fanouts 5,5");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("device: cpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ms/batch"), std::string::npos) << r.out;
}

TEST_F(Cli, BenchSampleOnTheGpuWithoutOneNamesTheWayOut) {
  const CliRun r = gale(std::string("bench sample ") + kBenchGraph + " --batches 2 --warmup 0");
  if (r.code == 0) GTEST_SKIP() << "a GPU is present: the gpu sampler ran";
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("--samplers cpu"), std::string::npos) << r.out;
  EXPECT_EQ(lines(r.out), 1) << r.out;
}

// The read-ahead's ways of sampling (gpu-blocks, gpu-inputs) need a GPU too, and --concurrent a
// positive count, each a one-line error naming the flag.
TEST_F(Cli, BenchSampleReadAheadWaysNameTheirFlags) {
  const CliRun none = gale(std::string("bench sample ") + kBenchGraph + " --samplers cpu --concurrent 0");
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_NE(none.out.find("--concurrent: expected at least 1, found 0"), std::string::npos) << none.out;
  EXPECT_EQ(lines(none.out), 1) << none.out;
  const CliRun unknown = gale(std::string("bench sample ") + kBenchGraph + " --samplers gpu-lookahead");
  EXPECT_EQ(unknown.code, 2) << unknown.out;
  EXPECT_NE(unknown.out.find("--samplers"), std::string::npos) << unknown.out;
  EXPECT_NE(unknown.out.find("gpu-inputs"), std::string::npos) << unknown.out;
  const CliRun inputs = gale(std::string("bench sample ") + kBenchGraph + " --samplers gpu-inputs --batches 8 --warmup 0");
  if (inputs.code == 0) GTEST_SKIP() << "a GPU is present: the gpu-inputs sampler ran";
  EXPECT_EQ(inputs.code, 4) << inputs.out;
  EXPECT_NE(inputs.out.find("--samplers cpu"), std::string::npos) << inputs.out;
}

TEST_F(Cli, BenchPipelineTrainsOnTheCpu) {
  const CliRun r = gale("bench pipeline --generate rmat:scale=10,edge-factor=4,classes=4,feature-dim=16 --device cpu "
                        "--epochs 1 --warmup 0 --layers 2 --fanouts 5,5 --hidden 16 --batch-size 256 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rows = json_rows(r.out);
  ASSERT_EQ(rows.size(), 2u) << r.out;  // the epoch, then the median
  for (const auto& row : rows) {
    for (const char* key : {"device", "epoch_s", "sample_s", "io_s", "compute_s", "wait_s", "host_to_gpu_gb",
                            "feature_rows", "rows_previous", "rows_device", "rows_cache", "rows_host", "peak_gib"})
      EXPECT_TRUE(row.contains(key)) << key << ": " << r.out;
    EXPECT_EQ(row["device"], "cpu");
    EXPECT_GT(row["batches"].get<int64_t>(), 0);
  }
  EXPECT_EQ(rows[0]["epoch"], 1);
  EXPECT_EQ(rows[1]["median"], true);
}

// The roofline is a GPU's: on the CPU the table keeps its columns and says so once under it, and
// the JSON rows have no bound fields.
TEST_F(Cli, BenchTrainOnTheCpuHasNoRoofline) {
  const std::string run = "bench train --generate rmat:scale=8,edge-factor=4,classes=4,feature-dim=16 --device cpu "
                          "--epochs 1 --warmup 0 --layers 2 --hidden 16 --models gcn,sage";
  const CliRun table = gale(run);
  ASSERT_EQ(table.code, 0) << table.out;
  EXPECT_EQ(table.out.find("bound_ms"), std::string::npos) << table.out;
  const size_t note = table.out.find("no roofline on the CPU");
  ASSERT_NE(note, std::string::npos) << table.out;
  EXPECT_EQ(table.out.find("no roofline on the CPU", note + 1), std::string::npos) << table.out;
  const CliRun json = gale(run + " --json");
  ASSERT_EQ(json.code, 0) << json.out;
  const auto rows = json_rows(json.out);
  ASSERT_EQ(rows.size(), 2u) << json.out;
  for (const auto& row : rows) {
    EXPECT_TRUE(row.contains("ms_per_epoch")) << json.out;
    for (const char* key : {"bound_ms", "bound_gemm_ms", "bound_agg_ms", "bound_other_ms", "efficiency"})
      EXPECT_FALSE(row.contains(key)) << key << ": " << json.out;
  }
  EXPECT_EQ(json.out.find("roofline"), std::string::npos) << json.out;
}

TEST_F(Cli, BenchBadFlagsAreNamed) {
  const std::string graph = kBenchGraph;
  for (const std::string& bad :
       {"sample --fanouts x", "sample --samplers foo", "sample --samplers cpu --batches 0", "sample --topology disk",
        "sample --fanouts 10,0", "gather --match maybe", "gather --feature-gpu-mem 12Q", "pipeline --sampler x",
        "pipeline --layers 3 --fanouts 5,5", "pipeline --device tpu", "pipeline --epochs 0", "pipeline --prefetch 0"}) {
    const CliRun r = gale("bench " + bad + " " + graph);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    const std::string flag = bad.substr(bad.rfind("--"), bad.find(' ', bad.rfind("--")) - bad.rfind("--"));
    EXPECT_NE(r.out.find(flag), std::string::npos) << bad << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
  }
  // A bad graph source is named before any command looks for a GPU (CI has none: exit 4 there
  // would hide the input error). A build without CUDA has no `bench spmm` at all (exit 4).
  const std::string store = sbm_store();
  std::vector<std::string> commands = {"train", "sample", "gather", "pipeline"};
#if GALE_WITH_CUDA
  commands.insert(commands.end(), {"spmm", "spmm --maxk 32"});
#endif
  for (const std::string& command : commands) {
    const CliRun spec = gale("bench " + command + " --generate rmat:scale=abc");
    EXPECT_EQ(spec.code, 2) << command << ": " << spec.out;
    EXPECT_NE(spec.out.find("--generate: 'scale'"), std::string::npos) << command << ": " << spec.out;
    EXPECT_EQ(lines(spec.out), 1) << spec.out;
    const CliRun both = gale("bench " + command + " " + store + " --generate rmat:scale=4");
    EXPECT_EQ(both.code, 2) << command << ": " << both.out;
    EXPECT_NE(both.out.find("exactly one"), std::string::npos) << command << ": " << both.out;
  }
#if GALE_WITH_CUDA
  // A k wider than every width would measure nothing: named before any GPU is looked for.
  const CliRun wide_k = gale("bench spmm " + store + " --maxk 16,300 --dims 64,256");
  EXPECT_EQ(wide_k.code, 2) << wide_k.out;
  EXPECT_NE(wide_k.out.find("--maxk 300: expected at most the widest --dims width (256)"), std::string::npos) << wide_k.out;
  EXPECT_EQ(lines(wide_k.out), 1) << wide_k.out;
#endif
  // Training needs features and labels: a generated graph without them names the spec's keys (its
  // temporary store is gone by then), and a bad --activation is the run's only line.
  const CliRun bare = gale("bench train --generate rmat:scale=5 --device cpu --epochs 1 --models gcn");
  EXPECT_EQ(bare.code, 2) << bare.out;
  EXPECT_NE(bare.out.find("--generate rmat:scale=5: the graph has no features; training needs them (add feature-dim=D"),
            std::string::npos) << bare.out;
  const CliRun maxk0 = gale("bench train " + store + " --device cpu --epochs 1 --models sage --activation maxk:0");
  EXPECT_EQ(maxk0.code, 2) << maxk0.out;
  EXPECT_EQ(lines(maxk0.out), 1) << maxk0.out;
  const CliRun unknown = gale("bench sampel");
  EXPECT_EQ(unknown.code, 2) << unknown.out;
  for (const char* name : {"spmm", "train", "sample", "gather", "pipeline"})
    EXPECT_NE(unknown.out.find(name), std::string::npos) << unknown.out;
}

}  // namespace
}  // namespace gale

namespace gale {
namespace {

// --host-mem-budget and --io-engine: bad values are exit 2 naming the flag; a budget below the run's
// minimum (the topology and the IO staging) is exit 4 naming it; a budget the features exceed sends
// them to the disk tier, which the metrics say (placement, bytes read, read amplification).
TEST_F(Cli, HostBudgetFlagsAreNamedAndASmallBudgetReadsFeaturesFromDisk) {
  const std::string store = sbm_store();
  const std::string run = "train " + store + " -q --device cpu --fanouts 5,5 --epochs 1 ";
  for (const std::string& bad : {"--host-mem-budget 0", "--host-mem-budget lots", "--io-engine aio"}) {
    const CliRun r = gale(run + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find(bad.substr(0, bad.find(' '))), std::string::npos) << bad << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << bad << ": " << r.out;
  }
  const CliRun tiny = gale(run + "--host-mem-budget 20M");
  EXPECT_EQ(tiny.code, 4) << tiny.out;
  EXPECT_NE(tiny.out.find("--host-mem-budget"), std::string::npos) << tiny.out;
  EXPECT_EQ(lines(tiny.out), 1) << tiny.out;
  // 128 MiB + 128 KiB: the staging reserve, the 90 KiB topology, and a cache for part of the 128 KiB of rows.
  for (const char* engine : {"io_uring", "pread"}) {
    const std::string metrics = path(std::string("m-") + engine + ".jsonl");
    const CliRun disk = gale(run + "--host-mem-budget 131200K --io-engine " + engine + " --metrics " + metrics);
    if (std::string(engine) == "io_uring" && disk.code == 4 && disk.out.find("io_uring") != std::string::npos) {
      std::printf("io_uring refused here (%s): only the pread pool is checked\n", disk.out.c_str());
      continue;
    }
    ASSERT_EQ(disk.code, 0) << engine << ": " << disk.out;
    const std::string first = slurp(metrics).substr(0, slurp(metrics).find('\n'));
    EXPECT_NE(first.find("\"features\":\"disk\""), std::string::npos) << first;
    EXPECT_NE(first.find(engine), std::string::npos) << first;
    EXPECT_NE(first.find("\"disk_bytes_read\""), std::string::npos) << first;
    EXPECT_NE(first.find("\"useful_disk_bytes\""), std::string::npos) << first;
  }
}

// A byte flipped in features.npy stops training with exit 3 and one line naming the page's offset,
// whether the rows are in memory (checked whole as they load) or read from disk (checked per page).
TEST_F(Cli, FlippedFeatureByteStopsTrainingWithExitThree) {
  const std::string store = sbm_store();
  {
    std::fstream io(fs::path(store) / "features.npy", std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(4096 + 2 * 4096 + 5);
    const char c = static_cast<char>(io.get());
    io.seekp(4096 + 2 * 4096 + 5);
    io.put(static_cast<char>(c ^ 0x20));
  }
  for (const std::string& budget : {"", " --host-mem-budget 131200K"}) {
    const CliRun r = gale("train " + store + " -q --device cpu --fanouts 5,5 --batch-size 2000 --epochs 1" + budget);
    EXPECT_EQ(r.code, 3) << budget << ": " << r.out;
    EXPECT_NE(r.out.find("features.npy: page checksum mismatch at byte offset 12288"), std::string::npos) << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
  }
}

// Where the machine lets a test make a memory-limited cgroup (root, cgroup v2 or v1's memory
// controller), a run whose features exceed what the limit leaves trains in it through the disk tier
// with the default budget (derived from the cgroup's limit) instead of being killed.
TEST_F(Cli, TrainsInsideAMemoryLimitedCgroupWithTheDefaultBudget) {
  fs::path cgroup;
  std::string limit_file;
  const std::string name = "gale-cli-test-" + std::to_string(::getpid());
  if (fs::exists("/sys/fs/cgroup/cgroup.controllers")) {
    cgroup = fs::path("/sys/fs/cgroup") / name;
    limit_file = "memory.max";
  } else if (fs::is_directory("/sys/fs/cgroup/memory")) {
    cgroup = fs::path("/sys/fs/cgroup/memory") / name;
    limit_file = "memory.limit_in_bytes";
  }
  std::error_code ec;
  if (cgroup.empty() || !fs::create_directory(cgroup, ec) || ec)
    GTEST_SKIP() << "no memory-limited cgroup can be made here (" << (cgroup.empty() ? "no memory controller" : ec.message())
                 << "); the GPU machine's runs measure this";
  struct Remove {
    fs::path p;
    ~Remove() { ::rmdir(p.c_str()); }
  } remove{cgroup};
  const std::string store = path("big.gale");
  // 300K nodes of 256 f32 features: 307 MB, beyond what a 512 MiB limit leaves after the reserve.
  const CliRun made =
      gale("preprocess --generate sbm:nodes=300K,classes=4,avg-degree=6,feature-dim=256,seed=3 -o " + store);
  ASSERT_EQ(made.code, 0) << made.out;
  {
    std::ofstream limit(cgroup / limit_file);
    limit << (uint64_t{512} << 20);
    if (!limit.flush()) GTEST_SKIP() << "cannot set " << (cgroup / limit_file).string();
  }
  std::ofstream(cgroup / "memory.swap.max") << 0;  // v2: no swap to hide in (absent on v1; ignored)
  const std::string metrics = path("m.jsonl");
  const std::string cmd = "sh -c 'echo $$ > " + (cgroup / "cgroup.procs").string() + " && exec " +
                          std::string(GALE_BINARY_DIR) + "/bin/gale train " + store +
                          " -q --device cpu --fanouts 5,5 --batch-size 1024 --hidden 32 --epochs 1 --eval none --metrics " +
                          metrics + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << "killed (the OOM killer?): " << out;
  ASSERT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(slurp(metrics).find("\"features\":\"disk\""), std::string::npos) << slurp(metrics);
}

}  // namespace
}  // namespace gale

namespace gale {
namespace {

// gale bench io: the three ceilings with the reader training uses and what a request costs in pages,
// as a table or JSON rows, and with --rows the disk tier's own read; a bad queue depth, engine or
// fraction is exit 2 naming the flag.
TEST_F(Cli, BenchIoMeasuresTheDisksCeilingsWithTheTrainingReader) {
  const std::string store = sbm_store();
  const CliRun table = gale("bench io " + store + " --seconds 0.1");
  ASSERT_EQ(table.code, 0) << table.out;
  for (const char* row : {"random 4 KiB", "random 64 KiB", "sequential 1 MiB", "reads/s", "MB/s", "a request costs"})
    EXPECT_NE(table.out.find(row), std::string::npos) << row << ": " << table.out;
  const CliRun json = gale("bench io " + store + " --seconds 0.1 --json --io-engine pread");
  ASSERT_EQ(json.code, 0) << json.out;
  EXPECT_EQ(lines(json.out), 4) << json.out;
  EXPECT_NE(json.out.find("\"engine\":\"pread\""), std::string::npos) << json.out;
  EXPECT_NE(json.out.find("\"request_pages\":"), std::string::npos) << json.out;
  const CliRun sweep = gale("bench io " + store + " --seconds 0.05 --json --sweep");
  ASSERT_EQ(sweep.code, 0) << sweep.out;
  EXPECT_EQ(lines(sweep.out), 9) << sweep.out;  // 4, 8, 16, 32, 64, 128, 256 KiB, the pass, request_pages
  EXPECT_NE(sweep.out.find("\"read\":\"random 256 KiB\""), std::string::npos) << sweep.out;
  // --rows: the disk tier's own read of a fraction of the rows, its rounds one at a time and
  // overlapped, every page checked.
  const CliRun rows = gale("bench io " + store + " --seconds 0.05 --rows 0.5");
  ASSERT_EQ(rows.code, 0) << rows.out;
  for (const char* row : {"disk tier, 50% of the rows, rounds one at a time:", "disk tier, 50% of the rows, rounds overlapped:",
                          "GB of needed pages"})
    EXPECT_NE(rows.out.find(row), std::string::npos) << row << ": " << rows.out;
  const CliRun rows_json = gale("bench io " + store + " --seconds 0.05 --rows 1 --json");
  ASSERT_EQ(rows_json.code, 0) << rows_json.out;
  EXPECT_EQ(lines(rows_json.out), 6) << rows_json.out;
  EXPECT_NE(rows_json.out.find("\"read\":\"disk tier\",\"overlap_rounds\":true"), std::string::npos) << rows_json.out;
  for (const std::string& bad : {"--queue-depth 0", "--io-engine aio", "--seconds 0", "--rows 0", "--rows 1.5"}) {
    const CliRun r = gale("bench io " + store + " " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find(bad.substr(0, bad.find(' '))), std::string::npos) << bad << ": " << r.out;
  }
}

}  // namespace
}  // namespace gale

namespace gale {
namespace {

// gale predict under a --host-mem-budget the features exceed: layer by layer, each chunk's rows read
// through the disk tier, and the same classes as the whole-graph forward with them in memory.
TEST_F(Cli, PredictBeyondTheHostBudgetReadsFeaturesFromDiskLayerByLayer) {
  const std::string store = sbm_store();
  ASSERT_EQ(gale("train " + store + " -q --model sage --hidden 16 --epochs 3 --device cpu --checkpoint-dir " + path("ck")).code, 0);
  const std::string predict = "predict " + store + " --checkpoint " + path("ck");
  const CliRun memory = gale(predict + " --out " + path("memory.npy"));
  ASSERT_EQ(memory.code, 0) << memory.out;
  const CliRun disk = gale(predict + " --out " + path("disk.npy") + " --host-mem-budget 131200K --io-engine pread");
  ASSERT_EQ(disk.code, 0) << disk.out;
  EXPECT_NE(disk.out.find("layer by layer"), std::string::npos) << disk.out;
  EXPECT_NE(disk.out.find("read from features.npy with pread"), std::string::npos) << disk.out;
  EXPECT_NE(disk.out.find("gale predict: the features are on disk"), std::string::npos) << disk.out;  // the hint
  EXPECT_EQ(memory.out.find("--fanouts"), std::string::npos) << memory.out;
  const std::string a = slurp(path("memory.npy")), b = slurp(path("disk.npy"));
  ASSERT_EQ(a.size(), b.size());
  size_t differ = 0;
  for (size_t i = 4096; i + 4 <= a.size(); i += 4) differ += a.compare(i, 4, b, i, 4) != 0;
  EXPECT_LE(differ, 2u) << "of 2000 nodes";  // the two forwards sum in other orders: a near-tie may flip
  const CliRun tiny = gale(predict + " --out " + path("x.npy") + " --host-mem-budget 20M");
  EXPECT_EQ(tiny.code, 4) << tiny.out;
  EXPECT_NE(tiny.out.find("--host-mem-budget"), std::string::npos) << tiny.out;
  EXPECT_FALSE(fs::exists(path("x.npy")));
}

// gale predict --fanouts: sampled inference over every node, in batches of --batch-size; bad
// values are refused naming the flag (exit 2) before any output is written.
TEST_F(Cli, PredictWithFanoutsSamplesEveryNodeAndNamesBadFlags) {
  const std::string store = sbm_store();
  ASSERT_EQ(gale("train " + store + " -q --model sage --hidden 16 --epochs 2 --device cpu --checkpoint-dir " + path("ck")).code, 0);
  const std::string predict = "predict " + store + " --checkpoint " + path("ck") + " --out " + path("p.npy");
  const std::pair<std::string, std::string> cases[] = {
      {" --fanouts 5,x", "--fanouts: expected comma-separated integers"},
      {" --fanouts ''", "--fanouts: expected comma-separated integers"},
      {" --fanouts 5,0", "--fanouts: expected positive fanouts (or -1 for all), found 0"},
      {" --fanouts 5,5,5", "--fanouts: expected one fanout per layer"},
      {" --fanouts 5,5 --batch-size=0", "--batch-size: expected at least 1, found 0"},
      {" --fanouts 5,5 --batch-size x", "--batch-size"},
      {" --batch-size 100", "--batch-size: sets sampled inference's batches; add --fanouts"},
  };
  for (const auto& [flags, expect] : cases) {
    const CliRun r = gale(predict + flags);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.out;
    EXPECT_NE(r.out.find(expect), std::string::npos) << flags << ": " << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
    EXPECT_FALSE(fs::exists(path("p.npy"))) << flags;
  }
  const CliRun ok = gale(predict + " --fanouts 5,5 --batch-size 300");
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("sampled inference with fanouts 5,5 over 2000 nodes in 7 batches"), std::string::npos) << ok.out;
  const CliRun again = gale("predict " + store + " --checkpoint " + path("ck") + " --out " + path("q.npy") +
                            " --fanouts 5,5 --batch-size 300");
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_EQ(slurp(path("q.npy")), slurp(path("p.npy")));  // the same draws, the same predictions
}

}  // namespace
}  // namespace gale
