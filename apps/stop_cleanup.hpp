// apps/stop_cleanup.hpp — SIGINT / SIGTERM during a command that writes temporaries (gale
// preprocess: a store and sorted runs; gale predict: its outputs before their rename): a watcher
// thread removes them (storage/temp_paths.hpp) and ends the process with 128 + the signal's
// number, so a stopped command leaves neither a half-written result nor any litter.
#pragma once

#include <csignal>
#include <thread>

namespace gale::apps {

// While it lives, SIGINT and SIGTERM go to a handler that only writes the signal's number to a
// pipe (whichever thread takes it: libraries start threads of their own before main); the
// watcher thread reads it, removes the registered temporary directories and exits. One at a time.
class StopCleanup {
 public:
  StopCleanup();
  ~StopCleanup();
  StopCleanup(const StopCleanup&) = delete;
  StopCleanup& operator=(const StopCleanup&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
  std::thread watcher_;
};

}  // namespace gale::apps
