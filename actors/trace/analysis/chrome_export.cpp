// Chrome trace-event JSON writer; see chrome_export.hpp.
#include "actors/trace/analysis/chrome_export.hpp"

#include "actors/trace/analysis/trace_clock.hpp"
#include "actors/trace/analysis/trace_edges.hpp"
#include "io/ckpt/atomic_file.hpp"

#include <fmt/format.h>

#include <map>
#include <unordered_map>
#include <vector>

namespace dsa::actors {

namespace {

double us(std::uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

// I/O spans (the NVMe swap's, is_io_span) run on the aio engine beside the shard's update: a
// row of their own (tid io_row + actor, named "<actor> nvme"), as they overlap the shard's spans.
constexpr std::uint64_t io_row = 1'000'000;
// Device spans (a CUDA stage's kernels, is_device_span): a row of their own too (tid
// gpu_row + actor, named "<actor> gpu").
constexpr std::uint64_t gpu_row = 2'000'000;

// Writes the events of one rank's trace as process `pid`; flow ids stay unique over all ranks.
class rank_writer {
public:
  // offset_ns: added to every time, to put the rank on the common clock (trace_clock.hpp).
  rank_writer(std::string& out, const trace_data& trace, std::uint32_t pid, std::uint64_t& next_flow,
              std::uint64_t offset_ns = 0)
      : out_(out), t_(trace), pid_(pid), next_flow_(next_flow), edges_(trace_edges(trace)), offset_ns_(offset_ns) {}

  void write() {
    event(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":"rank {}"}}}})", pid_, pid_));
    event(fmt::format(R"({{"ph":"M","name":"process_sort_index","pid":{},"args":{{"sort_index":{}}}}})", pid_, pid_));
    for (std::size_t a = 0; a < t_.actors.size(); ++a) thread_name(a, t_.actors[a]);
    std::vector<bool> swaps(t_.actors.size()), gpus(t_.actors.size());
    for (const auto& r : t_.records)
      if (r.actor < swaps.size() && r.name < t_.names.size()) {
        if (is_io_span(t_.names[r.name])) swaps[r.actor] = true;
        if (is_device_span(t_.names[r.name])) gpus[r.actor] = true;
      }
    for (std::size_t a = 0; a < swaps.size(); ++a) {
      if (swaps[a]) thread_name(io_row + a, t_.actors[a] + " nvme");
      if (gpus[a]) thread_name(gpu_row + a, t_.actors[a] + " gpu");
    }
    for (const auto& r : t_.records) record(r);
  }

private:
  void event(const std::string& e) {
    if (out_.back() != '[') out_ += ",\n";
    out_ += e;
  }
  void thread_name(std::uint64_t tid, const std::string& name) {
    event(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":{}}}}})", pid_, tid,
                      json_quoted(name)));
  }
  std::string name_of(const trace_record& r) const {
    return r.name < t_.names.size() ? t_.names[r.name] : fmt::format("name {}", r.name);
  }

  void record(const trace_record& r) {
    const std::string name = name_of(r);
    const auto kind = static_cast<trace_kind>(r.kind);
    if (kind == trace_kind::span && is_io_span(name)) {
      event(fmt::format(R"({{"ph":"X","name":{},"cat":"io","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},)"
                        R"("args":{{"stage":{},"step":{},"chunk":{},"bytes":{}}}}})",
                        json_quoted(name), pid_, io_row + r.actor, at(r.t0_ns), us(r.t1_ns - r.t0_ns), r.stage, r.step,
                        r.micro_batch, r.bytes));
      return;
    }
    if (kind == trace_kind::span && is_device_span(name)) {
      event(fmt::format(R"({{"ph":"X","name":{},"cat":"gpu","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},)"
                        R"("args":{{"stage":{},"step":{},"micro_batch":{}}}}})",
                        json_quoted(name), pid_, gpu_row + r.actor, at(r.t0_ns), us(r.t1_ns - r.t0_ns), r.stage, r.step,
                        r.micro_batch));
      return;
    }
    if (kind == trace_kind::span) {
      // Gradient allreduces are the network's spans (cat "comm"); the rest compute.
      event(fmt::format(R"({{"ph":"X","name":{},"cat":"{}","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},)"
                        R"("args":{{"stage":{},"step":{},"micro_batch":{}}}}})",
                        json_quoted(name), name == "allreduce" ? "comm" : "compute", pid_, r.actor, at(r.t0_ns), us(r.t1_ns - r.t0_ns), r.stage, r.step,
                        r.micro_batch));
      return;
    }
    const bool send = kind == trace_kind::send;
    event(fmt::format(R"({{"ph":"i","s":"t","name":{},"cat":"msg","pid":{},"tid":{},"ts":{:.3f},)"
                      R"("args":{{"peer":{},"edge":{},"slot":{},"bytes":{},"step":{},"micro_batch":{}}}}})",
                      json_quoted((send ? "send " : "recv ") + name), pid_, r.actor, at(r.t0_ns), r.peer, r.edge,
                      r.slot, r.bytes, r.step, r.micro_batch));
    const auto id = flows_.emplace(r.flow, next_flow_).first->second;
    if (id == next_flow_) ++next_flow_;
    event(fmt::format(R"({{"ph":"{}",{}"name":{},"cat":"msg","id":{},"pid":{},"tid":{},"ts":{:.3f}}})",
                      send ? "s" : "f", send ? "" : R"("bp":"e",)", json_quoted(name), id, pid_, r.actor,
                      at(r.t0_ns)));
    // The producer's view of its edge: a produce takes a slot, the release it receives gives it back.
    if ((send && name == "produced") || (!send && name == "released")) credit(r, send);
  }

  void credit(const trace_record& r, bool take) {
    auto& used = in_use_[r.edge];
    used = take ? used + 1 : (used > 0 ? used - 1 : 0);
    auto it = edges_.find(r.edge);
    const std::uint32_t slots = it == edges_.end() ? 0 : it->second.slots;
    const std::string free = slots > 0 ? fmt::format(R"(,"free":{})", slots > used ? slots - used : 0) : "";
    event(fmt::format(R"({{"ph":"C","name":{},"cat":"credit","pid":{},"ts":{:.3f},"args":{{"in use":{}{}}}}})",
                      json_quoted("credits " + trace_edge_label(edges_, r.edge)), pid_, at(r.t0_ns), used, free));
  }

  std::string& out_;
  const trace_data& t_;
  const std::uint32_t pid_;
  std::uint64_t& next_flow_;
  const std::map<std::uint32_t, trace_edge> edges_;
  std::unordered_map<std::uint64_t, std::uint64_t> flows_; // trace flow -> exported id
  std::map<std::uint32_t, std::uint32_t> in_use_;          // slots in flight per edge
  std::uint64_t offset_ns_ = 0;
  double at(std::uint64_t ns) const { return us(ns + offset_ns_); }
};

template <class Each> std::string document(const std::string& clock, Each&& each_rank) {
  std::string out = R"({"traceEvents":[)";
  std::uint64_t next_flow = 1;
  each_rank([&](const trace_data& t, std::uint32_t rank, std::uint64_t offset_ns) {
    rank_writer(out, t, rank, next_flow, offset_ns).write();
  });
  out += fmt::format(R"(],"displayTimeUnit":"ms","otherData":{{"format":"dsactor trace","clock":{}}}}})",
                     json_quoted(clock));
  return out;
}

} // namespace

std::string json_quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20 || c == '<') {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string chrome_trace_json(const std::vector<rank_trace>& traces) {
  const trace_clocks clocks = align_trace_clocks(traces);
  return document(clocks.how, [&](auto&& write) {
    for (std::size_t i = 0; i < traces.size(); ++i) write(traces[i].trace, traces[i].rank, clocks.offset_ns[i]);
  });
}

std::string chrome_trace_json(const trace_data& trace) {
  return document("one trace: its own clock", [&](auto&& write) { write(trace, 0, 0); });
}

status write_chrome_trace(const std::string& path, const std::vector<rank_trace>& traces) {
  return ckpt::write_file_atomic(path, chrome_trace_json(traces));
}

status write_chrome_trace(const std::string& path, const trace_data& trace) {
  return ckpt::write_file_atomic(path, chrome_trace_json(trace));
}

} // namespace dsa::actors
