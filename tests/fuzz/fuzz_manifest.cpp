// libFuzzer target: a checkpoint's manifest.json.
#include "io/ckpt/checkpoint_manifest.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)dsa::ckpt::parse_manifest(std::string(reinterpret_cast<const char*>(data), size), "<fuzz>");
  return 0;
}
