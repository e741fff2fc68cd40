#include "engine/local_processes.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

extern char** environ;

#include "kernels/error.hpp"

namespace gale::engine::local {

namespace {

constexpr const char* kRankVar = "GALE_LOCAL_RANK";
constexpr const char* kSizeVar = "GALE_LOCAL_SIZE";
constexpr const char* kFdVar = "GALE_LOCAL_FD";

// A message's header; `bytes` bytes follow it.
struct Header {
  uint32_t kind = 0;
  uint32_t reserved = 0;
  uint64_t bytes = 0;
};

// Whole writes and reads on a socket (EINTR retried; no SIGPIPE). False: the other end is gone.
bool send_all(int fd, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}
bool recv_all(int fd, void* data, size_t bytes) {
  auto* p = static_cast<unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}
bool send_message(int fd, Kind kind, const void* data, size_t bytes) {
  Header h;
  h.kind = static_cast<uint32_t>(kind);
  h.bytes = bytes;
  return send_all(fd, &h, sizeof h) && (bytes == 0 || send_all(fd, data, bytes));
}

int env_int(const char* var, int low) {
  const char* text = std::getenv(var);
  char* end = nullptr;
  errno = 0;
  const long v = text == nullptr ? 0 : std::strtol(text, &end, 10);
  if (text == nullptr || end == text || *end != '\0' || errno != 0 || v < low || v > 1 << 20)
    throw InputError(std::string(var) + ": expected a whole number of at least " + std::to_string(low) + ", found '" +
                     (text ? text : "") + "' (it is set by gale train --processes for the processes it starts)");
  return static_cast<int>(v);
}

// The launcher's signals, passed on to the copies by its loop.
volatile std::sig_atomic_t pending_signal = 0;
extern "C" void on_launcher_signal(int sig) { pending_signal = sig; }

// One started copy, as the launcher sees it.
struct Copy {
  pid_t pid = -1;
  int fd = -1;
  bool ended = false;  // reaped
  std::vector<unsigned char> in;  // bytes read, not yet a whole message
  bool pending = false;           // a whole message waits for the others'
  Header header;
  std::vector<unsigned char> payload;
};

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

class Launcher {
 public:
  explicit Launcher(int count) : copies_(static_cast<size_t>(count)) {}

  int run(const std::vector<std::string>& args) {
    start(args);
    struct sigaction sa {};
    sa.sa_handler = on_launcher_signal;
    sigemptyset(&sa.sa_mask);  // no SA_RESTART: poll returns at once
    struct sigaction old_int {}, old_term {};
    ::sigaction(SIGINT, &sa, &old_int);
    ::sigaction(SIGTERM, &sa, &old_term);
    const int code = supervise();
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    return code;
  }

 private:
  void start(const std::vector<std::string>& args) {
    std::vector<std::string> argv_text{"gale"};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t launcher = ::getpid();
    for (size_t r = 0; r < copies_.size(); ++r) {
      int pair[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        throw ResourceError(std::string("--processes: socketpair failed: ") + std::strerror(errno));
      // Everything the copy needs is made before fork: between fork and exec only async-signal-safe
      // calls (the launcher may have threads, the CUDA driver's among them).
      std::vector<std::string> env_text;
      for (char** e = environ; *e != nullptr; ++e) {
        const std::string var(*e);
        const std::string name = var.substr(0, var.find('='));
        if (name != kRankVar && name != kSizeVar && name != kFdVar) env_text.push_back(var);
      }
      env_text.push_back(std::string(kRankVar) + "=" + std::to_string(r));
      env_text.push_back(std::string(kSizeVar) + "=" + std::to_string(copies_.size()));
      env_text.push_back(std::string(kFdVar) + "=" + std::to_string(pair[1]));
      std::vector<char*> envp;
      for (std::string& e : env_text) envp.push_back(e.data());
      envp.push_back(nullptr);
      static const char kExecFailed[] = "gale: error: --processes: cannot start a process of the run\n";
      std::fflush(nullptr);
      const pid_t pid = ::fork();
      if (pid < 0) {
        ::close(pair[0]);
        ::close(pair[1]);
        stop_others(static_cast<int>(ExitCode::kResource));
        throw ResourceError(std::string("--processes: fork failed: ") + std::strerror(errno));
      }
      if (pid == 0) {  // the copy: its end of the pair survives exec, the launcher's ends do not
        ::setpgid(0, 0);
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (::getppid() != launcher) ::_exit(static_cast<int>(ExitCode::kPeer));
        ::fcntl(pair[1], F_SETFD, 0);
        ::execve("/proc/self/exe", argv.data(), envp.data());
        const ssize_t ignored = ::write(STDERR_FILENO, kExecFailed, sizeof kExecFailed - 1);
        (void)ignored;
        ::_exit(static_cast<int>(ExitCode::kResource));
      }
      ::setpgid(pid, pid);  // as the copy does: whichever runs first
      ::close(pair[1]);
      copies_[r].pid = pid;
      copies_[r].fd = pair[0];
    }
  }

  // Carries the copies' collectives until every copy has ended; the run's code.
  int supervise() {
    bool forwarded = false;  // a stop signal was passed on: copies ending with it are expected
    int result = 0;
    for (;;) {
      if (const int sig = pending_signal; sig != 0) {
        pending_signal = 0;
        forwarded = true;
        for (Copy& c : copies_)
          if (!c.ended) ::kill(c.pid, sig);
      }
      std::vector<pollfd> fds;
      std::vector<size_t> which;
      for (size_t r = 0; r < copies_.size(); ++r) {
        if (copies_[r].fd < 0) continue;
        fds.push_back({copies_[r].fd, POLLIN, 0});
        which.push_back(r);
      }
      if (fds.empty()) return result;
      if (::poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR)
        return fail(static_cast<int>(ExitCode::kInternal), std::string("poll: ") + std::strerror(errno));
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        Copy& c = copies_[which[i]];
        unsigned char buffer[65536];
        const ssize_t n = ::recv(c.fd, buffer, sizeof buffer, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) {  // the copy is ending
          const int code = reap(c);
          const bool expected = code == 0 || (forwarded && (code == 128 + SIGINT || code == 128 + SIGTERM));
          if (!expected) return stop_others(code);
          if (result == 0) result = code;
          continue;
        }
        c.in.insert(c.in.end(), buffer, buffer + n);
        if (const int code = parse(c); code != 0) return stop_others(code);
      }
      if (const int code = answer(); code != 0) return code;
    }
  }

  // Moves a whole message out of c.in; a failure report's code, else 0.
  int parse(Copy& c) {
    if (c.in.size() < sizeof(Header)) return 0;
    Header h;
    std::memcpy(&h, c.in.data(), sizeof h);
    if (c.in.size() < sizeof h + h.bytes) return 0;
    if (c.pending) {
      std::fprintf(stderr, "gale: error: --processes: process %d sent a second message before the answer\n",
                   index(c));
      return static_cast<int>(ExitCode::kInternal);
    }
    c.header = h;
    c.payload.assign(c.in.begin() + sizeof h, c.in.begin() + static_cast<std::ptrdiff_t>(sizeof h + h.bytes));
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(sizeof h + h.bytes));
    if (h.kind == static_cast<uint32_t>(Kind::kFail)) {
      int32_t code = static_cast<int32_t>(ExitCode::kInternal);
      if (c.payload.size() == sizeof code) std::memcpy(&code, c.payload.data(), sizeof code);
      return code != 0 ? code : static_cast<int>(ExitCode::kInternal);
    }
    c.pending = true;
    return 0;
  }

  // Once every copy waits in the same collective, answers them all; a failure's code, else 0.
  int answer() {
    size_t waiting = 0, ended = 0;
    for (const Copy& c : copies_) {
      waiting += c.pending ? 1 : 0;
      ended += c.ended ? 1 : 0;
    }
    if (waiting == 0) return 0;
    if (ended > 0) {  // one ended while others wait for it: they would wait forever
      for (size_t r = 0; r < copies_.size(); ++r) {
        if (!copies_[r].ended) continue;
        std::fprintf(stderr, "gale: error: --processes: process %zu ended while the others waited for it\n", r);
        return stop_others(static_cast<int>(ExitCode::kPeer));
      }
    }
    if (waiting < copies_.size()) return 0;
    const Header& first = copies_[0].header;
    for (const Copy& c : copies_) {
      if (c.header.kind != first.kind || c.header.bytes != first.bytes) {
        std::fprintf(stderr, "gale: error: --processes: the processes' collectives differ (process %d)\n", index(c));
        return stop_others(static_cast<int>(ExitCode::kInternal));
      }
    }
    std::vector<unsigned char> reply;
    if (first.kind == static_cast<uint32_t>(Kind::kBroadcast)) {
      reply = copies_[0].payload;
    } else {
      for (const Copy& c : copies_) reply.insert(reply.end(), c.payload.begin(), c.payload.end());
    }
    for (Copy& c : copies_) {
      c.pending = false;
      send_message(c.fd, static_cast<Kind>(first.kind), reply.data(), reply.size());  // a copy gone shows as its end
    }
    return 0;
  }

  int reap(Copy& c) {
    ::close(c.fd);
    c.fd = -1;
    int status = 0;
    while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
    }
    c.ended = true;
    const int code = exit_code(status);  // 128 + N when ended by signal N
    if (WIFSIGNALED(status) && !(code == 128 + SIGINT || code == 128 + SIGTERM))
      std::fprintf(stderr, "gale: error: --processes: process %d was killed by signal %d\n", index(c), WTERMSIG(status));
    return code;
  }

  // A process failed with `code`: the others get SIGTERM, SIGKILL 10 s later; all are reaped.
  int stop_others(int code) {
    stop_all(SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (Copy& c : copies_) {
      if (c.ended || c.pid < 0) continue;
      int status = 0;
      while (::waitpid(c.pid, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          ::kill(c.pid, SIGKILL);
          ::waitpid(c.pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      c.ended = true;
      if (c.fd >= 0) ::close(c.fd);
      c.fd = -1;
    }
    return code;
  }
  int fail(int code, const std::string& why) {
    std::fprintf(stderr, "gale: error: --processes: %s\n", why.c_str());
    return stop_others(code);
  }
  void stop_all(int sig) {
    for (Copy& c : copies_) {
      if (c.ended || c.pid <= 0) continue;
      ::kill(c.pid, sig);
      ::kill(c.pid, SIGCONT);  // a stopped copy acts on it too
    }
  }
  int index(const Copy& c) const { return static_cast<int>(&c - copies_.data()); }

  std::vector<Copy> copies_;
};

}  // namespace

int launch(int count, const std::vector<std::string>& args) {
  if (count < 2) throw InputError("--processes: launch needs at least 2 processes");
  Launcher launcher(count);
  return launcher.run(args);
}

bool started_by_launcher() { return std::getenv(kSizeVar) != nullptr || std::getenv(kFdVar) != nullptr; }

std::optional<Link> link_from_environment() {
  if (!started_by_launcher()) return std::nullopt;
  Link link;
  link.size = env_int(kSizeVar, 1);
  link.rank = env_int(kRankVar, 0);
  link.fd = env_int(kFdVar, 0);
  if (link.rank >= link.size)
    throw InputError(std::string(kRankVar) + ": rank " + std::to_string(link.rank) + " of " + std::to_string(link.size) +
                     " processes");
  if (::fcntl(link.fd, F_GETFD) < 0)
    throw InputError(std::string(kFdVar) + ": descriptor " + std::to_string(link.fd) +
                     " is not open (set by gale train --processes for the processes it starts)");
  ::fcntl(link.fd, F_SETFD, FD_CLOEXEC);  // not to a program this one starts
  return link;
}

std::vector<uint8_t> exchange(const Link& link, Kind kind, const void* data, size_t bytes) {
  const std::string who = "process " + std::to_string(link.rank) + " of " + std::to_string(link.size);
  if (!send_message(link.fd, kind, data, bytes))
    throw PeerError(who + ": the launching gale process is gone (--processes)");
  Header h;
  if (!recv_all(link.fd, &h, sizeof h)) throw PeerError(who + ": the launching gale process is gone (--processes)");
  const size_t want = kind == Kind::kGather ? bytes * static_cast<size_t>(link.size) : bytes;
  if (h.kind != static_cast<uint32_t>(kind) || h.bytes != want)
    throw InternalError(who + ": the launcher answered a different collective");
  std::vector<uint8_t> out(want);
  if (want > 0 && !recv_all(link.fd, out.data(), want))
    throw PeerError(who + ": the launching gale process is gone (--processes)");
  return out;
}

void report_failure(const Link& link, int code) {
  const int32_t value = code;
  send_message(link.fd, Kind::kFail, &value, sizeof value);
}

}  // namespace gale::engine::local
