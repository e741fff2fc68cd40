// tests/fuzz/fuzz_common.hpp — what every libFuzzer harness shares (issue 39): a scratch directory
// of its own process, the input written to a file there, and the rule every parser of outside bytes
// must keep: bytes it cannot take are refused with one of Gale's clean errors (InputError,
// CorruptStoreError, ResourceError: exit 2, 3, 4, one line naming the file). Anything else is a
// finding: an InternalError or any other exception aborts, as do crashes, sanitizer reports
// (ASan, UBSan), leaks, and inputs that take over a second (libFuzzer's -timeout).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "kernels/error.hpp"

namespace gale::fuzz {

// $GALE_FUZZ_DIR, /dev/shm or the temp directory, plus gale-fuzz-PID; made once, removed at exit.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    const char* env = std::getenv("GALE_FUZZ_DIR");
    std::filesystem::path base = env != nullptr ? std::filesystem::path(env)
                                 : std::filesystem::is_directory("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                                              : std::filesystem::temp_directory_path();
    std::filesystem::path d = base / ("gale-fuzz-" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch(), ec);
    });
    return d;
  }();
  return dir;
}

// The input as the file scratch()/name (its directories made).
inline std::filesystem::path write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::filesystem::path p = scratch() / name;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return p;
}

// Runs fn; a clean refusal is fine, anything else aborts with what it was.
template <typename Fn>
void expect_clean(Fn&& fn) {
  try {
    fn();
  } catch (const InputError&) {
  } catch (const CorruptStoreError&) {
  } catch (const ResourceError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gale fuzz: not a clean error: %s\n", e.what());
    std::abort();
  }
}

}  // namespace gale::fuzz
