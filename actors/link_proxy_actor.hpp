// A stand-in for an actor of this replica that runs in another process (a stage or
// a reducer): local actors are wired to it as to the actor itself, and it sends what
// they say (produced, released, grad_partial) through the pipe_link.
#pragma once

#include "actors/pipe_link.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <memory>
#include <string>

namespace dsa::actors {

// process: the world rank running actor `target` (the plan's id), named `name` in errors.
// A send that fails aborts the job's transport with the reason, which stops every process.
caf::actor spawn_link_proxy(caf::actor_system& sys, std::shared_ptr<pipe_link> link, int process,
                            std::uint32_t target, std::string name);

} // namespace dsa::actors
