// 1-bit Adam, 0/1 Adam and 1-bit LAMB in `dsactor run` (optimizer.type OneBitAdam,
// ZeroOneAdam, OneBitLamb) at ZeRO stage 0: the warm-up on R ranks is the one-rank run with the same global
// batch; after it the reducers leave the gradients local and the shards exchange 1-bit
// compressed state; checkpoints resume the optimizers' state; bad settings are named.
#include "actors/train/config/deepspeed_json.hpp"
#include "actors/train/config/run_config.hpp"
#include "tests/train/compressed_run.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using namespace dsa;
using namespace dsa::test::compressed_run;

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
