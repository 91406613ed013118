// Weak scaling of data parallelism: see bench_scaling.hpp.
#include "tools/bench/bench_scaling.hpp"

#include "tools/bench/bench_process.hpp"
#include "tools/bench/bench_util.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>


#include <algorithm>
#include <fstream>
#include <vector>

namespace dsa::tools {
namespace {

// BERT-mini on the quick start's prepared data, timing columns on, no checkpoints, no evaluation.
std::string config_text(const scaling_plan& p) {
  return quickstart_bert_config("mini", p.seq,
                                fmt::format("train_micro_batch_size_per_gpu = {}\ngradient_accumulation_steps = {}\n"
                                            "train_steps = {}",
                                            p.micro_batch, p.accumulation, p.steps));
}

} // namespace

expected<scaling_result> bench_weak_scaling(const scaling_plan& p) {
  if (p.steps <= p.warmup || p.warmup < 0)
    return make_error(errc::invalid_argument, "weak scaling: {} steps with {} warm-up", p.steps, p.warmup);
  DSA_ASSIGN_OR_RETURN(std::string self, dsactor_path());
  const std::string config = p.work_dir + "/scaling.toml";
  std::ofstream(config) << config_text(p);
  const int per_rank = p.micro_batch * p.accumulation;
  auto run = [&](const char* name, int ranks) -> expected<double> {
    const std::string run_dir = fmt::format("{}/{}", p.work_dir, name), log = run_dir + ".log";
    std::vector<std::string> argv{self};
    if (ranks > 1) argv.insert(argv.end(), {"launch", "--num_procs", std::to_string(ranks)});
    else argv.push_back("run");
    argv.insert(argv.end(), {config, "--set", fmt::format("run_dir=\"{}\"", run_dir), "--set",
                             fmt::format("train_batch_size={}", per_rank * ranks)});
    DSA_ASSIGN_OR_RETURN(int code, run_logged(argv, log));
    if (code != 0) return make_error(errc::runtime, "the {} run failed (exit code {}); see {}", name, code, log);
    return median_step_seconds(run_dir, p.warmup);
  };
  scaling_result r;
  DSA_ASSIGN_OR_RETURN(r.dp1_step_s, run("dp1", 1));
  DSA_ASSIGN_OR_RETURN(r.dp2_step_s, run("dp2", 2));
  return r;
}

} // namespace dsa::tools
