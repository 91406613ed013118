// The NVMe engine actor's scheduling without CAF: priority order, FIFO within a class,
// the request and byte credits, and engines that do not hold each other back.
#include "actors/nvme_engine_state.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace dsa;
using namespace dsa::actors;
using aio::io_priority;

namespace {

std::vector<std::uint64_t> ids(const std::vector<io_ticket>& tickets) {
  std::vector<std::uint64_t> out;
  for (const auto& t : tickets)
    out.push_back(t.id);
  return out;
}

io_ticket ticket(std::uint64_t id, io_priority p, std::uint64_t bytes = 4096,
                 std::uint32_t engine = 0) {
  return io_ticket{id, engine, p, bytes};
}

} // namespace

TEST_CASE("nvme schedule: a waiting fetch read starts before an update's, a prefetch and a write "
          "behind, FIFO within a class") {
  io_credits one;
  one.requests = 1;
  one.always = 1;
  io_schedule s({one});
  s.push(ticket(1, io_priority::write_behind));
  CHECK(ids(s.admit()) == std::vector<std::uint64_t>{1}); // nothing in flight: it starts at once
  s.push(ticket(2, io_priority::prefetch));
  s.push(ticket(3, io_priority::write_behind));
  s.push(ticket(4, io_priority::update));
  s.push(ticket(5, io_priority::fetch));
  s.push(ticket(6, io_priority::update));
  CHECK(s.admit().empty()); // the one credit is taken
  CHECK(s.waiting() == 5);
  std::vector<std::uint64_t> order;
  std::uint64_t running = 1;
  while (!s.idle()) {
    s.ended(ticket(running, io_priority::fetch));
    auto next = s.admit();
    if (next.empty())
      break;
    REQUIRE(next.size() == 1);
    CHECK(s.in_flight(0) == 1);
    running = next.front().id;
    order.push_back(running);
  }
  CHECK(order == std::vector<std::uint64_t>{5, 4, 6, 2, 3});
  CHECK(s.idle());
  CHECK(s.peak_in_flight(0) == 1);
}

TEST_CASE("nvme schedule: bytes in flight stay within the credit beyond `always`, and no smaller "
          "request overtakes") {
  io_credits c;
  c.requests = 8;
  c.bytes = 100;
  c.always = 1;
  io_schedule s({c});
  s.push(ticket(1, io_priority::update, 60));
  s.push(ticket(2, io_priority::update, 60));
  s.push(ticket(3, io_priority::update, 30)); // would fit beside 1, but 2 is ahead of it
  CHECK(ids(s.admit()) == std::vector<std::uint64_t>{1});
  CHECK(s.in_flight_bytes(0) == 60);
  s.ended(ticket(1, io_priority::update, 60));
  CHECK(ids(s.admit()) == std::vector<std::uint64_t>{2, 3});
  CHECK(s.in_flight_bytes(0) == 90);
  // A request larger than the whole credit still starts, alone.
  s.push(ticket(4, io_priority::fetch, 1000));
  CHECK(s.admit().empty());
  s.ended(ticket(2, io_priority::update, 60));
  s.ended(ticket(3, io_priority::update, 30));
  CHECK(ids(s.admit()) == std::vector<std::uint64_t>{4});
  CHECK(s.in_flight(0) == 1);
}

TEST_CASE(
    "nvme schedule: `always` requests start whatever their size, `requests` bounds the count") {
  io_credits c;
  c.requests = 3;
  c.bytes = 10;
  c.always = 2;
  io_schedule s({c});
  for (std::uint64_t i = 1; i <= 5; ++i)
    s.push(ticket(i, io_priority::prefetch, 1000));
  CHECK(ids(s.admit()) == std::vector<std::uint64_t>{1, 2}); // the third would pass the bytes
  io_credits small;
  small.requests = 3;
  small.bytes = 1 << 20;
  small.always = 1;
  io_schedule t({small});
  for (std::uint64_t i = 1; i <= 5; ++i)
    t.push(ticket(i, io_priority::prefetch, 10));
  CHECK(ids(t.admit()) == std::vector<std::uint64_t>{1, 2, 3});
  CHECK(t.peak_in_flight(0) == 3);
}

TEST_CASE("nvme schedule: an engine out of credits does not hold back another engine's requests") {
  io_credits one;
  one.requests = 1;
  one.always = 1;
  io_schedule s({one, one});
  s.push(ticket(1, io_priority::fetch, 4096, 0));
  s.push(ticket(2, io_priority::fetch, 4096, 0));
  s.push(ticket(3, io_priority::write_behind, 4096, 1));
  CHECK(ids(s.admit()) == std::vector<std::uint64_t>{1, 3});
  CHECK(s.in_flight(0) == 1);
  CHECK(s.in_flight(1) == 1);
}

TEST_CASE("nvme schedule: [aio]'s queue_depth x intra_op_parallelism blocks of block_size are the "
          "credits") {
  aio::aio_config config;
  config.queue_depth = 8;
  config.intra_op_parallelism = 2;
  config.block_size = 1 << 20;
  const io_credits c = io_credits_of(config);
  CHECK(c.requests == 16);
  CHECK(c.bytes == 16u << 20);
  CHECK(c.always == 2);
  config.queue_depth = 1;
  config.intra_op_parallelism = 1;
  CHECK(io_credits_of(config).always == 1); // never more than the requests
}
