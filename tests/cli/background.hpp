// tests/cli/background.hpp — runs of the gale binary in the background for the tests of several
// processes (mpirun's and gale train --processes): started, waited for with a limit, found by pid.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
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

extern char** environ;

namespace gale::testing_support {

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Each line of a metrics file that reports an epoch.
inline std::vector<nlohmann::json> metrics_epochs(const std::string& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("epoch")) out.push_back(j);
  }
  return out;
}

// A run stopped and resumed against one never stopped: the same last loss and test accuracy, bit
// for bit (epochs trained again after a resume report twice).
inline void expect_same_last_epoch(const std::string& resumed, const std::string& whole) {
  const auto a = metrics_epochs(resumed), b = metrics_epochs(whole);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_GE(a.size(), b.size());
  EXPECT_EQ(a.back()["loss"].get<double>(), b.back()["loss"].get<double>());
  EXPECT_EQ(a.back()["test_acc"].get<double>(), b.back()["test_acc"].get<double>());
}

// One shell command (`exec`ed, so its pid is the command's), its output in a file; killed if it
// still runs when the object goes.
class Background {
 public:
  Background(const std::string& command, const std::filesystem::path& log) : log_(log) {
    const std::string cmd = "exec " + command + " > " + log.string() + " 2>&1";
    const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
    if (::posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) != 0) pid_ = -1;
  }
  ~Background() {
    if (pid_ > 0 && code_ == kRunning) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // The exit code once the command has ended (128 + N for signal N), waiting at most `limit`; -1
  // if it still runs then.
  int wait(std::chrono::seconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (code_ == kRunning && std::chrono::steady_clock::now() < end) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return code_ == kRunning ? -1 : code_;
  }
  std::string output() const { return read_file(log_); }

 private:
  static constexpr int kRunning = -1000;
  pid_t pid_ = -1;
  int code_ = kRunning;
  std::filesystem::path log_;
};

// Sends `signal` to `victim`, one process of `run`, and returns the run's exit code: the run must
// end within a minute (-1 when it still runs after 90 s; the victim is then killed).
inline int signal_and_wait(Background& run, pid_t victim, int signal) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(::kill(victim, signal), 0);
  const int code = run.wait(std::chrono::seconds(90));
  if (code == -1) ::kill(victim, SIGKILL);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << run.output();
  return code;
}

// The pid of a `gale train` process whose command line mentions `marker` and whose environment
// holds `variable` (NAME=value), or -1.
inline pid_t find_gale_process(const std::string& marker, const std::string& variable) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_file(e.path() / "cmdline");
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find("gale train") == std::string::npos || cmdline.find(marker) == std::string::npos) continue;
    std::string env = "\n" + read_file(e.path() / "environ");
    for (char& c : env)
      if (c == '\0') c = '\n';
    if (env.find("\n" + variable + "\n") != std::string::npos) return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

// Rank 1 of `run`, started with --comm-timeout 3, stops answering (SIGSTOP): rank 0's watchdog
// ends the run with exit code 5 within a minute, naming itself and the timeout.
inline void expect_silent_rank_times_out(Background& run, pid_t victim) {
  ASSERT_GT(victim, 0) << run.output();
  EXPECT_EQ(signal_and_wait(run, victim, SIGSTOP), 5) << run.output();
  EXPECT_NE(run.output().find("rank 0 ("), std::string::npos) << run.output();
  EXPECT_NE(run.output().find("--comm-timeout 3 s"), std::string::npos) << run.output();
}

// An empty directory of its own for the running test (`prefix`-PID-TEST) and, in it, the small SBM
// store the tests of several processes train on (sbm.gale, made by `gale`); the store's path.
inline std::string fresh_dir_with_store(const std::string& gale, const std::string& prefix, std::filesystem::path* dir) {
  *dir = std::filesystem::temp_directory_path() /
         (prefix + "-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(*dir);
  std::filesystem::create_directories(*dir);
  const std::string store = (*dir / "sbm.gale").string();
  const std::string cmd = gale + " preprocess --generate sbm:nodes=2000,classes=4,avg-degree=8,feature-dim=16,seed=3 -o " +
                          store + " > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return store;
}

}  // namespace gale::testing_support
