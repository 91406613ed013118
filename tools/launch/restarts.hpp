// `dsactor launch --max_restarts`: attempts of a job until one ends well, a user stops it,
// its configuration is refused (exit code 2: a restart would be refused too), or the
// restarts are spent. Each restart probes every host of the original list
// (host_probe.hpp; every slot again on one host) and starts the ranks again on those that
// answer, in list order, at least --min_procs and at most --max_procs processes on at least
// --min_nodes hosts: a host lost earlier that answers again rejoins. A `dsactor run` job with --resume-if-any (its latest committed checkpoint, or afresh
// before the first) in the run directory the first attempt chose (DSA_LAUNCH_RUN_DIR). On
// fewer ranks the run keeps train_batch_size by accumulating more micro-batches, or refuses.
#pragma once

#include "tools/launch/hostfile.hpp"
#include "tools/launch/launch_plan.hpp"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dsa::tools {

// How one attempt of the job ended: the launcher's exit code, the first rank that failed
// and how (the restart's cause), and whether Ctrl-C (or SIGTERM) stopped it.
struct attempt_end {
  int code = 0;
  std::string cause;            // the first rank that ended badly, and how
  std::string rendezvous_cause; // what the rendezvous saw first (a host may never report its ranks' ends)
  bool interrupted = false;
};

// The hosts a restart may drop: a host list's (null: one host) and the ssh client that
// probes them; `remote` is kept true while any host other than localhost is left.
struct restart_hosts {
  std::vector<host_slots>* hosts = nullptr;
  std::string ssh;
  bool* remote = nullptr;
};

// (choose_restart_hosts, hostfile.hpp, picks the hosts of each restart.)

// What the restarts may do: how many, and the least (min_procs, min_nodes: hosts of the
// list) and most (max_procs; 0: the first attempt's count) a restart starts on.
struct restart_limits {
  int max_restarts = 0;
  int min_procs = 1, max_procs = 0;
  int min_nodes = 1;
};

// What is wrong with the restart flags, said for the user (nothing when they hold):
// negative counts, --max_procs under --min_procs, bounds (`given`: the flags the user
// wrote among min_procs, min_nodes, max_procs) without --max_restarts, --min_nodes without
// a host list (`hosts` null) or above its host count, or beyond what --max_procs lets a
// restart reach (it takes hosts in list order).
std::optional<std::string> check_restart_limits(const restart_limits& limits, const std::vector<std::string>& given,
                                                const std::vector<host_slots>* hosts);

// Runs attempts through `start` (one attempt: starts the ranks, supervises them, fills
// its attempt_end, returns the exit code) and returns the last attempt's code.
int run_attempts(launch_request& request, restart_limits limits, bool dsactor_run, restart_hosts hosts,
                 const std::function<int(attempt_end&)>& start);

// Sets DSA_LAUNCH_RUN_DIR, unless set, to the run directory `dsactor run CONFIG` would pick now,
// so that every attempt uses the first one's (a config's run_dir wins).
void pin_run_dir(const std::string& config_path);

} // namespace dsa::tools
