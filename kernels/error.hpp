// kernels/error.hpp — Gale's one error path.
//
// Every failure a user can meet is an exception carrying a one-line message that names the file,
// line or flag and what was expected. The CLI (apps/) maps each type to a distinct exit code;
// nothing below apps/ calls exit().
#pragma once

#include <stdexcept>
#include <string>

namespace gale {

// Exit codes the CLI returns for each error type (documented in README.md).
enum class ExitCode : int {
  kOk = 0,
  kInternal = 1,       // a bug or an unexpected system failure
  kInput = 2,          // bad input file, flag or usage
  kCorruptStore = 3,   // a store that fails its size, manifest or hash checks, or a wrong version
  kResource = 4,       // an exceeded memory budget, or a missing / failing device
  kPeer = 5,           // another process of a distributed run was lost or stopped answering
};

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, ExitCode code) : std::runtime_error(message), code_(code) {}
  ExitCode code() const noexcept { return code_; }

 private:
  ExitCode code_;
};

// Bad user input: a file that does not parse, a flag out of range, an id out of bounds.
class InputError : public Error {
 public:
  explicit InputError(const std::string& message) : Error(message, ExitCode::kInput) {}
};

// A store that is damaged or of an incompatible version.
class CorruptStoreError : public Error {
 public:
  explicit CorruptStoreError(const std::string& message) : Error(message, ExitCode::kCorruptStore) {}
};

// A memory budget that would be exceeded (host or GPU).
class ResourceError : public Error {
 public:
  explicit ResourceError(const std::string& message) : Error(message, ExitCode::kResource) {}
};

// A device that is missing, or a CUDA / cuBLAS / cuSPARSE / NCCL call that failed.
class DeviceError : public Error {
 public:
  explicit DeviceError(const std::string& message) : Error(message, ExitCode::kResource) {}
};

// A distributed run that cannot go on: a peer process was lost, failed or stopped answering.
class PeerError : public Error {
 public:
  explicit PeerError(const std::string& message) : Error(message, ExitCode::kPeer) {}
};

// A broken invariant inside Gale: always a bug.
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& message) : Error(message, ExitCode::kInternal) {}
};

// Throws InternalError naming the condition and the place; for invariants, not user input.
#define GALE_ASSERT(cond)                                                                  \
  do {                                                                                     \
    if (!(cond))                                                                           \
      throw ::gale::InternalError(std::string("internal check failed: ") + #cond + " at " + \
                                  __FILE__ + ":" + std::to_string(__LINE__));              \
  } while (0)

}  // namespace gale
