// The HTML page of a run's traces; see trace_html.hpp.
#include "actors/trace/analysis/trace_html.hpp"

#include "actors/trace/analysis/chrome_export.hpp"
#include "actors/trace/analysis/trace_check.hpp"
#include "actors/trace/analysis/trace_clock.hpp"
#include "actors/trace/analysis/trace_swap_io.hpp"
#include "actors/trace/analysis/trace_waits.hpp"
#include "io/ckpt/atomic_file.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace dsa::actors {

namespace {


std::string html_escaped(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

// The timeline's data: lanes, names, spans [lane, t0 ms, t1 ms, name, step, micro-batch]
// and messages [from lane, to lane, sent ms, received ms, name, edge, slot, step, micro-batch, bytes].
class timeline_json {
public:
  // Every rank on the common clock (trace_clock.hpp).
  explicit timeline_json(const std::vector<rank_trace>& traces) {
    const trace_clocks clocks = align_trace_clocks(traces);
    for (std::size_t i = 0; i < traces.size(); ++i) add_rank(traces[i], clocks.offset_ns[i]);
  }
  std::string text() const {
    std::string names;
    for (const auto& n : names_) names += (names.empty() ? "" : ",") + json_quoted(n);
    return fmt::format(R"({{"lanes":[{}],"names":[{}],"end":{:.4f},"spans":[{}],"msgs":[{}]}})", lanes_, names,
                       end_ms_, spans_, msgs_);
  }

private:
  std::size_t name_id(const std::string& name) {
    auto it = std::find(names_.begin(), names_.end(), name);
    if (it != names_.end()) return static_cast<std::size_t>(it - names_.begin());
    names_.push_back(name);
    return names_.size() - 1;
  }
  void lane(std::uint32_t rank, const std::string& name, bool io) {
    lanes_ += fmt::format(R"({}{{"rank":{},"name":{},"io":{}}})", lane_count_ ? "," : "", rank, json_quoted(name),
                          io ? "true" : "false");
    ++lane_count_;
  }
  static void append(std::string& list, const std::string& item) { list += (list.empty() ? "" : ",") + item; }

  void add_rank(const rank_trace& rt, std::uint64_t offset_ns) {
    auto ms = [offset_ns](std::uint64_t ns) { return static_cast<double>(ns + offset_ns) / 1e6; };
    const auto& t = rt.trace;
    std::uint32_t actors = static_cast<std::uint32_t>(t.actors.size());
    for (const auto& r : t.records) actors = std::max(actors, std::max(r.actor, r.peer) + 1);
    std::vector<bool> used(actors), io(actors), gpu(actors);
    for (const auto& r : t.records) {
      const bool span = r.kind == static_cast<std::uint8_t>(trace_kind::span);
      const bool io_span = span && is_io_span(t.names[r.name]), gpu_span = span && is_device_span(t.names[r.name]);
      (io_span ? io : gpu_span ? gpu : used)[r.actor] = true;
      if (!span) used[r.peer] = true;
    }
    // Beside an actor's lane: its NVMe transfers' lane and its GPU's (a device row).
    std::vector<std::size_t> lane_of(actors), io_lane_of(actors), gpu_lane_of(actors);
    for (std::uint32_t a = 0; a < actors; ++a) {
      if (!used[a] && !io[a] && !gpu[a]) continue; // an actor with beside spans alone still gets its lane
      lane_of[a] = lane_count_;
      lane(rt.rank, trace_actor_name(t, a), false);
      if (io[a]) {
        io_lane_of[a] = lane_count_;
        lane(rt.rank, trace_actor_name(t, a) + " nvme", true);
      }
      if (gpu[a]) {
        gpu_lane_of[a] = lane_count_;
        lane(rt.rank, trace_actor_name(t, a) + " gpu", false);
      }
    }
    const trace_index index(t);
    for (std::size_t i = 0; i < t.records.size(); ++i) {
      const auto& r = t.records[i];
      end_ms_ = std::max(end_ms_, ms(std::max(r.t0_ns, r.t1_ns)));
      const auto name = name_id(t.names[r.name]);
      if (r.kind == static_cast<std::uint8_t>(trace_kind::span)) {
        const std::size_t in_lane = is_io_span(t.names[r.name])       ? io_lane_of[r.actor]
                                    : is_device_span(t.names[r.name]) ? gpu_lane_of[r.actor]
                                                                      : lane_of[r.actor];
        append(spans_, fmt::format("[{},{:.4f},{:.4f},{},{},{}]", in_lane,
                                   ms(r.t0_ns), ms(r.t1_ns), name, r.step, r.micro_batch));
        continue;
      }
      if (r.kind != static_cast<std::uint8_t>(trace_kind::recv)) continue;
      const auto send = index.matching_send(t, i);
      if (send < 0) continue; // the check names it; the picture has no arrow to draw
      const auto& s = t.records[static_cast<std::size_t>(send)];
      append(msgs_, fmt::format("[{},{},{:.4f},{:.4f},{},{},{},{},{},{}]", lane_of[s.actor], lane_of[r.actor],
                                ms(s.t0_ns), ms(r.t0_ns), name, r.edge, r.slot, r.step, r.micro_batch, r.bytes));
    }
  }

  std::vector<std::string> names_;
  std::string lanes_, spans_, msgs_;
  std::size_t lane_count_ = 0;
  double end_ms_ = 0;
};

} // namespace

std::string trace_html_page(const std::vector<rank_trace>& traces, const std::string& title) {
  const auto summary =
      format_trace_summary(summarize_traces(traces), summary_format{true, format_swap_io(summarize_swap_io(traces))});
  const auto check = format_trace_check(check_traces(traces));
  return fmt::format(
      R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dsactor trace: {title}</title>
<style>{style}</style></head>
<body>
<h1>dsactor trace: {title}</h1>
<div id="controls"><button id="fit">fit</button> <label><input type="checkbox" id="messages" checked> messages</label>
<span class="hint">mouse wheel: zoom &middot; drag: pan &middot; double-click: fit</span>
<span id="render-status" data-status="pending">rendering&hellip;</span></div>
<pre id="render-errors"></pre>
<div id="timeline-box"><canvas id="timeline"></canvas><div id="tip"></div></div>
<h2>Summary</h2>
<pre class="table">{summary}</pre>
<h2>Check</h2>
<pre class="table">{check}</pre>
<script>
window.onerror = function (message, source, line, column) {{
  var errors = document.getElementById('render-errors');
  errors.textContent += message + ' (line ' + line + ':' + column + ')\n';
  var status = document.getElementById('render-status');
  status.setAttribute('data-status', 'error');
  status.textContent = 'script error';
}};
</script>
<script type="application/json" id="trace-data">{data}</script>
<script>{script}</script>
</body></html>
)",
      fmt::arg("title", html_escaped(title)), fmt::arg("style", trace_html_style),
      fmt::arg("summary", html_escaped(summary)), fmt::arg("check", html_escaped(check)),
      fmt::arg("data", timeline_json(traces).text()), fmt::arg("script", trace_html_script));
}

status write_trace_html(const std::string& path, const std::vector<rank_trace>& traces, const std::string& title) {
  return ckpt::write_file_atomic(path, trace_html_page(traces, title));
}

} // namespace dsa::actors
