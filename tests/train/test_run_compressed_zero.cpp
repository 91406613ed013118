// The compressed optimizers over ZeRO partitions (stages 1 and 2, which runs as 1) in
// `dsactor run`: bit for bit as ZeRO stage 0 (weights and every rank's error buffers), the
// dummy first step, resumes across the freeze and onto other rank counts and stages.
#include "tests/train/compressed_run.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

using namespace dsa;
using namespace dsa::test::compressed_run;

TEST_CASE("1-bit Adam and 1-bit LAMB with ZeRO stages 1 and 2 equal ZeRO stage 0 bit for bit: weights and error buffers") {
  struct variant {
    const char* pipeline;
    int ranks;
    std::vector<std::string> extra;
  };
  const std::vector<std::string> lamb{"optimizer.type=\"OneBitLamb\"", "optimizer.params.max_coeff=0.5"};
  // OneCycle with cycle_momentum changes the betas every step (both stages must take them).
  const std::vector<std::string> one_cycle{"scheduler.type=\"OneCycle\"", "scheduler.params.cycle_min_lr=1e-4",
                                           "scheduler.params.cycle_max_lr=2e-3",
                                           "scheduler.params.cycle_first_step_size=3",
                                           "scheduler.params.cycle_momentum=true",
                                           "scheduler.params.cycle_min_mom=0.8", "scheduler.params.cycle_max_mom=0.9"};
  const variant variants[] = {{"pipeline.stages=1", 2, warmup_lr}, {"pipeline.stages=1", 4, warmup_lr},
                              {"pipeline.stages=2", 2, warmup_lr}, {"pipeline.stages=2", 4, warmup_lr},
                              {"pipeline.stages=1", 2, one_cycle},
                              {"pipeline.stages=1", 2, with(warmup_lr, lamb)}, {"pipeline.stages=2", 4, with(warmup_lr, lamb)},
                              {"pipeline.stages=1", 2, with(one_cycle, lamb)}};
  for (const auto& v : variants) {
    CAPTURE(v.pipeline);
    CAPTURE(v.ranks);
    CAPTURE(v.extra.size());
    const auto common = with(with(onebit_zero_base, v.extra),
                             {v.pipeline, fmt::format("devices.ranks={}", v.ranks), "train_steps=5"});
    test::temp_dir zero0;
    REQUIRE(test::run_config(zero0.path(), "z0", test::tiny_config(zero0.path()), common) == 0);
    const auto want = model_and_errors(zero0, "latest");
    REQUIRE(want.size() > 1); // the model and the error files
    for (const char* stage : {"zero_optimization.stage=1", "zero_optimization.stage=2"}) {
      CAPTURE(stage);
      test::temp_dir dir;
      REQUIRE(test::run_config(dir.path(), "z", test::tiny_config(dir.path()), with(common, {stage})) == 0);
      const auto got = model_and_errors(dir, "latest");
      REQUIRE(got.size() == want.size());
      for (const auto& [group, tensors] : want) {
        INFO(group);
        REQUIRE(got.count(group) == 1);
        check_equal(got.at(group), tensors);
      }
      const std::string log = read_log(dir);
      // Two warm-up steps, then three compressed ones with the gradients left on each rank.
      CHECK(log.find("compressed communication: 3 of the steps kept their gradients local") != std::string::npos);
      // The memory accounting counts the whole momentum (and LAMB's fresh variance).
      CHECK(log.find("model states measured after the first step") != std::string::npos);
      CHECK(log.find("(as expected)") != std::string::npos);
      if (std::string(stage).back() == '2')
        CHECK(log.find("zero_optimization.stage 2 runs as stage 1 with OneBit") != std::string::npos);
    }
  }
}

TEST_CASE("dummy_first_step with ZeRO stage 1: the first step leaves the model as it was, then equals stage 0") {
  auto untouched = train_model({"train_steps=1", "optimizer.params.lr=0.0", "scheduler.type=\"WarmupLR\"",
                                "scheduler.params.warmup_max_lr=0.0", "scheduler.params.warmup_num_steps=1"});
  for (const auto& o : optimizers) {
    CAPTURE(o.front());
    const auto base = with(o, {"devices.ranks=2", "optimizer.params.dummy_first_step=true"});
    check_equal(train_model(with(base, {"zero_optimization.stage=1", "train_steps=1"})), untouched);
    // Through the warm-up into the compressed phase (0/1 Adam: its local steps), the dummy
    // step shifts both stages' schedules alike.
    check_equal(train_model(with(base, {"zero_optimization.stage=1", "train_steps=6"})),
                train_model(with(base, {"train_steps=6"})));
  }
}
TEST_CASE("1-bit Adam and LAMB with ZeRO stage 1: a 4-rank checkpoint resumes on 2 ranks with fresh error buffers") {
  for (const char* type : {"OneBitAdam", "OneBitLamb"}) {
    CAPTURE(type);
    const auto base = with(with(onebit_zero_base, warmup_lr),
                           {"zero_optimization.stage=1", fmt::format("optimizer.type=\"{}\"", type)});
    test::temp_dir dir;
    REQUIRE(test::run_config(dir.path(), "four", test::tiny_config(dir.path()),
                             with(base, {"devices.ranks=4", "train_steps=4"})) == 0);
    REQUIRE(test::run_config(dir.path(), "four", test::tiny_config(dir.path()),
                             with(base, {"devices.ranks=2", "train_steps=6"}), /*resume=*/true) == 0);
    CHECK(read_log(dir).find("1-bit error buffers start at zero (saved on 4 ranks, this run has 2)") != std::string::npos);
    auto saved = test::load_run_checkpoint(dir.path() + "/ckpt", "6");
    CHECK(saved.groups.count("onebit_errors_0_rank1") == 1);
    CHECK(saved.groups.count("onebit_errors_0_rank2") == 0);
    // 1-bit LAMB's coefficients, factors, scalings and fresh variance: one group, whole tensors.
    CHECK(saved.groups.count("onebit_lamb_0") == (std::string(type) == "OneBitLamb" ? 1u : 0u));
    for (const auto& [name, t] : saved.groups.at("model")) {
      INFO(name);
      const float* p = t.data<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i) REQUIRE(std::isfinite(p[i]));
    }
  }
}

TEST_CASE("1-bit LAMB: a stage-0 checkpoint does not resume at ZeRO stage 1, and still resumes at stage 0") {
  const auto base = with(with(onebit_zero_base, warmup_lr), {"optimizer.type=\"OneBitLamb\"", "devices.ranks=2"});
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "zero0", test::tiny_config(dir.path()), with(base, {"train_steps=3"})) == 0);
  // Refused before training: the partitions cannot take the stage-0 shard's group arrays
  // (compressed.<group>.coeff and the like), and the message names the first of them.
  CHECK(test::run_config(dir.path(), "zero0", test::tiny_config(dir.path()),
                         with(base, {"train_steps=4", "zero_optimization.stage=1"}), /*resume=*/true) == 1);
  // The checkpoint is untouched: stage 0 resumes it.
  CHECK(test::run_config(dir.path(), "zero0", test::tiny_config(dir.path()), with(base, {"train_steps=4"}),
                         /*resume=*/true) == 0);
}

TEST_CASE("1-bit Adam and LAMB with ZeRO stage 1: resumes before, at and after the freeze continue bit for bit") {
  // The resumed ranks hold only their partition of the momentum: the first compressed step
  // all-gathers it; the error buffers come from each rank's own file, 1-bit LAMB's state from
  // its group (freeze_step 2: saved at step 1 before the freeze, at 2 on it, at 4 after).
  for (const char* type : {"OneBitAdam", "OneBitLamb"}) {
    CAPTURE(type);
    const auto two = with(with(onebit_zero_base, warmup_lr),
                          {"devices.ranks=2", "zero_optimization.stage=1", fmt::format("optimizer.type=\"{}\"", type)});
    test::temp_dir full;
    REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()), with(two, {"train_steps=6"})) == 0);
    for (int saved_at : {1, 2, 4}) {
      CAPTURE(saved_at);
      test::temp_dir part;
      REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()),
                               with(two, {fmt::format("train_steps={}", saved_at)})) == 0);
      REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), with(two, {"train_steps=6"}),
                               /*resume=*/true) == 0);
      check_equal(final_model(part, "6"), final_model(full, "6"));
    }
  }
}

TEST_CASE("1-bit LAMB: a ZeRO stage-1 checkpoint resumes at stage 0 bit for bit, and on one rank") {
  // Stage 0 takes the group's per-tensor state as its per-group arrays; with the same ranks
  // (the error files resumed) it continues exactly as the stage-1 run does.
  const auto base = with(with(onebit_zero_base, warmup_lr), {"optimizer.type=\"OneBitLamb\"", "devices.ranks=2"});
  test::temp_dir full, part, one;
  REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()),
                           with(base, {"train_steps=6", "zero_optimization.stage=1"})) == 0);
  REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()),
                           with(base, {"train_steps=4", "zero_optimization.stage=1"})) == 0);
  REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), with(base, {"train_steps=6"}),
                           /*resume=*/true) == 0);
  check_equal(final_model(part, "6"), final_model(full, "6"));
  REQUIRE(test::run_config(one.path(), "one", test::tiny_config(one.path()),
                           with(base, {"train_steps=4", "zero_optimization.stage=1"})) == 0);
  REQUIRE(test::run_config(one.path(), "one", test::tiny_config(one.path()),
                           with(base, {"train_steps=5", "devices.ranks=1"}), /*resume=*/true) == 0);
}


TEST_CASE("0/1 Adam with ZeRO stages 1 and 2 equals ZeRO stage 0 bit for bit through its local steps") {
  // Every step's loss (the ranks' own parameters between synchronisations) and every rank's
  // error buffers equal stage 0's; so do the model and the optimizer state where the run
  // ends on a synchronisation (bf16: no skipped step moves the schedule). fp16 adds loss
  // scaling: a skipped step keeps each rank's own weights (on this data one overflows in
  // the local phase, but no check depends on where).
  struct variant {
    const char* pipeline;
    int ranks;
    std::vector<std::string> precision;
  };
  for (const variant& v : {variant{"pipeline.stages=1", 2, fp16_scaled},
                           variant{"pipeline.stages=2", 4, {"bf16.enabled=true"}}}) {
    CAPTURE(v.pipeline);
    CAPTURE(v.ranks);
    const bool bf16 = v.precision.front() == "bf16.enabled=true";
    CAPTURE(bf16);
    const auto common = with(with(zeroone_zero_base, v.precision),
                             {v.pipeline, fmt::format("devices.ranks={}", v.ranks), "train_steps=12"});
    test::temp_dir zero0;
    REQUIRE(test::run_config(zero0.path(), "z0", test::tiny_config(zero0.path()), common) == 0);
    const auto want = model_and_errors(zero0, "latest");
    const auto want_losses = test::run_losses(zero0.path() + "/run");
    REQUIRE(want.size() > 1);
    REQUIRE(want_losses.size() == 12);
    for (const char* stage : {"zero_optimization.stage=1", "zero_optimization.stage=2"}) {
      CAPTURE(stage);
      test::temp_dir dir;
      REQUIRE(test::run_config(dir.path(), "z", test::tiny_config(dir.path()), with(common, {stage})) == 0);
      CHECK(test::run_losses(dir.path() + "/run") == want_losses);
      const auto got = model_and_errors(dir, "latest");
      REQUIRE(got.size() == want.size());
      for (const auto& [group, tensors] : want) {
        INFO(group);
        REQUIRE(got.count(group) == 1);
        if (group != "model" || bf16) check_equal(got.at(group), tensors);
      }
      if (bf16) { // the masters and moments, stage 0's group against the partitions assembled
        const auto whole0 = test::whole_groups(test::load_run_checkpoint(zero0.path() + "/ckpt", "latest"));
        const auto whole = test::whole_groups(test::load_run_checkpoint(dir.path() + "/ckpt", "latest"));
        int compared = 0;
        for (const auto& [group, tensors] : whole0)
          if (group.rfind("optimizer_", 0) == 0) {
            INFO(group);
            compared += static_cast<int>(tensors.size());
            REQUIRE(whole.count(group) == 1);
            for (const auto& [name, t] : tensors) {
              INFO(name);
              REQUIRE(whole.at(group).count(name) == 1);
              CHECK(std::memcmp(whole.at(group).at(name).raw_data(), t.raw_data(), t.nbytes()) == 0);
            }
          }
        CHECK(compared > 0);
      }
      const std::string log = read_log(dir);
      CHECK(log.find("of the steps kept their gradients local") != std::string::npos);
      // The whole variance, moves and parameters of the local steps are counted.
      CHECK(log.find("(as expected)") != std::string::npos);
      if (std::string(stage).back() == '2')
        CHECK(log.find("zero_optimization.stage 2 runs as stage 1 with ZeroOneAdam") != std::string::npos);
    }
  }
}

TEST_CASE("0/1 Adam with ZeRO stage 1: resumes in both phases continue bit for bit, and at stage 0") {
  // Saved on a compressed step of phase A (3), at the variance freeze (6) and on a
  // synchronisation (8): the resumed ranks gather their whole state again on the first
  // local step. A stage-1 checkpoint also resumes at stage 0 as the stage-0 run continues.
  const auto two = with(with(zeroone_zero_base, fp16_scaled), {"devices.ranks=2"});
  const auto one = with(two, {"zero_optimization.stage=1"});
  test::temp_dir full, full0;
  REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()), with(one, {"train_steps=12"})) == 0);
  REQUIRE(test::run_config(full0.path(), "full0", test::tiny_config(full0.path()), with(two, {"train_steps=12"})) == 0);
  for (int saved_at : {3, 6, 8}) {
    CAPTURE(saved_at);
    test::temp_dir part;
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()),
                             with(one, {fmt::format("train_steps={}", saved_at)})) == 0);
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), with(one, {"train_steps=12"}),
                             /*resume=*/true) == 0);
    check_equal(final_model(part, "12"), final_model(full, "12"));
  }
  // Saved between synchronisations (step 10; the last was 8): the checkpoint holds the point
  // the ranks last agreed on, the same weights as the one saved at 8, and resumes.
  test::temp_dir between;
  const auto bf16 = with(zeroone_zero_base, {"devices.ranks=2", "zero_optimization.stage=1", "bf16.enabled=true"});
  REQUIRE(test::run_config(between.path(), "b", test::tiny_config(between.path()), with(bf16, {"train_steps=8"})) == 0);
  REQUIRE(test::run_config(between.path(), "b", test::tiny_config(between.path()), with(bf16, {"train_steps=10"}),
                           /*resume=*/true) == 0);
  check_equal(final_model(between, "10"), final_model(between, "8"));
  REQUIRE(test::run_config(between.path(), "b", test::tiny_config(between.path()), with(bf16, {"train_steps=12"}),
                           /*resume=*/true) == 0);
  test::temp_dir cross;
  REQUIRE(test::run_config(cross.path(), "cross", test::tiny_config(cross.path()), with(one, {"train_steps=8"})) == 0);
  REQUIRE(test::run_config(cross.path(), "cross", test::tiny_config(cross.path()), with(two, {"train_steps=12"}),
                           /*resume=*/true) == 0);
  check_equal(final_model(cross, "12"), final_model(full0, "12"));
}

TEST_CASE("1-bit LAMB resumed with an earlier freeze_step: the fresh variance starts from the variance, at stage 0 and "
          "over ZeRO alike") {
  // Saved at step 3 under freeze_step 5 (no fresh variance yet), resumed under freeze_step 3:
  // the run is frozen at once, and both the stage-0 shard and the ZeRO partition start the
  // fresh variance from the (bias-corrected) variance, as at a freeze.
  const auto lamb = with(with(onebit_zero_base, warmup_lr), {"devices.ranks=2", "optimizer.type=\"OneBitLamb\""});
  std::vector<ckpt::named_tensors> models;
  for (const char* stage : {"zero_optimization.stage=0", "zero_optimization.stage=1"}) {
    CAPTURE(stage);
    test::temp_dir dir;
    REQUIRE(test::run_config(dir.path(), "r", test::tiny_config(dir.path()),
                             with(lamb, {stage, "train_steps=3", "optimizer.params.freeze_step=5"})) == 0);
    REQUIRE(test::run_config(dir.path(), "r", test::tiny_config(dir.path()),
                             with(lamb, {stage, "train_steps=5", "optimizer.params.freeze_step=3"}), /*resume=*/true) == 0);
    CHECK(read_log(dir).find("compressed communication: 2 of the steps kept their gradients local") != std::string::npos);
    models.push_back(final_model(dir, "5"));
  }
  check_equal(models[1], models[0]);
}
