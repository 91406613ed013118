// Running dsactor itself from a benchmark: the program's path, a child with its output in
// a log file, a BERT training config on the quick start's data, and the median step time
// of a finished run (bench scaling, bench pipeline).
#pragma once

#include "core/error.hpp"

#include <string>
#include <vector>

namespace dsa::tools {

// The dsactor program beside this one (dsactor-bench), which runs and launches the runs.
expected<std::string> dsactor_path();

// Runs argv (argv[0] a path) with stdout and stderr into `log` and stdin from /dev/null,
// in this process's environment; its exit code (128 + the signal when killed), or an error.
expected<int> run_logged(const std::vector<std::string>& argv, const std::string& log);

// A run config: BERT of `model_size` at sequence length `seq` on the quick start's prepared
// data (its [data.prepare] keys, so its cached shards are reused), AdamW, the timing columns
// on (wall_clock_breakdown), no evaluation, no final checkpoint; `extra` (top-level keys)
// goes first. The caller sets the batch and the steps with --set or `extra`.
std::string quickstart_bert_config(const std::string& model_size, int seq, const std::string& extra);

// The median of a finished run's step times after its first `warmup` steps (rank 0's
// metrics.jsonl, Train/Samples/elapsed_time_ms_iteration), in seconds.
expected<double> median_step_seconds(const std::string& run_dir, int warmup);

} // namespace dsa::tools
