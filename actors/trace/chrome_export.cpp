// Chrome trace-event JSON writer; see chrome_export.hpp.
#include "actors/trace/chrome_export.hpp"

#include <fmt/format.h>
#include <fstream>
#include <vector>

namespace dsa::actors {

namespace {

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
      continue;
    }
    out += c;
  }
  return out;
}

double us(std::uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

// NVMe swap spans run on the aio engine beside the shard's update: a row of their own
// (tid io_row + actor, named "<actor> nvme"), as they overlap the shard's spans.
constexpr std::uint64_t io_row = 1'000'000;
bool is_swap(const std::string& name) { return name == "swap_read" || name == "swap_write"; }

void append_event(std::string& out, const trace_data& trace, const trace_record& r) {
  const std::string name = escaped(trace.names.at(r.name));
  const auto kind = static_cast<trace_kind>(r.kind);
  if (kind == trace_kind::span && is_swap(name)) {
    out += fmt::format(R"({{"ph":"X","name":"{}","cat":"io","pid":0,"tid":{},"ts":{:.3f},"dur":{:.3f},)"
                       R"("args":{{"stage":{},"step":{},"chunk":{},"bytes":{}}}}})",
                       name, io_row + r.actor, us(r.t0_ns), us(r.t1_ns - r.t0_ns), r.stage, r.step, r.micro_batch,
                       r.bytes);
    return;
  }
  if (kind == trace_kind::span) {
    out += fmt::format(R"({{"ph":"X","name":"{}","cat":"compute","pid":0,"tid":{},"ts":{:.3f},"dur":{:.3f},)"
                       R"("args":{{"stage":{},"step":{},"micro_batch":{}}}}})",
                       name, r.actor, us(r.t0_ns), us(r.t1_ns - r.t0_ns), r.stage, r.step, r.micro_batch);
    return;
  }
  const bool send = kind == trace_kind::send;
  out += fmt::format(R"({{"ph":"i","s":"t","name":"{} {}","cat":"msg","pid":0,"tid":{},"ts":{:.3f},)"
                     R"("args":{{"peer":{},"edge":{},"slot":{},"bytes":{},"step":{},"micro_batch":{}}}}},)",
                     send ? "send" : "recv", name, r.actor, us(r.t0_ns), r.peer, r.edge, r.slot, r.bytes, r.step,
                     r.micro_batch);
  out += fmt::format(R"({{"ph":"{}",{}"name":"{}","cat":"msg","id":{},"pid":0,"tid":{},"ts":{:.3f}}})",
                     send ? "s" : "f", send ? "" : R"("bp":"e",)", name, r.flow, r.actor, us(r.t0_ns));
}

} // namespace

std::string chrome_trace_json(const trace_data& trace) {
  std::string out = R"({"traceEvents":[)";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  sep();
  out += R"({"ph":"M","name":"process_name","pid":0,"args":{"name":"dsactor"}})";
  for (std::size_t a = 0; a < trace.actors.size(); ++a) {
    sep();
    out += fmt::format(R"({{"ph":"M","name":"thread_name","pid":0,"tid":{},"args":{{"name":"{}"}}}})", a,
                       escaped(trace.actors[a]));
  }
  std::vector<bool> swaps(trace.actors.size());
  for (const auto& r : trace.records)
    if (r.actor < swaps.size() && r.name < trace.names.size() && is_swap(trace.names[r.name])) swaps[r.actor] = true;
  for (std::size_t a = 0; a < swaps.size(); ++a) {
    if (!swaps[a]) continue;
    sep();
    out += fmt::format(R"({{"ph":"M","name":"thread_name","pid":0,"tid":{},"args":{{"name":"{} nvme"}}}})", io_row + a,
                       escaped(trace.actors[a]));
  }
  for (const auto& r : trace.records) {
    sep();
    append_event(out, trace, r);
  }
  out += R"(],"displayTimeUnit":"ms","otherData":{"format":"dsactor trace v1"}})";
  return out;
}

status write_chrome_trace(const std::string& path, const trace_data& trace) {
  std::ofstream file(path, std::ios::trunc);
  if (!file) return make_error(errc::io, "cannot open {} for writing", path);
  file << chrome_trace_json(trace);
  file.close();
  if (!file) return make_error(errc::io, "short write to {}", path);
  return {};
}

} // namespace dsa::actors
