#include "apps/stop_cleanup.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <string>

#include "kernels/error.hpp"
#include "storage/temp_paths.hpp"

namespace gale::apps {

namespace {

int stop_pipe[2] = {-1, -1};  // [0] the watcher reads, [1] the handler writes

extern "C" void on_stop(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  const ssize_t ignored = ::write(stop_pipe[1], &b, 1);
  (void)ignored;
  errno = saved;
}

}  // namespace

StopCleanup::StopCleanup() {
  if (stop_pipe[0] >= 0) throw InternalError("StopCleanup: one at a time");
  if (::pipe2(stop_pipe, O_CLOEXEC) != 0) throw InternalError("StopCleanup: pipe2 failed");
  watcher_ = std::thread([] {
    unsigned char sig = 0;
    ssize_t got;
    do got = ::read(stop_pipe[0], &sig, 1);
    while (got < 0 && errno == EINTR);
    if (got != 1 || sig == 0) return;  // the destructor's 0: the command finished
    // Hold the lock to the end: no store is renamed into place and no temporary directory is
    // created between the cleanup and the exit.
    std::unique_lock<std::recursive_mutex> held = storage::lock_temps();
    storage::remove_registered_temps(held);
    const std::string line = std::string("gale: stopped by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
                             "; temporary files removed (a store is only ever written whole)\n";
    const ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
    ::_exit(128 + sig);
  });
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

StopCleanup::~StopCleanup() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  const unsigned char done = 0;
  const ssize_t ignored = ::write(stop_pipe[1], &done, 1);  // a signal written before it wins
  (void)ignored;
  watcher_.join();
  ::close(stop_pipe[0]);
  ::close(stop_pipe[1]);
  stop_pipe[0] = stop_pipe[1] = -1;
}

}  // namespace gale::apps
