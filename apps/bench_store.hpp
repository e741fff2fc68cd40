// apps/bench_store.hpp — the store a `gale bench` command reads: the STORE given on its command line,
// or a graph generated from --generate into a temporary store that is deleted afterwards.
#pragma once

#include <filesystem>
#include <string>

namespace gale::apps {

class BenchStore {
 public:
  // Exactly one of `store` and `generate` must be non-empty, and `generate` a valid generator spec;
  // an InputError says which is wrong. Commands call this before they look for a GPU, so a bad spec
  // is reported as such on any machine. `bench` names the command in messages.
  static void check(const std::string& store, const std::string& generate, const std::string& bench);

  // Checks as above, then generates the graph when `generate` is given.
  BenchStore(const std::string& store, const std::string& generate, const std::string& bench);
  ~BenchStore();
  BenchStore(const BenchStore&) = delete;
  BenchStore& operator=(const BenchStore&) = delete;

  const std::string& path() const { return path_; }
  // What to print as the graph's name: the generator spec or the store path.
  const std::string& label() const { return label_; }

 private:
  std::filesystem::path temp_;  // empty unless generated
  std::string path_, label_;
};

}  // namespace gale::apps
