// libFuzzer target: a trace file (the 16-byte header, then frames: string tables, info,
// records, flight records, the end frame; version 1 and 2), as `dsactor trace` reads it,
// and each flight record it holds decoded as `dsactor trace hang` does.
#include "actors/trace/trace_file.hpp"
#include "io/net/flight_recorder.hpp"
#include "tests/fuzz/fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto trace = dsa::actors::read_trace(dsa::fuzz::as_file(data, size));
  if (!trace) return 0;
  for (const auto& flight : trace->flights) (void)dsa::net::decode_flight(flight);
  return 0;
}
