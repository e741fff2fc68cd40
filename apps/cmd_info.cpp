// `gale info STORE [--verify]`.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>

#include "apps/commands.hpp"
#include "kernels/error.hpp"
#include "storage/store.hpp"

namespace gale::apps {

namespace po = boost::program_options;

int run_info(const std::vector<std::string>& args) {
  std::string path;
  bool verify = false;
  po::options_description desc("usage: gale info STORE [--verify]\n\noptions");
  desc.add_options()
      ("help,h", "show this help")
      ("verify", po::bool_switch(&verify), "check every file's xxHash64 against the manifest")
      ("store", po::value(&path), "store directory");
  po::positional_options_description pos;
  pos.add("store", 1);
  po::variables_map vm;
  if (!parse_command_line(args, desc, pos, &vm)) return 0;
  if (path.empty()) throw InputError("info: expected a STORE path");
  const storage::Store store = storage::Store::open(path);
  std::fputs(storage::describe_store(store).c_str(), stdout);
  if (verify) {
    store.verify();
    std::printf("verify: all %zu files match their xxHash64\n", store.manifest().files.size());
  }
  return 0;
}

}  // namespace gale::apps
