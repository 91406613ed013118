// The NVMe optimizer swap in a run's trace: every chunk of every step read and written
// as swap_read/swap_write spans of its optimizer shard, the next step's first chunks
// read (prefetched) before that step's update begins, the summary's I/O section, the
// end-of-run swap line in the log, and `trace check` still passing; each chunk's update a
// swap_update span, with the next chunk's read begun before it (read ahead).
#include "tests/train/train_fixture.hpp"

#include "actors/trace/analysis/chrome_export.hpp"
#include "actors/trace/analysis/trace_check.hpp"
#include "actors/trace/analysis/trace_swap_io.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

using namespace dsa;
using namespace dsa::actors;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int name_of(const trace_data& t, const char* name) {
  for (std::size_t i = 0; i < t.names.size(); ++i)
    if (t.names[i] == name)
      return static_cast<int>(i);
  return -1;
}

} // namespace

TEST_CASE("offload: the trace holds a swap_read and a swap_write span per chunk and step, "
          "prefetched reads first") {
  // Without pipeline_write every write has ended when a sweep returns, so the prefetch
  // after it always finds free buffer sets: the next step's first chunk is read ahead,
  // whatever the timing. With it, the last writes go on behind the step (and the
  // prefetch may find no free set): every chunk is still read and written once per step.
  for (const bool write_behind : {false, true}) {
    CAPTURE(write_behind);
    test::temp_dir dir, swap;
    constexpr std::uint32_t steps = 3, stages = 2;
    REQUIRE(test::run_config(
                dir.path(), "io", test::tiny_config(dir.path()),
                {"train_steps=3", "pipeline.stages=2", "zero_optimization.stage=1",
                 "zero_optimization.offload_optimizer.device=\"nvme\"",
                 fmt::format("zero_optimization.offload_optimizer.nvme_path=\"{}\"", swap.path()),
                 "zero_optimization.sub_group_size=2048",
                 "zero_optimization.offload_optimizer.pipeline_read=true",
                 fmt::format("zero_optimization.offload_optimizer.pipeline_write={}", write_behind),
                 fmt::format("zero_optimization.offload_optimizer.buffer_count={}",
                             write_behind ? 9 : 6)}) == 0);
    const std::string run = dir.path() + "/run";
    auto traces = load_run_traces(run);
    REQUIRE(traces);
    REQUIRE(traces->size() == 1);
    const trace_data& t = traces->front().trace;
    const int read = name_of(t, "swap_read"), write = name_of(t, "swap_write"),
              optimizer = name_of(t, "optimizer"), chunk_update = name_of(t, "swap_update");
    REQUIRE(read >= 0);
    REQUIRE(write >= 0);
    REQUIRE(chunk_update >= 0);

    // (stage, step) -> chunks read and written, the earliest read of chunk 0, the update's start.
    struct seen {
      std::set<std::uint32_t> reads, writes;
      std::uint64_t first_read_t0 = ~0ull, update_t0 = ~0ull, update_t1 = 0;
      std::uint64_t bytes = 0;
      // Per chunk: the earliest start of its reads and of its updates (a redone update
      // updates it twice).
      std::map<std::uint32_t, std::uint64_t> read_t0, chunk_update_t0;
    };
    std::map<std::pair<std::int32_t, std::uint32_t>, seen> by;
    std::map<std::int32_t, std::uint32_t> chunks; // per stage: 1 + the highest chunk written
    for (const auto& r : t.records) {
      if (r.kind != static_cast<std::uint8_t>(trace_kind::span))
        continue;
      auto& s = by[{r.stage, r.step}];
      if (r.name == optimizer) {
        s.update_t0 = r.t0_ns;
        s.update_t1 = r.t1_ns;
      }
      if (r.name == chunk_update) {
        CHECK(r.t0_ns <= r.t1_ns);
        CHECK(r.bytes == 0);
        CHECK(r.actor == 3 + stages + static_cast<std::uint32_t>(r.stage));
        auto at = s.chunk_update_t0.emplace(r.micro_batch, r.t0_ns).first;
        at->second = std::min(at->second, r.t0_ns);
      }
      if (r.name != read && r.name != write)
        continue;
      CHECK(r.t0_ns <= r.t1_ns);
      CHECK(r.bytes > 0);
      CHECK(r.actor ==
            3 + stages + static_cast<std::uint32_t>(r.stage)); // the stage's optimizer shard
      s.bytes += r.bytes;
      if (r.name == write) {
        s.writes.insert(r.micro_batch);
        chunks[r.stage] = std::max(chunks[r.stage], r.micro_batch + 1);
      } else {
        s.reads.insert(r.micro_batch);
        auto at = s.read_t0.emplace(r.micro_batch, r.t0_ns).first;
        at->second = std::min(at->second, r.t0_ns);
        if (r.micro_batch == 0)
          s.first_read_t0 = std::min(s.first_read_t0, r.t0_ns);
      }
    }
    REQUIRE(chunks.size() == stages);
    for (std::int32_t stage = 0; stage < static_cast<std::int32_t>(stages); ++stage) {
      CAPTURE(stage);
      const std::uint32_t n = chunks[stage];
      CHECK(n > 2); // sub-groups of 2048 elements: the tiny stages stream through many chunks
      for (std::uint32_t step = 0; step < steps; ++step) {
        CAPTURE(step);
        const seen& s = by[{stage, step}];
        CHECK(s.reads.size() == n);
        CHECK(s.writes.size() == n);
        CHECK((s.reads.empty() ? 0 : *s.reads.rbegin() + 1) == n);
        REQUIRE(s.update_t0 != ~0ull);
        // The step's first chunk was read ahead: the read began before its update did
        // (after the previous update, while the stages ran forward and backward; for the
        // first step, after the initial write).
        if (!write_behind)
          CHECK(s.first_read_t0 < s.update_t0);
        // Every chunk's update is a swap_update span inside the step's optimizer span, and
        // (read ahead, with a buffer set free: no write-behind) the read of the chunk updated
        // next began before the update of the one before it.
        REQUIRE(s.chunk_update_t0.size() == n);
        std::vector<std::pair<std::uint64_t, std::uint32_t>> order; // (first update t0, chunk)
        for (const auto& [chunk, t0] : s.chunk_update_t0) {
          CHECK(t0 >= s.update_t0);
          CHECK(t0 <= s.update_t1);
          order.emplace_back(t0, chunk);
        }
        std::sort(order.begin(), order.end());
        if (!write_behind)
          for (std::size_t k = 0; k + 1 < order.size(); ++k) {
            CAPTURE(k);
            REQUIRE(s.read_t0.count(order[k + 1].second) == 1);
            CHECK(s.read_t0.at(order[k + 1].second) < order[k].first);
          }
      }
    }
    // A real run on a shared machine may stall a thread for any time: the starvation rule's
    // tolerance is wide here (its detection is tested on injected traces).
    actors::trace_check_options wide;
    wide.idle_tolerance_ms = 600'000;
    CHECK(check_traces(*traces, wide).first == std::nullopt);

    const auto io = summarize_swap_io(*traces);
    REQUIRE(io.size() >= steps);
    for (std::uint32_t step = 0; step < steps; ++step) {
      CAPTURE(step);
      CHECK(io[step].step == step);
      CHECK(io[step].reads == by[{0, step}].reads.size() + by[{1, step}].reads.size());
      CHECK(io[step].bytes_read + io[step].bytes_written ==
            by[{0, step}].bytes + by[{1, step}].bytes);
      CHECK(io[step].busy_s > 0);
      CHECK(io[step].gb_per_s() > 0);
      CHECK(io[step].updated);
      CHECK(io[step].read_s > 0);
      CHECK(io[step].reads_during_update_s <= io[step].read_s + 1e-12);
    }
    // The prefetch after the last update reads for a step that never comes (always
    // without write-behind, which leaves every buffer set free when a sweep returns).
    if (!write_behind) {
      REQUIRE(io.size() == steps + 1);
      CHECK_FALSE(io.back().updated);
      CHECK(io.back().writes == 0);
    }
    const std::string table = format_swap_io(io);
    CHECK(table.find("NVMe swap I/O per step") != std::string::npos);
    CHECK(table.find(" GB/s ") != std::string::npos);
    CHECK(table.find("read/upd") != std::string::npos);
    // The Chrome export puts the transfers on a row of their own per shard.
    CHECK(chrome_trace_json(t).find("optimizer 0 nvme") != std::string::npos);
    const std::string log = read_text(run + "/train.log");
    for (std::uint32_t stage = 0; stage < stages; ++stage) {
      const auto at = log.find(fmt::format("stage {} NVMe swap: read ", stage));
      REQUIRE(at != std::string::npos);
      CHECK(log.find("prefetched before their update", at) != std::string::npos);
      CHECK(log.find("GB/s achieved", at) != std::string::npos);
    }
  }
}

TEST_CASE("offload: a streamed update is a stream_update span before the step's optimizer span; the trace checks clean") {
  test::temp_dir dir, swap;
  // Three stages without clipping: the middle one streams its update over the backward.
  REQUIRE(test::run_config(dir.path(), "stream", test::tiny_config(dir.path()),
                           {"train_steps=3", "gradient_clipping=0.0", "pipeline.stages=3", "zero_optimization.stage=1",
                            "zero_optimization.offload_optimizer.device=\"nvme\"",
                            fmt::format("zero_optimization.offload_optimizer.nvme_path=\"{}\"", swap.path()),
                            "zero_optimization.sub_group_size=2048"}) == 0);
  auto traces = load_run_traces(dir.path() + "/run");
  REQUIRE(traces);
  const trace_data& t = traces->front().trace;
  const int stream = name_of(t, "stream_update"), optimizer = name_of(t, "optimizer"),
            chunk_update = name_of(t, "swap_update");
  REQUIRE(stream >= 0);
  std::map<std::pair<std::int32_t, std::uint32_t>, std::vector<const trace_record*>> streams, updates, chunks;
  for (const auto& r : t.records) {
    if (r.kind != static_cast<std::uint8_t>(trace_kind::span)) continue;
    if (r.name == stream) streams[{r.stage, r.step}].push_back(&r);
    if (r.name == optimizer) updates[{r.stage, r.step}].push_back(&r);
    if (r.name == chunk_update) chunks[{r.stage, r.step}].push_back(&r);
  }
  for (std::int32_t stage = 0; stage < 3; ++stage)
    for (std::uint32_t step = 0; step < 3; ++step) {
      CAPTURE(stage);
      CAPTURE(step);
      REQUIRE(updates[{stage, step}].size() == 1);
      if (stage != 1) {
        CHECK(streams[{stage, step}].empty()); // the tied stages update after the backward
        continue;
      }
      REQUIRE(streams[{stage, step}].size() == 1);
      CHECK(streams[{stage, step}][0]->t1_ns <= updates[{stage, step}][0]->t0_ns); // the same worker, in turn
      // The chunks were updated inside the stream, the last chunk first (a descending sweep).
      REQUIRE_FALSE(chunks[{stage, step}].empty());
      const trace_record* previous = nullptr;
      for (const trace_record* c : chunks[{stage, step}]) {
        CHECK(c->t0_ns >= streams[{stage, step}][0]->t0_ns);
        CHECK(c->t1_ns <= streams[{stage, step}][0]->t1_ns);
        if (previous && previous->t0_ns < c->t0_ns) CHECK(previous->micro_batch > c->micro_batch);
        previous = c;
      }
    }
  actors::trace_check_options wide;
  wide.idle_tolerance_ms = 600'000;
  CHECK(check_traces(*traces, wide).first == std::nullopt);
}
