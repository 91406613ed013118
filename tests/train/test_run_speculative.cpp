// pipeline.speculative_update: a shard that updates before the global norm is in and
// rolls back when the step clips or overflows ends every run with the bits of the run
// without speculation. Which steps roll back is forced, not timed: a huge
// gradient_clipping never clips, a tiny one always does, a huge initial loss scale
// overflows the first steps. The counts in the log prove the path was taken.
#include "tests/train/train_fixture.hpp"

#include "actors/trace/analysis/trace_check.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

using namespace dsa;
using dsa::test::with;

namespace {

struct finished {
  ckpt::loaded_checkpoint checkpoint;
  std::string log;
};

finished train(std::vector<std::string> overrides, bool speculate) {
  test::temp_dir dir;
  overrides.push_back(fmt::format("pipeline.speculative_update={}", speculate ? "true" : "false"));
  REQUIRE(test::run_config(dir.path(), "spec", test::tiny_config(dir.path()), overrides) == 0);
  std::ifstream in(dir.path() + "/run/train.log");
  std::stringstream text;
  text << in.rdbuf();
  return {test::load_run_checkpoint(dir.path() + "/ckpt", "latest"), text.str()};
}

struct counts {
  long speculated = -1, rolled_back = -1, skipped = -1;
};

counts counts_of(const std::string& log) {
  counts c;
  std::smatch m;
  if (std::regex_search(log, m, std::regex(R"((\d+) shard update\(s\) started before the global norm, (\d+) rolled back)"))) {
    c.speculated = std::stol(m[1]);
    c.rolled_back = std::stol(m[2]);
  }
  if (std::regex_search(log, m, std::regex(R"((\d+) step\(s\) skipped)"))) c.skipped = std::stol(m[1]);
  return c;
}

// Runs `v` with and without speculation: the same bits (masters, moments, working
// weights), the same skipped steps; returns the speculative run's counts.
counts check_equal(const std::vector<std::string>& v) {
  const finished plain = train(v, false);
  const finished spec = train(v, true);
  test::check_same_state(spec.checkpoint, plain.checkpoint);
  const counts c = counts_of(spec.log), p = counts_of(plain.log);
  CHECK(c.skipped == p.skipped);
  CHECK(plain.log.find("speculative update: off") != std::string::npos);
  // The memory plan counts the rollback copy when the shards speculate.
  CHECK((spec.log.find("the speculative update's rollback copy") != std::string::npos) == (c.speculated > 0));
  CHECK(plain.log.find("rollback copy") == std::string::npos);
  return c;
}

const std::vector<std::string> never_clips{"gradient_clipping=1e6"};
const std::vector<std::string> always_clips{"gradient_clipping=1e-6"};
// 2^20 overflows the tiny model's fp16 gradients: the scaler halves the scale per skipped
// step (3 of the 5) until they fit, then the speculation is kept.
const std::vector<std::string> overflows{"fp16.enabled=true", "fp16.initial_scale_power=20", "fp16.hysteresis=1",
                                         "gradient_clipping=1e6"};

// 2 stages x 5 steps: 10 shard updates, each speculated; all kept when nothing clips, all
// rolled back and redone when clipping always fires.
void check_kept_and_clipped(const std::vector<std::string>& base) {
  counts kept = check_equal(with(base, never_clips));
  CHECK(kept.speculated == 10);
  CHECK(kept.rolled_back == 0);
  counts clipped = check_equal(with(base, always_clips));
  CHECK(clipped.speculated == 10);
  CHECK(clipped.rolled_back == 10);
}

} // namespace

// 2 stages x 5 steps: 10 shard updates, each speculated.
TEST_CASE("speculative update: kept when nothing clips, rolled back and redone when clipping fires, AdamW and LAMB") {
  for (const char* type : {"AdamW", "Lamb"}) {
    CAPTURE(type);
    const std::vector<std::string> base{"pipeline.stages=2", fmt::format("optimizer.type=\"{}\"", type)};
    check_kept_and_clipped(base);
  }
}

// OneCycle cycles the betas: the speculation assumes the schedule's current ones, and an
// overflow (no schedule step) rolls them back with the moments.
TEST_CASE("speculative update with OneCycle momentum: the betas of the kept and the redone steps") {
  const std::vector<std::string> one_cycle{"pipeline.stages=2", "scheduler.type=\"OneCycle\"",
                                           "scheduler.params.cycle_min_lr=1e-4", "scheduler.params.cycle_max_lr=1e-3",
                                           "scheduler.params.cycle_first_step_size=2"};
  CHECK(check_equal(with(one_cycle, never_clips)).rolled_back == 0);
  counts c = check_equal(with(one_cycle, overflows));
  CHECK(c.skipped > 0);
  CHECK(c.rolled_back == 2 * c.skipped);
}

TEST_CASE("speculative update: fp16 overflows roll back to the state before, and the step is skipped") {
  counts c = check_equal(with({"pipeline.stages=2"}, overflows));
  CHECK(c.speculated == 10);
  CHECK(c.skipped > 0);
  CHECK(c.skipped < 5);
  CHECK(c.rolled_back == 2 * c.skipped); // both stages' shards of each skipped step
}

// With ZeRO 1 and 2 each rank's shard steps its partition (LAMB exchanging norms
// between the ranks inside the step): every rank speculates and rolls back alike.
TEST_CASE("speculative update on 2 ranks with ZeRO 0, 1 and 2 equals the run without") {
  for (int zero : {0, 1, 2}) {
    CAPTURE(zero);
    const std::vector<std::string> base{"pipeline.stages=2", "devices.ranks=2",
                                        fmt::format("zero_optimization.stage={}", zero)};
    CHECK(check_equal(with(base, always_clips)).rolled_back == 10);
    CHECK(check_equal(with(with(base, {"optimizer.type=\"Lamb\""}), always_clips)).rolled_back == 10);
    counts c = check_equal(with(with(base, {"optimizer.type=\"Lamb\""}), overflows));
    CHECK(c.skipped > 0);
    CHECK(c.rolled_back == 2 * c.skipped);
  }
}

TEST_CASE("speculative update: nothing to speculate on with one stage or without clipping and fp16, and the log says so") {
  const finished one = train(with({"pipeline.stages=1"}, always_clips), true);
  CHECK(one.log.find("speculative update: nothing to speculate on (one stage") != std::string::npos);
  CHECK(counts_of(one.log).speculated == -1);
  const finished local = train({"pipeline.stages=2", "gradient_clipping=0"}, true);
  CHECK(local.log.find("speculative update: nothing to speculate on (no global norm") != std::string::npos);
  CHECK(counts_of(local.log).speculated == -1);
}

// Swapped state: the speculative sweeps write the swap's second files and the outcome
// commits or discards them (aio::swap_store::begin_shadow): the same bits as the run
// without speculation, whether kept, redone after clipping or skipped after an overflow,
// with the state in several chunks and both swap pipelines on; the swap files go at the end.
TEST_CASE("speculative update of optimizer state swapped to NVMe: kept, rolled back, skipped, the same bits") {
  test::temp_dir swap;
  const std::vector<std::string> offload{
      "pipeline.stages=2", "zero_optimization.stage=1", "zero_optimization.offload_optimizer.device=\"nvme\"",
      fmt::format("zero_optimization.offload_optimizer.nvme_path=\"{}\"", swap.path()),
      "zero_optimization.offload_optimizer.pipeline_read=true", "zero_optimization.offload_optimizer.pipeline_write=true",
      "zero_optimization.offload_optimizer.buffer_count=9", "zero_optimization.sub_group_size=2048"};
  for (const char* type : {"AdamW", "Lamb"}) {
    CAPTURE(type);
    const auto base = with(offload, {fmt::format("optimizer.type=\"{}\"", type)});
    check_kept_and_clipped(base);
  }
  counts c = check_equal(with(offload, overflows));
  CHECK(c.skipped > 0);
  CHECK(c.rolled_back == 2 * c.skipped);
  // Two ranks, each swapping its partition: LAMB's norm exchange inside the redone step.
  CHECK(check_equal(with(with(offload, {"devices.ranks=2", "optimizer.type=\"Lamb\""}), always_clips)).rolled_back == 10);
  // Scratch: nothing is left in the swap folder, the second files included.
  for (const auto& e : std::filesystem::recursive_directory_iterator(swap.path()))
    CHECK_MESSAGE(!e.is_regular_file(), "left behind: " << e.path().string());
}

// Each shard's worker runs the speculative update, then the update that keeps or redoes
// it: one `speculate` span per stage and step, ended before that step's `optimizer` span
// begins (an order of one thread, not a timing), and `trace check` still passes.
TEST_CASE("speculative update: a speculate span per shard and step, before its update, in a trace that checks") {
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "spec", test::tiny_config(dir.path()),
                           {"pipeline.stages=2", "pipeline.speculative_update=true"}) == 0);
  auto traces = actors::load_run_traces(dir.path() + "/run");
  REQUIRE(traces);
  REQUIRE(traces->size() == 1);
  const actors::trace_data& t = traces->front().trace;
  int speculate = -1, optimizer = -1;
  for (std::size_t i = 0; i < t.names.size(); ++i) {
    if (t.names[i] == "speculate") speculate = static_cast<int>(i);
    if (t.names[i] == "optimizer") optimizer = static_cast<int>(i);
  }
  REQUIRE(speculate >= 0);
  std::map<std::pair<std::int32_t, std::uint32_t>, std::vector<const actors::trace_record*>> spec, upd;
  for (const auto& r : t.records) {
    if (r.kind != static_cast<std::uint8_t>(actors::trace_kind::span)) continue;
    if (r.name == speculate) spec[{r.stage, r.step}].push_back(&r);
    if (r.name == optimizer) upd[{r.stage, r.step}].push_back(&r);
  }
  CHECK(spec.size() == 10);
  for (const auto& [key, spans] : spec) {
    CAPTURE(key.first);
    CAPTURE(key.second);
    REQUIRE(spans.size() == 1);
    REQUIRE(upd[key].size() == 1);
    CHECK(spans[0]->t1_ns <= upd[key][0]->t0_ns);
  }
// A real run on a shared machine may stall a thread for any time: the starvation rule's
  // tolerance is wide here (its detection is tested on injected traces, test_trace_starvation).
  actors::trace_check_options wide;
  wide.idle_tolerance_ms = 600'000;
  CHECK(actors::check_traces(*traces, wide).first == std::nullopt);
}
