// dsactor trace check: the traces of real synthetic runs pass; faults injected
// into a recorded trace (an over-committed slot, a lost release, a sequence gap,
// a starved stage) are named as the first violation. The data-parallel case (collective order
// across ranks) is in test_data_parallel.cpp, beside its group runner.
#include "actors/trace/analysis/trace_check.hpp"
#include "actors/trace/trace_file.hpp"
#include "synthetic_run.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>

using namespace dsa::actors;

namespace {

// The trace of a 2-stage synthetic run, read back from its run directory.
std::vector<rank_trace> two_stage_traces(const char* name) {
  auto traces = dsa::test::two_stage_run_traces(name);
  REQUIRE(traces.has_value());
  REQUIRE(traces->size() == 1);
  return std::move(*traces);
}

bool is(const trace_data& t, const trace_record& r, trace_kind kind, const char* name) {
  return r.kind == static_cast<std::uint8_t>(kind) && t.names[r.name] == name;
}

// Index of the n-th record (0-based) that is `kind` `name` on the edge called `edge`.
std::size_t nth(const trace_data& t, trace_kind kind, const char* name, const std::string& edge, int n) {
  std::string key;
  for (const auto& [k, v] : t.info)
    if (v.size() > edge.size() && v.compare(v.size() - edge.size(), edge.size(), edge) == 0 &&
        v[v.size() - edge.size() - 1] == ' ')
      key = k;
  REQUIRE_MESSAGE(!key.empty(), "the trace's info frame lists no edge '" << edge << "'");
  const auto id = static_cast<std::uint32_t>(std::stoul(key.substr(5)));
  for (std::size_t i = 0; i < t.records.size(); ++i)
    if (is(t, t.records[i], kind, name) && t.records[i].edge == id && n-- == 0) return i;
  FAIL("no such record");
  return 0;
}

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

} // namespace

TEST_CASE("trace check: the trace of a 2-stage run passes every check") {
  auto traces = two_stage_traces("check-pass");
  const auto result = check_traces(traces);
  INFO(format_trace_check(result));
  CHECK(!result.first);
  CHECK(result.outstanding.empty());
  REQUIRE(result.checked.size() == 5);
  CHECK(contains(result.checked[3], "starvation (rank 0): 48 forward/backward spans of 2 stages"));
  CHECK(contains(result.checked[0], "within the plan's slot counts"));
  CHECK(contains(format_trace_check(result), "OK: no violation"));
}

TEST_CASE("trace check: a duplicated produced over-commits its slot") {
  auto traces = two_stage_traces("check-dup");
  auto& t = traces[0].trace;
  const auto i = nth(t, trace_kind::send, "produced", "activation 0", 5);
  const auto dup = t.records[i];
  t.records.push_back(dup);
  sort_trace_records(t.records);
  const auto result = check_traces(traces);
  INFO(format_trace_check(result));
  REQUIRE(result.first);
  CHECK(result.first->check == "slots");
  CHECK(result.first->time_s == doctest::Approx(static_cast<double>(dup.t0_ns) * 1e-9));
  CHECK(contains(result.first->what, "slot over-committed"));
  CHECK(contains(result.first->what, "activation 0"));
  CHECK(contains(result.first->what, "stage 0"));
  CHECK(contains(format_trace_check(result), "FAILED"));
}

TEST_CASE("trace check: a deleted released receipt is a lost release, at the time it was sent") {
  auto traces = two_stage_traces("check-lost");
  auto& t = traces[0].trace;
  const auto i = nth(t, trace_kind::recv, "released", "activation 0", 3);
  const auto lost = t.records[i];
  t.records.erase(t.records.begin() + static_cast<std::ptrdiff_t>(i));
  const auto result = check_traces(traces);
  INFO(format_trace_check(result));
  REQUIRE(result.first);
  CHECK(result.first->check == "delivery");
  CHECK(contains(result.first->what, "a lost release"));
  CHECK(contains(result.first->what, "activation 0"));
  CHECK(result.first->time_s < static_cast<double>(lost.t0_ns) * 1e-9); // the send, before the lost receipt
}

TEST_CASE("trace check: a skipped sequence number is a gap, at the message that skips") {
  auto traces = two_stage_traces("check-seq");
  auto& t = traces[0].trace;
  // Renumber every produced on the gradient edge from number 2 on (sent and received
  // alike, so each still meets its match), as if the sender had skipped number 2.
  const auto first = nth(t, trace_kind::send, "produced", "gradient 0", 2);
  const auto edge = t.records[first].edge;
  for (auto& r : t.records)
    if (t.names[r.name] == "produced" && r.edge == edge && (r.flow & 0xffffu) >= 2) ++r.flow;
  const auto result = check_traces(traces);
  INFO(format_trace_check(result));
  REQUIRE(result.first);
  CHECK(result.first->check == "sequence");
  CHECK(result.first->time_s == doctest::Approx(static_cast<double>(t.records[first].t0_ns) * 1e-9));
  CHECK(contains(result.first->what, "stage 1 sent produced to stage 0"));
  CHECK(contains(result.first->what, "expected 2 (1 missing)"));
}

TEST_CASE("trace check: without slot counts in the trace, alternation alone is checked and said so") {
  auto traces = two_stage_traces("check-noslots");
  auto& info = traces[0].trace.info;
  info.erase(std::remove_if(info.begin(), info.end(), [](const auto& kv) { return kv.first.rfind("edge", 0) == 0; }),
             info.end());
  const auto result = check_traces(traces);
  CHECK(!result.first);
  REQUIRE(!result.checked.empty());
  CHECK(contains(result.checked[0], "alternation only"));
}

TEST_CASE("trace check: a torn trace reports what is in flight at the cut, not a violation") {
  auto traces = two_stage_traces("check-torn");
  auto& t = traces[0].trace;
  // Cut in the middle of step 1, as a killed run would, after a produced sent on "activation 0".
  const auto cut = nth(t, trace_kind::send, "produced", "activation 0", 5);
  t.records.resize(cut + 1);
  t.end.closed = false;
  t.end.why = "cut by the test";
  // The cut above is consistent (the whole sorted trace up to a record): no margin for the writer's drains.
  for (auto& [key, value] : t.info)
    if (key == "trace_interval_ms") value = "0";
  const auto result = check_traces(traces);
  INFO(format_trace_check(result));
  CHECK(!result.first);
  CHECK(!result.outstanding.empty());
  CHECK(contains(format_trace_check(result), "torn trace"));
  CHECK(contains(result.checked[0], "checked up to"));
  // With the writer's real interval the checked part ends 2 s before the cut: this short run's whole trace.
  for (auto& [key, value] : t.info)
    if (key == "trace_interval_ms") value = "1000";
  const auto margin = check_traces(traces);
  CHECK(!margin.first);
  CHECK(margin.outstanding.empty());
  CHECK(contains(margin.checked[0], "(0 of"));
  // The same cut in a trace that says it is complete is a slot never released.
  t.end.closed = true;
  const auto complete = check_traces(traces);
  REQUIRE(complete.first);
  CHECK(contains(complete.first->what, "never"));
}

namespace {

std::uint32_t actor_id(const trace_data& t, const char* name) {
  const auto it = std::find(t.actors.begin(), t.actors.end(), name);
  REQUIRE_MESSAGE(it != t.actors.end(), "no actor " << name);
  return static_cast<std::uint32_t>(it - t.actors.begin());
}

bool is_kind(const trace_record& r, trace_kind k) { return r.kind == static_cast<std::uint8_t>(k); }

// Whether stage 1, at time `at`, cannot have been holding runnable work: its next span
// (if any) was bound by something at or after `at` — its previous span ended then or
// later, or the produced it works on came then or later.
bool stage1_waits_past(const trace_data& t, std::uint64_t at) {
  const auto s1 = actor_id(t, "stage 1");
  std::uint64_t previous_end = 0;
  for (const auto& r : t.records) {
    if (r.actor != s1 || !is_kind(r, trace_kind::span)) continue;
    if (r.t0_ns < at) {
      previous_end = std::max(previous_end, r.t1_ns);
      continue;
    }
    if (previous_end >= at) return true;
    return std::any_of(t.records.begin(), t.records.end(), [&](const trace_record& m) {
      return m.actor == s1 && is(t, m, trace_kind::recv, "produced") && m.step == r.step &&
             m.micro_batch == r.micro_batch && m.t0_ns >= at && m.t0_ns < r.t0_ns;
    });
  }
  return true; // no span of stage 1 after `at`
}

// The injected fault: stage 0 holds its runnable forward `f` for `pause` — the rank's
// every record at or after f's start moves `pause` later (a span running across it
// ends later), so each message still follows its cause and the other checks pass.
void hold(trace_data& t, const trace_record& f, std::uint64_t pause) {
  for (auto& r : t.records) {
    if (r.t0_ns >= f.t0_ns) r.t0_ns += pause;
    if (r.t1_ns >= f.t0_ns) r.t1_ns += pause;
  }
  sort_trace_records(t.records);
}

} // namespace

TEST_CASE("trace check: a stage that holds a runnable forward idle past the tolerance is starved") {
  const auto traces = two_stage_traces("check-starve");
  const auto s0 = actor_id(traces[0].trace, "stage 0");
  std::vector<trace_record> forwards; // stage 0's after step 0 at which stage 1 was not runnable
  for (const auto& r : traces[0].trace.records)
    if (r.actor == s0 && is(traces[0].trace, r, trace_kind::span, "forward") && r.step > 0 &&
        stage1_waits_past(traces[0].trace, r.t0_ns))
      forwards.push_back(r);
  REQUIRE(!forwards.empty());
  const auto f = forwards.front();
  auto starved = traces;
  hold(starved[0].trace, f, 2'000'000'000); // 2 s, ten times the default tolerance
  const auto result = check_traces(starved);
  INFO(format_trace_check(result));
  REQUIRE(result.first);
  CHECK(result.first->check == "starvation");
  CHECK(result.first->time_s < static_cast<double>(f.t0_ns) * 1e-9);
  const auto& what = result.first->what;
  CHECK(contains(what, fmt::format("stage 0 held forward s{} mb{} runnable", f.step, f.micro_batch).c_str()));
  CHECK(contains(what, "over the 200.000 ms tolerance"));
  CHECK(result.checked.size() == 4); // the other checks pass: the fault is starvation alone
  // A tolerance above the pause lets the same trace pass.
  trace_check_options lenient;
  lenient.idle_tolerance_ms = 3000;
  const auto passed = check_traces(starved, lenient);
  INFO(format_trace_check(passed));
  CHECK(!passed.first);
}
