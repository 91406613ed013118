// The run's end waits for every slot an actor wrote to come back (endpoint::drain, asked by
// the coordinator with drain_atom before it stops the actors): an actor with a slot out
// answers only once its release arrives, and at once when nothing is out.
#include "actors/endpoint.hpp"
#include "actors/protocol/announce.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include <memory>
#include <string>

using namespace dsa;
using namespace dsa::actors;

namespace {

// An actor owning an endpoint that has produced one slot of edge 0 (to an absent peer).
caf::behavior producer(caf::event_based_actor* self, std::shared_ptr<endpoint> io) {
  (void)io->stamp_produced(1, {0, 0}, 0, 0);
  return {
      [=](drain_atom) -> caf::result<done_atom> { return io->drain(self); },
      [=](const released& m) -> std::string {
        auto s = io->received(m, 1);
        return s ? "ok" : s.err().message;
      },
  };
}

} // namespace

TEST_CASE("endpoint drain: answered only once every produced slot is released") {
  caf::actor_system_config cfg;
  announce_protocol(cfg);
  cfg.set("scheduler.max-threads", std::size_t{1});
  cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system system{cfg};
  auto slots = std::make_shared<slot_table>();
  slots->add_edge("activation 0", 2, 1);
  auto io = std::make_shared<endpoint>(slots, nullptr, 0, 0);
  auto actor = system.spawn(producer, io);
  caf::scoped_actor self{system};
  // The slot is out: the drain is not answered within a short wait...
  bool answered = false;
  self->request(actor, std::chrono::milliseconds(50), drain_atom::value)
      .receive([&](done_atom) { answered = true; }, [&](caf::error&) {});
  CHECK_FALSE(answered);
  // ...and a drain waiting when the release comes is answered by it.
  self->send(actor, drain_atom::value);
  std::string reply;
  self->request(actor, caf::infinite, released{{0, 0}, 0})
      .receive([&](const std::string& s) { reply = s; }, [&](caf::error& e) { reply = system.render(e); });
  CHECK(reply == "ok");
  bool done = false;
  self->receive([&](done_atom) { done = true; }, caf::after(std::chrono::seconds(30)) >> [] {});
  CHECK(done);
  // Nothing out: answered at once.
  answered = false;
  self->request(actor, caf::infinite, drain_atom::value).receive([&](done_atom) { answered = true; }, [&](caf::error&) {});
  CHECK(answered);
  self->send_exit(actor, caf::exit_reason::user_shutdown);
}
