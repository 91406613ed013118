// dsactor trace's analyses: the wait split of the summary, per-step compute vs
// communication vs I/O, critical-path, actor and diff. Hand-built traces whose
// answers are known by construction, and the trace of a real 2-stage run.
#include "actors/trace/analysis/chrome_export.hpp"
#include "actors/trace/analysis/trace_critical_path.hpp"
#include "actors/trace/analysis/trace_html.hpp"
#include "actors/trace/analysis/trace_pipeline.hpp"
#include "actors/trace/analysis/trace_summary.hpp"
#include "actors/trace/analysis/trace_views.hpp"
#include "actors/trace/analysis/trace_waits.hpp"
#include "synthetic_run.hpp"

#include <doctest/doctest.h>

#include <map>

using namespace dsa::actors;

namespace {

constexpr std::uint64_t us = 1000; // hand-built traces count in microseconds

struct trace_builder {
  trace_data t;
  std::map<std::pair<int, std::uint32_t>, std::uint64_t> seq; // (name, edge) -> next sequence number

  trace_builder() {
    t.names = trace_name_table();
    t.actors = {"feeder", "stage 0", "stage 1", "reducer 0"};
  }
  void span(std::uint32_t actor, trace_name name, std::uint64_t t0, std::uint64_t t1, std::uint32_t step,
            std::uint32_t mb) {
    trace_record r;
    r.kind = static_cast<std::uint8_t>(trace_kind::span);
    r.name = static_cast<std::uint16_t>(name);
    r.actor = actor;
    r.stage = actor == 1 ? 0 : actor == 2 ? 1 : -1;
    r.t0_ns = t0 * us;
    r.t1_ns = t1 * us;
    r.step = step;
    r.micro_batch = mb;
    t.records.push_back(r);
  }
  // A message from `from` (sent at `sent`) to `to` (received at `got`).
  void message(trace_name name, std::uint32_t from, std::uint32_t to, std::uint32_t edge, std::uint32_t slot,
               std::uint64_t sent, std::uint64_t got, std::uint32_t step, std::uint32_t mb) {
    trace_record r;
    r.name = static_cast<std::uint16_t>(name);
    r.edge = edge;
    r.slot = slot;
    r.step = step;
    r.micro_batch = mb;
    r.flow = flow_id(name, edge, seq[{static_cast<int>(name), edge}]++);
    r.kind = static_cast<std::uint8_t>(trace_kind::send);
    r.actor = from;
    r.peer = to;
    r.t0_ns = sent * us;
    t.records.push_back(r);
    r.kind = static_cast<std::uint8_t>(trace_kind::recv);
    r.actor = to;
    r.peer = from;
    r.t0_ns = got * us;
    t.records.push_back(r);
  }
  trace_data done() {
    sort_trace_records(t.records);
    return t;
  }
};

// Two stages, one slot on the activation edge (edge 1): stage 0's second
// forward has its input early but must wait for stage 1 to release the slot.
//   stage 0: forward mb0 [20, 100], forward mb1 [220, 300]  (credit from 210)
//   stage 1: forward mb0 [115, 200], forward mb1 [320, 400]
trace_data credit_bound_trace() {
  trace_builder b;
  b.message(trace_name::produced, 0, 1, 0, 0, 0, 10, 0, 0);
  b.message(trace_name::produced, 0, 1, 0, 1, 5, 30, 0, 1);
  b.span(1, trace_name::forward, 20, 100, 0, 0);
  b.message(trace_name::produced, 1, 2, 1, 0, 100, 110, 0, 0);
  b.span(2, trace_name::forward, 115, 200, 0, 0);
  b.message(trace_name::released, 2, 1, 1, 0, 200, 210, 0, 0);
  b.span(1, trace_name::forward, 220, 300, 0, 1);
  b.message(trace_name::produced, 1, 2, 1, 0, 300, 310, 0, 1);
  b.span(2, trace_name::forward, 320, 400, 0, 1);
  return b.done();
}

std::vector<rank_trace> as_run(trace_data t) {
  std::vector<rank_trace> run(1);
  run[0].path = "synthetic";
  run[0].trace = std::move(t);
  return run;
}

const actor_usage& usage_of(const trace_summary& s, const std::string& name) {
  for (const auto& a : s.actors)
    if (a.name == name) return a;
  FAIL("no actor " << name);
  return s.actors.front();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

} // namespace

TEST_CASE("trace waits: input, credit and idle time of a credit-bound pipeline") {
  const auto s = summarize_traces(as_run(credit_bound_trace()));
  const auto& s0 = usage_of(s, "stage 0");
  // Busy 160; input 0..10; idle 10..20; credit 100..210 (its input came at 30);
  // idle 210..220 and after its last span, 300..400.
  CHECK(s0.busy_s == doctest::Approx(160e-6));
  CHECK(s0.input_wait_s == doctest::Approx(10e-6));
  CHECK(s0.credit_wait_s == doctest::Approx(110e-6));
  CHECK(s0.idle_s == doctest::Approx(120e-6));
  const auto& s1 = usage_of(s, "stage 1");
  // Input 0..110 and 200..310, idle 110..115 and 310..320.
  CHECK(s1.busy_s == doctest::Approx(165e-6));
  CHECK(s1.input_wait_s == doctest::Approx(220e-6));
  CHECK(s1.credit_wait_s == doctest::Approx(0.0));
  CHECK(s1.idle_s == doctest::Approx(15e-6));
  REQUIRE(s.steps.size() == 1);
  CHECK(s.steps[0].critical_path == "stage 1 43%, stage 0 42%"); // 165 and 160 of 380 us
  const auto& feeder = usage_of(s, "feeder");
  CHECK(feeder.idle_s == doctest::Approx(400e-6));
  CHECK(contains(format_trace_summary(s), "credit s"));
}

TEST_CASE("trace critical path: follows the input and credit edges of a credit-bound pipeline") {
  const auto t = credit_bound_trace();
  auto path = find_critical_path(t, 0, 0);
  REQUIRE(path.has_value());
  INFO(format_critical_path(t, *path));
  CHECK(path->start_ns == 20 * us);
  CHECK(path->end_ns == 400 * us);
  REQUIRE(path->links.size() == 4);
  const std::uint64_t starts[] = {20, 115, 220, 320};
  const span_bound bounds[] = {span_bound::input, span_bound::input, span_bound::credit, span_bound::input};
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(t.records[path->links[i].span].t0_ns == starts[i] * us);
    CHECK(path->links[i].bound == bounds[i]);
  }
  // The credit edge: stage 1 released the slot at 200, stage 0 got it at 210 and started at 220.
  const auto& credit = path->links[2];
  CHECK(t.records[credit.message].t0_ns == 210 * us);
  CHECK(t.records[credit.sent].t0_ns == 200 * us);
  CHECK(credit.wait_ns == 10 * us);
  REQUIRE(path->shares.size() == 2);
  CHECK(path->shares[0].actor == "stage 1");
  CHECK(path->shares[0].busy_s == doctest::Approx(165e-6));
  CHECK(path->shares[1].busy_s == doctest::Approx(160e-6));
  CHECK(path->gaps_s == doctest::Approx(55e-6));
  const auto text = format_critical_path(t, *path);
  CHECK(contains(text, "credit: released edge 1 slot 0 from stage 1, in flight 0.010 ms"));
  CHECK(!find_critical_path(t, 0, 7).has_value());
}

TEST_CASE("trace summary: per step compute, communication and I/O with their overlaps, and the allreduce's bus "
          "bandwidth") {
  trace_builder b;
  b.t.names.push_back("swap_read"); // an I/O span name, as the NVMe swap records
  const auto swap = static_cast<trace_name>(b.t.names.size() - 1);
  b.span(1, trace_name::forward, 0, 100, 0, 0);
  b.span(3, trace_name::allreduce, 50, 150, 0, 0);
  b.t.records.back().bytes = 1'000'000; // a bucket of 1 MB summed over 4 ranks in 100 us
  b.t.info = {{"ranks", "4"}};
  b.span(3, swap, 120, 200, 0, 0);
  // A shard's update of one swapped chunk: compute inside its update, not I/O.
  b.span(3, trace_name::swap_update, 160, 190, 0, 0);
  const auto s = summarize_traces(as_run(b.done()));
  REQUIRE(s.steps.size() == 1);
  const auto& st = s.steps[0];
  // The I/O span runs beside the step (a prefetch before it, writes behind it): it counts
  // in the io columns, not in the step's window.
  CHECK(st.time_s == doctest::Approx(150e-6));
  CHECK(st.compute_s == doctest::Approx(100e-6));
  CHECK(st.comm_s == doctest::Approx(100e-6));
  CHECK(st.io_s == doctest::Approx(80e-6));
  CHECK(st.compute_comm_s == doctest::Approx(50e-6));
  CHECK(st.comm_io_s == doctest::Approx(30e-6));
  CHECK(st.compute_io_s == doctest::Approx(0.0));
  // 1e6 bytes in 100 us is 10 GB/s of algorithm bandwidth; a ring moves 2(n-1)/n of it per rank.
  CHECK(st.allreduce_bytes == 1'000'000);
  CHECK(st.bus_gbps == doctest::Approx(15.0));
  CHECK(contains(format_trace_summary(s), "bus 15.000 GB/s (median)"));
  CHECK(contains(format_trace_summary(s, summary_format{true, {}}), "bus GB/s"));
}

// A CUDA stage's device spans (gpu_forward, gpu_backward) run beside its worker: the summary
// sums them per stage as the GPU's busy time and keeps them out of the stage's busy time,
// waits and the step's window; the html page and the Chrome export draw them on a device
// row of their own.
TEST_CASE("trace summary, html and export: GPU spans are a device row, summed per stage as GPU busy time") {
  trace_builder b;
  b.span(1, trace_name::forward, 0, 100, 0, 0);
  b.span(1, trace_name::gpu_forward, 10, 90, 0, 0);
  b.span(1, trace_name::backward, 200, 300, 0, 0);
  b.span(1, trace_name::gpu_backward, 210, 250, 0, 0);
  b.span(1, trace_name::gpu_backward, 240, 280, 0, 0); // overlapping: counted once
  const auto run = as_run(b.done());
  const auto s = summarize_traces(run);
  REQUIRE(s.ranks.size() == 1);
  REQUIRE(s.ranks[0].gpu_busy_s.size() == 1);
  CHECK(s.ranks[0].gpu_busy_s[0] == doctest::Approx(150e-6)); // 80 + 70
  for (const auto& a : s.actors)
    if (a.name == "stage 0") {
      CHECK(a.spans == 2); // the worker's forward and backward only
      CHECK(a.busy_s == doctest::Approx(200e-6));
    }
  REQUIRE(s.steps.size() == 1);
  CHECK(s.steps[0].time_s == doctest::Approx(300e-6));
  CHECK(s.steps[0].compute_s == doctest::Approx(200e-6));
  const std::string text = format_trace_summary(s);
  CHECK(contains(text, "GPU busy (its kernels' time, from CUDA events) of rank 0: stage 0 0.000 s (50.0% of the trace)"));
  const std::string page = trace_html_page(run, "gpu");
  CHECK(contains(page, "\"name\":\"stage 0 gpu\""));
  const std::string chrome = chrome_trace_json(run);
  CHECK(contains(chrome, "\"cat\":\"gpu\""));
  CHECK(contains(chrome, "stage 0 gpu"));
  // A trace without device spans has no GPU line.
  CHECK_FALSE(contains(format_trace_summary(summarize_traces(as_run(credit_bound_trace()))), "GPU busy"));
}

TEST_CASE("trace actor view: an actor's spans with their waits; an unknown name lists the actors") {
  const auto t = credit_bound_trace();
  auto id = find_trace_actor(t, "stage 0");
  REQUIRE(id.has_value());
  CHECK(*id == 1);
  const auto view = format_actor_view(t, *id, std::nullopt);
  INFO(view);
  CHECK(contains(view, "waited: input 0.000, credit 0.110, idle 0.010; bound by credit"));
  CHECK(contains(view, "recv  released"));
  auto none = find_trace_actor(t, "stage 9");
  REQUIRE(!none.has_value());
  CHECK(contains(none.err().message, "no actor 'stage 9'"));
  CHECK(contains(none.err().message, "feeder, stage 0, stage 1"));
  CHECK(!find_trace_actor(t, "stage").has_value()); // two match: ambiguous
  CHECK(*find_trace_actor(t, "reducer") == 3);
}

TEST_CASE("trace diff: the first span whose order differs, and the step time change") {
  const auto a = as_run(credit_bound_trace());
  const auto same = diff_runs(a, a);
  CHECK(same.actors.empty());
  CHECK(contains(format_run_difference(same), "the same order of spans"));

  auto b = as_run(credit_bound_trace());
  // In B stage 1 runs micro-batch 1 first, and its last span ends 40 us later.
  for (auto& r : b[0].trace.records)
    if (r.kind == static_cast<std::uint8_t>(trace_kind::span) && r.actor == 2) {
      r.micro_batch = 1 - r.micro_batch;
      if (r.t0_ns == 320 * us) r.t1_ns = 440 * us;
    }
  const auto d = diff_runs(a, b);
  INFO(format_run_difference(d));
  REQUIRE(d.actors.size() == 1);
  CHECK(d.actors[0].actor == "stage 1");
  CHECK(d.actors[0].index == 0);
  CHECK(contains(d.actors[0].a, "forward s0 mb0"));
  CHECK(contains(d.actors[0].b, "forward s0 mb1"));
  REQUIRE(d.steps.size() == 1);
  CHECK(d.steps[0].a_s == doctest::Approx(380e-6));
  CHECK(d.steps[0].b_s == doctest::Approx(420e-6));
  CHECK(contains(format_run_difference(d), "+10.5%"));
}

TEST_CASE("trace analyses on a real 2-stage run: waits add up, the critical path is a chain") {
  auto traces = dsa::test::two_stage_run_traces("analysis");
  REQUIRE(traces.has_value());
  const auto& run = *traces;
  const auto& t = run[0].trace;
  const auto s = summarize_traces(run);
  const double window = s.ranks[0].window_s;
  for (const auto& a : s.actors) {
    INFO(a.name);
    // Busy and comm spans never overlap on one actor here (no allreduce without data parallelism).
    CHECK(a.busy_s + a.comm_s + a.input_wait_s + a.credit_wait_s + a.idle_s == doctest::Approx(window).epsilon(1e-6));
  }
  CHECK(usage_of(s, "stage 1").input_wait_s > 0);
  for (std::uint32_t step = 0; step < 3; ++step) {
    auto path = find_critical_path(t, 0, step);
    REQUIRE(path.has_value());
    INFO(format_critical_path(t, *path));
    REQUIRE(!path->links.empty());
    CHECK(t.records[path->links.back().span].t1_ns == path->end_ns);
    double on_path = path->gaps_s;
    for (const auto& sh : path->shares) on_path += sh.busy_s;
    CHECK(on_path == doctest::Approx(static_cast<double>(path->end_ns - path->start_ns) * 1e-9));
    for (std::size_t i = 0; i + 1 < path->links.size(); ++i) {
      const auto& next = path->links[i + 1];
      const auto& cur = t.records[path->links[i].span];
      CHECK(cur.t0_ns < t.records[next.span].t0_ns);
      // A message edge leads from the sender's span on the path to the receiver.
      if (next.bound == span_bound::input || next.bound == span_bound::credit) {
        REQUIRE(next.sent >= 0);
        CHECK(t.records[next.sent].actor == cur.actor);
        CHECK(t.records[next.message].actor == t.records[next.span].actor);
      } else {
        CHECK(next.bound == span_bound::previous);
        CHECK(cur.actor == t.records[next.span].actor);
      }
    }
  }
  CHECK(diff_runs(run, run).actors.empty());
}

// Two processes' traces (stage 0 in one, stage 1 in the other) of one host, joined on the
// steady clock they share: step windows over both, each stage's idle share, the spans'
// means and the micro-batches held.
TEST_CASE("pipeline_bubble joins the stages of several processes on their common clock") {
  auto with_clock = [](trace_builder& b, std::uint64_t origin) {
    b.t.info = {{"boot_id", "b1"}, {"origin_steady_ns", std::to_string(origin)}, {"origin_unix_ns", "1"}};
  };
  trace_builder p0, p1;
  with_clock(p0, 1'000'000);
  with_clock(p1, 1'000'000 + 5 * us); // process 1's recorder started 5 us later
  // Step 0, 2 micro-batches; stage 0: F F . . B B, stage 1 (times on its own origin, 5 us on).
  p0.span(1, trace_name::forward, 0, 10, 0, 0);
  p0.span(1, trace_name::forward, 10, 20, 0, 1);
  p0.span(1, trace_name::backward, 40, 50, 0, 0);
  p0.span(1, trace_name::backward, 60, 70, 0, 1);
  p1.span(2, trace_name::forward, 5, 15, 0, 0);  // 10..20 on the common clock
  p1.span(2, trace_name::backward, 15, 30, 0, 0); // 20..35
  p1.span(2, trace_name::forward, 30, 40, 0, 1);  // 35..45
  p1.span(2, trace_name::weight, 40, 45, 0, 0);   // 45..50: zero-bubble's W
  p1.span(2, trace_name::backward, 45, 55, 0, 1); // 50..60
  p1.span(2, trace_name::weight, 55, 60, 0, 1);   // 60..65
  std::vector<rank_trace> traces{{0, "p0", p0.t}, {1, "p1", p1.t}};
  auto f = pipeline_bubble(traces, 0);
  REQUIRE(f.has_value());
  CHECK(f->steps == 1);
  CHECK(f->window_s == doctest::Approx(70e-6)); // 0..70
  REQUIRE(f->stages.size() == 2);
  CHECK(f->stages[0].idle_fraction == doctest::Approx(1.0 - 40.0 / 70));
  CHECK(f->stages[1].idle_fraction == doctest::Approx(1.0 - 55.0 / 70));
  CHECK(f->stages[1].rank == 1);
  CHECK(f->stages[1].weight_ms == doctest::Approx(5e-3));
  CHECK(f->stages[1].backward_ms == doctest::Approx(12.5e-3));
  CHECK(f->stages[0].peak_held == 2);  // both forwards before the first backward
  CHECK(f->stages[1].peak_held == 2);  // forward 1 ends (45) before W of micro-batch 0 does (50)
  CHECK(f->bubble == doctest::Approx((30.0 / 70 + 15.0 / 70) / 2));
  CHECK_FALSE(pipeline_bubble(traces, 1).has_value()); // nothing after the first step
  // Theory: 1F1B's (S-1)/(M+S-1); ZB-H1's with equal costs, (S-1)/(3M+S-1); ZB-H2's its
  // floor there, (S-1) F, and (S-1)(F+B-2W) when that is larger.
  CHECK(one_f_one_b_bubble(2, 4) == doctest::Approx(0.2));
  CHECK(zb_bubble(zb_memory::h1, 2, 4, 1, 1, 1) == doctest::Approx(1.0 / 13));
  CHECK(zb_bubble(zb_memory::h2, 2, 4, 1, 1, 1) == doctest::Approx(1.0 / 13));
  CHECK(zb_bubble(zb_memory::h2, 4, 4, 2, 3, 1) == doctest::Approx(9.0 / 33));
  CHECK(zb_bubble(zb_memory::h1, 4, 4, 2, 3, 1) == doctest::Approx(12.0 / 36));
}

// Steps may overlap (a stage starts step k + 1 while another finishes k): the windows count
// once where they overlap.
TEST_CASE("pipeline_bubble counts overlapping step windows once") {
  trace_builder b;
  b.span(1, trace_name::forward, 0, 20, 0, 0);   // step 0: stage 0 0..20
  b.span(2, trace_name::forward, 20, 50, 0, 0);  // stage 1 20..50
  b.span(1, trace_name::forward, 40, 60, 1, 0);  // step 1 starts on stage 0 at 40
  b.span(2, trace_name::forward, 60, 100, 1, 0); // and ends at 100
  auto f = pipeline_bubble({{0, "t", b.t}}, 0);
  REQUIRE(f.has_value());
  CHECK(f->window_s == doctest::Approx(100e-6)); // 0..50 and 40..100: 100, not 110
  CHECK(f->stages[0].idle_fraction == doctest::Approx(1.0 - 40.0 / 100));
}
