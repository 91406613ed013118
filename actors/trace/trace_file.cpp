// Writing and reading the binary trace format; see trace_file.hpp.
#include "actors/trace/trace_file.hpp"

#include <cstring>
#include <fstream>
#include <iterator>

namespace dsa::actors {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the trace format is little-endian");

namespace {

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void put_strings(std::string& out, const std::vector<std::string>& xs) {
  put<std::uint32_t>(out, static_cast<std::uint32_t>(xs.size()));
  for (const auto& x : xs) {
    put<std::uint32_t>(out, static_cast<std::uint32_t>(x.size()));
    out += x;
  }
}

struct cursor {
  const std::string& data;
  std::size_t pos = 0;
  bool take(void* dst, std::size_t n) {
    if (data.size() - pos < n) return false;
    std::memcpy(dst, data.data() + pos, n);
    pos += n;
    return true;
  }
  template <class T>
  bool get(T& value) { return take(&value, sizeof(T)); }
  bool get_strings(std::vector<std::string>& xs) {
    std::uint32_t count = 0, length = 0;
    if (!get(count)) return false;
    for (std::uint32_t i = 0; i < count; ++i) {
      if (!get(length) || data.size() - pos < length) return false;
      xs.emplace_back(data.substr(pos, length));
      pos += length;
    }
    return true;
  }
};

} // namespace

status write_trace(const std::string& path, const trace_data& trace) {
  std::string out(trace_magic, sizeof(trace_magic));
  put<std::uint32_t>(out, trace_format_version);
  put<std::uint32_t>(out, sizeof(trace_record));
  put_strings(out, trace.names);
  put_strings(out, trace.actors);
  put<std::uint64_t>(out, trace.records.size());
  out.append(reinterpret_cast<const char*>(trace.records.data()), trace.records.size() * sizeof(trace_record));
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return make_error(errc::io, "cannot open trace file {} for writing", path);
  file.write(out.data(), static_cast<std::streamsize>(out.size()));
  file.close();
  if (!file) return make_error(errc::io, "short write to trace file {}", path);
  return {};
}

expected<trace_data> read_trace(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return make_error(errc::io, "cannot open trace file {}", path);
  const std::string data{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  cursor in{data};
  char magic[8];
  std::uint32_t version = 0, record_size = 0;
  if (!in.take(magic, sizeof(magic)) || std::memcmp(magic, trace_magic, sizeof(magic)) != 0)
    return make_error(errc::format, "{} is not a dsactor trace (bad magic)", path);
  if (!in.get(version) || version != trace_format_version)
    return make_error(errc::format, "{}: trace version {} (this reader knows {})", path, version,
                      trace_format_version);
  if (!in.get(record_size) || record_size != sizeof(trace_record))
    return make_error(errc::format, "{}: record size {} (expected {})", path, record_size, sizeof(trace_record));
  trace_data trace;
  std::uint64_t count = 0;
  if (!in.get_strings(trace.names) || !in.get_strings(trace.actors) || !in.get(count))
    return make_error(errc::format, "{}: truncated header", path);
  if ((data.size() - in.pos) / sizeof(trace_record) < count || (data.size() - in.pos) % sizeof(trace_record))
    return make_error(errc::format, "{}: {} records announced, {} bytes left", path, count, data.size() - in.pos);
  trace.records.resize(count);
  in.take(trace.records.data(), count * sizeof(trace_record));
  for (const auto& r : trace.records)
    if (r.name >= trace.names.size() || r.kind > 2)
      return make_error(errc::format, "{}: record with name {} kind {} out of range", path, r.name, r.kind);
  return trace;
}

} // namespace dsa::actors
