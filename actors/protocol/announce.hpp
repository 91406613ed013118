// The one place the protocol is announced to CAF. Every process of a job calls
// it on its actor_system_config, so remote nodes agree on the type names.
#pragma once

#include <caf/actor_system_config.hpp>

namespace dsa::actors {

void announce_protocol(caf::actor_system_config& cfg);

} // namespace dsa::actors
