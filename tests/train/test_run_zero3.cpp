// ZeRO stage 3 in `dsactor run`: the stage keeps its partition of the working weights
// and gathers each part's before running it (actors/train/stage/param_fetcher.hpp).
#include "actors/train/memory/memory_accounting.hpp"
#include "actors/train/shard/model_shard.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/tolerances.hpp"
#include "tests/train/train_fixture.hpp"

#include "core/file_backed.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace dsa;
using dsa::test::with;

namespace {

ckpt::loaded_checkpoint train_checkpoint(const std::vector<std::string>& overrides) {
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "z3", test::tiny_config(dir.path()), overrides) == 0);
  return test::load_run_checkpoint(dir.path() + "/ckpt", "latest");
}

std::string run_log(const std::vector<std::string>& overrides) {
  test::temp_dir dir;
  CHECK(test::run_config(dir.path(), "z3", test::tiny_config(dir.path()), overrides) == 0);
  std::ifstream in(dir.path() + "/run/train.log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

} // namespace

// A gathered tensor is the owners' working weights byte for byte; the gradients are
// summed over the ranks per micro-batch into each rank's partition, which changes only
// the order of the gradient sums (tolerances.hpp zero3_reduction_order). The tiny model's tensors are small,
// so the persistence threshold decides what is gathered: 0 gathers every tensor, 1000
// keeps the biases and LayerNorm vectors whole and gathers the matrices and embeddings;
// a prefetch of 0 gathers each part only when the model asks, and a live bound of 1
// forbids any gather ahead.
TEST_CASE("ZeRO stage 3 on 2 and 4 ranks equals stage 0, with AdamW, LAMB and fp16 with clipping") {
  // Without clipping (the first variant) a gradient's scale reaches the first moments; with
  // it, clipping normalizes the scale away.
  const std::vector<std::vector<std::string>> variants{
      {"gradient_clipping=0"},
      {"optimizer.type=\"Lamb\""},
      {"fp16.enabled=true", "fp16.initial_scale_power=8", "gradient_clipping=0.05"}};
  const std::vector<std::vector<std::string>> fetching{
      {"zero_optimization.stage3_param_persistence_threshold=0"},
      {"zero_optimization.stage3_param_persistence_threshold=1000",
       "zero_optimization.stage3_prefetch_bucket_size=0"},
      {"zero_optimization.stage3_param_persistence_threshold=0", "zero_optimization.stage3_max_live_parameters=1"}};
  for (const auto& v : variants)
    for (int ranks : {2, 4}) {
      CAPTURE(ranks);
      CAPTURE(v.front());
      auto zero0 = train_checkpoint(with(v, {fmt::format("devices.ranks={}", ranks)}));
      for (std::size_t f = 0; f < fetching.size(); ++f) {
        if (f > 0 && v.front() != "gradient_clipping=0") continue; // the fetch settings once, with AdamW
        CAPTURE(f);
        auto zero3 = train_checkpoint(
            with(with(v, fetching[f]), {fmt::format("devices.ranks={}", ranks), "zero_optimization.stage=3"}));
        const bool fp16 = std::find(v.begin(), v.end(), "fp16.enabled=true") != v.end();
        test::check_close_state(zero3, zero0, test::zero3_reduction_order,
                                fp16 ? test::zero_fp16_first_moments : test::zero3_first_moments);
        CHECK(zero3.manifest.state["data_cursor"] == zero0.manifest.state["data_cursor"]);
      }
    }
}

TEST_CASE("ZeRO stage 3: each rank holds 1/N of the working weights and gradients, as the accounting expects") {
  for (int ranks : {2, 4}) {
    CAPTURE(ranks);
    const std::string log = run_log({fmt::format("devices.ranks={}", ranks), "zero_optimization.stage=3",
                                     "zero_optimization.stage3_param_persistence_threshold=1000", "train_steps=1"});
    CHECK(log.find("(as expected)") != std::string::npos);
    CHECK(log.find("the accounting expected") == std::string::npos);
    CHECK(log.find(fmt::format("ZeRO stage 3: working weights, gradients, masters and moments of 1/{} of the stage",
                               ranks)) != std::string::npos);
    // The fetcher gathered: the tiny model's matrices and embeddings are above 1000 elements.
    CHECK(log.find("ZeRO-3 fetcher of rank 0: gathered ") != std::string::npos);
    CHECK(log.find("ZeRO-3 fetcher of rank 0: gathered 0 tensors") == std::string::npos);
  }
  // The accounting: the partition plus the persistent tensors for the weights; the next
  // version is written into them in place, and the shard reduces into the stage's
  // gradient partition itself: no second copy of either.
  train::zero_sizes z{4096, 1024, 3, 0};
  z.persistent = 100;
  const auto three = train::expected_model_states(1000, train::precision::f16, z);
  CHECK(three.weights == 2 * (1024 + 100));
  CHECK(three.grads == 4 * 1024);
  CHECK(three.version == 0);
  CHECK(three.reduced == 0);
  // The weights on NVMe: the version passes through one window of scratch.
  z.param_in_memory = 0;
  z.param_buffers = 8192;
  CHECK(train::expected_model_states(1000, train::precision::f16, z).version == 2 * 1024);
  z.partition = 3 * train::shard_version_window_elements;
  CHECK(train::expected_model_states(1000, train::precision::f16, z).version ==
        2 * train::shard_version_window_elements);
}

// fp16 steps that overflow are skipped: the shard keeps the version the fetcher's store
// holds (partition_shard::advance_into_fetcher), so after steps that all overflow (a loss
// scale of 2^30) the weights and state are stage 0's, which skipped them too: the
// initial ones.
TEST_CASE("ZeRO stage 3: skipped fp16 steps keep the weights, as stage 0's") {
  const std::vector<std::string> overflow{"fp16.enabled=true", "fp16.initial_scale_power=30", "fp16.hysteresis=1",
                                          "devices.ranks=2", "train_steps=2"};
  auto zero0 = train_checkpoint(overflow);
  auto zero3 = train_checkpoint(with(overflow, {"zero_optimization.stage=3",
                                                "zero_optimization.stage3_param_persistence_threshold=0"}));
  test::check_same_state(zero3, zero0);
}

// A stage-3 checkpoint is a stage-1 checkpoint (the shards write it): it resumes as stage 1
// on another rank count, and a stage-1 one as stage 3, continuing the uninterrupted run.
TEST_CASE("ZeRO stage 3 resumes as stage 1 on another rank count, and stage 1 resumes as stage 3") {
  const std::vector<std::string> z3{"zero_optimization.stage=3", "zero_optimization.stage3_param_persistence_threshold=0"};
  test::temp_dir full, a, b;
  REQUIRE(test::run_config(full.path(), "full", test::tiny_config(full.path()), {"train_steps=4", "devices.ranks=2"}) == 0);
  REQUIRE(test::run_config(a.path(), "a", test::tiny_config(a.path()), with(z3, {"train_steps=2", "devices.ranks=2"})) == 0);
  REQUIRE(test::run_config(a.path(), "a", test::tiny_config(a.path()),
                           {"train_steps=4", "devices.ranks=4", "zero_optimization.stage=1"}, /*resume=*/true) == 0);
  REQUIRE(test::run_config(b.path(), "b", test::tiny_config(b.path()),
                           {"train_steps=2", "devices.ranks=2", "zero_optimization.stage=1"}) == 0);
  REQUIRE(test::run_config(b.path(), "b", test::tiny_config(b.path()), with(z3, {"train_steps=4", "devices.ranks=2"}),
                           /*resume=*/true) == 0);
  auto want = test::load_run_checkpoint(full.path() + "/ckpt", "4");
  test::check_close_state(test::load_run_checkpoint(a.path() + "/ckpt", "4"), want, test::zero3_reduction_order);
  test::check_close_state(test::load_run_checkpoint(b.path() + "/ckpt", "4"), want, test::zero3_reduction_order);
}

// offload_param on NVMe moves where each rank's weight partition waits between gathers,
// not what is computed: the same bits as in memory, with everything on NVMe or only what
// is beyond max_in_cpu, small buffers (several chunks per tensor piece, two in flight),
// alone or beside the optimizer state on NVMe; the swap files are gone at the end.
TEST_CASE("ZeRO stage 3 with offload_param on NVMe equals the partitions in memory, bit for bit") {
  test::temp_dir swap;
  const std::vector<std::string> z3{"devices.ranks=2", "zero_optimization.stage=3",
                                    "zero_optimization.stage3_param_persistence_threshold=1000"};
  const auto memory = train_checkpoint(z3);
  auto nvme = [&](std::int64_t max_in_cpu) {
    return std::vector<std::string>{"zero_optimization.offload_param.device=\"nvme\"",
                                    fmt::format("zero_optimization.offload_param.nvme_path=\"{}\"", swap.path()),
                                    "zero_optimization.offload_param.buffer_size=1000",
                                    "zero_optimization.offload_param.buffer_count=2",
                                    fmt::format("zero_optimization.offload_param.max_in_cpu={}", max_in_cpu)};
  };
  for (std::int64_t max_in_cpu : {0, 3000}) {
    CAPTURE(max_in_cpu);
    test::temp_dir dir;
    REQUIRE(test::run_config(dir.path(), "z3", test::tiny_config(dir.path()), with(z3, nvme(max_in_cpu))) == 0);
    test::check_same_state(test::load_run_checkpoint(dir.path() + "/ckpt", "latest"), memory);
    std::ifstream in(dir.path() + "/run/train.log");
    std::stringstream log;
    log << in.rdbuf();
    CHECK(log.str().find("ZeRO-Infinity: each rank's partition of the working weights beyond its first") !=
          std::string::npos);
    CHECK(log.str().find("NVMe engine actor: ") != std::string::npos); // the parameter reads and writes went through it
    CHECK(log.str().find("(as expected)") != std::string::npos);
    CHECK(log.str().find("the accounting expected") == std::string::npos);
    CHECK(std::filesystem::is_empty(swap.path()));
  }
  // Beside the optimizer state on NVMe, in the same folder.
  const auto both = train_checkpoint(with(with(z3, nvme(0)), {"zero_optimization.offload_optimizer.device=\"nvme\"",
                                                              fmt::format("zero_optimization.offload_optimizer.nvme_path=\"{}\"", swap.path()),
                                                              "zero_optimization.sub_group_size=2048"}));
  test::check_same_state(both, memory);
  CHECK(std::filesystem::is_empty(swap.path()));
}

// limits.gradient_partition = "nvme": the partition each micro-batch's gradients are summed
// into is a file in the optimizer's swap folder (core/file_backed.hpp), read and written
// through a mapping whose windows are paged out after each pass; the same sums in the same
// order, so the same bits as in memory (with fp16 and clipping the update scales each
// window as it goes).
TEST_CASE("ZeRO stages 2 and 3 with the gradient partition on NVMe equal it in memory, bit for bit") {
  test::temp_dir swap;
  // 16 KiB windows: the tiny model's partitions (about 90 KiB) take several per pass.
  set_file_backed_window_bytes(16384);
  struct restore {
    ~restore() { set_file_backed_window_bytes(0); }
  } restore_window;
  const std::vector<std::string> nvme{"zero_optimization.offload_optimizer.device=\"nvme\"",
                                      fmt::format("zero_optimization.offload_optimizer.nvme_path=\"{}\"", swap.path()),
                                      "zero_optimization.sub_group_size=2048"};
  for (const char* stage : {"zero_optimization.stage=3", "zero_optimization.stage=2"})
    for (const bool fp16 : {false, true}) {
      CAPTURE(stage);
      CAPTURE(fp16);
      auto base = with(nvme, {"devices.ranks=2", stage});
      if (fp16) base = with(base, {"fp16.enabled=true", "fp16.initial_scale_power=8"});
      const auto memory = train_checkpoint(with(base, {"limits.gradient_partition=\"memory\""}));
      test::temp_dir dir;
      REQUIRE(test::run_config(dir.path(), "z3", test::tiny_config(dir.path()),
                               with(base, {"limits.gradient_partition=\"nvme\""})) == 0);
      test::check_same_state(test::load_run_checkpoint(dir.path() + "/ckpt", "latest"), memory);
      std::ifstream in(dir.path() + "/run/train.log");
      std::stringstream log;
      log << in.rdbuf();
      INFO(log.str());
      CHECK(log.str().find("(as expected)") != std::string::npos);
      CHECK(log.str().find("the accounting expected") == std::string::npos);
      CHECK(std::filesystem::is_empty(swap.path())); // the file went with the run
    }
}

// comms_logger sees ZeRO-3's own collectives: the fetchers' broadcasts, the gradient
// partitions' all-reduces and the shards' gathers (a checkpoint during the run), each
// under its caller.
TEST_CASE("comms_logger on 2 ranks with ZeRO stage 3 times the fetchers', gradient partitions' and shards' calls") {
  const std::string log = run_log({"devices.ranks=2", "zero_optimization.stage=3", "optimizer.type=\"Lamb\"",
                                   "zero_optimization.stage3_param_persistence_threshold=1000", "train_steps=2",
                                   "comms_logger.enabled=true", "comms_logger.debug=true", "checkpoint.save_interval=1"});
  const auto at = log.find("comms_logger summary");
  REQUIRE(at != std::string::npos);
  const std::string table = log.substr(at);
  CHECK(table.find("broadcast") != std::string::npos);
  CHECK(table.find("fetcher 0 of rank 0") != std::string::npos);
  CHECK(table.find("gradient partition 0 of rank 0") != std::string::npos);
  CHECK(table.find("shard 0 of rank 0") != std::string::npos);
}

// ZeRO-Infinity on one rank: stage 3 with offload_param on NVMe moves the weights to the
// swap file and back around each part (no other rank to gather from). Each micro-batch's
// gradients are computed from zero and then added to the partition, where stage 0's
// GEMMs accumulate into the running sum: the same up to that rounding order; with the
// optimizer state on NVMe as well, the same bits as without it.
TEST_CASE("ZeRO stage 3 on one rank with offload_param on NVMe equals stage 0") {
  test::temp_dir swap;
  const auto stage0 = train_checkpoint({});
  const std::vector<std::string> nvme{"zero_optimization.stage=3", "zero_optimization.stage3_param_persistence_threshold=1000",
                                      "zero_optimization.offload_param.device=\"nvme\"",
                                      fmt::format("zero_optimization.offload_param.nvme_path=\"{}\"", swap.path()),
                                      "zero_optimization.offload_param.max_in_cpu=0",
                                      "zero_optimization.offload_param.buffer_size=1000"};
  test::temp_dir dir;
  REQUIRE(test::run_config(dir.path(), "z3", test::tiny_config(dir.path()), nvme) == 0);
  const auto alone = test::load_run_checkpoint(dir.path() + "/ckpt", "latest");
  test::check_close_state(alone, stage0, test::zero3_reduction_order);
  std::ifstream in(dir.path() + "/run/train.log");
  std::stringstream log;
  log << in.rdbuf();
  CHECK(log.str().find("ZeRO-3 fetcher of rank 0: gathered ") != std::string::npos);
  CHECK(log.str().find("(as expected)") != std::string::npos);
  CHECK(log.str().find("the accounting expected") == std::string::npos);
  const auto both = train_checkpoint(with(nvme, {"zero_optimization.offload_optimizer.device=\"nvme\"",
                                                 fmt::format("zero_optimization.offload_optimizer.nvme_path=\"{}\"", swap.path()),
                                                 "zero_optimization.sub_group_size=2048"}));
  test::check_same_state(both, alone);
  CHECK(std::filesystem::is_empty(swap.path()));
}
