// The binary trace file (.dsat), version 1. All integers little-endian.
//
//   magic        8 bytes  "DSATRACE"
//   version      u32      1
//   record_size  u32      64
//   name_count   u32, then per name:  u32 length, bytes (UTF-8, no terminator)
//   actor_count  u32, then per actor: u32 length, bytes
//   record_count u64, then record_count records of 64 bytes, each laid out as
//     trace_record: t0_ns u64, t1_ns u64, bytes u64, flow u64, step u32,
//     micro_batch u32, actor u32, peer u32, edge u32, slot u32, stage i32,
//     name u16 (index into names), kind u8 (0 span, 1 send, 2 recv), reserved u8.
//
// Readers reject another magic or version; a new field means a new version.
#pragma once

#include "actors/trace/trace_recorder.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <string>

namespace dsa::actors {

inline constexpr char trace_magic[8] = {'D', 'S', 'A', 'T', 'R', 'A', 'C', 'E'};
inline constexpr std::uint32_t trace_format_version = 1;

status write_trace(const std::string& path, const trace_data& trace);
expected<trace_data> read_trace(const std::string& path);

} // namespace dsa::actors
