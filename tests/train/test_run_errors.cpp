// Bad configs and failing actors end the run with an error naming the cause.
#include "actors/train/config/deepspeed_json.hpp"
#include "actors/train/config/run_config.hpp"
#include "tests/train/train_fixture.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

using namespace dsa;

namespace {

// The lines of a multi-problem error, without the heading.
std::vector<std::string> problem_lines(const std::string& message) {
  std::vector<std::string> lines;
  std::istringstream in(message);
  std::string line;
  std::getline(in, line); // "<n> problems in the configuration:"
  while (std::getline(in, line))
    lines.push_back(line.substr(line.find_first_not_of(' ')));
  return lines;
}

// The error of parsing the run config in `path` (which must fail).
error parse_error(const std::string& path) {
  auto cfg = train::load_run_config(path);
  REQUIRE(cfg.has_value());
  auto rc = train::parse_run_config(*cfg, "runs/x");
  REQUIRE_FALSE(rc.has_value());
  return rc.err();
}

} // namespace

TEST_CASE("malformed configs are rejected with exit code 2") {
  test::temp_dir dir;
  std::string cfg = test::tiny_config(dir.path());
  CHECK(test::run_config(dir.path(), "bad", cfg, {"train_batch_size=\"eight\""}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"train_bach_size=8"}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"gradient_accumulation_steps=3"}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"optimizer.params.lr=\"fast\""}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"pipeline.stages=9"}) ==
        2); // more stages than layers
  CHECK(test::run_config(dir.path(), "bad", cfg,
                         {"train_stepz=1", "pipeline.schedule=\"zigzag\"", "novalue"}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"data.prepare.block_mb=0"}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"elasticity.enabled=true"}) == 2);
  CHECK(test::run_config(dir.path(), "fine", cfg, {"elasticity.enabled=false", "elasticity.max_train_batch_size=64",
                                                   "train_steps=1"}) == 0); // a disabled section is accepted
}

TEST_CASE(
    "a config with several problems reports them all in one call: unknown, missing, invalid") {
  test::temp_dir dir;
  const std::string path = dir.path() + "/run.toml";
  std::ofstream(path) << R"(train_stepz = 10
train_batch_sise = 32
steps_per_print = "often"

[model]
size = "tiny"

[pipeline]
schedule = "zigzag"

[scheduler]
type = "WarmupLinear"

[data]
vocab = "v.txt"
train_shards = "s"
)";
  const error err = parse_error(path);
  CHECK(err.code == errc::config);
  INFO(err.message);
  CHECK(err.message.rfind("8 problems in the configuration:\n", 0) == 0);
  const std::vector<std::string> expected{
      path + ":1: key 'train_stepz': unknown key (did you mean 'train_steps'?)",
      path + ":2: key 'train_batch_sise': unknown key (did you mean 'train_batch_size'?)",
      path + ": key 'train_batch_size': either 'train_batch_size' or "
             "'train_micro_batch_size_per_gpu' needs to be "
             "provided",
      path + ": key 'optimizer': required table is missing (type = Adam, AdamW or Lamb, with its "
             "params)",
      path + ": key 'train_steps': give the run's length as 'train_steps' (optimizer steps) or "
             "'epochs'",
      path + ":3: key 'steps_per_print': expected an integer, found a string",
      path + ":9: key 'pipeline.schedule': expected '1f1b', 'gpipe' or 'zb', got 'zigzag'",
      path + ":12: key 'scheduler.type': unknown scheduler \"WarmupLinear\" (known: WarmupLR, "
             "WarmupDecayLR, "
             "WarmupCosineLR, OneCycle, LRRangeTest)",
  };
  CHECK(problem_lines(err.message) == expected);
}

TEST_CASE("problems from the DeepSpeed JSON and --set flags name where the key came from, all in "
          "one call") {
  test::temp_dir dir;
  std::ofstream(dir.path() + "/ds.json")
      << R"({"train_batch_size": 16, "gradient_acumulation_steps": 2,
    "optimizer": {"type": "Adam", "params": {"lr": "fast"}}})";
  std::ofstream(dir.path() + "/run.toml") << "deepspeed_config = \"ds.json\"\ntrain_steps = 1\n"
                                             "[model]\nsize = \"tiny\"\n"
                                             "[optimizer]\ntype = \"Adam\"\n"
                                             "[data]\nvocab = \"v.txt\"\ntrain_shards = \"s\"\n";
  auto cfg = train::load_run_config(dir.path() + "/run.toml");
  REQUIRE(cfg.has_value());
  REQUIRE(cfg->set_override("pipeline.stagez=2").has_value());
  REQUIRE(cfg->set_override("optimizer.type=\"SGD\"").has_value());
  auto rc = train::parse_run_config(*cfg, "runs/x");
  REQUIRE_FALSE(rc.has_value());
  INFO(rc.err().message);
  const std::string json = dir.path() + "/ds.json";
  // The JSON's lr is not read: with an unknown optimizer type its params are not checked.
  const std::vector<std::string> expected{
      json + ": key 'gradient_acumulation_steps': unknown key (did you mean "
             "'gradient_accumulation_steps'?)",
      "--set pipeline.stagez=2: key 'pipeline.stagez': unknown key (did you mean 'stages'?)",
      "--set optimizer.type=\"SGD\": key 'optimizer.type': unknown optimizer \"SGD\" (known: Adam, "
      "AdamW, Lamb, OneBitAdam, ZeroOneAdam, OneBitLamb)",
  };
  CHECK(problem_lines(rc.err().message) == expected);
}

TEST_CASE("keys of a disabled fp16 section and of zero_optimization are checked too") {
  test::temp_dir dir;
  const std::string path = dir.path() + "/run.toml";
  std::ofstream(path) << R"(train_steps = 1
train_batch_size = 8
[model]
size = "tiny"
[optimizer]
type = "Adam"
[fp16]
enabeld = true
auto_cast = false
[zero_optimization]
stag = 2
overlap_comm = true
cpu_offload_param = false
[zero_optimization.offload_optimizer]
device = "cpu"
[zero_optimization.zeropp_loco_param]
err_beta = 0.8
[bf16]
immediate_grad_update = true
[data]
vocab = "v.txt"
train_shards = "s"
)";
  const error err = parse_error(path);
  INFO(err.message);
  // A misspelt `enabled` would otherwise train in fp32 without a word.
  const std::vector<std::string> expected{
      path + ":8: key 'fp16.enabeld': unknown key (did you mean 'fp16.enabled'?)",
      path + ":11: key 'zero_optimization.stag': unknown key (did you mean 'zero_optimization.stage'?)",
      // With the stage misspelt the run would be stage 0, where nothing can be offloaded.
      path + ":15: key 'zero_optimization.offload_optimizer.device': offloading the optimizer needs "
             "zero_optimization.stage >= 1 (as in DeepSpeed), got stage 0",
  };
  CHECK(problem_lines(err.message) == expected);
}

TEST_CASE("DeepSpeed's boolean zero_optimization, unsupported ZeRO stages, and half-precision master state") {
  test::temp_dir dir;
  const std::string base = "train_steps = 1\ntrain_batch_size = 8\n";
  const std::string rest = "[model]\nsize = \"tiny\"\n[optimizer]\ntype = \"Adam\"\n"
                           "[data]\nvocab = \"v.txt\"\ntrain_shards = \"s\"\n";
  auto parse = [&](const std::string& text) {
    const std::string path = dir.path() + "/run.toml";
    std::ofstream(path) << text;
    auto cfg = train::load_run_config(path);
    REQUIRE(cfg.has_value());
    return train::parse_run_config(*cfg, "runs/x");
  };
  // false is stage 0, true stage 1 (both accepted); stages 2 and 3 are accepted.
  auto off = parse(base + "zero_optimization = false\n" + rest);
  REQUIRE_MESSAGE(off.has_value(), (off.has_value() ? "" : off.err().message));
  CHECK(off->zero_stage == 0);
  auto on = parse(base + "zero_optimization = true\n" + rest);
  REQUIRE_MESSAGE(on.has_value(), (on.has_value() ? "" : on.err().message));
  CHECK(on->zero_stage == 1);
  auto two = parse(base + "[zero_optimization]\nstage = 2\n" + rest);
  REQUIRE_MESSAGE(two.has_value(), (two.has_value() ? "" : two.err().message));
  CHECK(two->zero_stage == 2);
  auto three = parse(base + "[zero_optimization]\nstage = 3\nstage3_param_persistence_threshold = 1e4\n"
                           "stage3_prefetch_bucket_size = 5e7\nmax_live_parameters = 1e6\n" + rest);
  REQUIRE_MESSAGE(three.has_value(), (three.has_value() ? "" : three.err().message));
  CHECK(three->zero_stage == 3);
  CHECK(three->stage3_persistence == 10000);
  CHECK(three->stage3_prefetch == 50'000'000);
  CHECK(three->stage3_max_live == 1'000'000);
  // Stage 3 with a pipeline, or with the gpipe schedule, is refused by name.
  auto piped = parse(base + "[zero_optimization]\nstage = 3\n[pipeline]\nstages = 2\n" + rest);
  REQUIRE_FALSE(piped.has_value());
  CHECK(piped.err().message.find("zero_optimization.stage") != std::string::npos);
  CHECK(piped.err().message.find("pipeline.stages = 2") != std::string::npos);
  auto gpipe = parse(base + "[zero_optimization]\nstage = 3\n[pipeline]\nschedule = \"gpipe\"\n" + rest);
  REQUIRE_FALSE(gpipe.has_value());
  CHECK(gpipe.err().message.find("1f1b") != std::string::npos);
  auto negative = parse(base + "[zero_optimization]\nstage = 3\nstage3_max_live_parameters = -1\n" + rest);
  REQUIRE_FALSE(negative.has_value());
  CHECK(negative.err().message.find("zero_optimization.stage3_max_live_parameters") != std::string::npos);
  // Masters in half cannot be honoured: an error naming the key.
  auto masters = parse(base + rest + "[fp16]\nenabled = true\nfp16_master_weights_and_grads = true\n");
  REQUIRE_FALSE(masters.has_value());
  CHECK(masters.err().message.find("fp16.fp16_master_weights_and_grads") != std::string::npos);
}

TEST_CASE("--resume without an earlier run is reported with the config's problems, exit code 2") {
  test::temp_dir dir;
  std::string cfg = test::tiny_config(dir.path());
  // tiny_config sets run_dir; without it --resume looks for runs/<name>-* and finds none.
  std::string without_run_dir;
  std::istringstream in(cfg);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("run_dir", 0) != 0) without_run_dir += line + "\n";
  REQUIRE(without_run_dir != cfg + "\n");
  CHECK(test::run_config(dir.path(), "never-ran-xyz", without_run_dir, {"train_stepz=1"}, true) == 2);
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

TEST_CASE("resuming with another precision or micro-batching is refused with exit code 2") {
  test::temp_dir dir;
  std::string cfg = test::tiny_config(dir.path());
  REQUIRE(test::run_config(dir.path(), "base", cfg, {"pipeline.stages=2", "train_steps=2"}) == 0);
  // Another stage count repartitions on load (test_run_resume.cpp).
  CHECK(test::run_config(dir.path(), "base", cfg, {"pipeline.stages=2", "train_steps=4", "bf16.enabled=true"}, true) == 2);
  CHECK(test::run_config(dir.path(), "base", cfg,
                         {"pipeline.stages=2", "train_steps=4", "train_micro_batch_size_per_gpu=4"}, true) == 2);
  CHECK(test::run_config(dir.path(), "base", cfg, {"pipeline.stages=2", "train_steps=4"}, true) == 0);
}

TEST_CASE("stages across processes: the layout from the process count, and what it refuses by name") {
  test::temp_dir dir;
  const std::string head = "train_steps = 1\ntrain_micro_batch_size_per_gpu = 2\n";
  const std::string rest = "[model]\nsize = \"tiny\"\n"
                           "[optimizer]\ntype = \"Adam\"\n[data]\nvocab = \"v.txt\"\ntrain_shards = \"s\"\n";
  auto read = [&](const std::string& text, int processes) {
    const std::string path = dir.path() + "/run.toml";
    std::ofstream(path) << head + text + rest;
    auto cfg = train::load_run_config(path);
    REQUIRE(cfg.has_value());
    config_problems problems;
    auto rc = train::read_run_config(*cfg, "runs/x", problems, processes);
    return std::make_pair(rc, problems.to_status());
  };
  // 4 processes, 2 stages: replicas of 2 processes, data-parallel 2 (the batch counts 2 ranks).
  auto [four, ok4] = read("train_batch_size = 4\n[pipeline]\nstages = 2\n", 4);
  REQUIRE_MESSAGE(ok4.has_value(), (ok4.has_value() ? "" : ok4.err().message));
  CHECK(four.pipe_processes == 2);
  CHECK(four.stages_across_processes());
  CHECK(four.batch.data_parallel_size == 2);
  // Two stages per process: the processes are data-parallel replicas, as before.
  auto [whole, okw] = read("train_batch_size = 8\n[pipeline]\nstages = 2\nstages_per_process = 2\n", 4);
  REQUIRE(okw.has_value());
  CHECK_FALSE(whole.stages_across_processes());
  CHECK(whole.batch.data_parallel_size == 4);
  // One process runs every stage whatever the key says.
  auto [alone, oka] = read("train_batch_size = 2\n[pipeline]\nstages = 2\n", 1);
  REQUIRE(oka.has_value());
  CHECK_FALSE(alone.stages_across_processes());
  // A process count that is not a multiple of the replica's processes names both.
  auto [three, bad3] = read("train_batch_size = 6\n[pipeline]\nstages = 2\n", 3);
  REQUIRE_FALSE(bad3.has_value());
  CHECK(bad3.err().message.find("a job of 3 processes cannot hold replicas of 2 processes") != std::string::npos);
  auto [odd, bad_odd] = read("train_batch_size = 4\n[pipeline]\nstages = 4\nstages_per_process = 3\n", 2);
  REQUIRE_FALSE(bad_odd.has_value());
  CHECK(bad_odd.err().message.find("pipeline.stages_per_process") != std::string::npos);
  // ZeRO over the replicas runs across processes, and so do CUDA ranks (their slots towards
  // another process on the host): the config takes both; the machine is checked at start-up.
  auto [zero, ok_zero] = read("train_batch_size = 4\n[zero_optimization]\nstage = 2\n[pipeline]\nstages = 2\n", 4);
  REQUIRE_MESSAGE(ok_zero.has_value(), (ok_zero.has_value() ? "" : ok_zero.err().message));
  CHECK(zero.zero_partitions());
  auto [cuda, ok_cuda] = read("train_batch_size = 4\n[devices]\nbackend = \"cuda\"\n[pipeline]\nstages = 2\n", 4);
  REQUIRE_MESSAGE(ok_cuda.has_value(), (ok_cuda.has_value() ? "" : ok_cuda.err().message));
  CHECK(cuda.stages_across_processes());
  CHECK(cuda.backend == "cuda");
}

TEST_CASE("the zero-bubble memory bounds: max_stashed at least the stage count, both keys only with zb") {
  test::temp_dir dir;
  auto read = [&](const std::string& pipeline) {
    const std::string path = dir.path() + "/run.toml";
    std::ofstream(path) << "train_steps = 1\ntrain_batch_size = 2\n[model]\nsize = \"tiny\"\n[optimizer]\n"
                           "type = \"Adam\"\n[data]\nvocab = \"v.txt\"\ntrain_shards = \"s\"\n[pipeline]\nstages = 2\n"
                        << pipeline;
    auto cfg = train::load_run_config(path);
    REQUIRE(cfg.has_value());
    config_problems problems;
    auto rc = train::read_run_config(*cfg, "runs/x", problems, 1);
    return std::make_pair(rc, problems.to_status());
  };
  auto [h2, ok] = read("schedule = \"zb\"\nmax_stashed = 3\n");
  REQUIRE_MESSAGE(ok.has_value(), (ok.has_value() ? "" : ok.err().message));
  CHECK(h2.max_stashed == 3);
  auto [low, bad_low] = read("schedule = \"zb\"\nmax_stashed = 1\n");
  REQUIRE_FALSE(bad_low.has_value());
  CHECK(bad_low.err().message.find("pipeline.max_stashed") != std::string::npos);
  CHECK(bad_low.err().message.find("at least pipeline.stages") != std::string::npos);
  CHECK(bad_low.err().message.find("got 1") != std::string::npos);
  auto [plain, bad_plain] = read("max_stashed = 3\n");
  REQUIRE_FALSE(bad_plain.has_value());
  CHECK(bad_plain.err().message.find("pipeline.max_stashed") != std::string::npos);
  CHECK(bad_plain.err().message.find("\"zb\"") != std::string::npos);
}
