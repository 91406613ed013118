// SIGINT / SIGTERM during a run: the first one asks the run to finish its
// current step, write a checkpoint and exit; a second one exits at once.
#pragma once

namespace dsa::train {

// Installs the handlers (SA_RESTART) and clears an earlier run's request.
void install_stop_handlers();
bool stop_requested();

} // namespace dsa::train
