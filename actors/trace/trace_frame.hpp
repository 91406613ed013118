// Frames of the streaming trace format (version 2): each frame carries its
// kind, length and a CRC32C, so a reader can keep every complete frame of a
// file whose tail was torn (a killed run) and say where the damage starts.
//
//   frame header 16 bytes: magic u32 "DSAF", kind u16, flags u16 (0),
//                          length u32 (payload bytes), crc u32
//   payload      `length` bytes
//
// crc is the CRC32C of the header's bytes 4..12 (kind, flags, length) followed
// by the payload, so a damaged length is caught like damaged data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsa::actors {

inline constexpr std::uint32_t trace_frame_magic = 0x46415344; // "DSAF" little-endian
inline constexpr std::size_t trace_frame_header_bytes = 16;
// Larger frames are taken for damage: the writer never writes more than a few MiB at once.
inline constexpr std::uint32_t trace_frame_max_payload = 1u << 30;

enum class trace_frame_kind : std::uint16_t {
  names = 1,   // u32 count, then per name: u32 length, bytes; replaces the name table
  actors = 2,  // same layout; replaces the actor table
  info = 3,    // u32 count, then per entry: key and value as (u32 length, bytes)
  records = 4, // n * 64-byte trace_records
  end = 5,     // u64: the number of records written; the writer closed the file
  flight = 6,  // a flight record (io/net/flight_recorder.hpp's encoding), written on a hang or stop
};

// Appends one frame holding `payload` to `out`.
void append_trace_frame(std::string& out, trace_frame_kind kind, const std::string& payload);

// The frame starting at data[pos], or why there is none.
struct trace_frame_view {
  bool ok = false;
  trace_frame_kind kind{};
  std::size_t payload_pos = 0, payload_bytes = 0; // into the data given
  std::string why; // when !ok: "incomplete frame header", "CRC mismatch", ...
};
trace_frame_view parse_trace_frame(std::string_view data, std::size_t pos);

} // namespace dsa::actors
