// Which hosts still answer; see host_probe.hpp.
#include "tools/launch/host_probe.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

extern char** environ;

namespace dsa::tools {

std::vector<bool> hosts_answering(const std::vector<host_slots>& hosts, const std::string& ssh, int timeout_s) {
  std::vector<bool> answered(hosts.size(), false);
  std::vector<pid_t> pids(hosts.size(), -1);
  const std::string connect = "ConnectTimeout=" + std::to_string(timeout_s);
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i].host == "localhost") {
      answered[i] = true;
      continue;
    }
    std::vector<std::string> words{ssh, "-o", "BatchMode=yes", "-o", connect, hosts[i].host, "true"};
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    if (::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) == 0) pids[i] = pid;
    posix_spawn_file_actions_destroy(&actions);
  }
  // Every probe reaped: by its own end, or killed at the deadline (a host that drops
  // packets may outlast ConnectTimeout in the kernel's connect).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2 * timeout_s);
  for (bool waiting = true; waiting;) {
    waiting = false;
    for (std::size_t i = 0; i < hosts.size(); ++i) {
      if (pids[i] < 0) continue;
      int status = 0;
      const pid_t done = ::waitpid(pids[i], &status, WNOHANG);
      if (done == pids[i]) {
        answered[i] = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        pids[i] = -1;
      } else if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], &status, 0);
        pids[i] = -1;
      } else {
        waiting = true;
      }
    }
    if (waiting) std::this_thread::sleep_for(std::chrono::milliseconds(20)); // polling children, not a test
  }
  return answered;
}

} // namespace dsa::tools
