// libFuzzer target: a safetensors file (its length prefix, JSON header, metadata and the
// tensors' offsets), through the header reader and then the reader that serves tensors.
#include "io/ckpt/safetensors.hpp"
#include "io/ckpt/safetensors_reader.hpp"
#include "tests/fuzz/fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = dsa::fuzz::as_file(data, size);
  auto header = dsa::ckpt::read_safetensors_header(path);
  if (!header) return 0;
  auto reader = dsa::ckpt::safetensors_reader::open(path, size);
  if (!reader) return 0;
  for (const auto& [name, entry] : header->tensors) {
    (void)(*reader)->read(name);
    (void)(*reader)->read_range(name, 0, 1);
  }
  return 0;
}
