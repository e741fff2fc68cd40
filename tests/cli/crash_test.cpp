// Sudden death and full disks, as a user's machine deals them out: the real `gale` binary killed
// with SIGKILL (nothing to catch, nothing cleaned up) at random moments of preprocess, train and
// predict, and writing past a file-size limit or onto a full file system. Whatever it leaves must
// be whole or absent, the next run of the same command cleans up and succeeds, a resumed training
// run ends bit for bit where a run never killed did, and no room to write is exit 4 with the
// earlier files untouched.
//
// The kill moments come from a seeded RNG: every test prints GALE_KILL_SEED=... and each trial its
// delay; run again with that variable to draw the same delays. GALE_KILL_TRIALS sets the trials
// per command (default 24).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "storage/temp_paths.hpp"

namespace gale {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Ended {
  int code = -1;       // the exit code, or 128 + the signal that ended it (as a shell reports)
  bool killed = false;  // our SIGKILL ended it
  std::string out;     // stdout and stderr together
};

std::string slurp(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// `gale args` with stdout and stderr in `log`, under a file-size limit of `fsize` bytes (0: none;
// SIGXFSZ keeps its default action, so a gale that did not ignore it would die of it).
pid_t spawn_gale(const std::string& args, const fs::path& log, rlim_t fsize = 0) {
  const std::string cmd = "exec " + std::string(GALE_BINARY_DIR) + "/bin/gale " + args + " > " + log.string() + " 2>&1";
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    if (fsize != 0) {
      const struct rlimit lim = {fsize, fsize};
      if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(127);
    }
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

Ended reap(pid_t pid, const fs::path& log) {
  Ended e;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return e;
  e.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  e.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  e.out = slurp(log);
  return e;
}

Ended run_gale(const std::string& args, const fs::path& log, rlim_t fsize = 0) {
  return reap(spawn_gale(args, log, fsize), log);
}

// Starts `gale args` and SIGKILLs it `delay` later (unless it has ended by then).
Ended kill_after(const std::string& args, const fs::path& log, std::chrono::microseconds delay) {
  const pid_t pid = spawn_gale(args, log);
  std::this_thread::sleep_for(delay);
  ::kill(pid, SIGKILL);  // a process that has ended is a zombie until reaped: never another's pid
  return reap(pid, log);
}

// Every regular file under `dir` by its relative path, with its bytes.
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = slurp(e.path());
  return files;
}

// The names in `dir` (not below) that are a run's temporaries: NAME.tmp-HOST-PID-... and the
// sorter's .gale-sort-HOST-PID-... (storage/temp_paths.hpp).
std::vector<std::string> temporaries(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp-") != std::string::npos || name.rfind(".gale-sort-", 0) == 0) found.push_back(name);
  }
  return found;
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A small graph whose commands each take a fraction of a second to a second or two on one core.
constexpr const char* kSpec = "sbm:nodes=20000,classes=4,avg-degree=16,feature-dim=32,seed=3";

class Kills : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gale-kill-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const char* seed = std::getenv("GALE_KILL_SEED");
    seed_ = seed != nullptr ? static_cast<uint32_t>(std::strtoul(seed, nullptr, 10)) : std::random_device{}();
    rng_.seed(seed_);
    const char* trials = std::getenv("GALE_KILL_TRIALS");
    trials_ = trials != nullptr ? std::max(1, std::atoi(trials)) : 24;
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
    else std::printf("left for a look: %s (GALE_KILL_SEED=%u)\n", dir_.c_str(), seed_);
  }

  fs::path path(const std::string& name) const { return dir_ / name; }

  // The store the training and predict tests use (the generator is deterministic).
  std::string make_store() {
    const Ended r = run_gale("preprocess --generate " + std::string(kSpec) + " -o " + path("g.gale").string(), path("pre.log"));
    EXPECT_EQ(r.code, 0) << r.out;
    return path("g.gale").string();
  }

  // Prints the seed the delays are drawn with, for a replay.
  void announce_trials() {
    std::printf("GALE_KILL_SEED=%u (%d trials)\n", seed_, trials_);
    RecordProperty("GALE_KILL_SEED", std::to_string(seed_));
  }

  // A delay drawn uniformly from [0, 1.2 x the uninterrupted run's time]: most kills land inside
  // the run (start-up, work, writing, renames), a few after it ended.
  std::chrono::microseconds draw_delay(double run_s) {
    std::uniform_real_distribution<double> u(0.0, 1.2 * run_s);
    return std::chrono::microseconds(static_cast<int64_t>(u(rng_) * 1e6));
  }
  std::string trial_name(int i, std::chrono::microseconds delay) const {
    return "trial " + std::to_string(i) + ": SIGKILL after " + std::to_string(delay.count() / 1000.0) +
           " ms (GALE_KILL_SEED=" + std::to_string(seed_) + ")";
  }

  // Trains with `flags` into checkpoint directories, killing at random moments (see the tests).
  void kill_training(const std::string& flags, int epochs);

  fs::path dir_;
  uint32_t seed_ = 0;
  std::mt19937 rng_;
  int trials_ = 24;
};

// preprocess writes a store into NAME.tmp-HOST-PID-... and renames it into place (exchanging it
// with the old one under --force), sorting edges in runs under --temp-dir: killed anywhere, NAME
// is the old store, the new one or absent, never a store that fails --verify, and the next run
// removes the leftovers and writes the same store as a run never killed.
TEST_F(Kills, PreprocessLeavesTheOldStoreOrTheNewOneAndTheNextRunCleansUp) {
  const fs::path runs = path("runs");
  fs::create_directories(runs);
  const std::string common = "preprocess --generate " + std::string(kSpec) + " --mem-budget 1M --temp-dir " + runs.string();
  announce_trials();
  const auto t0 = Clock::now();
  const Ended ref = run_gale(common + " -o " + path("ref.gale").string(), path("ref.log"));
  const double run_s = seconds_since(t0);
  ASSERT_EQ(ref.code, 0) << ref.out;
  ASSERT_NE(ref.out.find("sorted on disk"), std::string::npos) << "expected the sort to spill: " << ref.out;
  const auto want = tree(path("ref.gale"));
  const std::string store = path("s.gale").string(), args = common + " --force -o " + store;
  int killed = 0, present = 0;
  for (int i = 0; i < trials_; ++i) {
    const auto delay = draw_delay(run_s);
    SCOPED_TRACE(trial_name(i, delay));
    // Every other trial replaces the previous trial's store; the rest write a new one.
    if (i % 2 == 0) fs::remove_all(store);
    const bool existed = fs::exists(store);
    const Ended k = kill_after(args, path("k.log"), delay);
    killed += k.killed;
    if (!k.killed) EXPECT_EQ(k.code, 0) << k.out;
    if (existed) EXPECT_TRUE(fs::exists(store)) << "the old store is gone";
    if (fs::exists(store)) {
      ++present;
      const Ended v = run_gale("info " + store + " --verify", path("v.log"));
      EXPECT_EQ(v.code, 0) << v.out;
      EXPECT_TRUE(tree(store) == want) << "a store that opens differs from the uninterrupted run's";
    }
    const Ended again = run_gale(args, path("again.log"));
    ASSERT_EQ(again.code, 0) << again.out;
    EXPECT_TRUE(tree(store) == want);
    EXPECT_EQ(temporaries(dir_), std::vector<std::string>{});
    EXPECT_EQ(temporaries(runs), std::vector<std::string>{});
  }
  std::printf("preprocess: %d trials, %d killed while running, a store at its path after %d\n", trials_, killed, present);
}

// A temporary of this host named for `pid` (storage::temp_name's form with another pid).
std::string temp_of(const std::string& prefix, pid_t pid) {
  const std::string mine = storage::temp_name(prefix), ours = "-" + std::to_string(::getpid()) + "-";
  const size_t at = mine.rfind(ours);
  return mine.substr(0, at) + "-" + std::to_string(pid) + "-" + mine.substr(at + ours.size());
}

// The kills above rarely land in the few milliseconds between a store's manifest being written and
// its renames being done: what they leave is a whole store under a temporary name (the new one, or
// the old one it replaced). It is kept while NAME holds no store (it may be the only copy), and
// removed once a run has put one in place. A live process's temporaries stay.
TEST_F(Kills, FinishedStoresUnderTemporaryNamesGoOnceAStoreIsInPlace) {
  const pid_t dead = ::fork();  // a pid that has just ended
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string store = path("s.gale").string();
  const std::string args = "preprocess --generate sbm:nodes=500,classes=2,avg-degree=4,feature-dim=4,seed=1 -o " + store;
  ASSERT_EQ(run_gale(args, path("log")).code, 0);
  const fs::path finished = path(temp_of(".s.gale.tmp-", dead)), aside = path(temp_of(".s.gale.tmp-", dead) + ".old"),
                 live = path(temp_of(".s.gale.tmp-", 1));  // init: alive
  for (const fs::path& p : {finished, aside, live}) fs::copy(store, p, fs::copy_options::recursive);
  fs::remove_all(store);
  // No store at NAME: a run that fails before writing one keeps them.
  EXPECT_EQ(run_gale("preprocess " + path("missing.tsv").string() + " -o " + store, path("log")).code, 2);
  EXPECT_TRUE(fs::exists(finished) && fs::exists(aside));
  ASSERT_EQ(run_gale(args, path("log")).code, 0);
  EXPECT_FALSE(fs::exists(finished));
  EXPECT_FALSE(fs::exists(aside));
  EXPECT_TRUE(fs::exists(live));
  // With a store at NAME, the next --force run removes them before it starts.
  for (const fs::path& p : {finished, aside}) fs::copy(store, p, fs::copy_options::recursive);
  ASSERT_EQ(run_gale(args + " --force", path("log")).code, 0);
  EXPECT_FALSE(fs::exists(finished));
  EXPECT_FALSE(fs::exists(aside));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(run_gale("info " + store + " --verify", path("log")).code, 0);
}

// Every whole checkpoint a run writes, by content: the latest.ckpt and best.ckpt after each epoch,
// from runs of 1, 2, ... epochs each resumed from the one before (resuming is bit for bit, so these
// are the killed runs' checkpoints too). The value is the epoch count.
std::map<std::string, int> every_checkpoint(const std::string& train, const fs::path& dir, int epochs, const fs::path& log) {
  std::map<std::string, int> whole;
  for (int e = 1; e <= epochs; ++e) {
    const Ended r = run_gale(train + " --epochs " + std::to_string(e) + " --checkpoint-dir " + dir.string() +
                                 (e > 1 ? " --resume" : ""),
                             log);
    EXPECT_EQ(r.code, 0) << r.out;
    for (const char* name : {"latest.ckpt", "best.ckpt"}) whole.emplace(slurp(dir / name), e);
  }
  return whole;
}

void Kills::kill_training(const std::string& flags, int epochs) {
  const std::string store = make_store();
  const std::string train = "train " + store + " -q --deterministic --device cpu " + flags;
  announce_trials();
  const auto t0 = Clock::now();
  const Ended straight = run_gale(train + " --epochs " + std::to_string(epochs) + " --checkpoint-dir " + path("a").string(),
                                  path("a.log"));
  const double run_s = seconds_since(t0);
  ASSERT_EQ(straight.code, 0) << straight.out;
  const std::string final_latest = slurp(path("a/latest.ckpt")), final_best = slurp(path("a/best.ckpt"));
  const std::map<std::string, int> whole = every_checkpoint(train, path("steps"), epochs, path("steps.log"));
  ASSERT_EQ(whole.count(final_latest), 1u) << "a run of 1, 2, ... epochs resumed in turn ends elsewhere";
  const std::string args = train + " --epochs " + std::to_string(epochs) + " --checkpoint-dir ";
  int killed = 0, fresh = 0;
  std::map<int, int> resumed_from;  // epochs done in the checkpoint resumed -> trials
  for (int i = 0; i < trials_; ++i) {
    const auto delay = draw_delay(run_s);
    SCOPED_TRACE(trial_name(i, delay));
    const fs::path ck = path("ck" + std::to_string(i));
    const Ended k = kill_after(args + ck.string(), path("k.log"), delay);
    killed += k.killed;
    if (!k.killed) EXPECT_EQ(k.code, 0) << k.out;
    int epochs_done = 0;
    if (fs::exists(ck)) {
      for (const auto& e : fs::directory_iterator(ck)) {
        const std::string name = e.path().filename().string();
        if (name == "latest.ckpt" || name == "best.ckpt") {
          const auto it = whole.find(slurp(e.path()));
          EXPECT_TRUE(it != whole.end()) << name << " is not one of the run's whole checkpoints";
          if (it != whole.end() && name == "latest.ckpt") epochs_done = it->second;
        } else {
          EXPECT_TRUE(name.rfind(".latest.ckpt.tmp-", 0) == 0 || name.rfind(".best.ckpt.tmp-", 0) == 0)
              << "unexpected " << name;
        }
      }
    }
    // Continue the run where it stopped: --resume where it left a checkpoint, anew where not.
    const bool resume = fs::exists(ck / "latest.ckpt") || fs::exists(ck / "best.ckpt");
    fresh += !fs::exists(ck / "latest.ckpt");
    ++resumed_from[epochs_done];
    const Ended again = run_gale(args + ck.string() + (resume ? " --resume" : ""), path("again.log"));
    ASSERT_EQ(again.code, 0) << again.out;
    EXPECT_EQ(again.out, straight.out);  // the best epoch and its accuracies
    EXPECT_TRUE(slurp(ck / "latest.ckpt") == final_latest) << "latest.ckpt differs from the run never killed";
    EXPECT_TRUE(slurp(ck / "best.ckpt") == final_best) << "best.ckpt differs from the run never killed";
    EXPECT_EQ(temporaries(ck), std::vector<std::string>{});
    fs::remove_all(ck);
  }
  std::string from;
  for (const auto& [e, n] : resumed_from) from += " " + std::to_string(n) + "x" + std::to_string(e);
  std::printf("train %s: %d trials, %d killed while running, %d started over, epochs done when resumed:%s\n",
              flags.c_str(), trials_, killed, fresh, from.c_str());
}

// Checkpoints are written to a temporary beside them and renamed: a full-graph run killed anywhere
// leaves whole checkpoints of its own (or none), and resuming it ends bit for bit where the run
// never killed did.
TEST_F(Kills, FullGraphTrainingResumesToTheUninterruptedResult) {
  kill_training("--full-graph --model gcn --hidden 16", 10);
}

TEST_F(Kills, MiniBatchTrainingResumesToTheUninterruptedResult) {
  kill_training("--model sage --hidden 16 --fanouts 5,5 --batch-size 256", 6);
}

// best.ckpt is written before latest.ckpt, so a run killed between its first two checkpoints
// leaves best.ckpt of epoch 1 alone (a window of microseconds the random kills seldom find):
// --resume starts that run over and ends where a run never killed does.
TEST_F(Kills, RunKilledBetweenItsFirstTwoCheckpointsResumesAnew) {
  const std::string store = make_store();
  const std::string train = "train " + store + " -q --deterministic --device cpu --model gcn --hidden 16 --full-graph";
  const Ended straight = run_gale(train + " --epochs 3 --checkpoint-dir " + path("a").string(), path("log"));
  ASSERT_EQ(straight.code, 0) << straight.out;
  ASSERT_EQ(run_gale(train + " --epochs 1 --checkpoint-dir " + path("b").string(), path("log")).code, 0);
  fs::remove(path("b/latest.ckpt"));
  const Ended resumed = run_gale(train + " --epochs 3 --resume --checkpoint-dir " + path("b").string(), path("log"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(resumed.out, straight.out);
  EXPECT_TRUE(slurp(path("b/latest.ckpt")) == slurp(path("a/latest.ckpt")));
  EXPECT_TRUE(slurp(path("b/best.ckpt")) == slurp(path("a/best.ckpt")));
  // A best.ckpt of a later epoch alone is not that: the run's latest.ckpt was lost, so nothing
  // is overwritten.
  fs::remove(path("a/latest.ckpt"));
  const std::string best = slurp(path("a/best.ckpt"));
  const Ended lost = run_gale(train + " --epochs 4 --resume --checkpoint-dir " + path("a").string(), path("log"));
  EXPECT_EQ(lost.code, 2) << lost.out;
  EXPECT_NE(lost.out.find("--resume: no checkpoint at " + path("a/latest.ckpt").string() + " (only best.ckpt, of epoch"),
            std::string::npos) << lost.out;
  EXPECT_TRUE(slurp(path("a/best.ckpt")) == best);
}

// predict writes its outputs beside their paths and renames them: each output present after a
// kill is the whole prediction, and the next run removes the temporaries and writes both.
TEST_F(Kills, PredictLeavesWholeOutputsOrNone) {
  const std::string store = make_store();
  const Ended train = run_gale("train " + store + " -q --deterministic --device cpu --model gcn --hidden 16 --epochs 2 "
                               "--full-graph --checkpoint-dir " + path("ck").string(), path("train.log"));
  ASSERT_EQ(train.code, 0) << train.out;
  const std::string predict = "predict " + store + " --device cpu --checkpoint " + path("ck").string();
  announce_trials();
  const auto t0 = Clock::now();
  const Ended ref = run_gale(predict + " --out " + path("ref.npy").string() + " --embeddings " + path("refe.npy").string(),
                             path("ref.log"));
  const double run_s = seconds_since(t0);
  ASSERT_EQ(ref.code, 0) << ref.out;
  const std::string want_p = slurp(path("ref.npy")), want_e = slurp(path("refe.npy"));
  const fs::path out = path("out");
  fs::create_directories(out);
  const std::string args = predict + " --out " + (out / "p.npy").string() + " --embeddings " + (out / "e.npy").string();
  int killed = 0, outputs = 0;
  for (int i = 0; i < trials_; ++i) {
    const auto delay = draw_delay(run_s);
    SCOPED_TRACE(trial_name(i, delay));
    fs::remove(out / "p.npy");
    fs::remove(out / "e.npy");
    const Ended k = kill_after(args, path("k.log"), delay);
    killed += k.killed;
    if (!k.killed) EXPECT_EQ(k.code, 0) << k.out;
    if (fs::exists(out / "p.npy")) {
      ++outputs;
      EXPECT_TRUE(slurp(out / "p.npy") == want_p) << "p.npy is not the whole prediction";
    }
    if (fs::exists(out / "e.npy")) EXPECT_TRUE(slurp(out / "e.npy") == want_e) << "e.npy is not the whole output";
    const Ended again = run_gale(args, path("again.log"));
    ASSERT_EQ(again.code, 0) << again.out;
    EXPECT_TRUE(slurp(out / "p.npy") == want_p);
    EXPECT_TRUE(slurp(out / "e.npy") == want_e);
    EXPECT_EQ(temporaries(out), std::vector<std::string>{});
  }
  std::printf("predict: %d trials, %d killed while running, predictions present after %d\n", trials_, killed, outputs);
}

// ---------------------------------------------------------------------------------------------
// No room to write: a file-size limit (RLIMIT_FSIZE, what `ulimit -f` sets: writes past it fail
// with EFBIG, and gale ignores the SIGXFSZ that would kill it) everywhere, and a full tmpfs where
// this machine lets the test mount one.

class NoRoom : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gale-noroom-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!mounted_.empty()) ::umount2(mounted_.c_str(), MNT_DETACH);
    fs::remove_all(dir_);
  }
  fs::path path(const std::string& name) const { return dir_ / name; }

  // A tmpfs of `bytes` at dir/fs; false (with the reason in *why) where mounting is not allowed.
  bool mount_tmpfs(uint64_t bytes, std::string* why) {
    const fs::path at = path("fs");
    fs::create_directories(at);
    const std::string opts = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", at.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
      *why = std::string("cannot mount a tmpfs here (needs CAP_SYS_ADMIN): ") + std::strerror(errno);
      return false;
    }
    mounted_ = at;
    return true;
  }
  // Fills the file system holding `dir` until fewer than `room` bytes are free.
  static void fill(const fs::path& dir, uint64_t room) {
    struct statvfs st {};
    ASSERT_EQ(::statvfs(dir.c_str(), &st), 0);
    const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    std::ofstream f(dir / "filler", std::ios::binary);
    const std::string block(4096, 'x');
    for (uint64_t written = 0; written + room + block.size() <= free_bytes + block.size() && f; written += block.size())
      f.write(block.data(), static_cast<std::streamsize>(block.size()));
    f.close();
    ASSERT_EQ(::statvfs(dir.c_str(), &st), 0);
    ASSERT_LT(static_cast<uint64_t>(st.f_bavail) * st.f_frsize, room);
  }

  // The store the checkpoint and predict tests read (outside any limit).
  std::string make_store() {
    const Ended r = run_gale("preprocess --generate " + std::string(kSpec) + " -o " + path("g.gale").string(), path("pre.log"));
    EXPECT_EQ(r.code, 0) << r.out;
    return path("g.gale").string();
  }

  // Exit 4 with one line naming a file in `where` and why (EFBIG under a file-size limit, else
  // ENOSPC), nothing under the temporary names left there.
  static void expect_no_room(const Ended& r, const fs::path& where, rlim_t fsize) {
    EXPECT_EQ(r.code, 4) << r.out;
    EXPECT_EQ(lines(r.out), 1) << r.out;
    EXPECT_EQ(r.out.rfind("gale: error: " + where.string() + "/", 0), 0u) << "the message names no file in " << where << ": " << r.out;
    const char* why = fsize != 0 ? "File too large" : "No space left on device";
    EXPECT_NE(r.out.find(why), std::string::npos) << r.out;
    EXPECT_EQ(temporaries(where), std::vector<std::string>{});
  }

  // preprocess into `at` (a directory) must end with exit 4 and leave no store and no temporaries;
  // with a store already there, --force leaves it as it was.
  void check_preprocess(const fs::path& at, rlim_t fsize) {
    const fs::path runs = at / "runs", store = at / "s.gale";
    fs::create_directories(runs);
    const std::string args = "preprocess --generate " + std::string(kSpec) + " --temp-dir " + runs.string() + " -o " + store.string();
    for (const char* budget : {"", " --mem-budget 1M"}) {  // features first, or edges sorted in runs first
      SCOPED_TRACE(budget);
      const Ended r = run_gale(args + budget, path("log"), fsize);
      expect_no_room(r, at, fsize);
      EXPECT_FALSE(fs::exists(store));
      EXPECT_EQ(temporaries(runs), std::vector<std::string>{});
    }
    // An old store stays whole when its replacement finds no room.
    ASSERT_EQ(run_gale("preprocess --generate sbm:nodes=500,classes=2,avg-degree=4,feature-dim=4,seed=1 -o " + store.string(),
                       path("log")).code, 0);
    const auto old = tree(store);
    const Ended r = run_gale(args + " --force", path("log"), fsize);
    expect_no_room(r, at, fsize);
    EXPECT_TRUE(tree(store) == old);
    EXPECT_EQ(run_gale("info " + store.string() + " --verify", path("log")).code, 0);
    EXPECT_EQ(temporaries(runs), std::vector<std::string>{});
  }

  // A run resumed from ck's checkpoints that cannot write its next one: exit 4 naming it, the
  // earlier checkpoints as they were; then, with room again, it resumes to the result of a run
  // never stopped (`straight`).
  void check_checkpoint(const std::string& train, const fs::path& ck, rlim_t fsize, const std::function<void()>& no_room,
                        const std::function<void()>& room) {
    ASSERT_EQ(run_gale(train + " --epochs 2 --checkpoint-dir " + ck.string(), path("log")).code, 0);
    const std::string latest = slurp(ck / "latest.ckpt"), best = slurp(ck / "best.ckpt");
    no_room();
    const Ended r = run_gale(train + " --epochs 4 --resume --checkpoint-dir " + ck.string(), path("log"), fsize);
    expect_no_room(r, ck, fsize);
    EXPECT_TRUE(slurp(ck / "latest.ckpt") == latest) << "the earlier latest.ckpt changed";
    EXPECT_TRUE(slurp(ck / "best.ckpt") == best) << "the earlier best.ckpt changed";
    room();
    const Ended again = run_gale(train + " --epochs 4 --resume --checkpoint-dir " + ck.string(), path("log"));
    ASSERT_EQ(again.code, 0) << again.out;
    const Ended straight = run_gale(train + " --epochs 4 --checkpoint-dir " + path("straight").string(), path("log"));
    ASSERT_EQ(straight.code, 0) << straight.out;
    EXPECT_EQ(again.out, straight.out);
    EXPECT_TRUE(slurp(ck / "latest.ckpt") == slurp(path("straight/latest.ckpt")));
  }

  // predict that cannot write its outputs: exit 4, no temporaries, an earlier output as it was.
  void check_predict(const std::string& predict, const fs::path& out, rlim_t fsize) {
    const std::string args = predict + " --out " + (out / "p.npy").string() + " --embeddings " + (out / "e.npy").string();
    const Ended r = run_gale(args, path("log"), fsize);
    expect_no_room(r, out, fsize);
    EXPECT_FALSE(fs::exists(out / "p.npy"));
    EXPECT_FALSE(fs::exists(out / "e.npy"));
  }

  std::string train_args(const std::string& store) const {
    return "train " + store + " -q --deterministic --device cpu --model gcn --hidden 16 --full-graph";
  }

  fs::path dir_, mounted_;
};

// The store's largest file is 2.5 MB, its sorted runs ~1 MB each: 512 KiB stops both.
TEST_F(NoRoom, PreprocessPastAFileSizeLimitIsExitFourAndLeavesNothing) {
  check_preprocess(path("out"), 512 << 10);
}

// A checkpoint of this model is ~7.7 KB: 4 KiB stops the next one.
TEST_F(NoRoom, CheckpointPastAFileSizeLimitKeepsTheEarlierOne) {
  const std::string store = make_store();
  check_checkpoint(train_args(store), path("ck"), 4 << 10, [] {}, [] {});
}

// The predictions are 84 KB, the logits 324 KB: 64 KiB stops both.
TEST_F(NoRoom, PredictPastAFileSizeLimitLeavesNoOutput) {
  const std::string store = make_store();
  ASSERT_EQ(run_gale(train_args(store) + " --epochs 1 --checkpoint-dir " + path("ck").string(), path("log")).code, 0);
  const std::string predict = "predict " + store + " --device cpu --checkpoint " + path("ck").string();
  fs::create_directories(path("out"));
  check_predict(predict, path("out"), 64 << 10);
  // An earlier prediction stays as it was.
  ASSERT_EQ(run_gale(predict + " --out " + path("out/p.npy").string(), path("log")).code, 0);
  const std::string before = slurp(path("out/p.npy"));
  const Ended r = run_gale(predict + " --out " + path("out/p.npy").string(), path("log"), 64 << 10);
  expect_no_room(r, path("out"), 64 << 10);
  EXPECT_TRUE(slurp(path("out/p.npy")) == before);
}

// The same on a file system that is full: ENOSPC rather than EFBIG.
TEST_F(NoRoom, FullFileSystemIsExitFourAndLeavesNothing) {
  std::string why;
  if (!mount_tmpfs(3 << 20, &why)) GTEST_SKIP() << why;
  const fs::path fs_root = path("fs");
  {
    SCOPED_TRACE("preprocess: a 3 MiB file system for a 4.4 MB store");
    check_preprocess(fs_root / "pre", 0);
    fs::remove_all(fs_root / "pre");
  }
  const std::string store = make_store();
  {
    SCOPED_TRACE("checkpoints: the file system filled after the first run's");
    check_checkpoint(train_args(store), fs_root / "ck", 0, [&] { fill(fs_root, 4096); },
                     [&] { fs::remove(fs_root / "filler"); });
  }
  {
    SCOPED_TRACE("predict: the file system filled first");
    fs::create_directories(fs_root / "out");
    fill(fs_root, 4096);
    check_predict("predict " + store + " --device cpu --checkpoint " + (fs_root / "ck").string(), fs_root / "out", 0);
    fs::remove(fs_root / "filler");
  }
}

}  // namespace
}  // namespace gale
