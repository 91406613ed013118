// See pipeline_config.hpp.
#include "actors/train/config/pipeline_config.hpp"

#include "optim/param_reader.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <utility>

namespace dsa::train {

void read_pipeline(const config& cfg, run_config& rc, config_problems& problems, int processes) {
  optim::param_reader r(cfg, "pipeline", problems);
  std::int64_t stages = 1;
  r.read("stages", stages);
  std::int64_t per_process = 1;
  const bool per_process_set = cfg.has("pipeline.stages_per_process");
  r.read("stages_per_process", per_process);
  r.read("partition", rc.partition);
  r.read("schedule", rc.schedule);
  r.read("speculative_update", rc.speculative_update);
  r.read("max_deferred_w", rc.max_deferred_w);
  r.read("max_stashed", rc.max_stashed);
  r.check_unknown();
  if (stages < 1 || stages > 64)
    r.invalid("stages", fmt::format("must be in 1..64, got {}", stages));
  if (rc.schedule != "1f1b" && rc.schedule != "gpipe" && rc.schedule != "zb")
    r.invalid("schedule", fmt::format("expected '1f1b', 'gpipe' or 'zb', got '{}'", rc.schedule));
  if (rc.max_deferred_w < 0 || rc.max_deferred_w > 1024)
    r.invalid("max_deferred_w",
              fmt::format("must be in 0..1024 (0: pipeline.max_stashed bounds it), got {}", rc.max_deferred_w));
  for (const auto& [key, value] : {std::pair{"max_deferred_w", rc.max_deferred_w}, {"max_stashed", rc.max_stashed}})
    if (value != 0 && rc.schedule != "zb")
      r.invalid(key, fmt::format("bounds the zero-bubble schedule's deferred W work: it needs "
                                 "pipeline.schedule = \"zb\" (got \"{}\")",
                                 rc.schedule));
  if (stages < 1 || stages > 64) stages = 1;
  rc.stages = static_cast<std::uint32_t>(stages);
  // A stage must hold 1F1B's warm-up: the first stage runs S forwards before its first B.
  if (rc.max_stashed != 0 && (rc.max_stashed < rc.stages || rc.max_stashed > 1024))
    r.invalid("max_stashed", fmt::format("must be 0 (the number of stages: 1F1B's activation memory, ZB-H1) or in "
                                         "{}..1024 (at least pipeline.stages; 2 x stages - 1 gives ZB-H2), got {}",
                                         rc.stages, rc.max_stashed));
  // A value of at least the stage count keeps every stage in each process.
  if (per_process >= stages) per_process = stages;
  if (per_process < 1 || stages % per_process != 0) {
    r.invalid("stages_per_process", fmt::format("must divide pipeline.stages = {} (or be at least it: every stage in "
                                                "each process), got {}",
                                                stages, per_process));
    per_process = stages;
  }
  // One process runs every stage when it is the only one.
  rc.stages_per_process = processes > 1 ? static_cast<std::uint32_t>(per_process) : rc.stages;
  rc.pipe_processes = static_cast<int>(rc.stages / rc.stages_per_process);
  if (rc.pipe_processes > 1 && processes % rc.pipe_processes != 0) {
    r.invalid("stages", fmt::format("a job of {} processes cannot hold replicas of {} processes ({} stages, {} per "
                                    "process{}): the process count must be a multiple of {}",
                                    processes, rc.pipe_processes, stages, per_process,
                                    per_process_set ? "" : ", pipeline.stages_per_process's default",
                                    rc.pipe_processes));
    rc.stages_per_process = rc.stages;
    rc.pipe_processes = 1;
  }
}

void check_pipeline_combinations(const config& cfg, const run_config& rc, config_problems& problems) {
  // The zero-bubble schedule's W runs after B; what reduces the gradients during the
  // backward itself (partitioned gradients) is not written for it yet. (The speculative
  // update starts once the reducer has the step's gradients: after the last W.)
  if (rc.schedule == "zb" && rc.gradients_partitioned())
    problems.add(cfg.problem(problem_kind::invalid_value, "pipeline.schedule",
                             fmt::format("\"zb\" with ZeRO stage {} over {} ranks: partitioned gradients are summed "
                                         "during the backward, before the deferred W work; use \"1f1b\"",
                                         rc.zero_stage, rc.batch.data_parallel_size)));
}

actors::schedule_kind schedule_kind_of(const run_config& rc) {
  if (rc.schedule == "gpipe") return actors::schedule_kind::gpipe;
  if (rc.schedule == "zb") return actors::schedule_kind::zero_bubble;
  return actors::schedule_kind::one_f_one_b;
}

} // namespace dsa::train
