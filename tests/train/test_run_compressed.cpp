// 1-bit Adam, 0/1 Adam and 1-bit LAMB in `dsactor run` (optimizer.type OneBitAdam,
// ZeroOneAdam, OneBitLamb): the warm-up on R ranks is the one-rank run with the same global
// batch; after it the reducers leave the gradients local and the shards exchange 1-bit
// compressed state; checkpoints resume the optimizers' state; bad settings are named.
#include "actors/train/deepspeed_json.hpp"
#include "actors/train/run_config.hpp"
#include "tests/support/compare.hpp"
#include "tests/train/train_fixture.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

using namespace dsa;

namespace {

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

ckpt::named_tensors final_model(const test::temp_dir& dir, const char* step = "latest") {
  return test::load_run_checkpoint(dir.path() + "/ckpt", step).groups.at("model");
}

ckpt::named_tensors train_model(const std::vector<std::string>& overrides) {
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "c", test::tiny_config(dir.path()), overrides) == 0);
  return final_model(dir);
}

std::string read_log(const test::temp_dir& dir) {
  std::ifstream in(dir.path() + "/run/train.log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void check_close(const ckpt::named_tensors& got, const ckpt::named_tensors& want, const test::tolerance& tolerance) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    DSA_CHECK_CLOSE(got.at(name).data<float>(), t.data<float>(), t.numel(), tolerance);
  }
}

void check_equal(const ckpt::named_tensors& got, const ckpt::named_tensors& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(got.at(name).nbytes() == t.nbytes());
    CHECK(std::memcmp(got.at(name).raw_data(), t.raw_data(), t.nbytes()) == 0);
  }
}

const std::vector<std::vector<std::string>> optimizers = {
    {"optimizer.type=\"OneBitAdam\"", "optimizer.params.freeze_step=2"},
    {"optimizer.type=\"ZeroOneAdam\"", "optimizer.params.var_freeze_step=2", "optimizer.params.var_update_scaler=1"},
    {"optimizer.type=\"OneBitLamb\"", "optimizer.params.freeze_step=2"},
};

} // namespace

TEST_CASE("compressed optimizers warming up on 2 and 4 ranks equal one rank with the same global batch") {
  for (const char* type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    CAPTURE(type);
    // The 5 steps stay in the warm-up: gradients averaged in full precision as for Adam.
    const std::string t = type;
    const std::vector<std::string> keep{fmt::format("optimizer.type=\"{}\"", type),
                                        t == "ZeroOneAdam" ? "optimizer.params.var_freeze_step=100"
                                                           : "optimizer.params.freeze_step=100"};
    auto one = train_model(keep);
    for (int ranks : {2, 4}) {
      CAPTURE(ranks);
      check_close(train_model(with(keep, {fmt::format("devices.ranks={}", ranks)})), one, test::layout_equivalence);
    }
  }
}

TEST_CASE("compressed phase: the reducers leave gradients local, each shard exchanges 1-bit momentum") {
  for (const auto& o : optimizers) {
    CAPTURE(o.front());
    test::temp_dir dir;
    REQUIRE(test::run_config(dir.path(), "c", test::tiny_config(dir.path()),
                             with(o, {"devices.ranks=2", "train_steps=6", "comms_logger.enabled=true", "comms_logger.debug=true"})) == 0);
    const std::string log = read_log(dir);
    const auto at = log.find("comms_logger summary");
    REQUIRE(at != std::string::npos);
    const std::string table = log.substr(at);
    INFO(table);
    // Two warm-up steps summed by the reducer; after them no gradient allreduce, but the
    // shard's compressed exchanges.
    CHECK(table.find("reducer 0 of rank 0 x2") != std::string::npos);
    CHECK(table.find("compressed_all_reduce") != std::string::npos);
    CHECK(log.find("compressed communication:") != std::string::npos);
    // The warm-up's allreduces between the 2 in-process ranks went through shared memory,
    // which the transport does not count: the line says so.
    CHECK(log.find("gradient allreduces went through shared memory and are not counted") != std::string::npos);
    // 1-bit Adam exchanges each of BERT's two groups, 1-bit LAMB all its momentum at once.
    if (o.front().find("ZeroOneAdam") == std::string::npos) {
      const int per_step = o.front().find("OneBitLamb") != std::string::npos ? 1 : 2;
      CHECK(log.find(fmt::format("4 of the steps kept their gradients local and ran {} 1-bit exchanges", 4 * per_step)) !=
            std::string::npos);
    }
    // The model learns something and stays finite.
    auto model = final_model(dir);
    for (const auto& [name, t] : model) {
      INFO(name);
      const float* p = t.data<float>();
      for (std::int64_t i = 0; i < t.numel(); ++i) REQUIRE(std::isfinite(p[i]));
    }
  }
  // Over the transport every byte is counted, and the line has no such note.
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "c", test::tiny_config(dir.path()),
                           with(optimizers.front(), {"devices.ranks=2", "train_steps=3",
                                                     "devices.shared_memory_allreduce=false"})) == 0);
  const std::string log = read_log(dir);
  CHECK(log.find("communication: this rank sent") != std::string::npos);
  CHECK(log.find("went through shared memory") == std::string::npos);
}

TEST_CASE("compressed optimizers resume from a checkpoint as the uninterrupted run (one rank: no error buffers)") {
  // One rank exchanges nothing, so a resumed run must continue bit for bit: the moments,
  // step count, LAMB's coefficients, scalings, factors and fresh variance all restored.
  for (const auto& o : optimizers) {
    CAPTURE(o.front());
    test::temp_dir full, part;
    REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()), with(o, {"train_steps=6"})) == 0);
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), with(o, {"train_steps=4"})) == 0);
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), with(o, {"train_steps=6"}),
                             /*resume=*/true) == 0);
    check_equal(final_model(part, "6"), final_model(full, "6"));
  }
}

TEST_CASE("compressed optimizers on 2 ranks: each rank's 1-bit error buffers in its own file, resumed bit for bit") {
  for (const auto& o : optimizers) {
    CAPTURE(o.front());
    const auto two = with(o, {"devices.ranks=2"});
    test::temp_dir full, part, reset;
    REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()), with(two, {"train_steps=6"})) == 0);
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), with(two, {"train_steps=4"})) == 0);
    auto saved = test::load_run_checkpoint(part.path() + "/ckpt", "4");
    // One pair of buffers per exchanged group: BERT's two groups, or 1-bit LAMB's one fused
    // group (one exchange of the whole momentum, as DeepSpeed's OnebitLamb).
    const bool fused = o.front().find("OneBitLamb") != std::string::npos;
    const std::vector<std::string> names =
        fused ? std::vector<std::string>{"all.worker", "all.server"}
              : std::vector<std::string>{"decay.worker", "decay.server", "no_decay.worker", "no_decay.server"};
    for (const char* group : {"onebit_errors_0_rank0", "onebit_errors_0_rank1"}) {
      INFO(group);
      REQUIRE(saved.groups.count(group) == 1);
      for (const auto& name : names) CHECK(saved.groups.at(group).count(name) == 1);
      for (const char* absent : {"decay.worker", "all.worker"})
        if (std::find(names.begin(), names.end(), absent) == names.end()) CHECK(saved.groups.at(group).count(absent) == 0);
    }
    // The ranks' errors differ (each compressed its own momentum).
    const tensor& w0 = saved.groups.at("onebit_errors_0_rank0").at(names.front());
    const tensor& w1 = saved.groups.at("onebit_errors_0_rank1").at(names.front());
    CHECK(std::memcmp(w0.raw_data(), w1.raw_data(), w0.nbytes()) != 0);
    REQUIRE(test::run_config(part.path(), "part", test::tiny_config(part.path()), with(two, {"train_steps=6"}),
                             /*resume=*/true) == 0);
    check_equal(final_model(part, "6"), final_model(full, "6"));
    // DeepSpeed's behaviour on request: the errors restart at zero, and the run departs.
    REQUIRE(test::run_config(reset.path(), "reset", test::tiny_config(reset.path()), with(two, {"train_steps=4"})) == 0);
    REQUIRE(test::run_config(reset.path(), "reset", test::tiny_config(reset.path()),
                             with(two, {"train_steps=6", "checkpoint.load_error_feedback=false"}), /*resume=*/true) == 0);
    const auto a = final_model(reset, "6"), b = final_model(full, "6");
    const tensor& x = a.at("bert.encoder.layer.0.attention.self.query.weight");
    const tensor& y = b.at("bert.encoder.layer.0.attention.self.query.weight");
    CHECK(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0);
    CHECK(read_log(reset).find("1-bit error buffers start at zero (checkpoint.load_error_feedback = false)") !=
          std::string::npos);
  }
}

TEST_CASE("dummy_first_step: the first step updates nothing, as DeepSpeed's initialization step (all three)") {
  // The untrained model: one step at lr 0.
  auto untouched = train_model({"train_steps=1", "optimizer.params.lr=0.0", "scheduler.type=\"WarmupLR\"",
                                "scheduler.params.warmup_max_lr=0.0", "scheduler.params.warmup_num_steps=1"});
  for (const char* type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    for (const char* ranks : {"devices.ranks=1", "devices.ranks=2"}) {
      CAPTURE(type);
      CAPTURE(ranks);
      const std::string t = fmt::format("optimizer.type=\"{}\"", type);
      auto dummy = train_model({ranks, "train_steps=1", t, "optimizer.params.dummy_first_step=true"});
      check_equal(dummy, untouched);
      auto trained = train_model({ranks, "train_steps=1", t});
      const tensor& x = trained.at("bert.encoder.layer.0.attention.self.query.weight");
      const tensor& y = untouched.at("bert.encoder.layer.0.attention.self.query.weight");
      CHECK(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0);
    }
  }
}

TEST_CASE("compressed optimizers: bad settings and ZeRO stage 3 or offload with them are refused, naming the key") {
  test::temp_dir dir;
  // The configuration's error message, or "" when it is accepted.
  const auto problem = [&](const std::vector<std::string>& o) -> std::string {
    const std::string path = dir.path() + "/bad.toml";
    std::ofstream(path) << test::tiny_config(dir.path());
    auto cfg = dsa::train::load_run_config(path);
    REQUIRE(cfg.has_value());
    for (const auto& s : o) REQUIRE(cfg->set_override(s).has_value());
    auto rc = dsa::train::parse_run_config(*cfg, dir.path() + "/run");
    return rc.has_value() ? std::string() : rc.err().message;
  };
  struct bad {
    std::vector<std::string> overrides;
    std::vector<std::string> named; // what the message must say
  };
  const bad cases[] = {
      {{"optimizer.type=\"OneBitAdam\"", "optimizer.params.freeze_steps=3"},
       {"optimizer.params.freeze_steps", "did you mean 'freeze_step'"}},
      {{"optimizer.type=\"OneBitAdam\"", "optimizer.params.amsgrad=true"}, {"optimizer.params.amsgrad"}},
      {{"optimizer.type=\"OneBitAdam\"", "optimizer.params.adam_w_mode=true"}, {"optimizer.params.adam_w_mode"}},
      {{"optimizer.type=\"OneBitAdam\"", "optimizer.params.freeze_step=-1"}, {"optimizer.params.freeze_step", ">= 0"}},
      {{"optimizer.type=\"ZeroOneAdam\"", "optimizer.params.local_step_clipper=0"},
       {"optimizer.params.local_step_clipper", ">= 1"}},
      {{"optimizer.type=\"ZeroOneAdam\"", "optimizer.params.var_update_scaler=0"},
       {"optimizer.params.var_update_scaler", ">= 1"}},
      {{"optimizer.type=\"OneBitLamb\"", "optimizer.params.factor_min=5.0"},
       {"optimizer.params.factor_min", "<= factor_max (4"}},
      {{"optimizer.type=\"OneBitLamb\"", "optimizer.params.factor_max=0.25"},
       {"optimizer.params.factor_max", ">= factor_min (0.5"}},
      {{"optimizer.type=\"OneBitLamb\"", "optimizer.params.coeff_beta=1.0"}, {"optimizer.params.coeff_beta"}},
      // The three run over ZeRO's partitions (stages 1 and 2), never stage 3, nor offloaded.
      {{"optimizer.type=\"ZeroOneAdam\"", "devices.ranks=2", "zero_optimization.stage=3"},
       {"zero_optimization.stage", "ZeroOneAdam runs with ZeRO stages 0, 1 and 2"}},
      {{"optimizer.type=\"OneBitLamb\"", "devices.ranks=2", "zero_optimization.stage=3"},
       {"zero_optimization.stage", "OneBitLamb"}},
      {{"optimizer.type=\"OneBitAdam\"", "devices.ranks=2", "zero_optimization.stage=2",
        "zero_optimization.offload_optimizer.device=\"cpu\""},
       {"zero_optimization.offload_optimizer.device", "OneBitAdam keeps its state in memory"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.overrides.back());
    const std::string message = problem(c.overrides);
    INFO(message);
    REQUIRE_FALSE(message.empty());
    for (const auto& part : c.named) CHECK(message.find(part) != std::string::npos);
  }
  // The run itself exits 2 on such a config.
  CHECK(test::run_config(dir.path(), "bad", test::tiny_config(dir.path()),
                         {"optimizer.type=\"OneBitAdam\"", "optimizer.params.amsgrad=true"}) == 2);
  // DeepSpeed's backend keys are accepted.
  CHECK(problem({"optimizer.type=\"OneBitAdam\"", "optimizer.params.comm_backend_name=\"nccl\"",
                 "optimizer.params.cuda_aware=false"}).empty());
}

namespace {
// 1-bit Adam through the warm-up (2 steps) into the compressed phase, with fp16 loss scaling,
// a warm-up schedule and clipping (local steps clip with each rank's own norm and OR-reduce overflows).
const std::vector<std::string> onebit_zero_base = {
    "optimizer.type=\"OneBitAdam\"", "optimizer.params.freeze_step=2", "optimizer.params.weight_decay=0.01",
    "fp16.enabled=true", "fp16.initial_scale_power=8", "gradient_clipping=0.05",
    // Position rows past the data's 32 tokens: masked after every exchange.
    "model.max_position_embeddings=48"};
// A learning rate that changes every step (the shard takes each step's).
const std::vector<std::string> warmup_lr = {"scheduler.type=\"WarmupLR\"", "scheduler.params.warmup_max_lr=2e-3",
                                            "scheduler.params.warmup_num_steps=8"};

// The run's model and every rank's 1-bit error buffers, by checkpoint group.
std::map<std::string, ckpt::named_tensors> model_and_errors(const test::temp_dir& dir, const char* step) {
  auto saved = test::load_run_checkpoint(dir.path() + "/ckpt", step);
  std::map<std::string, ckpt::named_tensors> out;
  for (auto& [group, tensors] : saved.groups)
    if (group == "model" || group.rfind("onebit_errors_", 0) == 0) out[group] = std::move(tensors);
  return out;
}
} // namespace

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

namespace {
// 0/1 Adam with var_update_scaler 1: variance steps 1, 2 and 4, compressed gradients on 3, 5
// and 6; then local steps, synchronising on 7 and 8 and every 4 steps from there (9-11
// local only, 12 synchronises). Clipping and the position mask as for 1-bit Adam.
const std::vector<std::string> fp16_scaled = {"fp16.enabled=true", "fp16.initial_scale_power=8"};
const std::vector<std::string> zeroone_zero_base = {
    "optimizer.type=\"ZeroOneAdam\"", "optimizer.params.var_freeze_step=6", "optimizer.params.var_update_scaler=1",
    "optimizer.params.local_step_scaler=1", "optimizer.params.local_step_clipper=4",
    "optimizer.params.weight_decay=0.01", "gradient_clipping=0.05", "model.max_position_embeddings=48",
    "scheduler.type=\"WarmupLR\"", "scheduler.params.warmup_max_lr=2e-3",
    "scheduler.params.warmup_num_steps=8"};
} // namespace

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
