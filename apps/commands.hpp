// apps/commands.hpp — one function per `gale` subcommand; each returns the exit code and throws
// gale::Error (or a Boost.Program_options error) for main() to report.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gale::apps {

int run_preprocess(const std::vector<std::string>& args);
int run_info(const std::vector<std::string>& args);
int run_train(const std::vector<std::string>& args);
int run_predict(const std::vector<std::string>& args);

// "16G", "512M", "1024" -> bytes; throws InputError naming `flag`.
uint64_t parse_size(const std::string& text, const std::string& flag);
// "15,10,5" -> {15, 10, 5}; throws InputError naming `flag`.
std::vector<int> parse_int_list(const std::string& text, const std::string& flag);

}  // namespace gale::apps
