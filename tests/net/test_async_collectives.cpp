// The asynchronous collectives' host implementation (io/net/async_collectives.hpp): many
// operations enqueued, one wait, the blocking calls' bits; tickets checked; a failed
// operation breaking the group on every rank (the ones before it still ok, the ones after
// refused); each operation logged once under its caller.
#include "io/net/async_collectives.hpp"
#include "io/net/comms_logger.hpp"
#include "tests/net/net_support.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

namespace dsa::test {
namespace {

std::shared_ptr<net::communicator> comm_on(net::transport& t) { return std::make_shared<net::communicator>(t); }

} // namespace

TEST_CASE("host_collectives: operations enqueued together, one wait, the blocking calls' bits") {
  const int ranks = 3;
  const std::vector<std::int64_t> counts{1, 97, 40000}; // flat and ring allreduces
  const std::vector<dtype> types{dtype::f32, dtype::bf16, dtype::f16};
  auto inputs = [&](int r) {
    std::vector<typed_buffer> in;
    for (std::size_t k = 0; k < counts.size(); ++k)
      in.push_back(random_buffer(types[k], counts[k], 11u + static_cast<unsigned>(k), r));
    return in;
  };
  // The blocking calls, one after another.
  std::vector<std::vector<typed_buffer>> blocking(ranks), queued(ranks);
  std::vector<std::vector<std::int64_t>> gathered_blocking(ranks), gathered_queued(ranks);
  run_ranks(ranks, [&](net::transport& t, int r) {
    net::communicator comm(t);
    auto in = inputs(r);
    for (auto& b : in) REQUIRE(comm.allreduce_sum(b.data(), b.type, b.size()));
    const std::vector<std::int64_t> mine{r * 10 + 1, r * 10 + 2};
    gathered_blocking[r].resize(2 * ranks);
    REQUIRE(comm.allgather(gathered_blocking[r].data(), mine.data(), dtype::i64, 2 * ranks));
    blocking[r] = std::move(in);
  });
  run_ranks(ranks, [&](net::transport& t, int r) {
    net::host_collectives group(comm_on(t));
    CHECK(group.rank() == r);
    CHECK(group.size() == ranks);
    CHECK(group.memory() == net::buffer_memory::host);
    auto in = inputs(r);
    std::vector<net::async_collectives::ticket> tickets;
    for (auto& b : in) {
      auto enqueued = group.all_reduce_sum(b.data(), b.type, b.size());
      REQUIRE(enqueued);
      tickets.push_back(*enqueued);
    }
    const std::vector<std::int64_t> mine{r * 10 + 1, r * 10 + 2};
    gathered_queued[r].resize(2 * ranks);
    auto last = group.all_gather(gathered_queued[r].data(), mine.data(), dtype::i64, 2);
    REQUIRE(last);
    CHECK(*last == tickets.back() + 1); // tickets count up in enqueue order
    CHECK(group.wait(*last));           // and every one before it
    CHECK(group.wait(tickets.front())); // already ended: returns at once
    queued[r] = std::move(in);
  });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    for (std::size_t k = 0; k < counts.size(); ++k) CHECK(queued[r][k] == blocking[r][k]);
    CHECK(gathered_queued[r] == gathered_blocking[r]);
    CHECK(gathered_queued[r] == std::vector<std::int64_t>{1, 2, 11, 12, 21, 22});
  }
}

TEST_CASE("host_collectives: a ticket not handed out is refused by name") {
  run_ranks(1, [&](net::transport& t, int) {
    net::host_collectives group(comm_on(t));
    for (net::async_collectives::ticket bad : {0, 1, 7}) {
      const status s = group.wait(bad);
      REQUIRE_FALSE(s);
      CHECK(s.err().code == errc::invalid_argument);
      CHECK(s.err().message.find("ticket") != std::string::npos);
    }
    float x = 2.0f;
    auto one = group.all_reduce_sum(&x, dtype::f32, 1);
    REQUIRE(one);
    CHECK(group.wait(*one));
    CHECK(x == 2.0f); // one rank: its own value
  });
}

TEST_CASE("host_collectives: a failed operation breaks the group on every rank; earlier ones stand") {
  const int ranks = 2;
  std::vector<status> first(ranks), failed(ranks), after(ranks), later_wait(ranks);
  std::vector<bool> refused(ranks, false);
  run_ranks(ranks, [&](net::transport& t, int r) {
    net::host_collectives group(comm_on(t));
    std::vector<float> ok(5, 1.0f), bad(r == 1 ? 9 : 8, 1.0f), never(3, 1.0f);
    auto t1 = group.all_reduce_sum(ok.data(), dtype::f32, 5);
    auto t2 = group.all_reduce_sum(bad.data(), dtype::f32, static_cast<std::int64_t>(bad.size())); // counts differ
    REQUIRE(t1);
    REQUIRE(t2);
    failed[r] = group.wait(*t2);
    first[r] = group.wait(*t1);
    auto t3 = group.all_reduce_sum(never.data(), dtype::f32, 3);
    refused[r] = !t3.has_value();
    if (t3) after[r] = group.wait(*t3);
    later_wait[r] = group.wait(*t2);
    CHECK(never == std::vector<float>(3, 1.0f)); // never ran
    CHECK(ok == std::vector<float>(5, 2.0f));
  });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    CHECK(first[r]);
    REQUIRE_FALSE(failed[r]);
    CHECK(refused[r]);
    REQUIRE_FALSE(later_wait[r]);
    CHECK(later_wait[r].err().message == failed[r].err().message); // the same error from then on
  }
}

TEST_CASE("host_collectives: each operation is logged once, under its caller") {
  net::comms_logger_options o;
  o.enabled = true;
  o.debug = true;
  net::comms_logger logger(o, 2);
  run_ranks(2, [&](net::transport& t, int r) {
    net::host_collectives group(comm_on(t), &logger, fmt::format("reducer {}", r));
    std::vector<float> a(16, 1.0f);
    std::vector<double> gathered(2);
    const double mine = r;
    REQUIRE(group.all_reduce_sum(a.data(), dtype::f32, 16));
    auto gather = group.all_gather(gathered.data(), &mine, dtype::i64, 1);
    REQUIRE(gather);
    REQUIRE(group.wait(*gather));
    CHECK(gathered == std::vector<double>{0.0, 1.0});
  });
  std::int64_t reduces = 0, gathers = 0;
  for (const auto& row : logger.rows()) {
    CAPTURE(row.op);
    if (row.op == "all_reduce") {
      reduces += row.count;
      CHECK(row.bytes == 64);
    } else if (row.op == "all_gather") {
      gathers += row.count;
      CHECK(row.bytes == 16);
    }
    CHECK(row.callers.find("reducer ") != std::string::npos);
  }
  CHECK(reduces == 2); // one per rank
  CHECK(gathers == 2);
}

} // namespace dsa::test
