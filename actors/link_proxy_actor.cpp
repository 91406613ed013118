// The stand-in for an actor of another process; see link_proxy_actor.hpp.
#include "actors/link_proxy_actor.hpp"

#include "actors/protocol/protocol.hpp"
#include "core/log.hpp"

#include <caf/all.hpp>

namespace dsa::actors {

namespace {

caf::behavior link_proxy(caf::event_based_actor* self, std::shared_ptr<pipe_link> link, int process,
                         std::uint32_t target, std::string name) {
  (void)self;
  auto forward = [=](const link_payload& m) {
    auto sent = link->send(process, target, m);
    if (sent) return;
    log_error("sending to {} in process {}: {}", name, process, sent.err().message);
    link->abort(make_error(sent.err().code, "process {} sending to {} in process {}: {}", link->process(), name,
                           process, sent.err().message));
  };
  return {
      [=](const produced& m) { forward(m); },
      [=](const released& m) { forward(m); },
      [=](const grad_partial& m) { forward(m); },
  };
}

} // namespace

caf::actor spawn_link_proxy(caf::actor_system& sys, std::shared_ptr<pipe_link> link, int process,
                            std::uint32_t target, std::string name) {
  return sys.spawn(link_proxy, std::move(link), process, target, std::move(name));
}

} // namespace dsa::actors
