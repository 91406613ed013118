// Marks the threads a CAF actor system starts (its scheduler workers and timer) as
// runtime threads (core/device_waits.hpp), so a host wait on a device there is refused.
// Every actor system of the runtime installs it on its config.
#pragma once

#include <caf/actor_system_config.hpp>

namespace dsa::actors {

void mark_runtime_threads(caf::actor_system_config& cfg);

} // namespace dsa::actors
