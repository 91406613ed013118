// The local processes of a launched job: starts each rank (spawn_rank, the one place a
// process_spec becomes a process), forwards their output prefixed with the rank, passes
// Ctrl-C on, and stops every rank when one fails. Used by `dsactor launch`.
#pragma once

#include "core/error.hpp"
#include "tools/launch/launch_plan.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace dsa::tools {

struct supervise_options {
  // After a failure: SIGTERM to every rank, then SIGKILL to those still running this late.
  std::chrono::milliseconds grace{10000};
  // On the first interrupt (Ctrl-C), after the local ranks got the signal: how to reach the
  // ranks started over ssh, which it would not reach (the rendezvous server's interrupt()).
  // Those are not signalled on the first interrupt (their ssh would end without them).
  std::function<void()> on_interrupt;
  // On SIGUSR1: how to ask every rank, on every host, for a flight record (the rendezvous
  // server's request_flight_dumps()); false when it cannot (no server here), and the local
  // ranks get SIGUSR1 instead.
  std::function<bool()> on_flight_request;
  // Whether ranks on other hosts learn of a failure from the rendezvous (dsactor run ranks
  // do; a `-- PROGRAM` need not): then a failure does not signal their ssh clients, whose
  // end would kill them by SIGHUP before they clean up, until the grace has passed.
  bool remote_ranks_hear_rendezvous = false;
};

// One per launcher process: it installs handlers for SIGINT, SIGTERM, SIGHUP and SIGCHLD
// and ignores SIGPIPE. Not thread-safe except fail().
class process_group {
public:
  explicit process_group(supervise_options options);
  ~process_group(); // SIGKILL to every rank still running, then reaps them
  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;

  // Starts `spec` with its variables set on top of this process's environment, in its own
  // process group (so a terminal's Ctrl-C reaches the launcher only, which passes it on
  // once), stdin from /dev/null, stdout and stderr into pipes this group reads, and
  // SIGKILL should the launcher die. spec.argv[0] must be a path (resolve_program).
  status spawn_rank(const process_spec& spec);

  // Any thread (the rendezvous server's): the job failed (`why` names the rank and how;
  // `rank` is that rank, or -1); stop every rank as after a rank's failure.
  void fail(std::string why, int rank = -1);

  // Runs until every rank ended: forwards each line of output as "[rank r] line" to the
  // same stream (stdout or stderr); on a first SIGINT/SIGTERM/SIGHUP sends it to every
  // rank, on a second SIGKILL; when a rank fails (non-zero exit, signal) or fail() is
  // called, sends SIGTERM to every rank and SIGKILL after the grace period. Calls
  // on_end(rank, how) as each rank ends ("exited with code 3", "was killed by signal 9
  // (SIGKILL)"). Returns the launcher's exit code: 0 when every rank exited 0 and nothing
  // failed; otherwise the code of the first rank that failed before the launcher stopped
  // it (128 + signal for a signal), or 1 when every failed rank was stopped by it.
  int supervise(const std::function<void(int rank, const std::string& how)>& on_end);

  class impl;

private:
  std::unique_ptr<impl> impl_;
};

// "exited with code 3", "was killed by signal 9 (SIGKILL)" for a waitpid status.
std::string describe_wait_status(int status);

} // namespace dsa::tools
