// The rendezvous with ranks as real processes (tests/net/rendezvous_probe.cpp): a join of 4,
// a rank killed with SIGKILL, a stopped (SIGSTOP) rank lost by missed heartbeats.
#include "tests/net/rendezvous_support.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>

namespace dsa::test {
namespace {

using kind = net::server_event::kind;

std::unique_ptr<net::rendezvous_server> start_server(int world, event_log& log,
                                                     net::rendezvous_options options = {}) {
  auto s =
      net::rendezvous_server::start("127.0.0.1", 0, test_token, world, options, log.callback());
  REQUIRE_MESSAGE(s.has_value(), (s ? "" : s.err().to_string()));
  return std::move(*s);
}

TEST_CASE("rendezvous processes: 4 processes join, allgather, leave and exit 0") {
  event_log events;
  auto server = start_server(4, events);
  std::vector<std::unique_ptr<probe_process>> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.push_back(std::make_unique<probe_process>(
        server->port(), r, 4, std::vector<std::string>{"--config", "train_steps=4"}));
  for (auto& p : ranks) {
    auto st = p->wait_exit();
    REQUIRE(st.has_value());
    CHECK(WIFEXITED(*st));
    CHECK(WEXITSTATUS(*st) == 0);
  }
  CHECK(events.wait_for(kind::finished));
  CHECK(server->phase() == net::server_phase::finished);
}

TEST_CASE("rendezvous processes: kill -9 of a rank is seen by the others within the bound") {
  event_log events;
  auto server = start_server(3, events);
  // Rank 1 is a process that blocks after joining; ranks 0 and 2 are in this process.
  probe_process rank1(server->port(), 1, 3, {"--hang-rank", "1", "--config", "train_steps=4"});
  std::optional<expected<std::unique_ptr<net::rendezvous_client>>> rank2;
  std::thread t(
      [&] { rank2.emplace(net::rendezvous_client::join(request_for(server->port(), 2, 3))); });
  auto rank0 = net::rendezvous_client::join(request_for(server->port(), 0, 3));
  t.join();
  REQUIRE_MESSAGE(rank0.has_value(), (rank0 ? "" : rank0.err().to_string()));
  REQUIRE(rank2->has_value());

  REQUIRE(::kill(rank1.pid(), SIGKILL) == 0);
  for (auto* c : {&*rank0, &**rank2}) {
    auto lost = (*c)->wait_lost(wait_bound);
    REQUIRE(lost.has_value());
    CHECK(lost->message.rfind("rank 1 lost (its connection closed without a leave", 0) == 0);
  }
  auto st = rank1.wait_exit();
  REQUIRE(st.has_value());
  CHECK(WIFSIGNALED(*st));
  auto failed = events.wait_for(kind::failed);
  REQUIRE(failed.has_value());
  CHECK(failed->rank == 1);
}

TEST_CASE("rendezvous processes: a stopped rank (SIGSTOP) is lost by missed heartbeats") {
  net::rendezvous_options fast;
  fast.heartbeat_interval = std::chrono::milliseconds(50);
  fast.heartbeat_timeout = std::chrono::milliseconds(1000);
  event_log events;
  auto server = start_server(2, events, fast);
  probe_process rank1(
      server->port(), 1, 2,
      {"--hang-rank", "1", "--heartbeat-interval-ms", "50", "--config", "train_steps=4"});
  net::rendezvous_options patient = fast; // what is tested is the server's view
  patient.heartbeat_timeout = std::chrono::minutes(1);
  auto rank0 = net::rendezvous_client::join(request_for(server->port(), 0, 2), patient);
  REQUIRE_MESSAGE(rank0.has_value(), (rank0 ? "" : rank0.err().to_string()));
  REQUIRE(::kill(rank1.pid(), SIGSTOP) == 0); // its heartbeat thread stops too
  auto lost = (*rank0)->wait_lost(wait_bound);
  REQUIRE(lost.has_value());
  CHECK(lost->message.rfind("rank 1 lost (no heartbeat for ", 0) == 0);
  ::kill(rank1.pid(), SIGKILL);
  CHECK(rank1.wait_exit().has_value());
}

TEST_CASE("rendezvous processes: a process with a wrong token is refused and exits 4") {
  event_log events;
  auto server = start_server(1, events);
  probe_process intruder(server->port(), 0, 1, {}, "not-the-token");
  auto st = intruder.wait_exit();
  REQUIRE(st.has_value());
  CHECK(WIFEXITED(*st));
  CHECK(WEXITSTATUS(*st) == 4);
  CHECK(server->refused() == 1);
  CHECK(server->phase() == net::server_phase::joining);
}

} // namespace
} // namespace dsa::test
