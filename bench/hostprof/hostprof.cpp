// bench/hostprof/hostprof.cpp — a sampling profiler of host code for machines without perf (the GPU
// machines have no perf, gdb or Nsight Systems). Preloaded into any program:
//
//   HOSTPROF_OUT=/tmp/prof HOSTPROF_US=250 LD_PRELOAD=build/lib/libgale_hostprof.so gale train ...
//   python3 bench/hostprof/report.py /tmp/prof.PID build/bin/gale LIBS...
//
// SIGPROF arrives every HOSTPROF_US microseconds of the process's CPU time (default 1000); the
// handler stores the interrupted thread's id and raw backtrace (glibc's unwinder, loaded before the
// first signal). At exit the samples and /proc/self/maps go to $HOSTPROF_OUT.PID; report.py
// symbolizes them offline with addr2line against unstripped copies of the binaries (the bundle's
// are stripped) and prints the inclusive and leaf counts, overall and for the training step.
// Not part of Gale itself: nothing links it.
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
namespace {
constexpr int kDepth = 48;
constexpr size_t kMax = 400000;
struct Sample { int tid; int n; void* pc[kDepth]; };
Sample* samples = nullptr;
std::atomic<size_t> count{0};
void handler(int, siginfo_t*, void*) {
  const size_t i = count.fetch_add(1, std::memory_order_relaxed);
  if (i >= kMax) return;
  Sample& s = samples[i];
  s.tid = static_cast<int>(syscall(SYS_gettid));
  s.n = backtrace(s.pc, kDepth);
}
void dump() {
  const char* out = std::getenv("HOSTPROF_OUT");
  if (!out || !samples) return;
  struct itimerval off{}; setitimer(ITIMER_PROF, &off, nullptr);
  char path[512]; std::snprintf(path, sizeof path, "%s.%d", out, static_cast<int>(getpid()));
  FILE* f = std::fopen(path, "w");
  if (!f) return;
  const size_t n = count.load() < kMax ? count.load() : kMax;
  for (size_t i = 0; i < n; ++i) {
    std::fprintf(f, "S %d", samples[i].tid);
    for (int k = 0; k < samples[i].n; ++k) std::fprintf(f, " %p", samples[i].pc[k]);
    std::fprintf(f, "\n");
  }
  FILE* maps = std::fopen("/proc/self/maps", "r");
  char line[1024];
  while (maps && std::fgets(line, sizeof line, maps)) std::fprintf(f, "M %s", line);
  if (maps) std::fclose(maps);
  std::fclose(f);
}
struct Init {
  Init() {
    if (!std::getenv("HOSTPROF_OUT")) return;
    samples = static_cast<Sample*>(std::calloc(kMax, sizeof(Sample)));
    void* warm[4]; backtrace(warm, 4);  // loads libgcc's unwinder outside the handler
    struct sigaction sa{}; sa.sa_sigaction = handler; sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, nullptr);
    const long us = std::getenv("HOSTPROF_US") ? std::atol(std::getenv("HOSTPROF_US")) : 1000;
    struct itimerval t{}; t.it_interval.tv_usec = us; t.it_value.tv_usec = us;
    setitimer(ITIMER_PROF, &t, nullptr);
    std::atexit(dump);
  }
} init;
}  // namespace
