// Data parallelism in `dsactor run`: [devices] ranks = R trains the model one rank
// trains with the same global batch (train_batch_size = micro x accumulation x R).
#include "tests/support/compare.hpp"
#include "tests/train/train_fixture.hpp"
#include "actors/train/memory/memory_accounting.hpp"

#include <doctest/doctest.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace dsa;
using dsa::test::with;

namespace {

struct finished {
  ckpt::named_tensors model;
  nlohmann::json state;
};

finished train_run(const std::vector<std::string>& overrides, std::uint64_t step = 5) {
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "dp", test::tiny_config(dir.path()), overrides) == 0);
  auto ck = test::load_run_checkpoint(dir.path() + "/ckpt", "latest");
  CHECK(ck.manifest.step == step);
  return {ck.groups.at("model"), ck.manifest.state};
}

void check_close(const ckpt::named_tensors& got, const ckpt::named_tensors& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    DSA_CHECK_CLOSE(got.at(name).data<float>(), t.data<float>(), t.numel(), test::layout_equivalence);
  }
}

// The train.log of a tiny run with `overrides`.
std::string run_log(const std::string& name, const std::vector<std::string>& overrides) {
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), name, test::tiny_config(dir.path()), overrides) == 0);
  std::ifstream in(dir.path() + "/run/train.log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The model states every stage measured after the first step equal the accounting's.
void check_accounting(const std::string& log) {
  CHECK(log.find("(as expected)") != std::string::npos);
  CHECK(log.find("the accounting expected") == std::string::npos);
}

} // namespace

// One rank accumulates the step's 4 micro-batch gradients in one buffer; R ranks
// accumulate 4/R each and sum the R buffers in rank order. Every rank reads the same
// rows for a global micro-batch and draws the same dropout masks, so only the
// summation order differs: tolerances.hpp layout_equivalence, as for pipeline layouts.
TEST_CASE("devices.ranks = 2 and 4, with 1 and 2 stages, equal one rank with the same global batch") {
  const std::vector<std::string> dropout{"model.hidden_dropout=0.1", "model.attention_dropout=0.1"};
  auto one = train_run(dropout);
  for (int ranks : {2, 4}) {
    for (int stages : {1, 2}) {
      CAPTURE(ranks);
      CAPTURE(stages);
      auto many = train_run(with(dropout, {fmt::format("devices.ranks={}", ranks), fmt::format("pipeline.stages={}", stages)}));
      check_close(many.model, one.model);
      // The data continues where one rank's would: the cursor is the global batch's.
      CHECK(many.state["data_cursor"] == one.state["data_cursor"]);
      CHECK(many.state["data_parallel_size"] == ranks);
    }
  }
}

TEST_CASE("devices.ranks = 2 with fp16 loss scaling equals one rank") {
  const std::vector<std::string> fp16{"fp16.enabled=true", "fp16.initial_scale_power=8"};
  auto one = train_run(fp16);
  auto two = train_run(with(fp16, {"devices.ranks=2"}));
  REQUIRE(two.model.size() == one.model.size());
  for (const auto& [name, t] : one.model) {
    INFO(name);
    DSA_CHECK_CLOSE(two.model.at(name).data<float>(), t.data<float>(), t.numel(), test::data_parallel_fp16);
  }
  CHECK(two.state["loss_scaler"] == one.state["loss_scaler"]);
}

TEST_CASE("a run on 2 ranks resumes on 1 rank, and one on 1 rank on 4, continuing as the uninterrupted run") {
  test::temp_dir full, part;
  REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()), {"train_steps=6"}) == 0);
  REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), {"train_steps=3", "devices.ranks=2"}) == 0);
  REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), {"train_steps=6"}, /*resume=*/true) == 0);
  auto a = test::load_run_checkpoint(full.path() + "/ckpt", "6");
  auto b = test::load_run_checkpoint(part.path() + "/ckpt", "6");
  CHECK(a.manifest.state["data_cursor"] == b.manifest.state["data_cursor"]);
  check_close(b.groups.at("model"), a.groups.at("model"));

  test::temp_dir part4;
  REQUIRE(test::run_config(part4.path(), "part", test::tiny_config(part4.path()), {"train_steps=3"}) == 0);
  REQUIRE(test::run_config(part4.path(), "part", test::tiny_config(part4.path()), {"train_steps=6", "devices.ranks=4"},
                           /*resume=*/true) == 0);
  auto c = test::load_run_checkpoint(part4.path() + "/ckpt", "6");
  check_close(c.groups.at("model"), a.groups.at("model"));
}

TEST_CASE("devices.ranks must divide the batch, and a failing rank fails the run (exit 1)") {
  test::temp_dir dir;
  // train_batch_size 8 = micro 2 x accumulation 4: 3 ranks cannot split it.
  CHECK(test::run_config(dir.path(), "bad", test::tiny_config(dir.path()), {"devices.ranks=3"}) == 2);
  CHECK(test::run_config(dir.path(), "bad", test::tiny_config(dir.path()), {"devices.ranks=0"}) == 2);
  // debug.fail_stage makes stage 0 throw in step 2 on every rank; the run fails, exit 1.
  CHECK(test::run_config(dir.path(), "fail", test::tiny_config(dir.path()),
                         {"devices.ranks=2", "debug.fail_stage=0", "debug.fail_step=2"}) == 1);
}

TEST_CASE("comms_logger on 2 ranks: one gradient all_reduce per stage and step, summarized at the end") {
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "comms", test::tiny_config(dir.path()),
                           {"devices.ranks=2", "pipeline.stages=2", "comms_logger.enabled=true",
                            "comms_logger.prof_all=false", "comms_logger.prof_ops=[\"all_reduce\"]",
                            "comms_logger.debug=true"}) == 0);
  std::ifstream in(dir.path() + "/run/train.log");
  std::stringstream text;
  text << in.rdbuf();
  const std::string log = text.str();
  const auto at = log.find("comms_logger summary");
  REQUIRE(at != std::string::npos);
  const std::string table = log.substr(at);
  // Each stage's gradients fit one bucket: 5 steps x one all_reduce per stage.
  CHECK(table.find("reducer 0 of rank 0 x5") != std::string::npos);
  CHECK(table.find("reducer 1 of rank 0 x5") != std::string::npos);
  CHECK(table.find("all_gather") == std::string::npos); // not in prof_ops

  CHECK(test::run_config(dir.path(), "comms", test::tiny_config(dir.path()), {"comms_logger.prof_ops=[\"allreduce\"]"}) == 2);
}

TEST_CASE("devices.ranks = 2 with small buckets sent during backward (overlap_comm) equals one rank") {
  auto one = train_run({});
  for (const char* overlap : {"true", "false"}) {
    CAPTURE(overlap);
    // 2000 elements: the 4-layer hidden-32 model's tensors fall into many buckets.
    auto two = train_run({"devices.ranks=2", "zero_optimization.reduce_bucket_size=2000",
                      fmt::format("zero_optimization.overlap_comm={}", overlap)});
    check_close(two.model, one.model);
  }
}

TEST_CASE("model-state accounting: 28 bytes per parameter in fp32, 26 in fp16, as measured on every stage") {
  CHECK(train::expected_model_states(1000, train::precision::f32).total() == 28000);
  CHECK(train::expected_model_states(1000, train::precision::f16).total() == 26000);
  CHECK(train::expected_model_states(1000, train::precision::bf16).half_masters == 2000);
  for (const char* fp16 : {"false", "true"}) {
    CAPTURE(fp16);
    const std::string log =
        run_log("mem", {"devices.ranks=2", "pipeline.stages=2", fmt::format("fp16.enabled={}", fp16), "train_steps=2"});
    CHECK(log.find("stage 0: model states measured after the first step") != std::string::npos);
    CHECK(log.find("stage 1: model states measured after the first step") != std::string::npos);
    check_accounting(log);
  }
}

namespace {

ckpt::loaded_checkpoint train_checkpoint(const std::vector<std::string>& overrides) {
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "z", test::tiny_config(dir.path()), overrides) == 0);
  return test::load_run_checkpoint(dir.path() + "/ckpt", "latest");
}
} // namespace

// The partitioned optimizer runs the whole-tensor kernels on each rank's pieces (LAMB's
// norms exchanged exactly), and the all-gather copies bits: stage 1 equals stage 0 bit
// for bit, masters and moments included (the checkpoint gathers them from every rank).
// Stage 2 keeps only the partition's gradients, but the sum of squares (clipping, the
// fp16 overflow check) still covers the whole gradients, and two stages still add the
// tied embedding's gradient whole: it too equals stage 0 bit for bit.
TEST_CASE("ZeRO stages 1 and 2 on 2 and 4 ranks equal stage 0 (bit for bit but stage 2 on one pipeline stage), with AdamW, LAMB, fp16 and 2 stages") {
  const std::vector<std::vector<std::string>> variants{
      {},
      {"optimizer.type=\"Lamb\"", "pipeline.stages=2"},
      {"fp16.enabled=true", "fp16.initial_scale_power=8"},
      {"fp16.enabled=true", "fp16.initial_scale_power=8", "pipeline.stages=2", "gradient_clipping=0.05"}};
  for (const auto& v : variants) {
    for (int ranks : {2, 4}) {
      CAPTURE(ranks);
      CAPTURE(v.empty() ? std::string("AdamW") : v.front());
      CAPTURE(v.size());
      auto zero0 = train_checkpoint(with(v, {fmt::format("devices.ranks={}", ranks)}));
      for (int stage : {1, 2}) {
        CAPTURE(stage);
        auto zero = train_checkpoint(
            with(v, {fmt::format("devices.ranks={}", ranks), fmt::format("zero_optimization.stage={}", stage)}));
        // Stage 2 on one pipeline stage sums each micro-batch's gradients into the
        // partitions (as stage 3): the same up to the order of those sums.
        const bool piped = std::find(v.begin(), v.end(), "pipeline.stages=2") != v.end();
        const bool fp16 = std::find(v.begin(), v.end(), "fp16.enabled=true") != v.end();
        if (stage == 2 && !piped)
          test::check_close_state(zero, zero0, test::zero3_reduction_order,
                                  fp16 ? test::zero_fp16_first_moments : test::zero3_first_moments);
        else test::check_same_state(zero, zero0);
        CHECK(zero.manifest.state["data_cursor"] == zero0.manifest.state["data_cursor"]);
      }
    }
  }
}

// DeepSpeed writes one optimizer file per ZeRO rank; so does dsactor, each rank its own
// partition, committed in one manifest; the model file holds the gathered masters.
TEST_CASE("ZeRO checkpoints: every rank writes its optimizer partition to its own file, committed together") {
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "z", test::tiny_config(dir.path()),
                           {"devices.ranks=2", "zero_optimization.stage=1", "pipeline.stages=2",
                            "checkpoint.save_interval=2"}) == 0);
  auto ck = test::load_run_checkpoint(dir.path() + "/ckpt", "latest");
  std::vector<std::string> groups;
  for (const auto& f : ck.manifest.files) groups.push_back(f.group);
  CHECK(groups == std::vector<std::string>{"model", "optimizer_0_rank0", "optimizer_0_rank1", "optimizer_1_rank0",
                                           "optimizer_1_rank1"});
  for (std::uint32_t s = 0; s < 2; ++s) {
    std::int64_t elements[2] = {0, 0};
    for (std::uint32_t r = 0; r < 2; ++r) {
      const auto& g = ck.groups.at(fmt::format("optimizer_{}_rank{}", s, r));
      for (const auto& [key, t] : g) {
        INFO(key);
        // Pieces by tensor range, shapes and the step count; no masters (the model file has them).
        CHECK(key.rfind("master.", 0) == std::string::npos);
        const bool ranged = key.find(".exp_avg") != std::string::npos && key.back() == ']';
        CHECK((ranged || key.rfind("shape.", 0) == 0 || key == "optimizer_step_count"));
        if (ranged) elements[r] += t.numel();
      }
    }
    // Each rank holds about half of the stage (its partition, padding left out).
    CHECK(elements[0] > 0);
    CHECK(elements[1] > 0);
  }
  // No staging folder is left behind.
  for (const auto& e : std::filesystem::directory_iterator(dir.path() + "/ckpt"))
    CHECK(e.path().filename().string().find("staging") == std::string::npos);
}

TEST_CASE("ZeRO stage 1 resumes on another rank count and stage, continuing as the uninterrupted run") {
  const std::vector<std::string> lamb{"optimizer.type=\"Lamb\""};
  test::temp_dir full, part;
  REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()), with(lamb, {"train_steps=6"})) == 0);
  // 3 steps with stage 1 on 2 ranks, then 3 more with stage 1 on 4 ranks, then compare.
  REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()),
                           with(lamb, {"train_steps=3", "devices.ranks=2", "zero_optimization.stage=1"})) == 0);
  REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()),
                           with(lamb, {"train_steps=6", "devices.ranks=4", "zero_optimization.stage=1"}),
                           /*resume=*/true) == 0);
  auto a = test::load_run_checkpoint(full.path() + "/ckpt", "6");
  auto b = test::load_run_checkpoint(part.path() + "/ckpt", "6");
  check_close(b.groups.at("model"), a.groups.at("model"));
  // And a stage-1 checkpoint continues on one rank without ZeRO.
  test::temp_dir back;
  REQUIRE(test::run_config(back.path(), "back", test::tiny_config(back.path()),
                           with(lamb, {"train_steps=3", "devices.ranks=2", "zero_optimization.stage=1"})) == 0);
  REQUIRE(test::run_config(back.path(), "back", test::tiny_config(back.path()), with(lamb, {"train_steps=6"}),
                           /*resume=*/true) == 0);
  auto c = test::load_run_checkpoint(back.path() + "/ckpt", "6");
  check_close(c.groups.at("model"), a.groups.at("model"));
}

// A stage-2 checkpoint has the same whole tensors as any other: it resumes bit for bit
// as stage 1 on the same ranks, and on another rank count as stage 2 or without ZeRO.
TEST_CASE("ZeRO stage 2 resumes as stage 1, on another rank count, and on one rank") {
  const std::vector<std::string> lamb{"optimizer.type=\"Lamb\"", "pipeline.stages=2"};
  test::temp_dir full;
  REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()),
                           with(lamb, {"train_steps=6", "devices.ranks=2"})) == 0);
  auto a = test::load_run_checkpoint(full.path() + "/ckpt", "6");
  struct leg {
    std::vector<std::string> first, second;
    bool same_ranks;
  };
  const std::vector<leg> legs{
      {{"devices.ranks=2", "zero_optimization.stage=2"}, {"devices.ranks=2", "zero_optimization.stage=1"}, true},
      {{"devices.ranks=2", "zero_optimization.stage=1"}, {"devices.ranks=2", "zero_optimization.stage=2"}, true},
      {{"devices.ranks=2", "zero_optimization.stage=2"}, {"devices.ranks=4", "zero_optimization.stage=2"}, false},
      {{"devices.ranks=4", "zero_optimization.stage=2"}, {}, false}};
  for (const auto& l : legs) {
    CAPTURE(fmt::format("{} then {}", fmt::join(l.first, " "), fmt::join(l.second, " ")));
    test::temp_dir part;
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()),
                             with(lamb, with(l.first, {"train_steps=3"}))) == 0);
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()),
                             with(lamb, with(l.second, {"train_steps=6"})), /*resume=*/true) == 0);
    auto b = test::load_run_checkpoint(part.path() + "/ckpt", "6");
    CHECK(b.manifest.state["data_cursor"] == a.manifest.state["data_cursor"]);
    if (l.same_ranks) test::check_same_state(b, a);
    else check_close(b.groups.at("model"), a.groups.at("model"));
  }
}

TEST_CASE("ZeRO stage 1: each rank holds 1/N of the masters and moments, as the accounting expects") {
  for (int ranks : {2, 4}) {
    CAPTURE(ranks);
    const std::string log =
        run_log("mem", {fmt::format("devices.ranks={}", ranks), "zero_optimization.stage=1", "train_steps=1"});
    check_accounting(log);
    CHECK(log.find(fmt::format("ZeRO stage 1: masters and moments of 1/{} of the stage", ranks)) != std::string::npos);
  }
  // The accounting itself: 12 bytes per partition element instead of 12 per parameter.
  const auto whole = train::expected_model_states(1000, train::precision::f32);
  const auto split = train::expected_model_states(1000, train::precision::f32, train::zero_sizes{4096, 1024});
  CHECK(whole.masters + whole.moments == 12000);
  CHECK(split.masters + split.moments == 12 * 1024);
  CHECK(split.reduced == 4 * 4096);
}

// The log's "(as expected)" compares what every shard holds (held_bytes) with the
// accounting, which gives a stage-2 shard 4 bytes of reduced gradient per partition
// element (plus, on a pipeline's end stages, the tied embedding's whole gradient).
TEST_CASE("ZeRO stage 2: each rank holds the reduced gradients of 1/N of the stage, as the accounting expects") {
  for (int ranks : {2, 4}) {
    for (int stages : {1, 2}) {
      CAPTURE(ranks);
      CAPTURE(stages);
      const std::string log = run_log("mem", {fmt::format("devices.ranks={}", ranks),
                                              fmt::format("pipeline.stages={}", stages), "zero_optimization.stage=2",
                                              "train_steps=1"});
      check_accounting(log);
      CHECK(log.find(fmt::format("ZeRO stage 2: gradients, masters and moments of 1/{} of the stage", ranks)) !=
            std::string::npos);
      CHECK(log.find(fmt::format("ZeRO stage 2: each rank holds the optimizer state and the reduced gradients of 1/{}",
                                 ranks)) != std::string::npos);
    }
  }
  // The accounting itself: 4 bytes of reduced gradient per partition element (and per
  // element of a gradient kept whole) instead of per padded element.
  const auto stage1 = train::expected_model_states(1000, train::precision::f32, train::zero_sizes{4096, 1024, 1, 0});
  const auto stage2 = train::expected_model_states(1000, train::precision::f32, train::zero_sizes{4096, 1024, 2, 0});
  const auto tied = train::expected_model_states(1000, train::precision::f32, train::zero_sizes{4096, 1024, 2, 300});
  CHECK(stage1.reduced == 4 * 4096);
  CHECK(stage2.reduced == 4 * 1024);
  CHECK(tied.reduced == 4 * (1024 + 300));
  CHECK(stage2.masters + stage2.moments == stage1.masters + stage1.moments);
}

TEST_CASE("DeepSpeed's model-state accounting: 16, 4 + 12/n, 2 + 14/n and 16/n bytes per parameter") {
  CHECK(train::deepspeed_model_states(1000, 0, 4) == doctest::Approx(16000));
  CHECK(train::deepspeed_model_states(1000, 1, 4) == doctest::Approx(4000 + 3000));
  CHECK(train::deepspeed_model_states(1000, 2, 4) == doctest::Approx(2000 + 3500));
  CHECK(train::deepspeed_model_states(1000, 3, 4) == doctest::Approx(4000));
}
