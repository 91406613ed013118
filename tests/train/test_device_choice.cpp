// devices.backend and devices.device: what a run is refused with, checked against made-up
// machines (no GPU needed), and `dsactor run` stopping at start-up with exit code 2.
#include "actors/train/config/deepspeed_json.hpp"
#include "actors/train/config/run_config.hpp"
#include "actors/train/memory/memory_accounting.hpp"
#include "actors/train/stage/device_choice.hpp"
#include "tests/train/train_fixture.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

using namespace dsa;

namespace {

// A config a CUDA rank runs: the optimizer stepped on the CPU shard (offload_optimizer
// "cpu", ZeRO stage 1).
train::run_config with_backend(const std::string& backend, std::int64_t device = -1) {
  train::run_config rc;
  rc.backend = backend;
  rc.device = device;
  rc.offload.device = train::offload_device::cpu;
  rc.zero_stage = 1;
  return rc;
}

train::gpu_facts machine(std::initializer_list<train::gpu_facts::device> devices) {
  train::gpu_facts f;
  f.built = true;
  f.devices = devices;
  f.probe = fmt::format("{} CUDA device(s)", f.devices.size());
  return f;
}

const train::gpu_facts::device h200{"NVIDIA H200", 9, 0, std::int64_t{140} << 30};
const train::gpu_facts::device a100{"NVIDIA A100-SXM4-80GB", 8, 0, std::int64_t{80} << 30};

// The message of a choice that must be refused, which must be a config error (exit 2).
std::string refusal(const train::run_config& rc, int local_rank, const train::gpu_facts& facts) {
  auto c = train::choose_device(rc, local_rank, facts);
  REQUIRE_FALSE(c.has_value());
  CHECK(c.err().code == errc::config);
  return c.err().message;
}

} // namespace

TEST_CASE("devices.backend = cpu runs on the CPU whatever the machine has") {
  for (const auto& facts : {train::gpu_facts{}, machine({h200})}) {
    auto c = train::choose_device(with_backend("cpu"), 3, facts);
    REQUIRE(c.has_value());
    CHECK(c->device == train::stage_device::cpu);
    CHECK(c->index == -1);
  }
}

TEST_CASE("devices.backend = cuda is refused naming why: no CUDA code, no device, an index out of range, an old GPU") {
  train::gpu_facts unbuilt;
  unbuilt.probe = "this build has no CUDA code";
  CHECK(refusal(with_backend("cuda"), 0, unbuilt).find("this build has no CUDA code") != std::string::npos);

  train::gpu_facts no_driver;
  no_driver.built = true;
  no_driver.probe = "no usable CUDA device: cudaGetDeviceCount: CUDA driver version is insufficient";
  CHECK(refusal(with_backend("cuda"), 0, no_driver).find("driver version is insufficient") != std::string::npos);

  // The default index is the local rank; an explicit one wins.
  const std::string by_rank = refusal(with_backend("cuda"), 2, machine({h200, h200}));
  CHECK(by_rank.find("devices.device = 2 (the local rank 2): only 2 CUDA device(s) visible") != std::string::npos);
  const std::string explicit_index = refusal(with_backend("cuda", 5), 0, machine({h200}));
  CHECK(explicit_index.find("devices.device = 5: only 1 CUDA device(s) visible") != std::string::npos);

  const std::string old = refusal(with_backend("cuda", 1), 0, machine({h200, a100}));
  CHECK(old.find("cuda:1 (NVIDIA A100-SXM4-80GB, sm_80") != std::string::npos);
  CHECK(old.find("compute capability 8.0") != std::string::npos);
}

TEST_CASE("a usable GPU is chosen and named: by the local rank, or devices.device") {
  auto by_rank = train::choose_device(with_backend("cuda"), 1, machine({h200, h200}));
  REQUIRE(by_rank.has_value());
  CHECK(by_rank->device == train::stage_device::cuda);
  CHECK(by_rank->index == 1);
  CHECK(by_rank->description == "cuda:1 (NVIDIA H200, sm_90, 140.0 GiB)");
  auto named = train::choose_device(with_backend("cuda", 0), 1, machine({h200, h200}));
  REQUIRE(named.has_value());
  CHECK(named->index == 0);
}

TEST_CASE("what a CUDA rank does not run yet is refused by its key, before the machine is looked at") {
  const train::gpu_facts gpu = machine({h200});
  // The GPU-resident optimizer (offload_optimizer "none"): Adam and AdamW over a whole stage.
  train::run_config rc = with_backend("cuda");
  rc.offload.device = train::offload_device::none;
  rc.zero_stage = 0;
  for (const auto type : {optim::optimizer_type::adam, optim::optimizer_type::adamw}) {
    rc.optimizer.type = type;
    CHECK(train::choose_device(rc, 0, gpu).has_value());
  }
  rc.optimizer.type = optim::optimizer_type::lamb;
  const std::string lamb = refusal(rc, 0, gpu);
  CHECK(lamb.find("runs Adam and AdamW, not optimizer.type = \"Lamb\"") != std::string::npos);
  CHECK(lamb.find("offload_optimizer.device = \"cpu\"") != std::string::npos);
  // The same refusal on a machine without a GPU: the config is wrong either way.
  CHECK(refusal(rc, 0, train::gpu_facts{}).find("not optimizer.type") != std::string::npos);
  rc.optimizer.type = optim::optimizer_type::onebit_adam;
  CHECK(refusal(rc, 0, gpu).find("not optimizer.type = \"OneBitAdam\"") != std::string::npos);
  rc.optimizer.type = optim::optimizer_type::adamw;
  rc.zero_stage = 1;
  rc.batch.data_parallel_size = 2;
  CHECK(refusal(rc, 0, gpu).find("ZeRO partitions of the GPU-resident optimizer") != std::string::npos);
  rc.offload.device = train::offload_device::cpu; // partitioned in host memory: runs
  CHECK(train::choose_device(rc, 0, gpu).has_value());

  rc = with_backend("cuda");
  rc.zero_stage = 3; // ZeRO-3 on a CUDA rank: the partitions step on the CPU shard
  rc.offload.device = train::offload_device::none;
  const std::string zero3 = refusal(rc, 0, gpu);
  CHECK(zero3.find("zero_optimization.stage = 3") != std::string::npos);
  CHECK(zero3.find("offload_optimizer.device = \"cpu\" or \"nvme\"") != std::string::npos);
  for (const auto device : {train::offload_device::cpu, train::offload_device::nvme}) {
    rc.offload.device = device;
    CHECK(train::choose_device(rc, 0, gpu).has_value());
  }
  rc = with_backend("cuda");
  rc.zero_stage = 2;
  rc.batch.data_parallel_size = 2; // ZeRO-2 over two ranks on one pipeline stage: partitioned gradients, runs
  CHECK(train::choose_device(rc, 0, gpu).has_value());
  rc.stages = 2; // with pipeline stages the gradients stay whole: runs
  CHECK(train::choose_device(rc, 0, gpu).has_value());

  rc = with_backend("cuda");
  rc.model.norm = bert::layer_norm_placement::pre; // pre-LN runs on the GPU
  CHECK(train::choose_device(rc, 0, gpu).has_value());
  rc = with_backend("cuda");
  rc.model.head = bert::head_kind::squad; // fine-tuning runs on a CUDA rank
  CHECK(train::choose_device(rc, 0, gpu).has_value());
  rc = with_backend("cuda");
  rc.model.memory.gelu_checkpoint = true; // the memory flags recompute on the GPU
  rc.model.memory.attn_dropout_checkpoint = true;
  rc.model.memory.normalize_invertible = true;
  CHECK(train::choose_device(rc, 0, gpu).has_value());
  rc = with_backend("cuda");
  rc.model.checkpoint_activations = true; // recomputed on the GPU as on the CPU
  CHECK(train::choose_device(rc, 0, gpu).has_value());
  rc.cpu_checkpointing = true; // but the checkpoints are not moved to host memory
  CHECK(refusal(rc, 0, gpu).find("activation_checkpointing.cpu_checkpointing") != std::string::npos);
  rc = with_backend("cuda");
  rc.schedule = "zb"; // the GPU stage does not split its backward
  CHECK(refusal(rc, 0, gpu).find("pipeline.schedule = \"zb\"") != std::string::npos);
  // A CPU rank runs every one of them.
  rc.backend = "cpu";
  CHECK(train::choose_device(rc, 0, gpu).has_value());
}

TEST_CASE("devices.backend and devices.device are checked with the config, and dsactor run stops before the run "
          "directory") {
  test::temp_dir dir;
  const std::string cfg = test::tiny_config(dir.path());
  CHECK(test::run_config(dir.path(), "bad", cfg, {"devices.backend=\"gpu\""}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"devices.device=-2"}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"devices.device=\"first\""}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg, {"devices.deterministic=\"yes\""}) == 2);
  // The zero-bubble schedule's keys: its bound needs it, and what it does not run yet (ZeRO-2
  // on one stage partitions the gradients during the backward) is refused.
  CHECK(test::run_config(dir.path(), "bad", cfg, {"pipeline.max_deferred_w=2"}) == 2);
  CHECK(test::run_config(dir.path(), "bad", cfg,
                         {"pipeline.schedule=\"zb\"", "devices.ranks=2", "zero_optimization.stage=2"}) == 2);
  // LAMB on the GPU-resident optimizer, refused on any machine: exit 2, no run directory.
  CHECK(test::run_config(dir.path(), "gpu", cfg, {"devices.backend=\"cuda\"", "optimizer.type=\"Lamb\""}) == 2);
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/run")); // tiny_config's run_dir
}

TEST_CASE("devices.deterministic reaches the stage options; a CPU rank runs it unchanged") {
  test::temp_dir dir;
  std::ofstream(dir.path() + "/run.toml") << "train_steps = 1\ntrain_batch_size = 2\n[model]\nsize = \"tiny\"\n"
                                              "[optimizer]\ntype = \"Adam\"\n[data]\nvocab = \"v.txt\"\n"
                                              "train_shards = \"s\"\n[devices]\ndeterministic = true\n";
  auto cfg = train::load_run_config(dir.path() + "/run.toml");
  REQUIRE_MESSAGE(cfg.has_value(), (cfg.has_value() ? "" : cfg.err().message));
  auto rc = train::parse_run_config(*cfg, "runs/x");
  REQUIRE_MESSAGE(rc.has_value(), (rc.has_value() ? "" : rc.err().message));
  CHECK(rc->deterministic);
  // A CPU run with it is the run without it, bit for bit (CPU ranks are deterministic either way).
  const std::string tiny = test::tiny_config(dir.path());
  REQUIRE(test::run_config(dir.path(), "plain", tiny, {}) == 0);
  const std::vector<double> plain = test::run_losses(dir.path() + "/run");
  REQUIRE(test::run_config(dir.path(), "det", tiny, {"devices.deterministic=true"}) == 0);
  const std::vector<double> det = test::run_losses(dir.path() + "/run");
  REQUIRE(!plain.empty());
  CHECK(det == plain);
}

TEST_CASE("a CUDA rank's planned device bytes for its model states follow the optimizer's placement") {
  train::run_config rc = with_backend("cuda");
  rc.working = train::precision::bf16;
  // A 10 x 100 matrix and a 100-element bias.
  std::vector<bert::param_spec> specs(2);
  specs[0].name = "w";
  specs[0].shape = {10, 100};
  specs[1].name = "b";
  specs[1].shape = {100};
  // The part: each f32 gradient, the matrix's bf16 working copy, the bias in f32 (no masters).
  CHECK(train::cuda_model_state_bytes(rc, specs) == 1000 * (4 + 2) + 100 * (4 + 4));
  // With the optimizer on the GPU also its master, two moments and working copy of each,
  // and its gradient scratch of the largest tensor.
  rc.offload.device = train::offload_device::none;
  CHECK(train::cuda_model_state_bytes(rc, specs) == 1000 * 6 + 100 * 8 + 1100 * (4 + 8 + 2) + 1000 * 4);
  rc.working = train::precision::f32; // f32 values read as they are, no working copies anywhere
  CHECK(train::cuda_model_state_bytes(rc, specs) == 1100 * 8 + 1100 * 12 + 1000 * 4);
  // Nothing on a CPU rank to report.
  CHECK(train::device_memory_report(train::device_choice{}).empty());
}

TEST_CASE("a CUDA rank's ZeRO-3 device bytes: the persistent values, a window of parts, two parts' gradients") {
  train::run_config rc = with_backend("cuda");
  rc.working = train::precision::bf16;
  rc.offload.device = train::offload_device::cpu;
  rc.zero_stage = 3;
  rc.batch.data_parallel_size = 2; // partitions to fetch from (on one rank stage 3 runs as stage 0)
  rc.stage3_persistence = 100;     // the vectors and the 8 x 8 matrix stay whole on the device
  auto spec = [](std::string name, shape_t shape) {
    bert::param_spec s;
    s.name = std::move(name);
    s.shape = std::move(shape);
    return s;
  };
  const std::vector<bert::param_spec> specs{
      spec(bert::word_embeddings_name(), {50, 8}), // 400 elements, tied to the head
      spec("bert.embeddings.LayerNorm.weight", {8}),
      spec("bert.encoder.layer.0.attention.self.query.weight", {8, 8}),
      spec("bert.encoder.layer.0.attention.self.query.bias", {8}),
      spec("bert.encoder.layer.1.intermediate.dense.weight", {32, 8}), // 256 elements
      spec("cls.predictions.bias", {50}),
  };
  const std::int64_t word_grad = 400 * 4; // bound from the head's backward to the embeddings'
  const std::int64_t persistent = 2 * 64 + 4 * (8 + 8 + 50); // the query matrix (bf16) and the f32 vectors
  // The values each part binds: the embeddings' and the head's the word embedding (400 in
  // bf16), layer 1's its matrix, layer 0's nothing (persistent). The gradients of the two
  // largest: layer 1's matrix and layer 0's query.
  const std::int64_t two_grads = 256 * 4 + (64 + 8) * 4;
  // The default stage3_prefetch_bucket_size holds every part: all four may be bound at once.
  CHECK(train::cuda_zero3_window_limit(rc, specs) == 4);
  CHECK(train::cuda_zero3_window(rc, specs) == 4);
  CHECK(train::cuda_model_state_bytes(rc, specs) == persistent + (800 + 800 + 512) + two_grads + word_grad);
  // Its pinned host buffers: the largest part's f32 gradients (the embeddings' 408 elements)
  // and an upload buffer per part of the window, each the persistent tensors and the largest
  // part's gathered ones, in bf16, each tensor padded to 64 bytes: the persistent 64, 8, 8 and
  // 50 elements take 128 + 64 + 64 + 128 bytes, the word embedding's 800 bytes 832.
  CHECK(train::cuda_zero3_staging_bytes(rc, specs) == 408 * 4 + 4 * (384 + 832));
  rc.zero3_device_window = 1;
  CHECK(train::cuda_zero3_staging_bytes(rc, specs) == 408 * 4 + (384 + 832));
  rc.zero3_device_window = 0;
  // The window follows stage3_prefetch_bucket_size in parts of a layer's gathered elements
  // (layer 1's 256; the embeddings and the head are counted once each, as they come).
  rc.stage3_prefetch = 255;
  CHECK(train::cuda_zero3_window_limit(rc, specs) == 1);
  CHECK(train::cuda_model_state_bytes(rc, specs) == persistent + 800 + two_grads + word_grad);
  rc.stage3_prefetch = 256;
  CHECK(train::cuda_zero3_window_limit(rc, specs) == 2);
  CHECK(train::cuda_model_state_bytes(rc, specs) == persistent + 1600 + two_grads + word_grad);
  // The plan's choice, within the limit.
  rc.stage3_prefetch = 50'000'000;
  rc.zero3_device_window = 3;
  CHECK(train::cuda_zero3_window(rc, specs) == 3);
  CHECK(train::cuda_model_state_bytes(rc, specs) == persistent + (800 + 800 + 512) + two_grads + word_grad);
  rc.zero3_device_window = 2;
  CHECK(train::cuda_model_state_bytes(rc, specs) == persistent + 1600 + two_grads + word_grad);
  rc.zero3_device_window = 0;
  // Everything persistent: the values whole, no window; two parts' gradients on top.
  rc.stage3_persistence = 1000;
  const std::int64_t whole = 2 * (400 + 64 + 256) + 4 * (8 + 8 + 50);
  CHECK(train::cuda_model_state_bytes(rc, specs) == whole + two_grads + word_grad);
  // SQuAD's head reads no word embedding: its gradient is the embeddings' own, no tied one.
  rc.model.head = bert::head_kind::squad;
  CHECK(train::cuda_model_state_bytes(rc, specs) == whole + (8 + 400) * 4 + 256 * 4);
  // One rank, the weights not on NVMe: nothing is partitioned, every value and gradient resident.
  rc.batch.data_parallel_size = 1;
  rc.zero_stage = 0;
  const std::int64_t stage0 = train::cuda_model_state_bytes(rc, specs);
  rc.zero_stage = 3;
  CHECK(train::cuda_model_state_bytes(rc, specs) == stage0);
}
