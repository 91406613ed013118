// Trace frames; see trace_frame.hpp.
#include "actors/trace/trace_frame.hpp"

#include "io/ckpt/crc32c.hpp"

#include <fmt/format.h>

#include <string_view>

#include <cstring>

namespace dsa::actors {

namespace {

template <class T> T load(std::string_view data, std::size_t pos) {
  T value;
  std::memcpy(&value, data.data() + pos, sizeof(T));
  return value;
}

} // namespace

void append_trace_frame(std::string& out, trace_frame_kind kind, const std::string& payload) {
  char header[trace_frame_header_bytes];
  const std::uint32_t magic = trace_frame_magic;
  const auto k = static_cast<std::uint16_t>(kind);
  const std::uint16_t flags = 0;
  const auto length = static_cast<std::uint32_t>(payload.size());
  std::memcpy(header, &magic, 4);
  std::memcpy(header + 4, &k, 2);
  std::memcpy(header + 6, &flags, 2);
  std::memcpy(header + 8, &length, 4);
  const std::uint32_t crc =
      ckpt::crc32c_extend(ckpt::crc32c(header + 4, 8), payload.data(), payload.size());
  std::memcpy(header + 12, &crc, 4);
  out.append(header, sizeof(header));
  out += payload;
}

trace_frame_view parse_trace_frame(std::string_view data, std::size_t pos) {
  trace_frame_view f;
  const std::size_t left = data.size() - pos;
  if (left < trace_frame_header_bytes) {
    f.why = fmt::format("incomplete frame header ({} of {} bytes)", left, trace_frame_header_bytes);
    return f;
  }
  if (load<std::uint32_t>(data, pos) != trace_frame_magic) {
    f.why = "no frame magic";
    return f;
  }
  const auto length = load<std::uint32_t>(data, pos + 8);
  if (length > trace_frame_max_payload || length > left - trace_frame_header_bytes) {
    f.why = fmt::format("incomplete frame ({} payload bytes announced, {} present)", length,
                        left - trace_frame_header_bytes);
    return f;
  }
  const std::uint32_t crc = ckpt::crc32c_extend(
      ckpt::crc32c(data.data() + pos + 4, 8), data.data() + pos + trace_frame_header_bytes, length);
  if (crc != load<std::uint32_t>(data, pos + 12)) {
    f.why = "frame CRC mismatch";
    return f;
  }
  f.ok = true;
  f.kind = static_cast<trace_frame_kind>(load<std::uint16_t>(data, pos + 4));
  f.payload_pos = pos + trace_frame_header_bytes;
  f.payload_bytes = length;
  return f;
}

} // namespace dsa::actors
