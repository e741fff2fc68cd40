// Fuzzes the INI reader of `gale train --config FILE` (Boost.Program_options' config parser and
// Gale's checks of every value it sets). A usage error from Boost is a clean refusal too (exit 2).
#include <boost/program_options/errors.hpp>

#include "apps/commands.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path file = gale::fuzz::write_input("train.ini", data, size);
  gale::fuzz::expect_clean([&] {
    try {
      (void)gale::apps::run_train({"--config", file.string()});
    } catch (const boost::program_options::error&) {
    }
  });
  return 0;
}
