// The rendezvous with ranks as threads: join of 1, 2 and 4, allgather and barrier, leave,
// refused tokens, differing configs, inconsistent hellos, and lost ranks and servers.
#include "core/log.hpp"
#include "io/net/rendezvous_frame.hpp"
#include "io/net/tcp_socket.hpp"
#include "tests/net/rendezvous_support.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <sys/socket.h>
#include <unistd.h>

namespace dsa::test {
namespace {

using namespace std::chrono_literals;
using kind = net::server_event::kind;

std::unique_ptr<net::rendezvous_server> start_server(int world, event_log* log = nullptr,
                                                     net::rendezvous_options options = {}) {
  auto s = net::rendezvous_server::start("127.0.0.1", 0, test_token, world, options,
                                         log ? log->callback() : nullptr);
  REQUIRE_MESSAGE(s.has_value(), (s ? "" : s.err().to_string()));
  CHECK((*s)->port() > 0);
  return std::move(*s);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST_CASE("rendezvous: 1, 2 and 4 ranks join, get every blob, allgather, barrier and leave") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    event_log events;
    auto server = start_server(world, &events);
    auto clients = join_all(server->port(), world);
    for (int r = 0; r < world; ++r) {
      auto& c = clients[static_cast<std::size_t>(r)];
      REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.err().to_string()));
      CHECK((*c)->rank() == r);
      REQUIRE((*c)->blobs().size() == static_cast<std::size_t>(world));
      for (int q = 0; q < world; ++q)
        CHECK(text_of((*c)->blobs()[static_cast<std::size_t>(q)]) == "blob" + std::to_string(q));
    }
    CHECK(events.wait_for(kind::joined));
    CHECK(server->phase() == net::server_phase::running);

    // Two allgathers and a barrier, every rank on its own thread.
    std::vector<std::thread> threads;
    std::vector<std::string> gathered(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        auto& c = *clients[static_cast<std::size_t>(r)];
        for (std::string key : {"a", "b"}) {
          auto g = c->allgather(key, bytes_of(key + std::to_string(r)));
          REQUIRE(g.has_value());
          for (const auto& b : *g)
            gathered[static_cast<std::size_t>(r)] += text_of(b) + " ";
        }
        REQUIRE(c->barrier("end").has_value());
      });
    for (auto& t : threads)
      t.join();
    std::string expect;
    for (std::string key : {"a", "b"})
      for (int q = 0; q < world; ++q)
        expect += key + std::to_string(q) + " ";
    for (const auto& g : gathered)
      CHECK(g == expect);

    for (auto& c : clients) {
      REQUIRE((*c)->leave().has_value());
      CHECK((*c)->state() == net::client_state::left);
    }
    CHECK(events.wait_for(kind::finished));
    CHECK(server->phase() == net::server_phase::finished);
    for (auto& c : clients)
      CHECK_FALSE((*c)->lost_error().has_value()); // leaving is not a loss
  }
}

TEST_CASE("rendezvous: the server's interrupt and flight-dump requests reach every joined rank, each its own") {
  const int world = 3;
  // Before the server and clients, whose threads call into them, so they outlive them.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> interrupts(world), dumps(world);
  auto server = start_server(world);
  auto clients = join_all(server->port(), world);
  for (int r = 0; r < world; ++r) {
    auto& c = clients[static_cast<std::size_t>(r)];
    REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.err().to_string()));
    (*c)->set_on_interrupt([&, r] {
      std::lock_guard lock(mu);
      ++interrupts[static_cast<std::size_t>(r)];
      cv.notify_all();
    });
    (*c)->set_on_flight_dump([&, r] {
      std::lock_guard lock(mu);
      ++dumps[static_cast<std::size_t>(r)];
      cv.notify_all();
    });
  }
  auto every = [&](const std::vector<int>& v, int n) {
    return std::all_of(v.begin(), v.end(), [n](int x) { return x == n; });
  };
  server->request_flight_dumps();
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, 10s, [&] { return every(dumps, 1); }));
  }
  server->request_flight_dumps();
  server->interrupt();
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, 10s, [&] { return every(dumps, 2) && every(interrupts, 1); }));
  }
  for (auto& c : clients) REQUIRE((*c)->leave().has_value());
  std::lock_guard lock(mu);
  CHECK(every(dumps, 2));
  CHECK(every(interrupts, 1));
}

// Server and ranks share this process's steady clock, so the true offset is 0: every
// estimate must contain it within its own error bound (half a round trip: exact, whatever
// the scheduling), and that bound is the best probe's.
TEST_CASE("rendezvous: a rank's estimate of the server's clock contains the true offset within its error") {
  auto server = start_server(2);
  auto clients = join_all(server->port(), 2);
  for (auto& c : clients) REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.err().to_string()));
  for (auto& c : clients) {
    auto estimate = (*c)->estimate_server_clock(5);
    REQUIRE_MESSAGE(estimate.has_value(), (estimate ? "" : estimate.err().to_string()));
    CHECK(estimate->probes == 5);
    CHECK(estimate->error_ns > 0);
    CHECK(static_cast<std::uint64_t>(estimate->offset_ns < 0 ? -estimate->offset_ns : estimate->offset_ns) <=
          estimate->error_ns);
  }
  CHECK_FALSE((*clients[0])->estimate_server_clock(0).has_value());
  // Probes interleave with collectives on the same connection.
  std::thread other([&] { CHECK((*clients[1])->barrier("x").has_value()); });
  CHECK((*clients[0])->estimate_server_clock(2).has_value());
  CHECK((*clients[0])->barrier("x").has_value());
  other.join();
  for (auto& c : clients) REQUIRE((*c)->leave().has_value());
  // After leave the client is not joined: an error, not a hang.
  CHECK_FALSE((*clients[0])->estimate_server_clock(1).has_value());
}

TEST_CASE("rendezvous: a wrong or missing token is refused, logged with the peer, not counted") {
  char log_path[] = "/tmp/dsa_rdzv_log_XXXXXX";
  int fd = ::mkstemp(log_path);
  REQUIRE(fd >= 0);
  ::close(fd);
  REQUIRE(set_log_file(log_path));
  event_log events;
  auto server = start_server(1, &events);

  auto bad = request_for(server->port(), 0, 1);
  bad.job_token = "guessed-token";
  auto refused = net::rendezvous_client::join(bad);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.err().message.find("refused the connection from 127.0.0.1:") != std::string::npos);
  CHECK(refused.err().message.find("wrong job token") != std::string::npos);

  bad.job_token = "";
  auto missing = net::rendezvous_client::join(bad);
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.err().message.find("no job token") != std::string::npos);

  // Something that is not a rendezvous client at all.
  {
    auto raw = net::tcp_connect("127.0.0.1", server->port(), std::chrono::steady_clock::now());
    REQUIRE(raw.has_value());
    std::string junk = "GET / HTTP/1.0\r\n\r\n";
    REQUIRE(net::send_all(raw->get(), junk.data(), junk.size(), "server").has_value());
    char buf[256];
    CHECK(::recv(raw->get(), buf, sizeof buf, 0) >= 0); // the refusal, or the close: no hang
  }
  // The refusals did not take rank 0's place: the real rank 0 joins and the job runs.
  auto good = net::rendezvous_client::join(request_for(server->port(), 0, 1));
  REQUIRE_MESSAGE(good.has_value(), (good ? "" : good.err().to_string()));
  CHECK(events.wait_for(kind::joined));
  CHECK(server->refused() == 3);
  REQUIRE((*good)->leave().has_value());
  CHECK(events.wait_for(kind::finished));

  set_log_file("");
  std::string log = read_file(log_path);
  ::unlink(log_path);
  CHECK(log.find("refused the connection from 127.0.0.1:") != std::string::npos);
  CHECK(log.find("wrong job token") != std::string::npos);
  CHECK(log.find("no job token") != std::string::npos);
  CHECK(log.find("guessed-token") == std::string::npos); // a token is never logged
  CHECK(log.find(test_token) == std::string::npos);
}

TEST_CASE("rendezvous: differing configs are refused, naming the keys and the ranks") {
  auto server = start_server(3);
  net::config_summary base{{"optimizer.params.lr", "0.001"}, {"train_steps", "4"}};
  auto other = base;
  other["optimizer.params.lr"] = "0.0002";
  other["zero_optimization.stage"] = "2";
  std::vector<std::optional<expected<std::unique_ptr<net::rendezvous_client>>>> results(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      results[static_cast<std::size_t>(r)].emplace(
          net::rendezvous_client::join(request_for(server->port(), r, 3, r == 2 ? other : base)));
    });
  for (auto& t : threads)
    t.join();
  for (auto& r : results) {
    REQUIRE_FALSE(r->has_value());
    CHECK(r->err().code == errc::config);
    CHECK(r->err().message ==
          "rank 2's config differs from rank 0's: optimizer.params.lr = 0.001 vs 0.0002, "
          "zero_optimization.stage = (unset) vs 2");
  }
  CHECK(server->phase() == net::server_phase::failed);
}

TEST_CASE("rendezvous: config_difference lists keys in order and counts past eight") {
  net::config_summary a, b;
  CHECK(net::config_difference(a, b, 1).empty());
  for (int i = 0; i < 10; ++i) {
    a["k" + std::to_string(i)] = "1";
    b["k" + std::to_string(i)] = "2";
  }
  std::string d = net::config_difference(a, b, 3);
  CHECK(d.rfind("rank 3's config differs from rank 0's: k0 = 1 vs 2, k1 = 1 vs 2", 0) == 0);
  CHECK(d.find("and 2 more") != std::string::npos);
}

TEST_CASE("rendezvous: a world size mismatch, a rank out of range and a duplicate rank fail the "
          "job clearly") {
  SUBCASE("world size") {
    auto server = start_server(2);
    auto r = net::rendezvous_client::join(request_for(server->port(), 0, 3));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.err().message.find("was started with world size 3; the rendezvous expects 2") !=
          std::string::npos);
    CHECK(server->phase() == net::server_phase::failed);
  }
  SUBCASE("rank out of range") {
    auto server = start_server(2);
    // The client checks its own rank, so speak the protocol directly to reach the server.
    auto raw = net::tcp_connect("127.0.0.1", server->port(), std::chrono::steady_clock::now());
    REQUIRE(raw.has_value());
    auto hello =
        net::encode_frame(net::frame_type::hello, net::encode_hello({test_token, 5, 2, {}, {}}));
    REQUIRE(net::send_all(raw->get(), hello.data(), hello.size(), "server").has_value());
    net::frame_buffer in;
    std::optional<net::frame> f;
    while (!f) {
      std::byte buf[4096];
      ssize_t n = ::recv(raw->get(), buf, sizeof buf, 0);
      REQUIRE(n > 0);
      in.append(buf, static_cast<std::size_t>(n));
      auto next = in.next(net::max_frame_bytes, "server");
      REQUIRE(next.has_value());
      f = *next;
    }
    REQUIRE(f->type == net::frame_type::abort);
    auto a = net::decode_abort(f->payload);
    REQUIRE(a.has_value());
    CHECK(a->text.find("rank 5 (from 127.0.0.1:") != std::string::npos);
    CHECK(a->text.find("is outside 0..1 (world size 2)") != std::string::npos);
    CHECK(server->phase() == net::server_phase::failed);
  }
  SUBCASE("duplicate rank") {
    auto server = start_server(2);
    std::optional<expected<std::unique_ptr<net::rendezvous_client>>> first;
    std::thread t(
        [&] { first.emplace(net::rendezvous_client::join(request_for(server->port(), 1, 2))); });
    // Whichever hello comes second fails the job, and both ranks 1 hear why.
    auto second = net::rendezvous_client::join(request_for(server->port(), 1, 2));
    t.join();
    REQUIRE_FALSE(second.has_value());
    CHECK(second.err().message.find("rank 1 joined twice (from 127.0.0.1:") != std::string::npos);
    REQUIRE_FALSE(first->has_value());
    CHECK(first->err().message.find("rank 1 joined twice") != std::string::npos);
  }
}

TEST_CASE("rendezvous: a rank whose connection closes without leave is lost; the others learn "
          "it by callback and state") {
  event_log events;
  auto server = start_server(3, &events);
  auto clients = join_all(server->port(), 3);
  for (auto& c : clients)
    REQUIRE(c.has_value());
  std::atomic<int> calls{0};
  std::thread::id caller;
  std::string seen;
  std::mutex m;
  (*clients[0])->set_on_lost([&](const error& e) {
    std::lock_guard<std::mutex> lock(m);
    caller = std::this_thread::get_id();
    seen = e.message;
    ++calls;
  });
  clients[1] = make_error(errc::runtime, "dropped"); // destroys rank 1's client: no leave
  for (int r : {0, 2}) {
    auto lost = (*clients[static_cast<std::size_t>(r)])->wait_lost(wait_bound);
    REQUIRE(lost.has_value());
    CHECK(lost->message.rfind("rank 1 lost (its connection closed without a leave", 0) == 0);
    CHECK((*clients[static_cast<std::size_t>(r)])->state() == net::client_state::lost);
  }
  auto failed = events.wait_for(kind::failed);
  REQUIRE(failed.has_value());
  CHECK(failed->rank == 1);
  CHECK(server->phase() == net::server_phase::failed);
  std::lock_guard<std::mutex> lock(m);
  CHECK(calls == 1);
  CHECK(caller != std::this_thread::get_id()); // from the client's own thread
  CHECK(seen.rfind("rank 1 lost (its connection closed without a leave", 0) == 0);
  // A loss makes the other calls fail instead of waiting.
  CHECK_FALSE((*clients[0])->allgather("x", {}).has_value());
  CHECK_FALSE((*clients[0])->leave().has_value());
}

TEST_CASE("rendezvous: a rank that stops sending heartbeats is lost after the timeout") {
  net::rendezvous_options fast;
  fast.heartbeat_interval = 50ms;
  fast.heartbeat_timeout = 1000ms;
  event_log events;
  auto server = start_server(2, &events, fast);
  // Rank 0 heartbeats every 50 ms (and is patient with the server: what is tested is the
  // server's view); rank 1 never does (its interval is an hour), as a hung process would not.
  net::rendezvous_options patient = fast;
  patient.heartbeat_timeout = std::chrono::minutes(1);
  std::optional<expected<std::unique_ptr<net::rendezvous_client>>> rank0;
  std::thread t([&] {
    rank0.emplace(net::rendezvous_client::join(request_for(server->port(), 0, 2), patient));
  });
  net::rendezvous_options silent;
  silent.heartbeat_interval = std::chrono::hours(1);
  silent.heartbeat_timeout = std::chrono::hours(1);
  auto rank1 = net::rendezvous_client::join(request_for(server->port(), 1, 2), silent);
  t.join();
  REQUIRE(rank1.has_value());
  REQUIRE(rank0->has_value());
  auto lost = (**rank0)->wait_lost(wait_bound);
  REQUIRE(lost.has_value());
  CHECK(lost->message.rfind("rank 1 lost (no heartbeat for ", 0) == 0);
  // The silent rank is told too: it was taken out of the job.
  auto told = (*rank1)->wait_lost(wait_bound);
  REQUIRE(told.has_value());
  CHECK(told->message.rfind("rank 1 lost", 0) == 0);
  CHECK(events.wait_for(kind::failed));
}

TEST_CASE("rendezvous: a client learns that the server is gone, closed or silent") {
  SUBCASE("closed") {
    auto server = start_server(2);
    auto clients = join_all(server->port(), 2);
    for (auto& c : clients)
      REQUIRE(c.has_value());
    server->stop();
    for (auto& c : clients) {
      auto lost = (*c)->wait_lost(wait_bound);
      REQUIRE(lost.has_value());
      CHECK(lost->message.find("the rendezvous server at 127.0.0.1:") != std::string::npos);
      CHECK(lost->message.find("closed the connection") != std::string::npos);
    }
  }
  SUBCASE("silent") {
    net::rendezvous_options quiet_server;
    quiet_server.heartbeat_interval = std::chrono::hours(1);
    auto server = start_server(1, nullptr, quiet_server);
    net::rendezvous_options impatient;
    impatient.heartbeat_interval = 50ms;
    impatient.heartbeat_timeout = 400ms;
    auto c = net::rendezvous_client::join(request_for(server->port(), 0, 1), impatient);
    REQUIRE(c.has_value());
    auto lost = (*c)->wait_lost(wait_bound);
    REQUIRE(lost.has_value());
    CHECK(lost->message.find("no heartbeat from the rendezvous server at 127.0.0.1:") !=
          std::string::npos);
  }
}

TEST_CASE("rendezvous: a rank that exits before joining fails the join of the others") {
  event_log events;
  auto server = start_server(2, &events);
  server->process_exited(1, "exited with code 0"); // what the launcher reports
  auto r = net::rendezvous_client::join(request_for(server->port(), 0, 2));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.err().message == "rank 1 lost (exited with code 0 before joining the rendezvous)");
  auto failed = events.wait_for(kind::failed);
  REQUIRE(failed.has_value());
  CHECK(failed->rank == 1);
}

TEST_CASE("rendezvous: a client times out joining a job whose other ranks never come") {
  auto server = start_server(2);
  net::rendezvous_options short_join;
  short_join.join_timeout = 300ms;
  auto r = net::rendezvous_client::join(request_for(server->port(), 0, 2), short_join);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.err().message.find("not every rank joined the rendezvous at 127.0.0.1:") !=
        std::string::npos);
}

} // namespace
} // namespace dsa::test
