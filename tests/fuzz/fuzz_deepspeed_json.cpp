// libFuzzer target: a DeepSpeed JSON config (--deepspeed_config), read from a file as the
// run reads it, converted into the TOML table the run config is read from.
#include "actors/train/config/deepspeed_json.hpp"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

namespace {
// The input's file, removed when the fuzzer exits.
struct input_file {
  std::string path = "/tmp/dsactor-fuzz-ds-" + std::to_string(::getpid()) + ".json";
  ~input_file() { ::unlink(path.c_str()); }
};
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const input_file file;
  const std::string& path = file.path;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                 static_cast<std::streamsize>(size));
  (void)dsa::train::load_deepspeed_json(path);
  return 0;
}
