// `dsactor launch --max_restarts`; see restarts.hpp.
#include "tools/launch/restarts.hpp"

#include "actors/train/run/trainer.hpp"
#include "tools/launch/host_probe.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace dsa::tools {
namespace {

// "4 process(es) on 2 host(s)".
std::string describe_hosts(const restart_hosts& h, int procs) {
  return h.hosts ? fmt::format("{} process(es) on {} host(s)", procs, h.hosts->size())
                 : fmt::format("{} process(es)", procs);
}

// Before a restart of a host-list job over ssh: the original list's hosts that answer now,
// up to max_procs processes (choose_restart_hosts). Fills the request's process count.
restart_choice answering_hosts(const restart_hosts& h, const std::vector<host_slots>& original, int max_procs,
                               launch_request& request) {
  restart_choice c;
  if (!h.hosts || h.ssh.empty()) {
    c.procs = request.num_procs = std::min(request.num_procs, max_procs);
    return c;
  }
  c = choose_restart_hosts(original, hosts_answering(original, h.ssh, 5), *h.hosts, max_procs);
  *h.hosts = c.hosts;
  request.num_procs = c.procs;
  if (h.remote)
    *h.remote = std::any_of(c.hosts.begin(), c.hosts.end(), [](const host_slots& x) { return x.host != "localhost"; });
  return c;
}

} // namespace

int run_attempts(launch_request& request, restart_limits limits, bool dsactor_run, restart_hosts hosts,
                 const std::function<int(attempt_end&)>& start) {
  const int port = request.master_port;
  const std::vector<host_slots> original = hosts.hosts ? *hosts.hosts : std::vector<host_slots>{};
  const int max_restarts = limits.max_restarts;
  const int max_procs = limits.max_procs <= 0 ? request.num_procs : limits.max_procs;
  for (int attempt = 0;; ++attempt) {
    attempt_end end;
    request.master_port = port; // 0: a fresh one from the OS each time
    const int code = start(end);
    if (code == 0 && attempt > 0)
      fmt::print(stderr, "dsactor launch: the job finished after {} restart(s)\n", attempt);
    if (code == 0) return code;
    const std::string cause = !end.cause.empty()            ? end.cause
                              : !end.rendezvous_cause.empty() ? end.rendezvous_cause
                                                              : fmt::format("the job ended with code {}", code);
    if (end.interrupted) return code;
    if (code == 2) {
      if (attempt == 0)
        fmt::print(stderr, "dsactor launch: not restarting: the job's configuration was refused (exit code 2)\n");
      else
        fmt::print(stderr, "dsactor launch: restart {} was refused by the ranks (exit code 2: their errors above say "
                   "why, e.g. a global batch {} cannot keep); not restarting again\n",
                   attempt, describe_hosts(hosts, request.num_procs));
      return code;
    }
    if (attempt == max_restarts) {
      fmt::print(stderr, "dsactor launch: {}; no restart left (--max_restarts {})\n", cause, max_restarts);
      return code;
    }
    auto token = random_job_token();
    if (!token) {
      fmt::print(stderr, "dsactor launch: no job token for the restart: {}\n", token.err().message);
      return code;
    }
    request.job_token = *token;
    if (dsactor_run &&
        std::find(request.command.begin(), request.command.end(), "--resume-if-any") == request.command.end())
      request.command.push_back("--resume-if-any");
    const std::string before = describe_hosts(hosts, request.num_procs);
    const restart_choice chosen = answering_hosts(hosts, original, max_procs, request);
    if (request.num_procs < std::max(1, limits.min_procs)) {
      fmt::print(stderr, "dsactor launch: {}; not restarting: {} of the hosts answer ({} did not), fewer than "
                 "--min_procs {}\n", cause, describe_hosts(hosts, request.num_procs), chosen.dropped, limits.min_procs);
      return code;
    }
    if (hosts.hosts && static_cast<int>(hosts.hosts->size()) < limits.min_nodes) {
      fmt::print(stderr, "dsactor launch: {}; not restarting: {} of the hosts answer ({} did not), fewer than "
                 "--min_nodes {}\n", cause, describe_hosts(hosts, request.num_procs), chosen.dropped, limits.min_nodes);
      return code;
    }
    std::string changes;
    if (!chosen.dropped.empty()) changes += chosen.dropped + " did not answer";
    if (!chosen.rejoined.empty()) changes += (changes.empty() ? "" : "; ") + chosen.rejoined + " rejoined";
    fmt::print(stderr, "dsactor launch: restart {} of {}: {}; {} before, {} after{}; {}\n", attempt + 1,
               max_restarts, cause, before, describe_hosts(hosts, request.num_procs),
               changes.empty() ? "" : " (" + changes + ")",
               dsactor_run ? "resuming from the latest committed checkpoint (rank 0 names its step)"
                           : "the program resumes by itself");
    std::fflush(stderr);
  }
}

std::optional<std::string> check_restart_limits(const restart_limits& limits, const std::vector<std::string>& given,
                                                const std::vector<host_slots>* hosts) {
  if (limits.max_restarts < 0) return std::string("--max_restarts must be >= 0");
  if (limits.max_procs < 0 || (limits.max_procs > 0 && limits.max_procs < std::max(1, limits.min_procs)))
    return fmt::format("--max_procs {} must be at least --min_procs {} (or 0: the job's own count)", limits.max_procs,
                       limits.min_procs);
  if (limits.max_restarts == 0 && !given.empty())
    return fmt::format("--{} bounds the restarts of --max_restarts N, and this job has none (add --max_restarts N, "
                       "N > 0)",
                       given.front());
  const int min_nodes = limits.min_nodes;
  if (min_nodes < 1) return std::string("--min_nodes must be >= 1");
  if (min_nodes == 1) return std::nullopt;
  if (!hosts) return fmt::format("--min_nodes {} counts the hosts of a --hostfile list, and this job has none", min_nodes);
  if (min_nodes > static_cast<int>(hosts->size()))
    return fmt::format("--min_nodes {} is more than the {} host(s) this job starts on", min_nodes, hosts->size());
  if (limits.max_procs > 0) {
    // A restart takes the hosts that answer in list order, up to --max_procs processes: if
    // the first min_nodes - 1 hosts' slots already reach it, no restart can span min_nodes.
    std::size_t before = 0;
    for (int h = 0; h + 1 < min_nodes; ++h) before += (*hosts)[static_cast<std::size_t>(h)].slots.size();
    if (static_cast<int>(before) >= limits.max_procs)
      return fmt::format("--max_procs {} is filled by the first {} host(s) of the list ({} slots; a restart takes "
                         "hosts in list order), so no restart could span --min_nodes {}",
                         limits.max_procs, min_nodes - 1, before, min_nodes);
  }
  return std::nullopt;
}

void pin_run_dir(const std::string& config_path) {
  if (std::getenv("DSA_LAUNCH_RUN_DIR")) return;
  ::setenv("DSA_LAUNCH_RUN_DIR", train::timestamped_run_dir(config_path).c_str(), 1);
}

} // namespace dsa::tools
