// libFuzzer target: a trace file (the 16-byte header, then frames: string tables, info,
// records, flight records, the end frame; version 1 and 2), as `dsactor trace` reads it,
// and each flight record it holds decoded as `dsactor trace hang` does. An input starting
// with "DSAF" is a flight record's own bytes, decoded directly: inside a trace file its
// frame's checksum turns most mutations away before the decoder sees them.
#include "actors/trace/trace_file.hpp"
#include "io/net/flight_recorder.hpp"
#include "tests/fuzz/fuzz_file.hpp"

#include <cstring>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size >= 4 && std::memcmp(data, "DSAF", 4) == 0) {
    (void)dsa::net::decode_flight(std::string_view(reinterpret_cast<const char*>(data) + 4, size - 4));
    return 0;
  }
  auto trace = dsa::actors::read_trace(dsa::fuzz::as_file(data, size));
  if (!trace) return 0;
  for (const auto& flight : trace->flights) (void)dsa::net::decode_flight(flight);
  return 0;
}
