// The in-process transport: per-(peer, tag) order, tag independence, bad peers, abort.
#include "io/net/communicator.hpp"
#include "io/net/local_transport.hpp"
#include "io/net/subgroup_transport.hpp"

#include <doctest/doctest.h>

#include <string>
#include <thread>

namespace dsa::test {
namespace {

net::bytes message_of(const std::string& s) {
  net::bytes b(s.size());
  for (std::size_t i = 0; i < s.size(); ++i)
    b[i] = static_cast<std::byte>(s[i]);
  return b;
}

std::string text_of(const net::bytes& b) {
  std::string s;
  for (auto c : b)
    s.push_back(static_cast<char>(c));
  return s;
}

TEST_CASE(
    "local transport: same peer and tag arrive in order; other tags and peers are independent") {
  net::local_group group(3);
  auto& a = group.at(0);
  auto& b = group.at(1);
  auto& c = group.at(2);
  CHECK(a.rank() == 0);
  CHECK(c.size() == 3);
  REQUIRE(a.send(2, 7, message_of("a7-first")).has_value());
  REQUIRE(a.send(2, 8, message_of("a8")).has_value());
  REQUIRE(a.send(2, 7, message_of("a7-second")).has_value());
  REQUIRE(b.send(2, 7, message_of("b7")).has_value());
  REQUIRE(a.send(2, 7, message_of("")).has_value());
  // Received in an order unlike the sending order: matching is by (peer, tag).
  CHECK(text_of(*c.recv(1, 7)) == "b7");
  CHECK(text_of(*c.recv(0, 8)) == "a8");
  CHECK(text_of(*c.recv(0, 7)) == "a7-first");
  CHECK(text_of(*c.recv(0, 7)) == "a7-second");
  CHECK(c.recv(0, 7)->empty());
  // A rank may send to itself.
  REQUIRE(b.send(1, 3, message_of("self")).has_value());
  CHECK(text_of(*b.recv(1, 3)) == "self");
}

TEST_CASE("local transport: a peer outside the group is an error naming it") {
  net::local_group group(3);
  for (int bad : {-1, 3, 100}) {
    auto sent = group.at(1).send(bad, 0, message_of("x"));
    REQUIRE_FALSE(sent.has_value());
    CHECK(sent.err().code == errc::invalid_argument);
    CHECK(sent.err().message.find("peer " + std::to_string(bad)) != std::string::npos);
    auto got = group.at(1).recv(bad, 0);
    REQUIRE_FALSE(got.has_value());
    CHECK(got.err().code == errc::invalid_argument);
    CHECK(got.err().message.find("receive from peer " + std::to_string(bad)) != std::string::npos);
  }
}

TEST_CASE("local transport: abort wakes a blocked receiver and fails later calls with the reason") {
  net::local_group group(2);
  expected<net::bytes> got = make_error(errc::runtime, "not received yet");
  std::thread receiver([&] { got = group.at(1).recv(0, 42); }); // nothing is ever sent
  group.at(0).abort(make_error(errc::protocol, "rank 0 gave up"));
  receiver.join();
  REQUIRE_FALSE(got.has_value());
  CHECK(got.err().message.find("rank 0 gave up") != std::string::npos);
  CHECK_FALSE(group.at(0).send(1, 1, message_of("late")).has_value());
  REQUIRE(group.aborted().has_value());
  CHECK(group.aborted()->code == errc::protocol);
}

} // namespace
} // namespace dsa::test

TEST_CASE("subgroup_transport: ranks renumbered, peers mapped, collectives over the members only") {
  dsa::net::local_group group(4);
  // Members 3 and 1 (in that order): 3 is subgroup rank 0.
  std::vector<std::thread> threads;
  std::vector<float> sums(4, 0.0f);
  for (int w : {1, 3})
    threads.emplace_back([&, w] {
      dsa::net::subgroup_transport sub(group.at(w), {3, 1});
      CHECK(sub.size() == 2);
      CHECK(sub.rank() == (w == 3 ? 0 : 1));
      CHECK(*sub.whole_rank(0) == 3);
      CHECK_FALSE(sub.whole_rank(2)); // outside the subgroup: an error, not a crash
      dsa::net::communicator comm(sub, {}, 5);
      float v = static_cast<float>(w);
      REQUIRE(comm.allreduce_sum(&v, dsa::dtype::f32, 1));
      sums[static_cast<std::size_t>(w)] = v;
    });
  for (auto& t : threads) t.join();
  CHECK(sums[1] == 4.0f);
  CHECK(sums[3] == 4.0f);
  CHECK(sums[0] == 0.0f); // rank 0 and 2 took no part
  // An abort of the subgroup aborts the whole group.
  dsa::net::subgroup_transport sub(group.at(0), {0, 2});
  sub.abort(dsa::make_error(dsa::errc::runtime, "stop"));
  CHECK(group.at(2).aborted());
}
