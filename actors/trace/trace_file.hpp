// The binary trace file (.dsat). All integers little-endian. Every version
// starts with magic "DSATRACE", u32 version, u32 record size (64); readers
// reject another magic or record size and a version they do not know.
//
// Version 2 (written today, streamed while the run goes; trace_writer.hpp):
//   header (16 bytes), then frames (trace_frame.hpp): names, actors and info
//   frames first, then records frames as the writer drains the recorder, and an
//   end frame when the writer closes the file. A reader keeps every complete
//   frame and stops at the first incomplete or corrupt one, which it reports in
//   trace_data::end (a run killed with kill -9 leaves such a tail).
//
// Version 1 (written at the end of a run until version 2; still read):
//   name_count   u32, then per name:  u32 length, bytes (UTF-8, no terminator)
//   actor_count  u32, then per actor: u32 length, bytes
//   record_count u64, then record_count records of 64 bytes.
//
// A record (both versions) is trace_record's layout: t0_ns u64, t1_ns u64,
// bytes u64, flow u64, step u32, micro_batch u32, actor u32, peer u32, edge
// u32, slot u32, stage i32, name u16 (index into names), kind u8 (0 span,
// 1 send, 2 recv), reserved u8.
#pragma once

#include "actors/trace/trace_recorder.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dsa::actors {

inline constexpr char trace_magic[8] = {'D', 'S', 'A', 'T', 'R', 'A', 'C', 'E'};
inline constexpr std::uint32_t trace_format_version = 2;
inline constexpr std::size_t trace_header_bytes = 16;

// The 16-byte file header of `version`.
std::string trace_file_header(std::uint32_t version);
// Frame payloads: a string table (names, actors) and the info entries.
std::string trace_table_payload(const std::vector<std::string>& strings);
std::string trace_info_payload(const std::vector<std::pair<std::string, std::string>>& info);
// Records frames of at most `per_frame` records each, appended to `out`.
void append_trace_records(std::string& out, const trace_record* records, std::size_t count,
                          std::size_t per_frame = 65536);

// Writes a whole trace at once in the current version (closed with an end frame).
status write_trace(const std::string& path, const trace_data& trace);
// Writes version 1, for the tests that show old files still load.
status write_trace_v1(const std::string& path, const trace_data& trace);
// Reads either version. A version-2 file with a torn or corrupt tail loads its
// complete frames; trace_data::end says where it stops and why. Records are
// sorted by (t0, actor). The file is mapped, not read into the heap; `keep`, when set,
// drops the records it rejects as they are read (a long run's end-of-run report reads its
// last steps without holding the whole trace).
expected<trace_data> read_trace(const std::string& path, const std::function<bool(const trace_record&)>& keep = {});

} // namespace dsa::actors
