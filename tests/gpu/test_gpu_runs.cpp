// `dsactor run` on a CUDA rank, in process, on the train tests' tiny BERT: checkpoints that
// move between CPU and GPU runs (fp16, the optimizer on the rank's device: its moments and
// the loss scaler in the checkpoint), both ways, against the CPU run straight through; and
// the deterministic mode's two runs and resume, bit for bit.
#include "gpu_test_util.hpp"

#include "tests/support/tolerances.hpp"
#include "tests/train/train_fixture.hpp"

#include <cmath>
#include <string>
#include <vector>

namespace dsa::test {
namespace {

const std::vector<std::string> device_optimizer_fp16{"zero_optimization.stage=0",
                                                     "zero_optimization.offload_optimizer.device=\"none\"",
                                                     "fp16.enabled=true", "fp16.initial_scale_power=12"};

std::vector<std::string> with(std::vector<std::string> v, const std::vector<std::string>& more) {
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

// Steps 1..2 on `first`, then --resume to step 4 on `second`; every step's loss.
std::vector<double> resumed_losses(const std::string& first, const std::string& second,
                                   const std::vector<std::string>& overrides) {
  temp_dir dir;
  const std::string cfg = tiny_config(dir.path());
  REQUIRE(run_config(dir.path(), "a", cfg,
                     with(overrides, {"devices.backend=\"" + first + "\"", "train_steps=2"})) == 0);
  REQUIRE(run_config(dir.path(), "b", cfg, with(overrides, {"devices.backend=\"" + second + "\"", "train_steps=4"}),
                     /*resume=*/true) == 0);
  return run_losses(dir.path() + "/run");
}

std::vector<double> straight_losses(const std::string& backend, const std::vector<std::string>& overrides) {
  temp_dir dir;
  REQUIRE(run_config(dir.path(), "a", tiny_config(dir.path()),
                     with(overrides, {"devices.backend=\"" + backend + "\"", "train_steps=4"})) == 0);
  return run_losses(dir.path() + "/run");
}

} // namespace

TEST_CASE("dsactor run: a CPU checkpoint resumes on a CUDA rank and the reverse, close to the CPU run") {
  const std::vector<double> cpu = straight_losses("cpu", device_optimizer_fp16);
  REQUIRE(cpu.size() == 4);
  for (const auto& [first, second] : {std::pair{"cpu", "cuda"}, std::pair{"cuda", "cpu"}}) {
    INFO(first << " then " << second);
    const std::vector<double> got = resumed_losses(first, second, device_optimizer_fp16);
    REQUIRE(got.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      INFO("step " << i + 1 << ": " << got[i] << " vs " << cpu[i]);
      CHECK(std::fabs(got[i] - cpu[i]) <= gpu_run_half_vs_cpu.abs + gpu_run_half_vs_cpu.rel * std::fabs(cpu[i]));
    }
  }
}

TEST_CASE("dsactor run: devices.deterministic gives the same bits twice and across a resume") {
  const std::vector<std::string> det = with(device_optimizer_fp16, {"devices.deterministic=true"});
  const std::vector<double> a = straight_losses("cuda", det), b = straight_losses("cuda", det);
  const std::vector<double> resumed = resumed_losses("cuda", "cuda", det);
  REQUIRE(a.size() == 4);
  CHECK(a == b);
  CHECK(resumed == a);
}

} // namespace dsa::test
