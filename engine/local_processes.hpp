// engine/local_processes.hpp — one host's processes of a run started by gale itself
// (`gale train --processes N|per-gpu`), without mpirun.
//
// The launcher (the process the user started) starts N copies of its own program with the same
// arguments and stays beside them: it carries their collectives (Processes::broadcast and
// all_gather: every copy sends its bytes over a socket pair, the launcher answers each with rank
// 0's bytes or with all of them in rank order) and supervises them. A copy that fails reports its
// exit code and exits; the launcher then stops the others (SIGTERM, SIGKILL 10 s later) and exits
// with that code, as mpirun does. SIGINT and SIGTERM sent to the launcher are passed to every copy
// once (each copy is in a process group of its own, so a terminal's Ctrl-C reaches it once, through
// the launcher), and a copy whose launcher dies gets SIGTERM. NCCL still carries the GPUs' tensors.
//
// The copies find their rank, the count and their end of the socket pair in the environment
// (GALE_LOCAL_RANK, GALE_LOCAL_SIZE, GALE_LOCAL_FD); Processes reads them (engine/processes.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gale::engine::local {

// Starts `count` (>= 2) copies of this program (/proc/self/exe) with `args` (argv[1..]: the
// command and its options), waits for them and returns the run's exit code: 0 when every copy
// ended with 0, else the first failing copy's code (128 + N for a copy ended by signal N).
int launch(int count, const std::vector<std::string>& args);

// In a copy: its place in the run, from the environment; nullopt in any other process. A malformed
// environment is an InputError naming the variable.
struct Link {
  int rank = 0, size = 1;
  int fd = -1;  // this copy's end of its socket pair with the launcher
};
std::optional<Link> link_from_environment();
// Whether this process is such a copy (the environment names a launcher).
bool started_by_launcher();

// One collective with the launcher: sends `bytes` bytes and returns rank 0's bytes (broadcast) or
// every copy's bytes in rank order (gather). Every copy must call it with the same kind and size.
// A launcher gone is a PeerError.
enum class Kind : uint32_t { kBroadcast = 1, kGather = 2, kFail = 3 };
std::vector<uint8_t> exchange(const Link& link, Kind kind, const void* data, size_t bytes);
// Tells the launcher this copy fails with `code` (it then stops the others); never throws.
void report_failure(const Link& link, int code);

}  // namespace gale::engine::local
