// Shared by the compressed-optimizer run tests (test_run_compressed.cpp: ZeRO stage 0;
// test_run_compressed_zero.cpp: over ZeRO partitions): runs of the tiny config with --set
// overrides, their checkpoints and logs, and the optimizers' base settings.
#pragma once

#include "tests/support/compare.hpp"
#include "tests/train/train_fixture.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace dsa::test::compressed_run {

using dsa::test::with; // for the files that use this namespace

inline ckpt::named_tensors final_model(const test::temp_dir& dir, const char* step = "latest") {
  return test::load_run_checkpoint(dir.path() + "/ckpt", step).groups.at("model");
}

inline ckpt::named_tensors train_model(const std::vector<std::string>& overrides) {
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "c", test::tiny_config(dir.path()), overrides) == 0);
  return final_model(dir);
}

inline std::string read_log(const test::temp_dir& dir) {
  std::ifstream in(dir.path() + "/run/train.log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline void check_close(const ckpt::named_tensors& got, const ckpt::named_tensors& want,
                        const test::tolerance& tolerance) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    DSA_CHECK_CLOSE(got.at(name).data<float>(), t.data<float>(), t.numel(), tolerance);
  }
}

inline void check_equal(const ckpt::named_tensors& got, const ckpt::named_tensors& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(got.at(name).nbytes() == t.nbytes());
    CHECK(std::memcmp(got.at(name).raw_data(), t.raw_data(), t.nbytes()) == 0);
  }
}

inline const std::vector<std::vector<std::string>> optimizers = {
    {"optimizer.type=\"OneBitAdam\"", "optimizer.params.freeze_step=2"},
    {"optimizer.type=\"ZeroOneAdam\"", "optimizer.params.var_freeze_step=2", "optimizer.params.var_update_scaler=1"},
    {"optimizer.type=\"OneBitLamb\"", "optimizer.params.freeze_step=2"},
};

// 1-bit Adam through the warm-up (2 steps) into the compressed phase, with fp16 loss scaling,
// a warm-up schedule and clipping (local steps clip with each rank's own norm and OR-reduce overflows).
inline const std::vector<std::string> onebit_zero_base = {
    "optimizer.type=\"OneBitAdam\"", "optimizer.params.freeze_step=2", "optimizer.params.weight_decay=0.01",
    "fp16.enabled=true", "fp16.initial_scale_power=8", "gradient_clipping=0.05",
    // Position rows past the data's 32 tokens: masked after every exchange.
    "model.max_position_embeddings=48"};
// A learning rate that changes every step (the shard takes each step's).
inline const std::vector<std::string> warmup_lr = {"scheduler.type=\"WarmupLR\"",
                                                   "scheduler.params.warmup_max_lr=2e-3",
                                                   "scheduler.params.warmup_num_steps=8"};

// The run's model and every rank's 1-bit error buffers, by checkpoint group.
inline std::map<std::string, ckpt::named_tensors> model_and_errors(const test::temp_dir& dir, const char* step) {
  auto saved = test::load_run_checkpoint(dir.path() + "/ckpt", step);
  std::map<std::string, ckpt::named_tensors> out;
  for (auto& [group, tensors] : saved.groups)
    if (group == "model" || group.rfind("onebit_errors_", 0) == 0) out[group] = std::move(tensors);
  return out;
}

// 0/1 Adam with var_update_scaler 1: variance steps 1, 2 and 4, compressed gradients on 3, 5
// and 6; then local steps, synchronising on 7 and 8 and every 4 steps from there (9-11
// local only, 12 synchronises). Clipping and the position mask as for 1-bit Adam.
inline const std::vector<std::string> fp16_scaled = {"fp16.enabled=true", "fp16.initial_scale_power=8"};
inline const std::vector<std::string> zeroone_zero_base = {
    "optimizer.type=\"ZeroOneAdam\"", "optimizer.params.var_freeze_step=6", "optimizer.params.var_update_scaler=1",
    "optimizer.params.local_step_scaler=1", "optimizer.params.local_step_clipper=4",
    "optimizer.params.weight_decay=0.01", "gradient_clipping=0.05", "model.max_position_embeddings=48",
    "scheduler.type=\"WarmupLR\"", "scheduler.params.warmup_max_lr=2e-3",
    "scheduler.params.warmup_num_steps=8"};

} // namespace dsa::test::compressed_run
