// Fuzzes the checkpoint reader: the input as a .ckpt file, loaded as `--resume` and `gale predict`
// load one.
#include "engine/checkpoint.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path file = gale::fuzz::write_input("input.ckpt", data, size);
  gale::fuzz::expect_clean([&] { (void)gale::engine::load_checkpoint(file); });
  return 0;
}
