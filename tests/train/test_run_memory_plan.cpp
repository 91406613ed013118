// limits.host_memory: the plan's arithmetic (it fits, it picks the largest NVMe
// sub_group_size that fits, moves the weights, the gradient partition and the prefetch, it
// refuses with the smallest budget that works), size strings and their errors. Real runs
// under a budget: test_run_memory_runs.cpp.
#include "tests/train/memory_fixture.hpp"

#include "actors/train/config/deepspeed_json.hpp"
#include "actors/train/config/limits_config.hpp"
#include "actors/train/memory/memory_accounting.hpp"
#include "core/file_backed.hpp"
#include "io/data/shard_reader.hpp"
#include "models/bert/parameter_specs.hpp"

using namespace dsa;
using namespace dsa::test::memory;

TEST_CASE("limits.host_memory: size strings, and bad values named by key") {
  CHECK(train::parse_byte_size("2GiB") == 2 * (std::int64_t{1} << 30));
  CHECK(train::parse_byte_size("512MiB") == 512 * mib);
  CHECK(train::parse_byte_size("512 MiB") == 512 * mib);
  CHECK(train::parse_byte_size("1.5GiB") == 3 * (std::int64_t{1} << 29));
  CHECK(train::parse_byte_size("3GB") == 3'000'000'000);
  CHECK(train::parse_byte_size("7") == 7);
  CHECK(train::parse_byte_size("64KiB") == 65536);
  for (const char* bad : {"2G", "", "GiB", "-1MiB", "0", "1.2.3MiB", "2gib", "2 GiB extra"}) {
    CAPTURE(bad);
    CHECK_FALSE(train::parse_byte_size(bad).has_value());
  }
  test::temp_dir dir;
  CHECK(parsed(dir.path(), "[limits]\nhost_memory = \"2GiB\"\n").host_memory == 2 * (std::int64_t{1} << 30));
  CHECK(parsed(dir.path(), "[limits]\nhost_memory = 1048576\n").host_memory == mib);
  CHECK(parsed(dir.path(), "").host_memory == 0);
  struct bad {
    std::string tables, says;
  };
  const std::vector<bad> cases{
      {"[limits]\nhost_memory = \"2G\"\n", "key 'limits.host_memory': expected a size such as \"2GiB\""},
      {"[limits]\nhost_memory = 0\n", "key 'limits.host_memory': must be a positive size, got 0"},
      {"[limits]\nhost_memory = true\n", "limits.host_memory"},
      {"[limits]\nhost_memroy = \"1GiB\"\n", "key 'limits.host_memroy': unknown key (did you mean 'host_memory'?)"}};
  for (const auto& c : cases) {
    CAPTURE(c.says);
    const std::string path = dir.path() + "/bad.toml";
    std::ofstream(path) << test::tiny_config(dir.path(), c.tables);
    auto cfg = train::load_run_config(path);
    REQUIRE(cfg.has_value());
    auto rc = train::parse_run_config(*cfg, "runs/x");
    REQUIRE_FALSE(rc.has_value());
    CHECK(rc.err().message.find(c.says) != std::string::npos);
  }
}

TEST_CASE("memory plan: model states of every stage and in-process rank, activations by schedule") {
  test::temp_dir dir;
  for (int ranks : {1, 2}) {
    CAPTURE(ranks);
    auto rc = parsed(dir.path(), "[pipeline]\nstages = 2\n[devices]\nranks = " + std::to_string(ranks) + "\n");
    const auto ranges = ranges_of(rc);
    std::int64_t psi = 0;
    for (const auto& r : ranges)
      for (const auto& s : bert::parameter_specs(rc.model, r)) psi += shape_numel(s.shape);
    const auto plan = train::plan_host_memory(rc, ranges, inputs());
    // fp32 without ZeRO: 28 bytes per parameter per rank (memory_accounting.hpp), 12 of them optimizer state.
    CHECK(plan.model_states == 28 * psi * ranks);
    CHECK(plan.optimizer_in_memory == 12 * psi * ranks);
    CHECK(plan.checkpoint == 0); // unpartitioned: a checkpoint reads the shards' own tensors
    // Each rank's reducers hold a bucket sent and one received (buckets larger than the stages here).
    CHECK(plan.communication == (ranks > 1 ? 2 * 4 * psi * ranks : 0));
    CHECK(plan.baseline == 10 * mib);
    CHECK(plan.peak() == plan.baseline + plan.data_reader + plan.model_states +
                             plan.activations + plan.communication + plan.checkpoint + plan.margin);
    CHECK(plan.margin == 16 * mib + (plan.peak() - plan.margin) / 10);
    // GPipe stashes all 4 micro-batches of a step where 1F1B stashes S - s of them.
    auto gpipe = rc;
    gpipe.schedule = "gpipe";
    CHECK(train::plan_host_memory(gpipe, ranges, inputs()).activations > plan.activations);
    // ZeRO: every rank gathers its stages' whole fp32 masters for a checkpoint (each
    // writes its own moments from views).
    auto zero = rc;
    zero.zero_stage = 1;
    if (ranks > 1) {
      const auto zplan = train::plan_host_memory(zero, ranges, inputs());
      std::int64_t padded = 0;
      for (std::size_t s = 0; s < ranges.size(); ++s) padded += train::run_zero_sizes(zero, ranges, s)->padded;
      CHECK(zplan.checkpoint == 4 * padded * ranks);
      CHECK(zplan.model_states < plan.model_states);
      auto no_save = inputs();
      no_save.writes_checkpoints = false;
      CHECK(train::plan_host_memory(zero, ranges, no_save).checkpoint == 0);
    }
  }
}

TEST_CASE("memory plan: a speculative stream in host memory counts its copy of the stage's state") {
  test::temp_dir dir;
  auto rc = parsed(dir.path(), "[debug]\nstream_host_update = true\n");
  rc.gradient_clipping = 1.0;
  const auto ranges = ranges_of(rc);
  std::int64_t psi = 0;
  for (const auto& s : bert::parameter_specs(rc.model, ranges.front())) psi += shape_numel(s.shape);
  CHECK(train::plan_host_memory(rc, ranges, inputs()).speculation == 0); // clipping waits for the backward
  rc.speculative_update = true;
  // Masters, moments and gradients of every parameter in f32: 16 bytes each.
  CHECK(train::plan_host_memory(rc, ranges, inputs()).speculation == 16 * psi);
  rc.gradient_clipping = 0.0; // nothing to speculate on: the stream's decision is known
  CHECK(train::plan_host_memory(rc, ranges, inputs()).speculation == 0);
}

TEST_CASE("memory plan: fits as configured, picks the largest NVMe sub_group_size that fits, or refuses") {
  test::temp_dir dir, swap;
  auto rc = parsed(dir.path(), fmt::format("[zero_optimization]\nstage = 1\n[zero_optimization.offload_optimizer]\n"
                                           "device = \"nvme\"\nnvme_path = \"{}\"\n",
                                           swap.path()));
  const auto ranges = ranges_of(rc);
  const auto as_configured = train::plan_host_memory(rc, ranges, inputs());
  // The default sub-group is larger than the partition: the swap buffers hold 3 whole copies.
  CHECK(as_configured.swap_buffers == 3 * 4 * train::run_zero_sizes(rc, ranges, 0)->partition);
  rc.host_memory = as_configured.peak();
  auto kept = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE(kept.has_value());
  CHECK_FALSE(kept->sub_group_size.has_value());

  auto at = [&](std::int64_t g) {
    auto c = rc;
    c.offload.sub_group_size = g;
    return train::plan_host_memory(c, ranges, inputs()).peak();
  };
  const std::int64_t floor = at(2048);
  REQUIRE(floor < as_configured.peak());
  rc.host_memory = (floor + as_configured.peak()) / 2;
  auto shrunk = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE(shrunk.has_value());
  REQUIRE(shrunk->sub_group_size.has_value());
  const std::int64_t g = *shrunk->sub_group_size;
  CHECK(g % 2048 == 0);
  CHECK(at(g) <= rc.host_memory);
  CHECK(at(g + 2048) > rc.host_memory); // the largest that fits
  CHECK(shrunk->plan.peak() == at(g));

  rc.host_memory = floor - 1;
  auto refused = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE_FALSE(refused.has_value());
  const std::string& m = refused.err().message;
  INFO(m);
  CHECK(refused.err().code == errc::config);
  CHECK(m.find("limits.host_memory = ") == 0);
  CHECK(m.find("model states") != std::string::npos);
  CHECK(m.find("activations") != std::string::npos);
  CHECK(m.find("smallest zero_optimization.sub_group_size, 2048") != std::string::npos);
  CHECK(smallest_mib(m) == (floor + mib - 1) / mib);
  CHECK(m.find("(offload_param) needs zero_optimization.stage = 3") != std::string::npos);
}

TEST_CASE("memory plan: with ZeRO-3 the plan moves the working weights to NVMe when the optimizer state is not enough") {
  test::temp_dir dir, swap;
  auto rc = zero3_on_nvme(dir.path(), swap.path());
  rc.stage3_prefetch = 0; // nothing gathered ahead: no prefetch for the plan to shrink
  const auto ranges = ranges_of(rc);
  REQUIRE(train::may_move_weights(rc));
  auto at = [&](train::run_config c, std::int64_t g) {
    c.offload.sub_group_size = g;
    return train::plan_host_memory(c, ranges, inputs());
  };
  // The smallest offload_param buffer_size the plan tries: the configured one halved while
  // it stays at least 64Ki elements.
  std::int64_t smallest_buffer = rc.offload.param.buffer_size;
  while (smallest_buffer / 2 >= 1 << 16) smallest_buffer /= 2;
  auto moved = rc;
  train::weights_to_nvme(moved, smallest_buffer);
  CHECK(moved.offload.param.swaps());
  CHECK(moved.offload.param.nvme_path == rc.offload.nvme_path);
  CHECK(moved.offload.param.max_in_cpu == 0);
  const std::int64_t optimizer_floor = at(rc, 2048).peak(), weights_floor = at(moved, 2048).peak();
  INFO(at(rc, 2048).describe());
  INFO(at(moved, 2048).describe());
  REQUIRE(weights_floor < optimizer_floor); // the weights' partition leaves memory
  // One byte short with the optimizer state alone: the weights go too.
  rc.host_memory = optimizer_floor - 1;
  auto d = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE_MESSAGE(d.has_value(), d.err().message);
  CHECK(d->weights_to_nvme);
  CHECK(d->plan.peak() <= rc.host_memory);
  CHECK(d->param_buffer_size >= 1 << 16);
  CHECK(d->param_buffer_size <= rc.offload.param.buffer_size);
  auto chosen = rc;
  train::weights_to_nvme(chosen, d->param_buffer_size);
  const std::int64_t g = d->sub_group_size.value_or(rc.offload.sub_group_size);
  CHECK(d->plan.peak() == at(chosen, g).peak());
  // Enough for the optimizer state alone: the weights stay.
  rc.host_memory = optimizer_floor;
  auto kept = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE(kept.has_value());
  CHECK_FALSE(kept->weights_to_nvme);
  // Below even that, with the gradient partition kept in memory: refused, naming the
  // smallest budget with both on NVMe.
  rc.host_memory = weights_floor - 1;
  rc.gradient_partition = "memory";
  auto refused = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE_FALSE(refused.has_value());
  const std::string& m = refused.err().message;
  INFO(m);
  CHECK(m.find("and the working weights on NVMe too") != std::string::npos);
  CHECK(smallest_mib(m) == (weights_floor + mib - 1) / mib);
}

TEST_CASE("memory plan: ZeRO's gradient partition goes to NVMe when nothing else fits, or as configured") {
  test::temp_dir dir, swap;
  auto rc = zero3_on_nvme(dir.path(), swap.path());
  rc.stage3_prefetch = 0; // the prefetch's own move is tested below
  const auto ranges = ranges_of(rc);
  CHECK(rc.gradient_partition == "auto");
  CHECK_FALSE(rc.grads_on_nvme);
  // The floors: everything else moved (weights on NVMe, the smallest sub-group), then the
  // gradient partition as well.
  std::int64_t smallest_buffer = rc.offload.param.buffer_size;
  while (smallest_buffer / 2 >= 1 << 16) smallest_buffer /= 2;
  auto weights = rc;
  train::weights_to_nvme(weights, smallest_buffer);
  weights.offload.sub_group_size = 2048;
  auto grads = weights;
  grads.grads_on_nvme = true;
  const auto weights_plan = train::plan_host_memory(weights, ranges, inputs());
  const auto grads_plan = train::plan_host_memory(grads, ranges, inputs());
  INFO(weights_plan.describe());
  INFO(grads_plan.describe());
  const std::int64_t partition = train::run_zero_sizes(rc, ranges, 0)->partition;
  // Two ranks, each 4 bytes per partition element less a window or two.
  REQUIRE(weights_plan.model_states - grads_plan.model_states >= 2 * (4 * partition - 2 * file_backed_window_bytes()));
  REQUIRE(grads_plan.peak() < weights_plan.peak());
  // One byte short of the weights' floor: the gradients go too.
  rc.host_memory = weights_plan.peak() - 1;
  auto d = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE_MESSAGE(d.has_value(), d.err().message);
  CHECK(d->grads_to_nvme);
  CHECK(d->plan.peak() <= rc.host_memory);
  // With room for the weights' move alone, the gradients stay.
  rc.host_memory = weights_plan.peak();
  auto kept = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE(kept.has_value());
  CHECK_FALSE(kept->grads_to_nvme);
  // Below the gradients' floor: refused, naming it.
  rc.host_memory = grads_plan.peak() - 1;
  auto refused = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE_FALSE(refused.has_value());
  INFO(refused.err().message);
  CHECK(refused.err().message.find("with the gradient partition on NVMe too") != std::string::npos);
  CHECK(smallest_mib(refused.err().message) == (grads_plan.peak() + mib - 1) / mib);
  // "memory" keeps it there: the weights' floor is the last word.
  rc.gradient_partition = "memory";
  rc.host_memory = weights_plan.peak() - 1;
  CHECK_FALSE(train::fit_host_memory(rc, ranges, inputs()).has_value());
}

TEST_CASE("memory plan: ZeRO-3's prefetch shrinks to the largest that fits when nothing else does") {
  test::temp_dir dir, swap;
  auto rc = zero3_on_nvme(dir.path(), swap.path());
  const auto ranges = ranges_of(rc);
  rc.stage3_prefetch = 4'000'000;
  // Every other move made: the weights and the gradients on NVMe, the smallest sub-group.
  std::int64_t smallest_buffer = rc.offload.param.buffer_size;
  while (smallest_buffer / 2 >= 1 << 16) smallest_buffer /= 2;
  auto moved = rc;
  train::weights_to_nvme(moved, smallest_buffer);
  moved.offload.sub_group_size = 2048;
  moved.grads_on_nvme = true;
  auto none = moved;
  none.stage3_prefetch = 0;
  const std::int64_t with_prefetch = train::plan_host_memory(moved, ranges, inputs()).peak();
  const std::int64_t without = train::plan_host_memory(none, ranges, inputs()).peak();
  REQUIRE(without < with_prefetch);
  // Between the two: a smaller prefetch, the largest that fits.
  rc.host_memory = (with_prefetch + without) / 2;
  auto d = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE_MESSAGE(d.has_value(), d.err().message);
  REQUIRE(d->stage3_prefetch.has_value());
  const std::int64_t p = *d->stage3_prefetch;
  CHECK(p > 0);
  CHECK(p < rc.stage3_prefetch);
  CHECK(d->grads_to_nvme);
  CHECK(d->plan.peak() <= rc.host_memory);
  auto at = [&](std::int64_t prefetch) {
    auto c = rc;
    c.grads_on_nvme = true;
    c.stage3_prefetch = prefetch;
    return train::fit_host_memory(c, ranges, inputs());
  };
  CHECK(at(p).has_value());
  auto larger = at(p + 1);
  CHECK((!larger.has_value() || larger->stage3_prefetch.has_value())); // p + 1 needs a move of its own
  // Below the floor with nothing gathered ahead: refused, naming it.
  rc.host_memory = without - 1;
  auto refused = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE_FALSE(refused.has_value());
  INFO(refused.err().message);
  CHECK(refused.err().message.find("no ZeRO-3 prefetch") != std::string::npos);
  CHECK(smallest_mib(refused.err().message) == (without + mib - 1) / mib);
}

TEST_CASE("limits.gradient_partition: values, and what \"nvme\" needs, named by key") {
  test::temp_dir dir, swap;
  const std::string nvme = fmt::format("[zero_optimization.offload_optimizer]\ndevice = \"nvme\"\nnvme_path = \"{}\"\n",
                                       swap.path());
  auto error_of = [&](const std::string& tables) {
    const std::string path = dir.path() + "/bad.toml";
    std::ofstream(path) << test::tiny_config(dir.path(), tables);
    auto cfg = train::load_run_config(path);
    REQUIRE(cfg.has_value());
    auto rc = train::parse_run_config(*cfg, dir.path() + "/run");
    return rc.has_value() ? std::string() : rc.err().message;
  };
  auto ok = parsed(dir.path(), "[devices]\nranks = 2\n[zero_optimization]\nstage = 3\n" + nvme +
                                   "[limits]\ngradient_partition = \"nvme\"\n");
  CHECK(ok.grads_on_nvme);
  std::string m = error_of("[limits]\ngradient_partition = \"disk\"\n");
  CHECK(m.find("limits.gradient_partition") != std::string::npos);
  CHECK(m.find("expected \"auto\", \"memory\" or \"nvme\", got \"disk\"") != std::string::npos);
  m = error_of("[devices]\nranks = 2\n[zero_optimization]\nstage = 1\n" + nvme + "[limits]\ngradient_partition = \"nvme\"\n");
  CHECK(m.find("limits.gradient_partition") != std::string::npos);
  CHECK(m.find("partitioned only with ZeRO stage 3") != std::string::npos);
  m = error_of("[devices]\nranks = 2\n[zero_optimization]\nstage = 3\n[limits]\ngradient_partition = \"nvme\"\n");
  CHECK(m.find("offload_optimizer.device = \"nvme\"") != std::string::npos);
  ok.optimizer.type = optim::optimizer_type::lamb; // what read_limits asks of the optimizer section
  const auto lamb = train::grads_to_nvme_refusal(ok);
  REQUIRE(lamb.has_value());
  CHECK(lamb->find("Adam and AdamW only") != std::string::npos);
}

TEST_CASE("memory plan: without offload the refusal says what NVMe offload would need") {
  test::temp_dir dir;
  auto rc = parsed(dir.path(), "");
  const auto ranges = ranges_of(rc);
  // A run that saves no checkpoint: offloading takes the optimizer state out for good.
  auto in = inputs();
  in.writes_checkpoints = false;
  const auto plan = train::plan_host_memory(rc, ranges, in);
  rc.host_memory = plan.peak() - 1;
  auto refused = train::fit_host_memory(rc, ranges, in);
  REQUIRE_FALSE(refused.has_value());
  const std::string& m = refused.err().message;
  INFO(m);
  CHECK(smallest_mib(m) == (plan.peak() + mib - 1) / mib);
  // ZeRO stage 0 here: offloading needs stage 1 first; the budget is one byte short,
  // and moving 12 bytes per parameter out makes it fit.
  CHECK(m.find("With zero_optimization.stage = 1 and zero_optimization.offload_optimizer.device = \"nvme\"") !=
        std::string::npos);
  CHECK(m.find("the run would fit") != std::string::npos);
  rc.host_memory = plan.peak();
  CHECK(train::fit_host_memory(rc, ranges, in).has_value());
  // With checkpoints, a save of swapped state reads the masters back whole (4 bytes per
  // parameter) and streams the moments chunk by chunk: offloading still fits.
  const auto saving = train::plan_host_memory(rc, ranges, inputs());
  rc.host_memory = saving.peak() - 1;
  auto still = train::fit_host_memory(rc, ranges, inputs());
  REQUIRE_FALSE(still.has_value());
  CHECK(still.err().message.find("the run would fit") != std::string::npos);
  auto offloaded = rc;
  offloaded.zero_stage = 1;
  offloaded.offload.device = train::offload_device::nvme;
  offloaded.offload.sub_group_size = 2048;
  const auto with_nvme = train::plan_host_memory(offloaded, ranges, inputs());
  std::int64_t partition = 0;
  for (std::size_t s = 0; s < ranges.size(); ++s) partition += train::run_zero_sizes(offloaded, ranges, s)->partition;
  // One rank and one stage: the masters stream into the model file a tensor at a time (a
  // tensor and its read buffer) instead of coming back whole.
  std::int64_t largest = 0;
  for (const auto& spec : bert::parameter_specs(rc.model, ranges.front()))
    largest = std::max(largest, shape_numel(spec.shape));
  const bool streamed = ranges.size() == 1 && rc.batch.data_parallel_size == 1;
  CHECK(with_nvme.checkpoint == (streamed ? 8 * largest : 4 * partition) + 8 * 2048 * static_cast<std::int64_t>(ranges.size()));
  CHECK(streamed); // the case this test's config makes
}

TEST_CASE("memory plan with stages across processes: this process's stages, rank 0 also the others' masters") {
  test::temp_dir dir;
  auto rc = parsed(dir.path(), "[pipeline]\nstages = 2\n");
  const auto ranges = ranges_of(rc);
  std::vector<std::int64_t> psi;
  for (const auto& r : ranges) {
    psi.push_back(0);
    for (const auto& s : bert::parameter_specs(rc.model, r)) psi.back() += shape_numel(s.shape);
  }
  const auto whole = train::plan_host_memory(rc, ranges, inputs());
  auto second = inputs();
  second.here = {false, true}; // the process running stage 1
  const auto mine = train::plan_host_memory(rc, ranges, second);
  CHECK(mine.model_states == 28 * psi[1]);
  CHECK(mine.checkpoint == 0);
  CHECK(mine.activations < whole.activations);
  CHECK(mine.evaluation == whole.evaluation); // the whole model either way (rank 0 evaluates)
  auto first = inputs();
  first.here = {true, false};
  first.gathers_masters = true; // rank 0: stage 1's masters come in for the model file
  const auto lead = train::plan_host_memory(rc, ranges, first);
  CHECK(lead.model_states == 28 * psi[0]);
  CHECK(lead.checkpoint == 4 * psi[1]);
  CHECK(lead.peak() < whole.peak());
}

TEST_CASE("memory plan: a shard reader's resident pages are bounded and counted per rank") {
  // Each row gives its pages back: at most its six slices' dropped windows of 256 KiB (two
  // when a slice straddles one): T = 128, P = 20: 3 x 2 + 2 x 2 + 2 windows; a load's check
  // (1,024 rows between releases, 2 MiB here) is less.
  CHECK(dsa::data::shard_reader::resident_bound(128, 20) == 12 * 256 * 1024);
  test::temp_dir dir;
  auto rc = parsed(dir.path(), "[devices]\nranks = 2\n");
  const auto ranges = ranges_of(rc);
  auto in = inputs();
  const auto without = train::plan_host_memory(rc, ranges, in);
  in.data_reader = dsa::data::shard_reader::resident_bound(128, 20);
  const auto with = train::plan_host_memory(rc, ranges, in);
  CHECK(with.data_reader == 2 * in.data_reader);
  CHECK(with.peak() > without.peak() + 2 * in.data_reader - 1);
  CHECK(with.describe().find("shard reader") != std::string::npos);
}
