// fp16 and bf16 working precision: a stage's working weights are f16/bf16 tensors
// (half the bytes of fp32), its parameter versions and gradients travel in half,
// and a few steps of a run stay within the precision's tolerance of fp32.
#include "tests/support/compare.hpp"
#include "tests/support/run_notes.hpp"
#include "tests/train/train_fixture.hpp"

#include "actors/train/stage/bert_stage.hpp"
#include "core/memory_stats.hpp"
#include "kernels/cpu/gemm_bf16.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

using namespace dsa;

namespace {

std::size_t total_bytes(const std::vector<tensor>& ts) {
  std::size_t n = 0;
  for (const auto& t : ts)
    n += t.nbytes();
  return n;
}

bert::bert_config stage_model() {
  bert::bert_config cfg = bert::bert_config_for(bert::model_size::tiny);
  cfg.vocab_size = 97;
  return cfg;
}


test::tolerance loss_tolerance(const std::string& precision) {
  return precision == "fp16" ? test::f16_run_loss : test::bf16_run_loss;
}

} // namespace

TEST_CASE("a stage's fp16/bf16 working weights are half tensors of half the bytes of fp32") {
  const bert::bert_config cfg = stage_model();
  const auto ranges = {bert::bert_range::layers(0, 1).with_embeddings(),
                       bert::bert_range::layers(1, 2).with_head()};
  for (const auto& range : ranges) {
    train::stage_shared shared;
    train::bert_stage f32({cfg, range, 1, train::precision::f32, 0}, shared);
    const std::size_t f32_bytes = total_bytes(f32.parameters());
    CHECK(f32_bytes == static_cast<std::size_t>(f32.part().parameters().count()) * 4);
    for (auto p : {train::precision::f16, train::precision::bf16}) {
      CAPTURE(train::precision_name(p));
      train::bert_stage half({cfg, range, 1, p, 0}, shared);
      const auto params = half.parameters();
      CHECK(total_bytes(params) * 2 == f32_bytes);
      for (const auto& t : params)
        CHECK(t.type() == train::working_dtype(p));
      // Gradients accumulate in f32 and go to the reducer rounded to half, in
      // place: no tensor is allocated, and every value is one the half type holds.
      for (const auto& e : half.part().parameters().entries()) {
        tensor g = e.grad; // a view: fill the accumulator with values no half type holds
        for (std::int64_t k = 0; k < g.numel(); ++k) g.data<float>()[k] = 1.0f + 1e-3f * k + 3e-7f;
      }
      const auto allocations = memory_usage_of(device::cpu()).allocations;
      const auto grads = half.gradients();
      CHECK(memory_usage_of(device::cpu()).allocations == allocations);
      for (const auto& t : grads) {
        CHECK(t.type() == dtype::f32);
        tensor back = train::cast_to(train::cast_to(t, train::working_dtype(p)), dtype::f32);
        CHECK(std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()) == 0);
      }
      // A parameter version in half is installed as is.
      std::vector<tensor> version;
      for (const auto& t : params) {
        tensor v = tensor::empty(t.shape(), t.type());
        std::fill(v.data<std::uint16_t>(), v.data<std::uint16_t>() + v.numel(),
                  std::uint16_t{0x3c00 | 1});
        version.push_back(v);
      }
      // Its last tensor is the next step's loss scale; without it the load fails.
      CHECK_THROWS_WITH(half.load_parameters(version), doctest::Contains("and the loss scale"));
      version.push_back(train::loss_scale_tensor(1024.5));
      half.load_parameters(version);
      CHECK(half.loss_scale() == 1024.5);
      for (const auto& t : half.parameters())
        CHECK(std::all_of(t.data<std::uint16_t>(), t.data<std::uint16_t>() + t.numel(),
                          [](std::uint16_t h) { return h == (0x3c00 | 1); }));
      version.back() = train::loss_scale_tensor(-1.0);
      CHECK_THROWS_WITH(half.load_parameters(version), doctest::Contains("loss scale -1"));
    }
  }
}

// Five steps with dropout off: fp16 and bf16 runs see the fp32 run's batches, and
// differ from it only by the rounding of weights and stashed activations.
TEST_CASE("five steps in fp16 and bf16 stay within tolerance of fp32") {
  test::temp_dir base;
  REQUIRE(test::run_config(base.path(), "fp32", test::tiny_config(base.path())) == 0);
  const auto want = test::run_losses(base.path() + "/run");
  REQUIRE(want.size() == 5);
  const auto want_model =
      test::load_run_checkpoint(base.path() + "/ckpt", "latest").groups.at("model");
  for (std::string precision : {"fp16", "bf16"}) {
    CAPTURE(precision);
    test::temp_dir dir;
    REQUIRE(test::run_config(dir.path(), precision, test::tiny_config(dir.path()),
                             {precision + ".enabled=true"}) == 0);
    const auto got = test::run_losses(dir.path() + "/run");
    REQUIRE(got.size() == want.size());
    DSA_CHECK_CLOSE(got.data(), want.data(), static_cast<std::int64_t>(got.size()),
                    loss_tolerance(precision));
    CHECK(got != want); // the precision really is in effect
    const auto model = test::load_run_checkpoint(dir.path() + "/ckpt", "latest").groups.at("model");
    for (const auto& [name, t] : want_model) {
      INFO(name);
      DSA_CHECK_CLOSE(model.at(name).data<float>(), t.data<float>(), t.numel(),
                      test::half_run_masters);
    }
  }
}

// bf16.cpu_gemm: the same five steps with every GEMM on bf16 operands (oneDNN, AMX or
// AVX512_BF16). Where it cannot run it is refused, naming the key and the reason.
TEST_CASE("bf16.cpu_gemm: five steps with bf16 GEMMs stay within tolerance of fp32, or are refused by key") {
  test::temp_dir base;
  REQUIRE(test::run_config(base.path(), "fp32", test::tiny_config(base.path())) == 0);
  const auto want = test::run_losses(base.path() + "/run");
  test::temp_dir dir;
  CHECK(test::run_config(dir.path(), "nobf16", test::tiny_config(dir.path()), {"bf16.cpu_gemm=true"}) == 2);
  std::string why;
  const bool supported = cpu::bf16_gemm_supported(&why);
  const int rc = test::run_config(dir.path(), "gemm", test::tiny_config(dir.path()),
                                  {"bf16.enabled=true", "bf16.cpu_gemm=true"});
  CHECK(!cpu::bf16_operands()); // the run's scope ended with it
  if (!supported) {
    CHECK(rc == 2);
    return test::skip_for_cpu("AVX512_BF16 or AMX", why);
  }
  REQUIRE(rc == 0);
  const auto got = test::run_losses(dir.path() + "/run");
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) MESSAGE("step " << i + 1 << ": fp32 " << want[i] << ", bf16 GEMM " << got[i]);
  DSA_CHECK_CLOSE(got.data(), want.data(), static_cast<std::int64_t>(got.size()), test::bf16_gemm_run_loss);
  std::ifstream in(dir.path() + "/run/train.log");
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(log.find("GEMMs on bf16 operands through oneDNN") != std::string::npos);
}

// debug.overflow_step: fp16's loss scaler skips exactly the injected step and halves the
// scale (the GPU check compares CPU and CUDA ranks through it); other precisions refuse it.
TEST_CASE("debug.overflow_step: fp16 skips that step and halves the scale; refused without fp16") {
  test::temp_dir dir;
  const std::string cfg = test::tiny_config(dir.path());
  REQUIRE(test::run_config(dir.path(), "fp16", cfg,
                           {"fp16.enabled=true", "fp16.initial_scale_power=8", "debug.overflow_step=2"}) == 0);
  std::ifstream in(dir.path() + "/run/metrics.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  REQUIRE(rows.size() == 5);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    CAPTURE(i);
    // Step k (counted from 0) is the metrics' step k + 1.
    CHECK(rows[i]["Train/Samples/skipped"].get<double>() == (i == 2 ? 1.0 : 0.0));
  }
  CHECK(rows[2]["Train/Samples/loss_scale"].get<double>() == rows[1]["Train/Samples/loss_scale"].get<double>() / 2);
  test::temp_dir other;
  CHECK(test::run_config(other.path(), "bf16", test::tiny_config(other.path()),
                         {"bf16.enabled=true", "debug.overflow_step=2"}) == 2);
  // Partitioned gradients (ZeRO-2 on one stage over two ranks) are not injected into: refused.
  CHECK(test::run_config(other.path(), "zero2", test::tiny_config(other.path()),
                         {"fp16.enabled=true", "debug.overflow_step=2", "devices.ranks=2", "zero_optimization.stage=2"}) ==
        2);
}

// model.checkpoint_activations through dsactor run: with dropout on, on two pipeline stages
// and in bf16, the losses and the checkpoint equal the plain run's bit for bit (each layer's
// forward is recomputed from its input with the same dropout streams); DeepSpeed's
// activation_checkpointing keys are accepted or refused by name.
TEST_CASE("model.checkpoint_activations: the same run bit for bit; activation_checkpointing keys checked") {
  const std::vector<std::vector<std::string>> variants{
      {"model.hidden_dropout=0.1", "model.attention_dropout=0.1"},
      {"model.hidden_dropout=0.1", "bf16.enabled=true", "pipeline.stages=2", "activation_checkpointing.cpu_checkpointing=true",
       "activation_checkpointing.number_checkpoints=4", "activation_checkpointing.synchronize_checkpoint_boundary=true"}};
  for (const auto& v : variants) {
    CAPTURE(fmt::format("{}", fmt::join(v, " ")));
    test::temp_dir plain_dir, ck_dir;
    REQUIRE(test::run_config(plain_dir.path(), "plain", test::tiny_config(plain_dir.path()), v) == 0);
    std::vector<std::string> with = v;
    with.push_back("model.checkpoint_activations=true");
    REQUIRE(test::run_config(ck_dir.path(), "ck", test::tiny_config(ck_dir.path()), with) == 0);
    CHECK(test::run_losses(ck_dir.path() + "/run") == test::run_losses(plain_dir.path() + "/run"));
    test::check_same_state(test::load_run_checkpoint(ck_dir.path() + "/ckpt", "latest"),
                           test::load_run_checkpoint(plain_dir.path() + "/ckpt", "latest"));
    // The host-memory plan counts one input per layer instead of its stash.
    auto planned_activations = [](const std::string& run_dir) {
      std::ifstream in(run_dir + "/train.log");
      const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto at = log.find(" + activations ");
      REQUIRE(at != std::string::npos);
      return log.substr(at + 15, log.find(" + ", at + 15) - at - 15);
    };
    const std::string ck_plan = planned_activations(ck_dir.path() + "/run"),
                      plain_plan = planned_activations(plain_dir.path() + "/run");
    CAPTURE(ck_plan);
    CAPTURE(plain_plan);
    CHECK(ck_plan != plain_plan);
    CHECK(std::stod(ck_plan) * (ck_plan.find("MiB") != std::string::npos ? 1024 : 1) <
          std::stod(plain_plan) * (plain_plan.find("MiB") != std::string::npos ? 1024 : 1));
  }
  {
    // The section without the switch: said in the log, not silently taken for checkpointing.
    test::temp_dir off;
    REQUIRE(test::run_config(off.path(), "off", test::tiny_config(off.path()),
                             {"activation_checkpointing.cpu_checkpointing=true"}) == 0);
    std::ifstream in(off.path() + "/run/train.log");
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(log.find("model.checkpoint_activations = true turns it on: it is off in this run") != std::string::npos);
  }
  test::temp_dir dir;
  const std::string cfg = test::tiny_config(dir.path());
  for (const char* key : {"activation_checkpointing.partition_activations=true",
                          "activation_checkpointing.contiguous_memory_optimization=true",
                          "activation_checkpointing.profile=true", "activation_checkpointing.number_checkpoints=0",
                          "activation_checkpointing.no_such_key=1"}) {
    CAPTURE(key);
    CHECK(test::run_config(dir.path(), "refused", cfg, {"model.checkpoint_activations=true", key}) == 2);
  }
}
