// apps/main.cpp — the `gale` command line: preprocess, info, train, predict.
//
// Every error below is an exception carrying one line; here it is printed as "gale: error: ..."
// on stderr and turned into the exit code of its type (kernels/error.hpp): 2 bad input or usage,
// 3 corrupt or incompatible store, 4 exceeded budget or missing device, 1 internal.
#include <unistd.h>

#include <boost/program_options.hpp>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "engine/processes.hpp"
#include "engine/worker_arena.hpp"
#include "kernels/error.hpp"

namespace {

constexpr const char* kUsage =
    "usage: gale <command> [options]\n"
    "\n"
    "commands:\n"
    "  preprocess INPUT... -o STORE   turn a graph into a store (edge list, OGB folder, .mtx, .npy)\n"
    "  preprocess --generate SPEC -o STORE   generate rmat:... or sbm:... into a store\n"
    "  info STORE [--verify] [--add-page-sums]   counts, degrees, dtypes, splits; --verify checks\n"
    "                                 every hash and page sum; --add-page-sums adds page sums in place\n"
    "  train STORE [options]          train a GNN (gcn, sage, gin, gat) on a store\n"
    "  predict STORE --checkpoint D   class predictions (and logits) for every node\n"
    "  bench spmm STORE|--generate SPEC   time the CUDA SpMM kernels against cuSPARSE\n"
    "  bench train|sample|gather|pipeline ...   time training, the samplers, the feature gather,\n"
    "                                 the mini-batch pipeline ('gale bench --help')\n"    "\n"
    "run 'gale <command> --help' for a command's options.\n";

// Prints the one-line error and returns its exit code. In a run of several processes (mpirun) the
// line names this process's rank and host, and every other process is stopped with the same code.
int report(const std::string& prefix, const std::string& message, gale::ExitCode code) {
  bool distributed = false;
  try {
    distributed = gale::engine::Processes::launched() && gale::engine::Processes::get().distributed();
  } catch (const std::exception&) {  // MPI itself would not start: report this process's error alone
  }
  const std::string where = distributed ? gale::engine::Processes::get().name() + ": " : "";
  std::fprintf(stderr, "%s%s%s\n", prefix.c_str(), where.c_str(), message.c_str());
  if (distributed) gale::engine::Processes::get().fail(static_cast<int>(code));
  return static_cast<int>(code);
}

}  // namespace

int main(int argc, char** argv) {
  // First, so it goes last: joins TBB's threads once every arena of the command is gone.
  const gale::engine::TbbThreadsJoinedAtExit tbb_threads;
  // A file-size limit (ulimit -f) then fails the write with EFBIG, reported as exit 4 naming the
  // file, instead of killing the process mid-write.
  ::signal(SIGXFSZ, SIG_IGN);
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return static_cast<int>(gale::ExitCode::kInput);
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (command == "--version") {
    std::puts("gale 0.1.0");
    return 0;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (command == "preprocess") return gale::apps::run_preprocess(args);
    if (command == "info") return gale::apps::run_info(args);
    if (command == "train") return gale::apps::run_train(args);
    if (command == "predict") return gale::apps::run_predict(args);
    if (command == "bench") return gale::apps::run_bench(args);
    throw gale::InputError("unknown command '" + command + "' (expected preprocess, info, train, predict or bench)");
  } catch (const gale::Error& e) {
    return report("gale: error: ", e.what(), e.code());
  } catch (const boost::program_options::error& e) {
    return report("gale " + command + ": error: ", gale::apps::option_error_text(e, args), gale::ExitCode::kInput);
  } catch (const std::bad_alloc&) {
    return report("gale: error: ", "out of host memory", gale::ExitCode::kResource);
  } catch (const std::exception& e) {
    return report("gale: internal error: ", e.what(), gale::ExitCode::kInternal);
  }
}
