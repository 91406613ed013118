// The flight recorder (io/net/flight_recorder.hpp) and `dsactor trace hang`'s analysis
// (actors/trace/analysis/trace_hang.hpp) on records made here: the ring, the encoding, the
// frame in a trace file, and the verdict for a stalled, a skipped and a mismatched call, a
// call every rank is stuck in, a rank without a record, and a pipeline edge in flight.
// tests/integration/trace_hang.sh does the same with real processes.
#include "actors/trace/analysis/trace_hang.hpp"
#include "actors/trace/trace_file.hpp"
#include "actors/trace/trace_writer.hpp"
#include "io/net/flight_recorder.hpp"

#include <doctest/doctest.h>

#include <cstring>

#include <filesystem>
#include <string>

namespace dsa::test {
namespace {

using actors::analyse_hang;
using actors::hang_input;
using net::flight_call;

flight_call call(std::uint64_t seq, net::op_kind kind, flight_call::state outcome, std::int32_t rank,
                 std::vector<std::int32_t> group, std::uint32_t channel = 1) {
  flight_call c;
  c.channel = channel;
  c.seq = seq;
  c.kind = kind;
  c.type = dtype::f32;
  c.count = 100;
  c.bytes = 400;
  c.rank = rank;
  c.group = std::move(group);
  c.start_ns = 1'000'000'000ull * (seq + 1);
  c.end_ns = outcome == flight_call::state::running ? 0 : c.start_ns + 1000;
  c.outcome = outcome;
  return c;
}

// Rank r's record: calls 0 .. done-1 finished, then `running` entered and not finished.
hang_input rank_input(std::int32_t r, std::vector<std::int32_t> group, std::uint64_t done, bool running,
                      net::op_kind kind = net::op_kind::allreduce_ring) {
  hang_input in;
  in.rank = r;
  in.path = "trace.rank" + std::to_string(r) + ".dsat";
  in.records = 1;
  in.record.rank = r;
  in.record.reason = "watchdog";
  in.record.at_ns = 100'000'000'000ull;
  for (std::uint64_t s = 0; s < done; ++s)
    in.record.calls.push_back(call(s, net::op_kind::allreduce_ring, flight_call::state::done, r, group));
  if (running) in.record.calls.push_back(call(done, kind, flight_call::state::running, r, group));
  return in;
}

TEST_CASE("the flight recorder keeps the last calls in a ring and its record survives encoding") {
  auto& fr = net::flight_recorder::instance();
  fr.clear();
  fr.set_rank(3);
  std::uint64_t first = 0;
  for (std::uint64_t i = 0; i < net::flight_recorder::capacity + 5; ++i) {
    auto t = fr.enter(call(i, net::op_kind::allgather, flight_call::state::running, 0, {3, 4}, 2));
    if (i == 0) first = t;
    if (i + 1 < net::flight_recorder::capacity + 5) fr.leave(t, i % 2 == 0);
  }
  fr.leave(first, true); // overwritten long ago: ignored
  fr.edge_sent(7, 4, 2, 1);
  fr.edge_sent(7, 4, 2, 2);
  fr.edge_received(8, 4, 2, 0);
  fr.credit_sent(8, 4);
  fr.credit_received(7, 4);
  fr.credit_received(7, 4);
  const auto r = fr.snapshot("SIGUSR1");
  CHECK(r.rank == 3);
  CHECK(r.reason == "SIGUSR1");
  REQUIRE(r.calls.size() == net::flight_recorder::capacity);
  CHECK(r.calls_dropped == 5);
  CHECK(r.calls.front().seq == 5);
  CHECK(r.calls.front().outcome == flight_call::state::failed); // 5 is odd
  CHECK(r.calls.back().outcome == flight_call::state::running);
  CHECK(r.calls.back().group == std::vector<std::int32_t>{3, 4});
  REQUIRE(r.edges.size() == 2);
  CHECK(r.edges[0].edge == 7);
  CHECK(r.edges[0].sent == 2);
  CHECK(r.edges[0].last_sent_micro == 2);
  CHECK(r.edges[1].received == 1);
  CHECK(r.edges[0].credits_received == 2);
  CHECK(r.edges[1].credits_sent == 1);

  const std::string bytes = net::encode_flight(r);
  auto back = net::decode_flight(bytes);
  REQUIRE(back.has_value());
  CHECK(net::encode_flight(*back) == bytes);
  CHECK(back->calls.back().kind == net::op_kind::allgather);
  // Cut anywhere, or with a byte too many, it is an error naming the place, never a crash.
  for (std::size_t cut : {std::size_t{0}, std::size_t{3}, bytes.size() / 2, bytes.size() - 1}) {
    auto bad = net::decode_flight(std::string_view(bytes).substr(0, cut));
    REQUIRE_FALSE(bad.has_value());
    CHECK(bad.err().message.find("flight record") != std::string::npos);
  }
  // A version-1 record (edges without the credit counts, the last 16 bytes of each) still reads.
  {
    net::flight_record one;
    one.rank = 2;
    net::flight_edge e;
    e.edge = 5, e.peer = 1, e.sent = 9, e.last_sent_step = 3, e.last_received_ns = 77;
    e.credits_sent = 4;
    one.edges.push_back(e);
    std::string v1 = net::encode_flight(one);
    v1.resize(v1.size() - 2 * sizeof(std::uint64_t));
    const std::uint32_t version = 1;
    std::memcpy(v1.data() + sizeof(std::uint32_t), &version, sizeof version);
    auto old = net::decode_flight(v1);
    REQUIRE_MESSAGE(old.has_value(), (old ? "" : old.err().message));
    REQUIRE(old->edges.size() == 1);
    CHECK(old->edges[0].sent == 9);
    CHECK(old->edges[0].last_sent_step == 3);
    CHECK(old->edges[0].last_received_ns == 77);
    CHECK(old->edges[0].credits_sent == 0);
  }
  CHECK_FALSE(net::decode_flight(bytes + "x").has_value());

  // A call still running when the ring wraps stays in the record until it ends (the call a
  // hang is stuck in), and a token of an earlier run marks nothing.
  fr.clear();
  const auto stuck = fr.enter(call(0, net::op_kind::broadcast, flight_call::state::running, 0, {0, 1}, 0));
  for (std::uint64_t i = 0; i < net::flight_recorder::capacity + 3; ++i)
    fr.leave(fr.enter(call(i, net::op_kind::allgather, flight_call::state::running, 0, {0, 1}, 2)), true);
  auto kept = fr.snapshot("wrapped");
  REQUIRE(kept.calls.size() == net::flight_recorder::capacity + 1);
  CHECK(kept.calls.front().kind == net::op_kind::broadcast);
  CHECK(kept.calls.front().outcome == flight_call::state::running);
  CHECK(kept.calls_dropped == 3);
  fr.leave(stuck, true);
  CHECK(fr.snapshot("later").calls.size() == net::flight_recorder::capacity);
  const auto old = fr.enter(call(0, net::op_kind::barrier, flight_call::state::running, 0, {0, 1}, 0));
  fr.clear();
  const auto fresh = fr.enter(call(0, net::op_kind::barrier, flight_call::state::running, 0, {0, 1}, 0));
  fr.leave(old, true);
  auto after = fr.snapshot("new run");
  REQUIRE(after.calls.size() == 1);
  CHECK(after.calls[0].outcome == flight_call::state::running); // the earlier run's leave did not end it
  fr.leave(fresh, true);

  // A failure's capture and a signal's request wait for the trace writer, then are gone.
  fr.capture("watchdog");
  net::request_flight_dump("SIGUSR1");
  auto pending = fr.take_pending();
  REQUIRE(pending.size() == 2);
  CHECK(pending[0].reason == "watchdog");
  CHECK(pending[1].reason == "SIGUSR1");
  CHECK(fr.take_pending().empty());
  fr.clear();
}

TEST_CASE("the trace writer writes flight frames and the reader returns them in order") {
  const auto dir = std::filesystem::temp_directory_path() / "dsactor-test-flight";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "trace.dsat").string();
  auto& fr = net::flight_recorder::instance();
  fr.clear();
  fr.set_rank(1);
  fr.leave(fr.enter(call(0, net::op_kind::barrier, flight_call::state::running, 0, {0, 1})), true);
  {
    actors::trace_recorder recorder;
    auto w = actors::trace_writer::open(recorder, path, {{"rank", "1"}});
    REQUIRE(w.has_value());
    REQUIRE((*w)->append_flight(net::encode_flight(fr.snapshot("first"))).has_value());
    fr.capture("captured"); // written by finish()
    REQUIRE((*w)->finish().has_value());
    CHECK_FALSE((*w)->append_flight("late").has_value()); // after finish: an error, not a write to a closed fd
  }
  auto read = actors::read_trace(path);
  REQUIRE(read.has_value());
  CHECK(read->end.closed);
  REQUIRE(read->flights.size() == 2);
  auto first = net::decode_flight(read->flights[0]);
  auto second = net::decode_flight(read->flights[1]);
  REQUIRE((first.has_value() && second.has_value()));
  CHECK(first->reason == "first");
  CHECK(second->reason == "captured");
  CHECK(first->rank == 1);
  REQUIRE(first->calls.size() == 1);
  CHECK(first->calls[0].outcome == flight_call::state::done);

  std::vector<actors::rank_trace> traces{{1, path, std::move(*read)}};
  auto firsts = actors::hang_inputs(traces);
  REQUIRE(firsts.has_value());
  CHECK(firsts->at(0).record.reason == "first");
  auto lasts = actors::hang_inputs(traces, true);
  REQUIRE(lasts.has_value());
  CHECK(lasts->at(0).record.reason == "captured");
  // Every record's reason, in order, for the report.
  CHECK(lasts->at(0).reasons == std::vector<std::string>{"first", "captured"});
  CHECK(actors::format_hang(actors::analyse_hang(*lasts)).find("its records in the order written: 1. first; 2. captured") !=
        std::string::npos);
  // A file whose record does not decode is listed and left out, not silently dropped.
  auto corrupt = traces[0];
  corrupt.rank = 2;
  corrupt.path = "trace.rank2.dsat";
  corrupt.trace.flights = {"not a flight record"};
  traces.push_back(corrupt);
  auto mixed = actors::hang_inputs(traces);
  REQUIRE(mixed.has_value());
  REQUIRE(mixed->size() == 2);
  const auto text = actors::format_hang(actors::analyse_hang(*mixed));
  CHECK(text.find("rank 2: its flight record does not read (flight record: no flight record header") != std::string::npos);
  traces.pop_back();
  traces[0].trace.flights.clear();
  auto none = actors::hang_inputs(traces);
  REQUIRE_FALSE(none.has_value());
  CHECK(none.err().message.find("SIGUSR1") != std::string::npos); // says how to get one
  fr.clear();
  std::filesystem::remove_all(dir);
}

TEST_CASE("trace hang names the rank that stalled before a call, in 2 and in 3 processes") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    std::vector<std::int32_t> group;
    for (int r = 0; r < n; ++r) group.push_back(r);
    std::vector<hang_input> in;
    for (int r = 0; r < n; ++r) in.push_back(rank_input(r, group, 3, r != 1)); // rank 1 stopped before #3
    const auto report = analyse_hang(in);
    REQUIRE(report.findings.size() == 1);
    const auto& f = report.findings[0];
    CHECK(f.seq == 3);
    CHECK(f.culprits == std::vector<std::int32_t>{1});
    CHECK(f.op == "allreduce (ring)");
    CHECK(report.verdict.find("rank 1 never entered allreduce (ring) #3 on channel 1 (gradient reducer of stage 0") == 0);
    INFO(report.verdict); // #3 began at 4 s, the records were taken at 100 s
    CHECK(report.verdict.find(n == 2 ? "; rank 0 waited up to 96.00 s in it" : "; ranks 0 and 2 waited up to 96.00 s in it") !=
          std::string::npos);
    const std::string text = actors::format_hang(report);
    CHECK(text.find("rank 1 never entered #3: its last call here was allreduce (ring) #2 (400 bytes of f32), finished") !=
          std::string::npos);
  }
}

TEST_CASE("trace hang names the rank that skipped a call and went on, in 2 and in 3 processes") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    std::vector<std::int32_t> group;
    for (int r = 0; r < n; ++r) group.push_back(r);
    std::vector<hang_input> in;
    for (int r = 0; r < n; ++r) in.push_back(rank_input(r, group, 3, true));
    // The last rank skipped #3: it has #4 running instead.
    auto& skipper = in.back().record.calls;
    skipper.back().seq = 4;
    const auto report = analyse_hang(in);
    REQUIRE(report.findings.size() == 1);
    CHECK(report.findings[0].culprits == std::vector<std::int32_t>{n - 1});
    CHECK(report.verdict.find(fmt::format("rank {} never entered allreduce (ring) #3", n - 1)) == 0);
    CHECK(actors::format_hang(report).find("it skipped it and went on to allreduce (ring) #4") != std::string::npos);
  }
}

TEST_CASE("trace hang: different collectives at one call, everyone stuck, a rank without a record, edges") {
  SUBCASE("ranks issued different collectives") {
    std::vector<hang_input> in{rank_input(0, {0, 1}, 2, true, net::op_kind::allgather),
                               rank_input(1, {0, 1}, 2, true, net::op_kind::broadcast)};
    const auto report = analyse_hang(in);
    CHECK(report.verdict ==
          "the ranks issued different collectives as call #2 on channel 1: rank 0 issued allgather of 100 f32, rank 1 "
          "issued broadcast of 100 f32");
  }
  SUBCASE("ranks issued the same collective with different counts") {
    auto a = rank_input(0, {0, 1}, 2, true), b = rank_input(1, {0, 1}, 2, true);
    b.record.calls.back().count = 99;
    const auto report = analyse_hang({a, b});
    CHECK(report.verdict.find("rank 0 issued allreduce (ring) of 100 f32, rank 1 issued allreduce (ring) of 99 f32") !=
          std::string::npos);
  }
  SUBCASE("a rank lost (no record) while the other waits for it") {
    std::vector<hang_input> in{rank_input(0, {0, 1}, 2, true)};
    const auto report = analyse_hang(in);
    REQUIRE(report.findings.size() == 1);
    CHECK(report.findings[0].culprits == std::vector<std::int32_t>{1});
    CHECK(report.verdict.find("rank 1 wrote no flight record (lost, or killed before it could); rank 0 waited up to") ==
          0);
  }
  SUBCASE("a rank missing from one call because it waits in another is a victim, not the cause") {
    // Ranks 0..3: 2 and 3 wait in the hooks' call #5 (channel 0) for 0 and 1; 0 waits in
    // the reducer's #3 (channel 1, ranks 0 and 1) for rank 1, which is in no call.
    std::vector<hang_input> in;
    for (int r = 0; r < 4; ++r) {
      hang_input h = rank_input(r, {0, 1}, 0, false);
      for (std::uint64_t s = 0; s < 5; ++s)
        h.record.calls.push_back(call(s, net::op_kind::allgather, flight_call::state::done, r, {0, 1, 2, 3}, 0));
      if (r >= 2) {
        h.record.calls.push_back(call(5, net::op_kind::allgather, flight_call::state::running, r, {0, 1, 2, 3}, 0));
        h.record.calls.back().start_ns = 1'000'000'000ull; // the longest wait: 99 s
      }
      if (r <= 1)
        for (std::uint64_t s = 0; s < 3; ++s)
          h.record.calls.push_back(call(s, net::op_kind::allreduce_ring, flight_call::state::done, r, {0, 1}, 1));
      if (r == 0) h.record.calls.push_back(call(3, net::op_kind::allreduce_ring, flight_call::state::running, 0, {0, 1}, 1));
      in.push_back(std::move(h));
    }
    const auto report = analyse_hang(in);
    REQUIRE(report.findings.size() == 2);
    CHECK(report.findings[0].channel == 1); // the end of the chain, though its wait is shorter
    CHECK(report.findings[0].culprits == std::vector<std::int32_t>{1});
    CHECK(report.verdict.find("rank 1 never entered allreduce (ring) #3 on channel 1") == 0);
    // The hooks' call names rank 1 too (rank 0 only as a victim, waiting in the reducer's call).
    CHECK(report.findings[1].culprits == std::vector<std::int32_t>{1});
    CHECK(report.findings[1].victims == std::vector<std::int32_t>{0});
    CHECK(report.findings[1].verdict.find("rank 1 never entered allgather #5 on channel 0") == 0);
    CHECK(report.findings[1].verdict.find("(rank 0 did not enter it either, waiting in another call)") !=
          std::string::npos);
    CHECK(actors::format_hang(report).find("rank 0 never entered #5: it is itself waiting in allreduce (ring) #3 (400 "
                                           "bytes of f32) on channel 1") != std::string::npos);
  }
  SUBCASE("every rank entered, none got out") {
    std::vector<hang_input> in{rank_input(0, {0, 1}, 2, true), rank_input(1, {0, 1}, 2, true)};
    const auto report = analyse_hang(in);
    CHECK(report.verdict.find("every rank entered allreduce (ring) #2") == 0);
    CHECK(report.findings[0].culprits == std::vector<std::int32_t>{0, 1});
  }
  SUBCASE("a rank of the group wrote no record") {
    std::vector<hang_input> in{rank_input(0, {0, 1, 2}, 2, true), rank_input(1, {0, 1, 2}, 2, true)};
    const auto text = actors::format_hang(analyse_hang(in));
    CHECK(text.find("rank 2 wrote no flight record") != std::string::npos);
  }
  SUBCASE("the longest wait comes first; a finished group is no finding") {
    auto a = rank_input(0, {0, 1}, 3, false), b = rank_input(1, {0, 1}, 3, false);
    a.record.calls.push_back(call(0, net::op_kind::barrier, flight_call::state::running, 0, {0, 1}, 0));
    a.record.calls.back().start_ns = 50'000'000'000ull; // waited 50 s
    a.record.calls.push_back(call(9, net::op_kind::allgather, flight_call::state::running, 0, {0, 1}, 2));
    a.record.calls.back().start_ns = 1'000'000'000ull; // waited 99 s: the oldest wait
    const auto report = analyse_hang({a, b});
    REQUIRE(report.findings.size() == 2);
    CHECK(report.findings[0].channel == 2);
    CHECK(report.findings[1].channel == 0);
    CHECK(actors::channel_role(0) == "the step hooks");
    CHECK(actors::channel_role(2) == "optimizer shards of stage 0");
    CHECK(actors::channel_role((1u << 20) + 1) == "ZeRO-3 parameter fetcher of stage 1");
  }
  SUBCASE("a pipeline edge with a message in flight") {
    auto a = rank_input(0, {0, 1}, 2, false), b = rank_input(1, {0, 1}, 2, false);
    net::flight_edge sent;
    sent.edge = 2;
    sent.peer = 1;
    sent.sent = 5;
    a.record.edges.push_back(sent);
    net::flight_edge got;
    got.edge = 2;
    got.peer = 0;
    got.received = 4;
    b.record.edges.push_back(got);
    const auto report = analyse_hang({a, b});
    REQUIRE(report.edges.size() == 1);
    CHECK(report.edges[0].line.find("edge 2 rank 0 -> rank 1: 5 sent (the last of step 0 micro-batch 0), 4 received") ==
          0);
    CHECK(report.edges[0].line.find(": 1 in flight or lost") != std::string::npos);
    CHECK(report.verdict.find("a pipeline edge has messages in flight") != std::string::npos);
  }
  SUBCASE("a pipeline edge whose given-back slots did not all reach the producer") {
    auto a = rank_input(0, {0, 1}, 2, false), b = rank_input(1, {0, 1}, 2, false);
    net::flight_edge producer; // rank 0 sent 4 and got 2 slots back
    producer.edge = 3, producer.peer = 1, producer.sent = 4, producer.credits_received = 2;
    a.record.edges.push_back(producer);
    net::flight_edge consumer; // rank 1 got all 4 and gave 3 back
    consumer.edge = 3, consumer.peer = 0, consumer.received = 4, consumer.credits_sent = 3;
    b.record.edges.push_back(consumer);
    auto report = analyse_hang({a, b});
    REQUIRE(report.edges.size() == 1);
    CHECK(report.edges[0].line.find("edge 3 rank 0 -> rank 1: 4 sent, all received; 3 slot(s) given back by rank 1, "
                                     "2 back at rank 0: 1 credit(s) in flight or lost") == 0);
    CHECK(report.verdict.find("credits in flight or lost") != std::string::npos);
    // Every credit back: the records agree.
    a.record.edges[0].credits_received = 3;
    report = analyse_hang({a, b});
    CHECK(report.edges[0].line.find("; 3 slot(s) given back, all back at rank 0") != std::string::npos);
    CHECK(report.verdict.find("the records agree") == 0);
  }
}

} // namespace
} // namespace dsa::test
