// dsactor trace export --chrome: the trace of a real 2-stage synthetic run as
// Chrome trace-event JSON names every actor, pairs each message's send with
// its receipt by a flow arrow, and counts each edge's slots in use. dsactor
// trace html: the page holds the timeline's data (a lane per actor, every span,
// every delivered message) and the summary, and loads nothing from elsewhere
// (tests/integration/trace_html.sh renders it in Chromium).
#include "actors/trace/analysis/chrome_export.hpp"
#include "actors/trace/analysis/trace_clock.hpp"
#include "actors/trace/analysis/trace_html.hpp"
#include "synthetic_run.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <set>

using namespace dsa::actors;

TEST_CASE("trace export: Chrome JSON of a real run: a track per actor, flows paired, credit counters") {
  auto traces = dsa::test::two_stage_run_traces("export-chrome");
  REQUIRE(traces.has_value());
  REQUIRE(traces->size() == 1);
  const auto& t = (*traces)[0].trace;
  const auto json = nlohmann::json::parse(chrome_trace_json(*traces));
  REQUIRE(json.contains("traceEvents"));

  std::set<std::string> tracks;
  std::map<std::uint64_t, int> starts, finishes; // flow id -> events
  std::set<std::string> counters;
  std::size_t messages = 0;
  bool process_named = false;
  for (const auto& e : json["traceEvents"]) {
    const auto ph = e["ph"].get<std::string>();
    if (ph == "M" && e["name"] == "thread_name") tracks.insert(e["args"]["name"].get<std::string>());
    if (ph == "M" && e["name"] == "process_name") process_named = e["args"]["name"] == "rank 0";
    if (ph == "s") ++starts[e["id"].get<std::uint64_t>()];
    if (ph == "f") ++finishes[e["id"].get<std::uint64_t>()];
    if (ph == "i") ++messages;
    if (ph == "C") {
      counters.insert(e["name"].get<std::string>());
      CHECK(e["args"]["in use"].get<int>() >= 0);
      CHECK(e["args"].contains("free")); // the trace lists the plan's slot counts
    }
  }
  CHECK(process_named);
  for (const auto& actor : t.actors)
    if (!actor.empty()) CHECK_MESSAGE(tracks.count(actor), "no track for " << actor);
  // Every message is an instant event plus one end of a flow; each flow has both ends once.
  std::size_t sends = 0, receipts = 0;
  for (const auto& r : t.records) {
    sends += r.kind == static_cast<std::uint8_t>(trace_kind::send);
    receipts += r.kind == static_cast<std::uint8_t>(trace_kind::recv);
  }
  CHECK(messages == sends + receipts);
  REQUIRE(!starts.empty());
  CHECK(starts.size() == sends);
  for (const auto& [id, n] : starts) {
    CHECK(n == 1);
    CHECK_MESSAGE(finishes.count(id) == 1, "flow " << id << " has no receipt");
  }
  CHECK(finishes.size() == starts.size());
  CHECK(counters.count("credits edge 2 (activation 0)") == 1);
  CHECK(counters.size() >= 2);
}

TEST_CASE("trace export: the counter of an edge returns to zero slots in use at the end of a run") {
  auto traces = dsa::test::two_stage_run_traces("export-counter");
  REQUIRE(traces.has_value());
  const auto json = nlohmann::json::parse(chrome_trace_json(*traces));
  std::map<std::string, int> last;
  std::map<std::string, int> peak;
  for (const auto& e : json["traceEvents"])
    if (e["ph"] == "C") {
      const auto n = e["args"]["in use"].get<int>();
      last[e["name"]] = n;
      peak[e["name"]] = std::max(peak[e["name"]], n);
      CHECK(n + e["args"]["free"].get<int>() >= 1); // in use + free = the edge's slot count
    }
  REQUIRE(!last.empty());
  for (const auto& [name, n] : last) CHECK_MESSAGE(n == 0, name << " ends with " << n << " slots in use");
  CHECK(peak["credits edge 2 (activation 0)"] >= 1);
}

TEST_CASE("trace export: json_quoted escapes quotes, control characters and '<'") {
  CHECK(json_quoted("a\"b\\c") == R"("a\"b\\c")");
  CHECK(json_quoted("x\ny") == R"("x\u000ay")");
  CHECK(json_quoted("</script>") == R"("\u003c/script>")");
}

TEST_CASE("trace html: the page carries every lane, span and message, the summary, and nothing from elsewhere") {
  auto traces = dsa::test::two_stage_run_traces("export-html");
  REQUIRE(traces.has_value());
  const auto& t = (*traces)[0].trace;
  const auto page = trace_html_page(*traces, "run <x>");
  CHECK(page.find("run &lt;x&gt;") != std::string::npos); // the title is escaped
  CHECK(page.find("<script src") == std::string::npos);
  CHECK(page.find("<link") == std::string::npos);
  CHECK(page.find("http") == std::string::npos);
  CHECK(page.find("steps of rank 0") != std::string::npos); // the summary's tables
  CHECK(page.find("OK: no violation") != std::string::npos);  // and the check's verdict
  const std::string open = R"(<script type="application/json" id="trace-data">)";
  const auto from = page.find(open);
  REQUIRE(from != std::string::npos);
  const auto to = page.find("</script>", from);
  const auto data = nlohmann::json::parse(page.substr(from + open.size(), to - from - open.size()));
  std::set<std::string> lanes;
  for (const auto& l : data["lanes"]) lanes.insert(l["name"].get<std::string>());
  std::set<std::string> recorded; // actors with a record of their own: each has a lane
  for (const auto& r : t.records) recorded.insert(t.actors.at(r.actor));
  CHECK(recorded.size() >= 7); // feeder, 2 stages, 2 reducers, 2 optimizer shards
  for (const auto& actor : recorded) CHECK_MESSAGE(lanes.count(actor), "no lane for " << actor);
  std::size_t spans = 0, receipts = 0;
  for (const auto& r : t.records) {
    spans += r.kind == static_cast<std::uint8_t>(trace_kind::span);
    receipts += r.kind == static_cast<std::uint8_t>(trace_kind::recv);
  }
  CHECK(data["spans"].size() == spans);
  CHECK(data["msgs"].size() == receipts); // a complete trace: every receipt has its send
  for (const auto& m : data["msgs"]) {
    CHECK(m[2].get<double>() <= m[3].get<double>()); // sent before received
    CHECK(m[0] != m[1]);                              // between two actors' lanes
  }
}

namespace {
// A one-span trace of `rank` with these clock facts in its info frame.
rank_trace clocked(std::uint32_t rank, const std::string& boot, std::uint64_t steady, std::uint64_t unix_ns) {
  rank_trace rt;
  rt.rank = rank;
  rt.trace.names = {"forward"};
  rt.trace.actors = {"stage 0"};
  trace_record r;
  r.kind = static_cast<std::uint8_t>(trace_kind::span);
  r.t0_ns = 1'000;
  r.t1_ns = 3'000;
  rt.trace.records.push_back(r);
  rt.trace.info = {{"rank", std::to_string(rank)}};
  if (!boot.empty()) rt.trace.info.emplace_back("boot_id", boot);
  if (steady) rt.trace.info.emplace_back("origin_steady_ns", std::to_string(steady));
  if (unix_ns) rt.trace.info.emplace_back("origin_unix_ns", std::to_string(unix_ns));
  return rt;
}
} // namespace

// The processes of one host share the steady clock: their traces align exactly; of
// several hosts, by their system clocks; without the facts, not at all, and it says so.
TEST_CASE("trace clocks: ranks of one boot align on the steady clock, of several hosts on the system clock") {
  const std::vector<rank_trace> one_host{clocked(0, "boot-a", 9'000'000, 50'000'000),
                                         clocked(1, "boot-a", 4'000'000, 70'000'000)};
  auto c = align_trace_clocks(one_host);
  CHECK(c.offset_ns == std::vector<std::uint64_t>{5'000'000, 0});
  CHECK(c.how.find("one host") != std::string::npos);
  const std::vector<rank_trace> two_hosts{clocked(0, "boot-a", 9'000'000, 50'000'000),
                                          clocked(1, "boot-b", 4'000'000, 70'000'000)};
  c = align_trace_clocks(two_hosts);
  CHECK(c.offset_ns == std::vector<std::uint64_t>{0, 20'000'000});
  CHECK(c.how.find("system clocks") != std::string::npos);
  const std::vector<rank_trace> old{clocked(0, "", 0, 0), clocked(1, "", 0, 0)};
  c = align_trace_clocks(old);
  CHECK(c.offset_ns == std::vector<std::uint64_t>{0, 0});
  CHECK(c.how.find("own origin") != std::string::npos);
  // The export places rank 0's span 5 ms after rank 1's, and says how it aligned them.
  const auto json = nlohmann::json::parse(chrome_trace_json(one_host));
  std::map<int, double> ts;
  for (const auto& e : json["traceEvents"])
    if (e["ph"] == "X") ts[e["pid"].get<int>()] = e["ts"].get<double>();
  CHECK(ts.at(0) == doctest::Approx(5001.0));
  CHECK(ts.at(1) == doctest::Approx(1.0));
  CHECK(json["otherData"]["clock"].get<std::string>().find("one host") != std::string::npos);
  // The summary names the alignment and each rank's origin on the common clock.
  const auto summarized = summarize_traces(one_host);
  const std::string summary = format_trace_summary(summarized);
  CHECK(summary.find("one host") != std::string::npos);
  CHECK(summary.find("+0.005000 s (rank 0)") != std::string::npos);
  // Several ranks fit a screen: one row per actor and per rank, one verdict (the slowest
  // rank's); every rank's actors and steps with --steps.
  CHECK(summary.find("actors, the mean over 2 ranks") != std::string::npos);
  CHECK(summary.find("steps per rank") != std::string::npos);
  CHECK(summary.find("the slowest rank is rank ") != std::string::npos);
  std::size_t verdicts = 0;
  for (auto at = summary.find("the step is bound by"); at != std::string::npos;
       at = summary.find("the step is bound by", at + 1))
    ++verdicts;
  CHECK(verdicts == 1);
  CHECK(summary.find("steps of rank 1") == std::string::npos);
  const std::string every = format_trace_summary(summarized, summary_format{true, {}});
  CHECK(every.find("steps of rank 1") != std::string::npos);
  CHECK(every.find(" of rank 1") != std::string::npos);
  // The steps' starts are on the common clock: rank 0's span began 5 ms after rank 1's.
  REQUIRE(summarized.steps.size() == 2);
  for (const auto& st : summarized.steps)
    CHECK(st.start_s == doctest::Approx(st.rank == 0 ? 5'001e-6 : 1e-6));
  // One rank's trace on the common clock (the critical-path and actor views): spans move
  // whole, messages (no end) only at their time.
  trace_data t = one_host[0].trace;
  trace_record message;
  message.kind = static_cast<std::uint8_t>(trace_kind::send);
  message.t0_ns = 2'000;
  t.records.push_back(message);
  const trace_data moved = shifted_trace(t, 5'000'000);
  CHECK(moved.records[0].t0_ns == 5'001'000);
  CHECK(moved.records[0].t1_ns == 5'003'000);
  CHECK(moved.records[1].t0_ns == 5'002'000);
  CHECK(moved.records[1].t1_ns == 0);
}

// Ranks of several hosts that measured the rendezvous server's clock are placed on it
// (origin + offset), whatever their system clocks say; one without the estimate, or with
// another reference, sends the alignment back to the system clocks.
TEST_CASE("trace clocks: ranks of several hosts align on the rendezvous server's clock, stating the error") {
  auto with_reference = [](rank_trace rt, const std::string& reference, const std::string& offset,
                           const std::string& error) {
    rt.trace.info.emplace_back("clock_reference", reference);
    rt.trace.info.emplace_back("clock_reference_offset_ns", offset);
    rt.trace.info.emplace_back("clock_reference_error_ns", error);
    return rt;
  };
  const std::string server = "rendezvous server at 10.0.0.1:29500";
  // Rank 0's origin is at 9 ms on its clock = 9 ms + 1 ms on the server's; rank 1's at
  // 4 ms + 8 ms = 12 ms: rank 1 started 2 ms later (its system clock says 20 ms).
  const std::vector<rank_trace> hosts{
      with_reference(clocked(0, "boot-a", 9'000'000, 50'000'000), server, "1000000", "40000"),
      with_reference(clocked(1, "boot-b", 4'000'000, 70'000'000), server, "8000000", "25000")};
  auto c = align_trace_clocks(hosts);
  CHECK(c.offset_ns == std::vector<std::uint64_t>{0, 2'000'000});
  CHECK(c.how.find("2 ranks on 2 hosts") != std::string::npos);
  CHECK(c.how.find(server) != std::string::npos);
  CHECK(c.how.find("+/-40.0 us") != std::string::npos);
  // A negative offset: the server's clock behind the rank's.
  const std::vector<rank_trace> behind{
      with_reference(clocked(0, "boot-a", 9'000'000, 50'000'000), server, "-5000000", "1000"),
      with_reference(clocked(1, "boot-b", 4'000'000, 70'000'000), server, "0", "1000")};
  CHECK(align_trace_clocks(behind).offset_ns == std::vector<std::uint64_t>{0, 0});
  // Another reference on one rank, or a malformed offset: the system clocks.
  for (const auto& odd : {with_reference(clocked(1, "boot-b", 4'000'000, 70'000'000), "rendezvous server at x:1", "0", "1"),
                          with_reference(clocked(1, "boot-b", 4'000'000, 70'000'000), server, "12x", "1")}) {
    const std::vector<rank_trace> mixed{hosts[0], odd};
    c = align_trace_clocks(mixed);
    CHECK(c.offset_ns == std::vector<std::uint64_t>{0, 20'000'000});
    CHECK(c.how.find("system clocks") != std::string::npos);
  }
  // The summary states it.
  CHECK(format_trace_summary(summarize_traces(hosts)).find("offsets estimated at rendezvous") != std::string::npos);
}
