// Writing and reading the binary trace format; see trace_file.hpp.
#include "actors/trace/trace_file.hpp"

#include "actors/trace/trace_frame.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <iterator>

namespace dsa::actors {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the trace format is little-endian");

namespace {

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void put_string(std::string& out, const std::string& x) {
  put<std::uint32_t>(out, static_cast<std::uint32_t>(x.size()));
  out += x;
}

struct cursor {
  std::string_view data;
  std::size_t pos = 0;
  std::size_t end = data.size();
  bool take(void* dst, std::size_t n) {
    if (end - pos < n) return false;
    std::memcpy(dst, data.data() + pos, n);
    pos += n;
    return true;
  }
  template <class T>
  bool get(T& value) { return take(&value, sizeof(T)); }
  bool get_string(std::string& x) {
    std::uint32_t length = 0;
    if (!get(length) || end - pos < length) return false;
    x = std::string(data.substr(pos, length));
    pos += length;
    return true;
  }
  bool get_strings(std::vector<std::string>& xs) {
    std::uint32_t count = 0;
    if (!get(count)) return false;
    xs.clear();
    for (std::uint32_t i = 0; i < count; ++i)
      if (!get_string(xs.emplace_back())) return false;
    return true;
  }
};

status write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return make_error(errc::io, "cannot open trace file {} for writing", path);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) return make_error(errc::io, "short write to trace file {}", path);
  return {};
}

using record_filter = std::function<bool(const trace_record&)>;

// Appends the records of `bytes` that `keep` accepts (all without it).
void append_records(std::vector<trace_record>& out, const char* bytes, std::size_t count, const record_filter& keep) {
  if (count == 0) return; // memcpy into an empty vector's null data() is undefined, even for 0 bytes
  const std::size_t before = out.size();
  out.resize(before + count);
  std::memcpy(out.data() + before, bytes, count * sizeof(trace_record));
  if (keep) out.erase(std::remove_if(out.begin() + static_cast<std::ptrdiff_t>(before), out.end(),
                                     [&](const trace_record& r) { return !keep(r); }),
                      out.end());
}

expected<trace_data> read_v1(const std::string& path, cursor& in, const record_filter& keep) {
  trace_data trace;
  trace.version = 1;
  std::uint64_t count = 0;
  if (!in.get_strings(trace.names) || !in.get_strings(trace.actors) || !in.get(count))
    return make_error(errc::format, "{}: truncated header", path);
  const std::size_t left = in.end - in.pos;
  if (left / sizeof(trace_record) < count || left % sizeof(trace_record))
    return make_error(errc::format, "{}: {} records announced, {} bytes left", path, count, left);
  append_records(trace.records, in.data.data() + in.pos, count, keep);
  trace.end.valid_bytes = trace.end.file_bytes = in.data.size();
  return trace;
}

// Frames until the end frame, the end of the data or the first bad frame.
expected<trace_data> read_v2(const std::string& path, std::string_view data, const record_filter& keep) {
  trace_data trace;
  trace.version = 2;
  trace.end.closed = false;
  trace.end.file_bytes = data.size();
  std::size_t pos = trace_header_bytes, released = 0;
  while (pos < data.size()) {
    const auto frame = parse_trace_frame(data, pos);
    if (!frame.ok) {
      trace.end.why = fmt::format("{} at byte {}", frame.why, pos);
      break;
    }
    cursor in{data, frame.payload_pos, frame.payload_pos + frame.payload_bytes};
    bool parsed = true;
    switch (frame.kind) {
    case trace_frame_kind::names: parsed = in.get_strings(trace.names); break;
    case trace_frame_kind::actors: parsed = in.get_strings(trace.actors); break;
    case trace_frame_kind::info: {
      std::uint32_t count = 0;
      parsed = in.get(count);
      trace.info.clear();
      for (std::uint32_t i = 0; parsed && i < count; ++i) {
        auto& [key, value] = trace.info.emplace_back();
        parsed = in.get_string(key) && in.get_string(value);
      }
      break;
    }
    case trace_frame_kind::records: {
      parsed = frame.payload_bytes % sizeof(trace_record) == 0;
      if (!parsed) break;
      append_records(trace.records, data.data() + frame.payload_pos, frame.payload_bytes / sizeof(trace_record), keep);
      break;
    }
    case trace_frame_kind::end: trace.end.closed = true; break;
    case trace_frame_kind::flight:
      trace.flights.emplace_back(data.substr(frame.payload_pos, frame.payload_bytes));
      break;
    default: break; // a kind from a later writer: skipped, its CRC held
    }
    // The CRC held, so a payload that does not parse was written wrong: an error, not a torn tail.
    if (!parsed)
      return make_error(errc::format, "{}: frame of kind {} at byte {} does not parse", path,
                        static_cast<unsigned>(frame.kind), pos);
    pos = frame.payload_pos + frame.payload_bytes;
    if (trace.end.closed) break;
    // The frames read leave the process's resident set (the page cache keeps them): reading
    // a long run's trace maps at most about 8 MiB of it at a time.
    if (pos - released >= (8u << 20)) {
      const std::size_t upto = pos / 4096 * 4096;
      if (upto > released) (void)::madvise(const_cast<char*>(data.data()) + released, upto - released, MADV_DONTNEED);
      released = upto;
    }
  }
  trace.end.valid_bytes = pos;
  if (!trace.end.closed && trace.end.why.empty())
    trace.end.why = fmt::format("no end frame after byte {} (the run was killed or is still going)", pos);
  return trace;
}

} // namespace

std::string trace_file_header(std::uint32_t version) {
  std::string out(trace_magic, sizeof(trace_magic));
  put<std::uint32_t>(out, version);
  put<std::uint32_t>(out, sizeof(trace_record));
  return out;
}

std::string trace_table_payload(const std::vector<std::string>& strings) {
  std::string out;
  put<std::uint32_t>(out, static_cast<std::uint32_t>(strings.size()));
  for (const auto& x : strings) put_string(out, x);
  return out;
}

std::string trace_info_payload(const std::vector<std::pair<std::string, std::string>>& info) {
  std::string out;
  put<std::uint32_t>(out, static_cast<std::uint32_t>(info.size()));
  for (const auto& [key, value] : info) {
    put_string(out, key);
    put_string(out, value);
  }
  return out;
}

void append_trace_records(std::string& out, const trace_record* records, std::size_t count, std::size_t per_frame) {
  for (std::size_t i = 0; i < count; i += per_frame) {
    const std::size_t n = std::min(per_frame, count - i);
    append_trace_frame(out, trace_frame_kind::records,
                       std::string(reinterpret_cast<const char*>(records + i), n * sizeof(trace_record)));
  }
}

status write_trace(const std::string& path, const trace_data& trace) {
  std::string out = trace_file_header(trace_format_version);
  append_trace_frame(out, trace_frame_kind::names, trace_table_payload(trace.names));
  append_trace_frame(out, trace_frame_kind::actors, trace_table_payload(trace.actors));
  append_trace_frame(out, trace_frame_kind::info, trace_info_payload(trace.info));
  append_trace_records(out, trace.records.data(), trace.records.size());
  std::string end;
  put<std::uint64_t>(end, trace.records.size());
  append_trace_frame(out, trace_frame_kind::end, end);
  return write_bytes(path, out);
}

status write_trace_v1(const std::string& path, const trace_data& trace) {
  std::string out = trace_file_header(1);
  out += trace_table_payload(trace.names);
  out += trace_table_payload(trace.actors);
  put<std::uint64_t>(out, trace.records.size());
  out.append(reinterpret_cast<const char*>(trace.records.data()), trace.records.size() * sizeof(trace_record));
  return write_bytes(path, out);
}

namespace {

// The file mapped read-only: its pages are the page cache's, not the reader's heap.
class mapped_trace {
public:
  static expected<mapped_trace> open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return make_error(errc::io, "cannot open trace file {}: {}", path, std::strerror(errno));
    struct stat st {};
    mapped_trace m;
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      m.size_ = static_cast<std::size_t>(st.st_size);
      void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p != MAP_FAILED) m.data_ = static_cast<const char*>(p);
    }
    const int error = errno;
    ::close(fd);
    if (m.size_ > 0 && m.data_ == nullptr)
      return make_error(errc::io, "cannot map trace file {}: {}", path, std::strerror(error));
    return m;
  }
  mapped_trace() = default;
  mapped_trace(mapped_trace&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  mapped_trace& operator=(mapped_trace&&) = delete;
  ~mapped_trace() {
    if (data_) ::munmap(const_cast<char*>(data_), size_);
  }
  std::string_view bytes() const { return {data_ ? data_ : "", size_}; }

private:
  const char* data_ = nullptr;
  std::size_t size_ = 0;
};

} // namespace

expected<trace_data> read_trace(const std::string& path, const std::function<bool(const trace_record&)>& keep) {
  DSA_ASSIGN_OR_RETURN(mapped_trace file, mapped_trace::open(path));
  const std::string_view data = file.bytes();
  cursor in{data};
  char magic[8];
  std::uint32_t version = 0, record_size = 0;
  if (!in.take(magic, sizeof(magic)) || std::memcmp(magic, trace_magic, sizeof(magic)) != 0)
    return make_error(errc::format, "{} is not a dsactor trace (bad magic)", path);
  if (!in.get(version) || version < 1 || version > trace_format_version)
    return make_error(errc::format, "{}: trace version {} (this reader knows 1 to {})", path, version,
                      trace_format_version);
  if (!in.get(record_size) || record_size != sizeof(trace_record))
    return make_error(errc::format, "{}: record size {} (expected {})", path, record_size, sizeof(trace_record));
  auto trace = version == 1 ? read_v1(path, in, keep) : read_v2(path, data, keep);
  if (!trace) return trace;
  for (const auto& r : trace->records)
    if (r.name >= trace->names.size() || r.kind > 2)
      return make_error(errc::format, "{}: record with name {} kind {} out of range", path, r.name, r.kind);
  sort_trace_records(trace->records);
  return trace;
}

} // namespace dsa::actors
