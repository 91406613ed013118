// libFuzzer target: a trace file (the 16-byte header, then frames: string tables, info,
// records, the end frame; version 1 and 2), as `dsactor trace` reads it.
#include "actors/trace/trace_file.hpp"
#include "tests/fuzz/fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)dsa::actors::read_trace(dsa::fuzz::as_file(data, size));
  return 0;
}
