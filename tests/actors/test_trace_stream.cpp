// The streaming trace format (version 2): round trip, files cut at every byte
// of their last frames, a corrupt CRC, version 1 still loading, the writer
// thread draining the recorder while a run goes, and the summary of a run.
#include "actors/trace/trace_file.hpp"
#include "actors/trace/trace_frame.hpp"
#include "actors/trace/analysis/trace_summary.hpp"
#include "actors/trace/trace_writer.hpp"
#include "synthetic_run.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

using namespace dsa::actors;

namespace {

std::string temp_dir(const char* name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("dsactor-test-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// n records with distinct, increasing fields (so sorting keeps the order).
trace_data numbered_trace(std::uint32_t n) {
  trace_data t;
  t.names = trace_name_table();
  t.actors = {"coordinator", "feeder", "tracer", "stage 0"};
  t.info = {{"rank", "0"}, {"stages", "1"}};
  for (std::uint32_t i = 0; i < n; ++i) {
    trace_record r;
    r.t0_ns = 1000 + 10 * i;
    r.t1_ns = r.t0_ns + 5;
    r.step = i / 4;
    r.micro_batch = i % 4;
    r.actor = 3;
    r.stage = 0;
    r.bytes = i * 7;
    r.name = static_cast<std::uint16_t>(i % 2 ? trace_name::backward : trace_name::forward);
    t.records.push_back(r);
  }
  return t;
}

bool same_records(const std::vector<trace_record>& a, const trace_record* b, std::size_t n) {
  if (a.size() != n)
    return false;
  return n == 0 || std::memcmp(a.data(), b, n * sizeof(trace_record)) == 0;
}

// Polls `done` until it holds or `limit` passes: the writer thread works on its
// own clock, so the test waits for what it wrote, with a bound, never for a time.
template <class Fn>
bool eventually(Fn done, std::chrono::seconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    std::this_thread::yield();
  }
  return true;
}

} // namespace

TEST_CASE("trace stream: a version-2 file round-trips names, actors, info and records") {
  const auto dir = temp_dir("v2-roundtrip");
  const auto path = dir + "/t.dsat";
  const auto trace = numbered_trace(13);
  REQUIRE(write_trace(path, trace).has_value());
  auto read = read_trace(path);
  REQUIRE(read.has_value());
  CHECK(read->version == 2);
  CHECK(read->names == trace.names);
  CHECK(read->actors == trace.actors);
  CHECK(read->info == trace.info);
  CHECK(read->info_value("stages") == "1");
  CHECK(read->end.closed);
  CHECK(read->end.valid_bytes == read->end.file_bytes);
  CHECK(same_records(read->records, trace.records.data(), trace.records.size()));
  std::filesystem::remove_all(dir);
}

TEST_CASE("trace stream: a file cut at any byte of its last frames loads the complete frames and "
          "says where") {
  const auto dir = temp_dir("v2-cut");
  const auto path = dir + "/t.dsat";
  const auto trace = numbered_trace(10);
  // Records frames of 3, 3, 3 and 1 records, then the end frame; `ends` holds the
  // byte after each records frame.
  std::string bytes = trace_file_header(trace_format_version);
  append_trace_frame(bytes, trace_frame_kind::names, trace_table_payload(trace.names));
  append_trace_frame(bytes, trace_frame_kind::actors, trace_table_payload(trace.actors));
  const std::size_t head = bytes.size();
  std::vector<std::size_t> ends;
  for (std::size_t i = 0; i < 10; i += 3) {
    append_trace_records(bytes, trace.records.data() + i, std::min<std::size_t>(3, 10 - i));
    ends.push_back(bytes.size());
  }
  const std::uint64_t count = 10;
  append_trace_frame(bytes, trace_frame_kind::end,
                     std::string(reinterpret_cast<const char*>(&count), 8));
  write_bytes(path, bytes);
  REQUIRE(read_trace(path)->end.closed);

  for (std::size_t cut = ends[1]; cut < bytes.size(); ++cut) {
    CAPTURE(cut);
    write_bytes(path, bytes.substr(0, cut));
    auto read = read_trace(path);
    REQUIRE(read.has_value());
    std::size_t frames = 0, end_byte = head;
    for (auto e : ends)
      if (e <= cut)
        ++frames, end_byte = e;
    const std::size_t kept = std::min<std::size_t>(10, 3 * frames);
    CHECK(same_records(read->records, trace.records.data(), kept));
    CHECK(!read->end.closed);
    CHECK(read->end.valid_bytes == end_byte);
    CHECK(read->end.file_bytes == cut);
    CHECK(read->end.why.find("byte " + std::to_string(end_byte)) != std::string::npos);
  }
  // Cut right after the header frames: a readable, empty trace.
  write_bytes(path, bytes.substr(0, head));
  auto empty = read_trace(path);
  REQUIRE(empty.has_value());
  CHECK(empty->records.empty());
  CHECK(empty->actors == trace.actors);
  CHECK(!empty->end.closed);
  std::filesystem::remove_all(dir);
}

TEST_CASE("trace stream: a corrupt frame stops the reader at that frame") {
  const auto dir = temp_dir("v2-crc");
  const auto path = dir + "/t.dsat";
  const auto trace = numbered_trace(6);
  std::string bytes = trace_file_header(trace_format_version);
  append_trace_frame(bytes, trace_frame_kind::names, trace_table_payload(trace.names));
  append_trace_records(bytes, trace.records.data(), 3);
  const std::size_t second = bytes.size();
  append_trace_records(bytes, trace.records.data() + 3, 3);
  SUBCASE("a flipped payload byte") {
    bytes[second + trace_frame_header_bytes + 20] ^= 0x40;
  }
  SUBCASE("a damaged length") {
    bytes[second + 8] ^= 0x01;
  }
  SUBCASE("a damaged magic") {
    bytes[second] ^= 0x01;
  }
  write_bytes(path, bytes);
  auto read = read_trace(path);
  REQUIRE(read.has_value());
  CHECK(same_records(read->records, trace.records.data(), 3));
  CHECK(!read->end.closed);
  CHECK(read->end.valid_bytes == second);
  CHECK(read->end.why.find("at byte " + std::to_string(second)) != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("trace stream: a version-1 file still loads") {
  const auto dir = temp_dir("v1-load");
  const auto path = dir + "/old.dsat";
  const auto trace = numbered_trace(9);
  REQUIRE(write_trace_v1(path, trace).has_value());
  CHECK(read_bytes(path).substr(8, 4) == std::string("\x01\x00\x00\x00", 4));
  auto read = read_trace(path);
  REQUIRE(read.has_value());
  CHECK(read->version == 1);
  CHECK(read->end.closed);
  CHECK(read->names == trace.names);
  CHECK(read->actors == trace.actors);
  CHECK(same_records(read->records, trace.records.data(), trace.records.size()));
  // The summary reads it too, the shape coming from the records.
  auto summary = summarize_traces({{0, path, *read}});
  REQUIRE(summary.ranks.size() == 1);
  CHECK(summary.ranks[0].stages == 1);
  CHECK(summary.ranks[0].micro_batches == 3);
  std::filesystem::remove_all(dir);
}

TEST_CASE("trace stream: a full buffer wakes the writer, which drains the recorder into the file") {
  const auto dir = temp_dir("writer-full");
  const auto path = dir + "/t.dsat";
  trace_recorder rec;
  rec.set_actor_name(0, "stage 0");
  trace_writer_options options;
  options.interval = std::chrono::hours(1); // only a full buffer can wake it
  options.full_records = 64;
  auto writer = trace_writer::open(rec, path, {{"rank", "0"}}, options);
  REQUIRE(writer.has_value());
  auto& w = **writer;
  CHECK(w.records_written() == 0);
  for (std::uint32_t round = 1; round <= 3; ++round) {
    std::thread([&rec] {
      for (int i = 0; i < 64; ++i)
        trace_span span(&rec, trace_name::forward, 0, 0, 0, 0);
    }).join();
    CAPTURE(round);
    REQUIRE(eventually([&] { return w.records_written() == 64u * round; }));
    // Drained: nothing waits in the recorder, and the file holds it while the writer is open.
    CHECK(rec.snapshot().records.empty());
    auto partial = read_trace(path);
    REQUIRE(partial.has_value());
    CHECK(partial->records.size() == 64u * round);
    CHECK(!partial->end.closed);
    CHECK(partial->actors.at(0) == "stage 0");
  }
  trace_span(&rec, trace_name::backward, 0, 0, 1, 0); // fewer than full_records: left for finish()
  REQUIRE(w.finish().has_value());
  auto done = read_trace(path);
  REQUIRE(done.has_value());
  CHECK(done->records.size() == 3 * 64 + 1);
  CHECK(done->end.closed);
  CHECK(done->info_value("rank") == "0");
  std::filesystem::remove_all(dir);
}

TEST_CASE("trace stream: a run's trace is in its file step by step while the run goes") {
  pipeline_options shape;
  shape.stages = 2;
  shape.micro_batches = 3;
  shape.steps = 4;
  dsa::test::synthetic_pipeline pipe({4, 5, 3, 0.05}, shape);
  const auto dir = temp_dir("writer-run");
  run_options options;
  options.pipeline = shape;
  options.run_dir = dir;
  options.trace_stream.interval = std::chrono::milliseconds(1);
  const auto path = dir + "/trace.dsat";
  std::vector<bool> seen;
  // Step k's hook runs before any shard starts step k + 1's update, while the
  // run still goes: the file must come to hold step k's optimizer spans.
  options.on_step = [&](const step_summary& s) {
    seen.push_back(eventually([&] {
      auto t = read_trace(path);
      if (!t || t->end.closed)
        return false;
      std::size_t updates = 0;
      for (const auto& r : t->records)
        updates += r.step == s.step && t->names.at(r.name) == "optimizer" ? 1 : 0;
      return updates == shape.stages;
    }));
  };
  auto result = run_pipeline(options, pipe.parts());
  REQUIRE(result.ok);
  CHECK(result.trace_error.empty());
  CHECK(seen == std::vector<bool>(4, true));
  auto read = read_trace(path);
  REQUIRE(read.has_value());
  CHECK(read->end.closed);
  CHECK(read->info_value("stages") == "2");
  CHECK(read->info_value("micro_batches") == "3");
  // run_result::trace is the file's records plus any made after the writer finished.
  CHECK(result.trace.records.size() >= read->records.size());
  std::filesystem::remove_all(dir);
}

// A long run's result need not hold its whole trace: with result_trace_steps the run reads
// back only its last steps' records (the file keeps all of them); read_trace's filter does
// the same for any reader.
TEST_CASE("trace stream: run_result::trace can hold only the run's last steps") {
  pipeline_options shape;
  shape.stages = 2;
  shape.micro_batches = 2;
  shape.steps = 6;
  dsa::test::synthetic_pipeline pipe({4, 5, 3, 0.05}, shape);
  const auto dir = temp_dir("tail-run");
  run_options options;
  options.pipeline = shape;
  options.run_dir = dir;
  options.result_trace_steps = 2;
  auto result = run_pipeline(options, pipe.parts());
  REQUIRE(result.ok);
  auto all = read_trace(dir + "/trace.dsat");
  REQUIRE(all.has_value());
  std::size_t late = 0, forwards_4 = 0;
  for (const auto& r : all->records) late += r.step >= 4 ? 1 : 0;
  for (const auto& r : result.trace.records) {
    CHECK(r.step >= 4);
    forwards_4 += r.step == 4 && result.trace.names.at(r.name) == "forward" ? 1 : 0;
  }
  CHECK(forwards_4 == shape.stages * shape.micro_batches); // the kept steps are whole
  CHECK(result.trace.records.size() >= late);              // plus what came after the writer finished
  CHECK(result.trace.records.size() < all->records.size());
  auto filtered = read_trace(dir + "/trace.dsat", [](const trace_record& r) { return r.step == 5; });
  REQUIRE(filtered.has_value());
  CHECK_FALSE(filtered->records.empty());
  for (const auto& r : filtered->records) CHECK(r.step == 5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("trace stream: the summary of a run directory, whole and with a torn tail") {
  pipeline_options shape;
  shape.stages = 2;
  shape.micro_batches = 4;
  shape.steps = 3;
  dsa::test::synthetic_pipeline pipe({4, 5, 3, 0.05}, shape);
  const auto dir = temp_dir("summary");
  auto result = dsa::test::run_synthetic(pipe, shape, dir);
  REQUIRE(result.ok);
  auto traces = load_run_traces(dir);
  REQUIRE(traces.has_value());
  REQUIRE(traces->size() == 1);
  auto summary = summarize_traces(*traces);
  REQUIRE(summary.ranks.size() == 1);
  CHECK(summary.ranks[0].end.closed);
  CHECK(summary.ranks[0].stages == 2);
  CHECK(summary.ranks[0].micro_batches == 4);
  REQUIRE(summary.steps.size() == 3);
  const auto& trace = traces->front().trace;
  for (const auto& st : summary.steps) {
    CAPTURE(st.step);
    CHECK(st.time_s > 0);
    CHECK(st.bubble >= 0);
    CHECK(st.bubble < 1);
    CHECK(st.allreduce_s == 0); // one rank: no allreduce spans
  }
  // Each stage's busy time is the sum of its spans (they never overlap), and
  // its messages and bytes are its send and receive records.
  int stages_seen = 0;
  for (const auto& a : summary.actors) {
    if (a.role != "stage")
      continue;
    ++stages_seen;
    std::uint64_t busy = 0, spans = 0, out = 0, bytes_out = 0;
    for (const auto& r : trace.records) {
      if (trace.actors.at(r.actor) != a.name)
        continue;
      if (r.kind == 0)
        busy += r.t1_ns - r.t0_ns, ++spans;
      if (r.kind == 1)
        ++out, bytes_out += r.bytes;
    }
    CAPTURE(a.name);
    CHECK(a.busy_s == doctest::Approx(static_cast<double>(busy) * 1e-9));
    CHECK(a.spans == spans);
    CHECK(a.messages_out == out);
    CHECK(a.bytes_out == bytes_out);
    CHECK(a.messages_in > 0);
    CHECK(a.idle_s >= 0);
  }
  CHECK(stages_seen == 2);
  const auto text = format_trace_summary(summary);
  for (const char* part :
       {"traces", "actors", "steps of rank 0", "stage 1", "(S-1)/(M+S-1) = 20.0%", "complete"})
    CHECK_MESSAGE(text.find(part) != std::string::npos, part);
  // The default view fits a screen: the step times' distribution (here 3 steps: the median
  // is the second slowest, the max the slowest, named first among the slowest steps) and a
  // verdict; each step's row only with per_step.
  std::vector<double> times;
  for (const auto& st : summary.steps) times.push_back(st.time_s);
  std::sort(times.begin(), times.end());
  const auto slowest = std::max_element(summary.steps.begin(), summary.steps.end(),
                                        [](const step_usage& a, const step_usage& b) { return a.time_s < b.time_s; });
  CHECK(text.find("steps of rank 0: 3 (") != std::string::npos);
  CHECK(text.find(fmt::format("step time  median {:.3f} s, p90 {:.3f} s, max {:.3f} s; slowest steps: {} ({:.3f} s)",
                              times[1], times[2], times[2], slowest->step, slowest->time_s)) != std::string::npos);
  CHECK(text.find("\nthe step is bound by ") != std::string::npos);
  CHECK(text.find("critical path") == std::string::npos);
  const auto rows = format_trace_summary(summary, summary_format{true, {}});
  CHECK(rows.find("critical path") != std::string::npos);
  CHECK(rows.find("step time  median") == std::string::npos);

  // The same run directory with its tail torn off (the end frame and part of a records frame).
  const auto path = dir + "/trace.dsat";
  auto bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 100));
  auto torn = load_run_traces(dir);
  REQUIRE(torn.has_value());
  auto torn_summary = summarize_traces(*torn);
  CHECK(!torn_summary.ranks[0].end.closed);
  CHECK(format_trace_summary(torn_summary).find("the trace ends at byte") != std::string::npos);
  std::filesystem::remove_all(dir);
}
