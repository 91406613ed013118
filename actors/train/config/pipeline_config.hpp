// The "pipeline" table of a run config (stages, stages_per_process, partition, schedule,
// speculative_update, max_deferred_w, max_stashed) and the runtime's schedule kind it names.
#pragma once

#include "actors/schedule_policy.hpp"
#include "actors/train/config/run_config.hpp"
#include "core/config.hpp"
#include "core/config_problems.hpp"

namespace dsa::train {

// Reads the table into rc; every problem names its key.
// processes: the job's (WORLD_SIZE); with several, rc.pipe_processes is stages /
// stages_per_process, and a process count that is not a multiple of it is refused naming both.
void read_pipeline(const config& cfg, run_config& rc, config_problems& problems, int processes = 1);

// After every section is read: the pipeline's combinations with other keys that are refused
// (zb with partitioned gradients), by key.
void check_pipeline_combinations(const config& cfg, const run_config& rc, config_problems& problems);

// pipeline.schedule as the runtime's kind: "gpipe", "zb" (zero_bubble), else 1F1B.
actors::schedule_kind schedule_kind_of(const run_config& rc);

} // namespace dsa::train
