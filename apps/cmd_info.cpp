// `gale info STORE [--verify] [--add-page-sums] [--host-mem-budget SIZE]`.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <string>

#include "apps/commands.hpp"
#include "kernels/error.hpp"
#include "kernels/cuda/budget.hpp"
#include "storage/host_features.hpp"
#include "storage/host_memory.hpp"
#include "storage/store.hpp"

namespace gale::apps {

namespace po = boost::program_options;

int run_info(const std::vector<std::string>& args) {
  std::string path;
  bool verify = false;
  bool add_sums = false;
  std::string host_budget;
  po::options_description desc("usage: gale info STORE [--verify] [--add-page-sums] [--host-mem-budget SIZE]\n\noptions");
  desc.add_options()
      ("help,h", "show this help")
      ("verify", po::bool_switch(&verify), "check every file's xxHash64 and every page sum against the manifest")
      ("add-page-sums", po::bool_switch(&add_sums),
       "give a store written before page sums its per-page checksums (pages/), in place")
      ("host-mem-budget", po::value(&host_budget),
       "say where gale train would read the features from under this host budget (default: train's default)")
      ("store", po::value(&path), "store directory");
  po::variables_map vm;
  if (!parse_store_command_line(args, desc, &vm)) return 0;
  if (path.empty()) throw InputError("info: expected a STORE path");
  const uint64_t budget_flag = host_budget.empty() ? 0 : parse_size(host_budget, "--host-mem-budget");
  if (add_sums) {
    const size_t files = storage::add_page_sums(path);
    if (files == 0) std::printf("page sums: %s already has them; nothing to do\n", path.c_str());
    else std::printf("page sums: added for %zu files\n", files);
  }
  const storage::Store store = storage::Store::open(path);
  std::fputs(storage::describe_store(store).c_str(), stdout);
  if (store.has_features()) {
    // Where gale train would read the features from under its default --host-mem-budget (a GPU
    // whose room holds them all keeps them there instead).
    const storage::HostMemory memory = storage::detect_host_memory();
    const uint64_t budget = budget_flag > 0 ? budget_flag : storage::default_host_budget(memory);
    const uint64_t needed = storage::in_memory_feature_need(store);
    std::printf("placement  features %s the %s--host-mem-budget %s (%s)\n",
                needed <= budget ? "in host memory under" : "read from disk (the disk tier) beyond",
                budget_flag > 0 ? "" : "default ", kernels::cuda::format_bytes(budget).c_str(),
                budget_flag > 0 ? "as given" : storage::describe(memory).c_str());
    if (const std::string advice = storage::row_order_advice(store); needed > budget && !advice.empty())
      std::printf("placement  %s\n", advice.c_str());
  }
  if (verify) {
    const uint64_t pages = store.verify();
    std::printf("verify: all %zu files match their xxHash64", store.manifest().files.size());
    if (store.has_page_sums()) std::printf(", all %llu pages their page sums\n", static_cast<unsigned long long>(pages));
    else std::printf(" (no page sums: gale info --add-page-sums adds them)\n");
  }
  return 0;
}

}  // namespace gale::apps
