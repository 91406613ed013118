// SIGINT / SIGTERM during a run: the first one asks the run to finish its
// current step, write a checkpoint and exit; a second one exits at once.
#pragma once

namespace dsa::train {

// Installs the handlers (SA_RESTART) and clears an earlier run's request. Each first stop
// signal, and SIGUSR1 at any time, also asks for a flight record in the trace
// (io/net/flight_recorder.hpp).
void install_stop_handlers();
// The same request as a first signal, from the launcher's rendezvous server (a rank on
// another host, which the launcher's Ctrl-C does not reach); a signal after it still
// counts as the first. Not async-signal-safe.
void request_stop();
bool stop_requested();

} // namespace dsa::train
