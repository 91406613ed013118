// Bad configs and failing actors end the run with an error naming the cause.
#include "tests/train/train_fixture.hpp"

#include <doctest/doctest.h>

using namespace dsa;

TEST_CASE("malformed configs are rejected with exit code 2") {
  test::temp_dir dir;
  std::string cfg = test::tiny_config(dir.path());
  CHECK(test::run_config(dir.path(), "bad", cfg, {"train_batch_size=\"eight\""}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"train_bach_size=8"}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"gradient_accumulation_steps=3"}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"optimizer.params.lr=\"fast\""}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"pipeline.stages=9"}) == 1); // more stages than layers
}

TEST_CASE("a stage that fails ends the run with exit code 1 and no checkpoint of that step") {
  test::temp_dir dir;
  std::string cfg = test::tiny_config(dir.path());
  CHECK(test::run_config(dir.path(), "fail", cfg,
                         {"pipeline.stages=2", "debug.fail_stage=1", "debug.fail_step=2",
                          "checkpoint.save_interval=1"}) == 1);
  auto list = ckpt::list_checkpoints(dir.path() + "/ckpt");
  REQUIRE(list.has_value());
  REQUIRE(!list->empty());
  CHECK(list->back().step == 2); // steps 0 and 1 completed; step 2 never did
}

// Stage 1's reducer waits for stage 0's share of the norm while stage 0's shard
// fails: nothing may wait on the failed shard (the watchdog, an hour here, is past
// the test's timeout).
TEST_CASE("an optimizer shard that fails while another waits for it ends the run promptly") {
  test::temp_dir dir;
  std::string cfg = test::tiny_config(dir.path());
  CHECK(test::run_config(dir.path(), "fail", cfg,
                         {"pipeline.stages=2", "debug.fail_stage=0", "debug.fail_optimizer_step=1",
                          "watchdog_seconds=3600"}) == 1);
}

TEST_CASE("resuming with another layout, precision or micro-batching is refused with exit code 2") {
  test::temp_dir dir;
  std::string cfg = test::tiny_config(dir.path());
  REQUIRE(test::run_config(dir.path(), "base", cfg, {"pipeline.stages=2", "train_steps=2"}) == 0);
  CHECK(test::run_config(dir.path(), "base", cfg, {"pipeline.stages=4", "train_steps=4"}, true) == 2);
  CHECK(test::run_config(dir.path(), "base", cfg, {"pipeline.stages=2", "train_steps=4", "bf16.enabled=true"}, true) == 2);
  CHECK(test::run_config(dir.path(), "base", cfg,
                         {"pipeline.stages=2", "train_steps=4", "train_micro_batch_size_per_gpu=4"}, true) == 2);
  CHECK(test::run_config(dir.path(), "base", cfg, {"pipeline.stages=2", "train_steps=4"}, true) == 0);
}
