// `dsactor run`: a training or fine-tuning run from a config, on the actor
// runtime. Builds the data, the stages and their optimizer shards, restores a
// checkpoint when asked, runs, checkpoints, evaluates, and reports.
#pragma once

#include <string>
#include <vector>

namespace dsa::train {

struct run_request {
  std::string config_path;
  std::vector<std::string> overrides; // --set key=value
  std::string deepspeed_config;       // --deepspeed_config ds.json
  bool resume = false;                // --resume: checkpoint.load = "latest"
  bool resume_if_any = false;         // --resume-if-any: the same when checkpoint.dir has one
  std::string trace_chrome;           // --trace-chrome FILE
};

// runs/<config's name>-<local time>: the run directory of a config without run_dir (unless
// `dsactor launch --max_restarts` pinned one for the job in DSA_LAUNCH_RUN_DIR).
std::string timestamped_run_dir(const std::string& config_path);

// Returns the process exit code (0 success, 1 failure, 2 bad configuration).
int run_training(const run_request& request);

} // namespace dsa::train
