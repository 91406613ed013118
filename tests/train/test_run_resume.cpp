// Resuming from a checkpoint reproduces the uninterrupted run bit for bit.
#include "tests/support/compare.hpp"
#include "tests/train/train_fixture.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <iterator>

using namespace dsa;

namespace {

void check_bit_equal(const ckpt::tensor_groups& a, const ckpt::tensor_groups& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [group, tensors] : a) {
    REQUIRE(b.count(group) == 1);
    const auto& other = b.at(group);
    REQUIRE(other.size() == tensors.size());
    for (const auto& [name, t] : tensors) {
      INFO(group << "/" << name);
      REQUIRE(other.count(name) == 1);
      const auto& u = other.at(name);
      REQUIRE(u.nbytes() == t.nbytes());
      CHECK(std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) == 0);
    }
  }
}

void resume_matches(const std::vector<std::string>& settings) {
  test::temp_dir full, part;
  std::vector<std::string> six = settings;
  six.push_back("train_steps=6");
  six.push_back("checkpoint.save_interval=3");
  REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()), six) == 0);
  // The interrupted run: the same config stopped after 3 steps, then resumed to 6.
  std::vector<std::string> three = settings;
  three.push_back("train_steps=3");
  REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), three) == 0);
  REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), six, /*resume=*/true) == 0);
  auto a = test::load_run_checkpoint(full.path() + "/ckpt", "6");
  auto b = test::load_run_checkpoint(part.path() + "/ckpt", "6");
  CHECK(a.manifest.state["data_cursor"] == b.manifest.state["data_cursor"]);
  CHECK(a.manifest.state["loss_scaler"] == b.manifest.state["loss_scaler"]);
  CHECK(a.manifest.state["schedule_iteration"] == b.manifest.state["schedule_iteration"]);
  check_bit_equal(a.groups, b.groups);
}

// A resume on another layout: the run in `dir` ends at step 6 where `want` (the same run on
// one layout throughout) does, within the layouts' summation-order tolerance, and says it
// repartitioned.
void check_repartitioned(const std::string& dir, const ckpt::loaded_checkpoint& want,
                         const test::tolerance& tol = test::layout_equivalence) {
  const auto got = test::load_run_checkpoint(dir + "/ckpt", "6");
  CHECK(got.manifest.state["data_cursor"] == want.manifest.state["data_cursor"]);
  for (const auto& [name, t] : want.groups.at("model")) {
    INFO(name);
    REQUIRE(got.groups.at("model").count(name) == 1);
    DSA_CHECK_CLOSE(got.groups.at("model").at(name).data<float>(), t.data<float>(), t.numel(),
                    tol);
  }
  std::ifstream log(dir + "/run/train.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  CHECK(text.find("repartitioned on load") != std::string::npos);
}

// `settings` for 3 steps on 2 stages, resumed to 6 on 1 and on 4 stages, each checked against
// 6 uninterrupted steps on one stage (check_repartitioned); returns each resumed run's log.
std::vector<std::string> resume_on_other_stage_counts(const std::vector<std::string>& settings,
                                                      const test::tolerance& tol = test::layout_equivalence) {
  test::temp_dir full;
  std::vector<std::string> six = settings;
  six.push_back("train_steps=6");
  REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()), six) == 0);
  const auto want = test::load_run_checkpoint(full.path() + "/ckpt", "6");
  std::vector<std::string> logs;
  for (const char* stages : {"pipeline.stages=1", "pipeline.stages=4"}) {
    CAPTURE(stages);
    test::temp_dir part;
    std::vector<std::string> three = settings;
    three.push_back("train_steps=3");
    three.push_back("pipeline.stages=2");
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), three) == 0);
    std::vector<std::string> more = six;
    more.push_back(stages);
    more.push_back("pipeline.partition=\"uniform\"");
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), more, /*resume=*/true) == 0);
    check_repartitioned(part.path(), want, tol);
    std::ifstream log(part.path() + "/run/train.log");
    logs.emplace_back(std::istreambuf_iterator<char>(log), std::istreambuf_iterator<char>());
  }
  return logs;
}

} // namespace

TEST_CASE("resume is bit-exact with gradient accumulation and a warm-up schedule") {
  resume_matches({"scheduler.type=\"WarmupLR\"", "scheduler.params.warmup_num_steps=4",
                  "model.hidden_dropout=0.1", "model.attention_dropout=0.1"});
}

TEST_CASE("resume is bit-exact with 2 pipeline stages, fp16 and dynamic loss scaling") {
  resume_matches({"pipeline.stages=2", "fp16.enabled=true", "fp16.initial_scale_power=8"});
}

TEST_CASE("resume is bit-exact with 4 stages in bf16") {
  resume_matches({"pipeline.stages=4", "bf16.enabled=true", "pipeline.partition=\"uniform\""});
}

TEST_CASE("resume is bit-exact with stages updating independently (no clipping)") {
  resume_matches({"pipeline.stages=2", "gradient_clipping=0", "scheduler.type=\"WarmupLR\"",
                  "scheduler.params.warmup_num_steps=4"});
}

// Resuming on another pipeline layout repartitions on load: the model and a whole run's
// optimizer state are named by parameter, so each new stage takes its parameters' state from
// whichever saved stage held them. 2 stages for 3 steps, then 1 or 4 stages to 6, end where
// 6 steps on 1 stage do, within the layouts' summation-order tolerance.
TEST_CASE("a checkpoint resumes on another stage count, repartitioned on load") {
  test::temp_dir full;
  REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()), {"train_steps=6"}) == 0);
  const auto want = test::load_run_checkpoint(full.path() + "/ckpt", "6");
  for (const char* stages : {"pipeline.stages=1", "pipeline.stages=4"}) {
    CAPTURE(stages);
    test::temp_dir part;
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()),
                             {"train_steps=3", "pipeline.stages=2"}) == 0);
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()),
                             {"train_steps=6", stages, "pipeline.partition=\"uniform\""}, /*resume=*/true) == 0);
    check_repartitioned(part.path(), want);
  }
}

// ZeRO over 2 ranks and NVMe offload keep the optimizer state in pieces named by tensor range
// (one file per rank, or the swap's chunks): a new stage reads its parameters' pieces from
// whichever saved stage held them, so these repartition the same way.
TEST_CASE("a ZeRO-partitioned or NVMe-offloaded checkpoint resumes on another stage count") {
  test::temp_dir swap;
  const std::vector<std::vector<std::string>> variants{
      {"devices.ranks=2", "zero_optimization.stage=1"},
      {"zero_optimization.stage=1", "zero_optimization.offload_optimizer.device=\"nvme\"",
       "zero_optimization.offload_optimizer.nvme_path=\"" + swap.path() + "\""}};
  for (const auto& v : variants) {
    CAPTURE(v.back());
    resume_on_other_stage_counts(v);
  }
}

// A compressed optimizer's state on another stage count: its moments are named by parameter,
// 1-bit LAMB's per-tensor arrays are keyed by name from either saved form (a whole shard's or
// a ZeRO run's group) and cut for the new stages (lamb_resume.hpp), and the error buffers
// start at zero (they cover a stage's flat buffer), as DeepSpeed resets them on a load. One
// rank past the freeze (no exchange, so no error feedback) and 2 ZeRO-1 ranks before it (the
// exchange is exact) each end where 6 steps on one stage do: 1-bit LAMB within the layouts'
// summation-order tolerance, the Adams within what their frozen variance makes of it (as
// far as two uninterrupted runs on 1 and 2 stages are apart, tolerances.hpp).
TEST_CASE("a compressed optimizer's checkpoint resumes on another stage count") {
  const std::vector<std::vector<std::string>> variants{
      {"optimizer.type=\"OneBitLamb\"", "optimizer.params.freeze_step=2"},
      {"optimizer.type=\"OneBitAdam\"", "optimizer.params.freeze_step=2"},
      {"optimizer.type=\"ZeroOneAdam\"", "optimizer.params.var_freeze_step=2"},
      {"optimizer.type=\"OneBitLamb\"", "optimizer.params.freeze_step=100", "devices.ranks=2",
       "zero_optimization.stage=1"}};
  for (const auto& v : variants) {
    CAPTURE(v.front());
    CAPTURE(v.back());
    const bool adam = v.front().find("Adam") != std::string::npos;
    for (const auto& log : resume_on_other_stage_counts(v, adam ? test::layout_after_freeze : test::layout_equivalence))
      if (v.back() == "zero_optimization.stage=1")
        CHECK(log.find("1-bit error buffers start at zero (saved with another pipeline layout") != std::string::npos);
  }
}
