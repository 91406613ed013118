// Resuming from a checkpoint reproduces the uninterrupted run bit for bit.
#include "tests/train/train_fixture.hpp"

#include <doctest/doctest.h>

#include <cstring>

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
