// limits.device_memory: a CUDA rank's device plan (actors/train/memory/device_plan.hpp)
// against a fake device (its free and total bytes), on every machine: what the plan counts
// per stage and rank, where the budget comes from, the refusal with the smallest budget that
// works and the alternatives, the size strings. The per-micro-batch figures it sums are
// bert::gpu_part_stash_bytes and gpu_part_scratch_bytes (tests/models/test_gpu_memory.cpp;
// set against a device's pool in the gpu suite).
#include "tests/train/memory_fixture.hpp"

#include "actors/train/config/limits_config.hpp"
#include "actors/train/memory/device_plan.hpp"
#include "core/pinned_memory.hpp"
#include "actors/train/memory/memory_accounting.hpp"
#include "models/bert/gpu_memory.hpp"
#include "models/bert/parameter_specs.hpp"

using namespace dsa;
using namespace dsa::test::memory;

namespace {

train::device_choice fake_gpu(std::int64_t total, std::int64_t free) {
  train::device_choice d;
  d.device = train::stage_device::cuda;
  d.index = 0;
  d.description = "cuda:0 (a fake device)";
  d.total_bytes = total;
  d.free_bytes = free;
  return d;
}

std::int64_t smallest_device_mib(const std::string& message) {
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(message, m, std::regex("limits.device_memory = \"([0-9]+)MiB\"")), message);
  return std::stoll(m[1].str());
}

std::int64_t parameters_of(const train::run_config& rc, const bert::bert_range& r, std::int64_t* largest = nullptr) {
  std::int64_t n = 0, big = 0;
  for (const auto& s : bert::parameter_specs(rc.model, r)) {
    n += shape_numel(s.shape);
    big = std::max(big, shape_numel(s.shape));
  }
  if (largest) *largest = big;
  return n;
}

bert::gpu_micro_batch micro_of(const train::run_config& rc, const train::plan_inputs& in) {
  bert::gpu_micro_batch mb;
  mb.batch = rc.batch.micro_batch_size;
  mb.seq = in.seq_length;
  mb.predictions = in.predictions;
  mb.elem_size = static_cast<std::int64_t>(dtype_size(train::working_dtype(rc.working)));
  return mb;
}

} // namespace

TEST_CASE("device plan: each stage's model states, stash slots by schedule and scratch, per in-process rank") {
  test::temp_dir dir;
  for (int ranks : {1, 2}) {
    CAPTURE(ranks);
    auto rc = parsed(dir.path(), "[pipeline]\nstages = 2\n[devices]\nranks = " + std::to_string(ranks) + "\n");
    rc.offload.device = train::offload_device::cpu; // the stages' own states only
    const auto ranges = ranges_of(rc);
    const train::plan_inputs in = inputs();
    const auto mb = micro_of(rc, in);
    const train::device_memory_plan p = train::plan_device_memory(rc, ranges, in);
    std::int64_t states = 0, scratch = 0;
    for (const auto& r : ranges) {
      states += train::cuda_model_state_bytes(rc, bert::parameter_specs(rc.model, r));
      scratch += bert::gpu_part_scratch_bytes(rc.model, r, mb);
    }
    CHECK(p.model_states == ranks * states);
    CHECK(p.scratch == ranks * scratch);
    // 1F1B over 2 stages: the first holds 2 micro-batches between forward and backward, the last 1.
    CHECK(p.activations == ranks * (2 * bert::gpu_part_stash_bytes(rc.model, ranges[0], mb) +
                                    bert::gpu_part_stash_bytes(rc.model, ranges[1], mb)));
    // One edge, two slots each way, (B, T, H) in the working precision.
    const std::int64_t hidden = rc.batch.micro_batch_size * in.seq_length * rc.model.hidden_size *
                                static_cast<std::int64_t>(dtype_size(train::working_dtype(rc.working)));
    CHECK(p.messages == ranks * 4 * hidden);
    CHECK(p.workspaces == ranks * 2 * 32 * mib);
    CHECK(p.margin == 64 * mib + (p.peak() - p.margin) / 20);
    CHECK(p.pool_peak() == p.peak() - p.workspaces);
  }
}

TEST_CASE("device plan: the GPU-resident optimizer adds masters, moments, working copies and a gradient scratch") {
  test::temp_dir dir;
  auto rc = parsed(dir.path(), "");
  rc.offload.device = train::offload_device::cpu;
  const auto ranges = ranges_of(rc);
  const train::plan_inputs in = inputs();
  const train::device_memory_plan offloaded = train::plan_device_memory(rc, ranges, in);
  auto on_gpu = rc;
  on_gpu.offload.device = train::offload_device::none;
  const train::device_memory_plan resident = train::plan_device_memory(on_gpu, ranges, in);
  std::int64_t largest = 0;
  const std::int64_t n = parameters_of(rc, ranges[0], &largest);
  const std::int64_t working = rc.working == train::precision::f32 ? 0 : 2;
  CHECK(resident.model_states - offloaded.model_states == (4 + 8 + working) * n + 4 * largest);
  CHECK(resident.activations == offloaded.activations);
}

TEST_CASE("device plan: stages across processes count this process's stages and their edge only") {
  test::temp_dir dir;
  auto rc = parsed(dir.path(), "[pipeline]\nstages = 3\n");
  const auto ranges = ranges_of(rc);
  train::plan_inputs in = inputs();
  const train::device_memory_plan all = train::plan_device_memory(rc, ranges, in);
  in.here = {false, true, true};
  const train::device_memory_plan last_two = train::plan_device_memory(rc, ranges, in);
  in.here = {true, false, true};
  const train::device_memory_plan apart = train::plan_device_memory(rc, ranges, in);
  CHECK(last_two.model_states < all.model_states);
  CHECK(last_two.messages == all.messages / 2); // the edge 1 -> 2 only
  CHECK(apart.messages == 0);                   // no edge with both ends here
  CHECK(last_two.workspaces == 2 * 32 * mib);
}

TEST_CASE("device plan: the budget is limits.device_memory, else the free bytes less a reserve") {
  train::run_config rc;
  const std::int64_t gib = std::int64_t{1} << 30;
  // No budget on the CPU.
  CHECK(train::device_budget_for(rc, train::device_choice{}).bytes == -1);
  // 80 GiB device, 79 free: the reserve is 2% of the device (1.6 GiB > 256 MiB).
  train::device_budget b = train::device_budget_for(rc, fake_gpu(80 * gib, 79 * gib));
  CHECK(b.bytes == 79 * gib - 80 * gib / 50);
  CHECK(b.source.find("cuda:0 (a fake device)'s free memory at start-up") != std::string::npos);
  // A small device: 256 MiB.
  CHECK(train::device_budget_for(rc, fake_gpu(4 * gib, 2 * gib)).bytes == 2 * gib - 256 * mib);
  // Free bytes unknown: no budget, said so.
  b = train::device_budget_for(rc, fake_gpu(4 * gib, 0));
  CHECK(b.bytes == -1);
  CHECK(b.source.find("could not be read") != std::string::npos);
  // Given: taken as it is, even above what is free.
  rc.device_memory = 100 * gib;
  b = train::device_budget_for(rc, fake_gpu(80 * gib, 79 * gib));
  CHECK(b.bytes == 100 * gib);
  CHECK(b.source == "limits.device_memory 100.00 GiB");
}

TEST_CASE("device plan: a run that does not fit is refused with the smallest budget and what would fit") {
  test::temp_dir dir;
  auto rc = parsed(dir.path(), "");
  rc.offload.device = train::offload_device::none; // the optimizer on the GPU
  const auto ranges = ranges_of(rc);
  const train::plan_inputs in = inputs();
  const train::device_memory_plan p = train::plan_device_memory(rc, ranges, in);
  rc.device_memory = p.peak() - 1; // given: the refusal names the smallest that works
  train::device_budget tight{p.peak() - 1, "limits.device_memory (test)"};
  auto refused = train::fit_device_memory(rc, ranges, in, tight);
  REQUIRE_FALSE(refused.has_value());
  const std::string& says = refused.err().message;
  CHECK(refused.err().code == errc::config);
  CHECK(says.find("limits.device_memory (test)") != std::string::npos);
  CHECK(says.find(p.describe()) != std::string::npos);
  CHECK(says.find("zero_optimization.offload_optimizer.device = \"cpu\"") != std::string::npos);
  CHECK(says.find("model.checkpoint_activations = true") != std::string::npos);
  // ZeRO-3 keeps a part or two of the weights on the device: offered, and smaller.
  CHECK(says.find("With ZeRO-3 (zero_optimization.stage = 3") != std::string::npos);
  CHECK(says.find("on one rank offload_param.device = \"nvme\"") != std::string::npos); // else nothing partitions
  train::run_config zero3 = rc;
  zero3.zero_stage = 3;
  zero3.offload.device = train::offload_device::cpu;
  zero3.offload.param.device = train::offload_device::nvme;
  zero3.stage3_persistence = 0; // the tiny model's tensors would all be persistent at the default
  zero3.zero3_device_window = 1; // as offered: a part's weights on the device at a time
  rc.offload.device = train::offload_device::cpu;
  CHECK(train::plan_device_memory(zero3, ranges, in).model_states <
        train::plan_device_memory(rc, ranges, in).model_states);
  rc.offload.device = train::offload_device::none;
  // The smallest budget it names fits.
  const std::int64_t smallest = smallest_device_mib(says) * mib;
  CHECK(train::fit_device_memory(rc, ranges, in, {smallest, "x"}).has_value());
  CHECK_FALSE(train::fit_device_memory(rc, ranges, in, {smallest - mib, "x"}).has_value());
  // With the optimizer on the CPU already, only checkpointing is offered; with both, neither.
  rc.offload.device = train::offload_device::cpu;
  rc.model.checkpoint_activations = true;
  refused = train::fit_device_memory(rc, ranges, in, {mib, "x"});
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.err().message.find("offload_optimizer") == std::string::npos);
  CHECK(refused.err().message.find("checkpoint_activations") == std::string::npos);
  CHECK(refused.err().message.find("With ZeRO-3") != std::string::npos);
  rc.zero_stage = 3; // already there: not offered
  refused = train::fit_device_memory(rc, ranges, in, {mib, "x"});
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.err().message.find("With ZeRO-3") == std::string::npos);
  // No budget: the plan, unchecked.
  CHECK(train::fit_device_memory(rc, ranges, in, {-1, "none"}).has_value());
}

TEST_CASE("device plan: nothing to plan on a CPU rank; the start-up check on a fake device") {
  test::temp_dir dir;
  auto rc = parsed(dir.path(), "");
  const train::plan_inputs in = inputs();
  auto cpu = train::plan_run_device_memory(rc, train::device_choice{}, in);
  REQUIRE(cpu.has_value());
  CHECK(cpu->peak() == 0);
  const std::int64_t gib = std::int64_t{1} << 30;
  CHECK(train::plan_run_device_memory(rc, fake_gpu(80 * gib, 79 * gib), in).has_value());
  auto refused = train::plan_run_device_memory(rc, fake_gpu(gib, 300 * mib), in);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.err().message.find("cuda:0 (a fake device)'s free memory at start-up, 300.00 MiB") !=
        std::string::npos);
  // Not given: a larger limits.device_memory would not make the memory appear.
  CHECK(refused.err().message.find("the device has not that much free") != std::string::npos);
  CHECK(refused.err().message.find("limits.device_memory = \"") == std::string::npos);
}

TEST_CASE("device plan: ZeRO-3's device window is the largest that fits, down to one part, then refused") {
  test::temp_dir dir;
  auto rc = parsed(dir.path(), "");
  rc.offload.device = train::offload_device::cpu;
  rc.zero_stage = 3;
  rc.batch.data_parallel_size = 2; // partitions are real
  rc.ranks = 2;
  rc.stage3_persistence = 0; // every tensor gathered: the window holds the layers
  const auto ranges = ranges_of(rc);
  const train::plan_inputs in = inputs();
  const auto specs = bert::parameter_specs(rc.model, ranges[0]);
  const std::int64_t limit = train::cuda_zero3_window_limit(rc, specs);
  REQUIRE(limit >= 3); // the tiny model's parts, all within the default prefetch
  auto peak_at = [&](std::int64_t w) {
    train::run_config at = rc;
    at.zero3_device_window = w;
    return train::plan_device_memory(at, ranges, in).peak();
  };
  CHECK(peak_at(1) < peak_at(2));
  CHECK(peak_at(2) < peak_at(limit));
  // No budget, or an ample one: the limit.
  train::run_config chosen = rc;
  CHECK(train::choose_zero3_window(chosen, ranges, in, {-1, "none"}) == limit);
  CHECK(chosen.zero3_device_window == limit);
  chosen = rc;
  CHECK(train::choose_zero3_window(chosen, ranges, in, {peak_at(limit), "x"}) == limit);
  CHECK(chosen.zero3_device_window == limit);
  // A budget between two windows' plans: the smaller window.
  chosen = rc;
  train::choose_zero3_window(chosen, ranges, in, {peak_at(2) + (peak_at(3) - peak_at(2)) / 2, "x"});
  CHECK(chosen.zero3_device_window == 2);
  CHECK(train::fit_device_memory(chosen, ranges, in, {peak_at(2), "x"}).has_value());
  // Below one part's plan: window 1, refused naming that plan's budget.
  chosen = rc;
  chosen.device_memory = peak_at(1) - 1;
  train::choose_zero3_window(chosen, ranges, in, {peak_at(1) - 1, "x"});
  CHECK(chosen.zero3_device_window == 1);
  auto refused = train::fit_device_memory(chosen, ranges, in, {peak_at(1) - 1, "x"});
  REQUIRE_FALSE(refused.has_value());
  CHECK(smallest_device_mib(refused.err().message) * mib >= peak_at(1));
  // A window chosen already (or none to choose: stage 2) is left alone.
  chosen = rc;
  chosen.zero3_device_window = 2;
  CHECK(train::choose_zero3_window(chosen, ranges, in, {-1, "none"}) == 0);
  CHECK(chosen.zero3_device_window == 2);
  chosen = rc;
  chosen.zero_stage = 2;
  CHECK(train::choose_zero3_window(chosen, ranges, in, {-1, "none"}) == 0);
  CHECK(chosen.zero3_device_window == 0);
  // stage3_prefetch_bucket_size bounds it: nothing ahead at 0.
  rc.stage3_prefetch = 0;
  CHECK(train::cuda_zero3_window_limit(rc, specs) == 1);
}

TEST_CASE("limits.device_memory: a size string or bytes, bad values named by key") {
  test::temp_dir dir;
  CHECK(parsed(dir.path(), "[limits]\ndevice_memory = \"40GiB\"\n").device_memory == 40 * (std::int64_t{1} << 30));
  CHECK(parsed(dir.path(), "[limits]\ndevice_memory = 1048576\n").device_memory == mib);
  CHECK(parsed(dir.path(), "").device_memory == 0);
  for (const auto& [tables, says] :
       std::vector<std::pair<std::string, std::string>>{
           {"[limits]\ndevice_memory = \"40G\"\n", "key 'limits.device_memory': expected a size such as \"2GiB\""},
           {"[limits]\ndevice_memory = -5\n", "key 'limits.device_memory': must be a positive size, got -5"}}) {
    CAPTURE(says);
    const std::string path = dir.path() + "/bad.toml";
    std::ofstream(path) << test::tiny_config(dir.path(), tables);
    auto cfg = train::load_run_config(path);
    REQUIRE(cfg.has_value());
    auto rc = train::parse_run_config(*cfg, "runs/x");
    REQUIRE_FALSE(rc.has_value());
    CHECK(rc.err().message.find(says) != std::string::npos);
  }
}


TEST_CASE("device plan: the end-of-run line sets the pool's share of the plan against its measured peak") {
  train::device_memory_plan p;
  bool above = true;
  CHECK(train::device_plan_report(p, 5, above).empty()); // nothing planned: a CPU rank
  CHECK_FALSE(above);
  p.model_states = 100 * mib;
  p.workspaces = 32 * mib;
  p.margin = 68 * mib;
  const std::string within = train::device_plan_report(p, 150 * mib, above);
  CHECK_FALSE(above);
  CHECK(within == "device memory: the pool's planned peak 168.00 MiB (the plan's 200.00 MiB less the cuBLASLt "
                  "workspaces), measured peak in use 150.00 MiB");
  CHECK(train::device_plan_report(p, 169 * mib, above).find("above the plan") != std::string::npos);
  CHECK(above);
  CHECK(train::device_plan_report(p, -1, above).find("could not be read") != std::string::npos);
  CHECK_FALSE(above);
}

TEST_CASE("host plan: a CUDA rank under ZeRO-2 on one stage counts its whole pinned host gradients") {
  test::temp_dir dir;
  auto rc = parsed(dir.path(), "[devices]\nranks = 2\n[zero_optimization]\nstage = 2\n");
  rc.offload.device = train::offload_device::cpu;
  REQUIRE(rc.gradients_partitioned());
  const auto ranges = ranges_of(rc);
  const train::host_memory_plan on_cpu = train::plan_host_memory(rc, ranges, inputs());
  rc.backend = "cuda";
  const train::host_memory_plan on_gpu = train::plan_host_memory(rc, ranges, inputs());
  CHECK(on_gpu.model_states - on_cpu.model_states == 2 * 4 * parameters_of(rc, ranges[0]));
  rc.zero_stage = 1; // whole gradients on both: the same plan
  CHECK(train::plan_host_memory(rc, ranges, inputs()).model_states ==
        [&] { auto c = rc; c.backend = "cpu"; return train::plan_host_memory(c, ranges, inputs()).model_states; }());
}

TEST_CASE("limits.host_memory caps the pinned memory too") {
  const std::int64_t before = pinned_owner::instance().limit();
  train::run_config rc;
  train::cap_pinned_memory(rc); // no budget: the cap stays as it was
  CHECK(pinned_owner::instance().limit() == before);
  rc.host_memory = 300 * mib;
  train::cap_pinned_memory(rc);
  CHECK(pinned_owner::instance().limit() == 300 * mib);
  pinned_owner::instance().set_limit(before);
}
