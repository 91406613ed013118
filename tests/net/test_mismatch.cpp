// Ranks that disagree (count, dtype, order of calls) or pass bad arguments get errors,
// not hangs and not garbage.
#include "tests/net/net_support.hpp"

#include <doctest/doctest.h>

#include <limits>
#include <string>

namespace dsa::test {
namespace {

// Runs call(comm, rank) on every rank; returns each rank's status.
std::vector<status> run_statuses(int ranks, net::collective_options options,
                                 const std::function<status(net::communicator&, int)>& call) {
  std::vector<status> out(static_cast<std::size_t>(ranks));
  run_ranks(ranks, [&](net::transport& t, int r) {
    net::communicator comm(t, options);
    out[static_cast<std::size_t>(r)] = call(comm, r);
  });
  return out;
}

// Every rank failed, and some rank names the disagreement.
void check_all_failed(const std::vector<status>& statuses, const std::string& named) {
  bool named_somewhere = false;
  for (std::size_t r = 0; r < statuses.size(); ++r) {
    INFO("rank " << r);
    REQUIRE_FALSE(statuses[r].has_value());
    const auto& e = statuses[r].err();
    if (e.code == errc::protocol && e.message.find(named) != std::string::npos)
      named_somewhere = true;
  }
  INFO("no rank reported a protocol error naming '" << named << "'");
  CHECK(named_somewhere);
}

net::collective_options with_threshold(std::size_t below) {
  net::collective_options o;
  o.flat_allreduce_below_bytes = below;
  return o;
}

TEST_CASE("ranks passing different counts get an error, on every collective") {
  const int ranks = 3;
  auto count_of = [](int r) -> std::int64_t { return r == 1 ? 98 : 97; };
  std::vector<float> in(ranks * 98, 1.0f), out(ranks * 98);
  for (std::size_t below : {std::numeric_limits<std::size_t>::max(), std::size_t{0}}) {
    INFO("allreduce, flat_allreduce_below_bytes=" << below);
    check_all_failed(run_statuses(ranks, with_threshold(below),
                                  [&](net::communicator& c, int r) {
                                    std::vector<float> data(98, 1.0f);
                                    return c.allreduce_sum(data.data(), dtype::f32, count_of(r));
                                  }),
                     "count");
  }
  auto reduce_scatter = [&](net::communicator& c, int r) {
    std::vector<float> part(98);
    return c.reduce_scatter_sum(part.data(), in.data(), dtype::f32, count_of(r));
  };
  check_all_failed(run_statuses(ranks, {}, reduce_scatter), "count");
  auto allgather = [&](net::communicator& c, int r) {
    std::vector<float> whole(98);
    return c.allgather(whole.data(), in.data(), dtype::f32, count_of(r));
  };
  check_all_failed(run_statuses(ranks, {}, allgather), "count");
  auto all_to_all = [&](net::communicator& c, int r) {
    std::vector<float> o(ranks * 98);
    return c.all_to_all(o.data(), in.data(), dtype::f32, count_of(r));
  };
  check_all_failed(run_statuses(ranks, {}, all_to_all), "count");
  // Broadcast: only receivers can see a disagreement; rank 1 receives from the root.
  auto statuses = run_statuses(ranks, {}, [&](net::communicator& c, int r) {
    std::vector<float> d(98);
    return c.broadcast(d.data(), dtype::f32, count_of(r), 0);
  });
  REQUIRE_FALSE(statuses[1].has_value());
  CHECK(statuses[1].err().code == errc::protocol);
  CHECK(statuses[1].err().message.find("sent count 97 where this rank expects 98") !=
        std::string::npos);
}

TEST_CASE("ranks passing different dtypes get an error") {
  auto statuses = run_statuses(4, {}, [](net::communicator& c, int r) {
    std::vector<float> data(33, 1.0f);
    return c.allreduce_sum(data.data(), r == 2 ? dtype::bf16 : dtype::f32, 33);
  });
  check_all_failed(statuses, "dtype");
}

TEST_CASE("ranks issuing collectives in different orders get an error, not each other's data") {
  auto statuses = run_statuses(2, {}, [](net::communicator& c, int r) -> status {
    std::vector<float> data(16, 1.0f);
    if (r == 0) {
      DSA_TRY(c.allreduce_sum(data.data(), dtype::f32, 16));
      return c.broadcast(data.data(), dtype::f32, 16, 0);
    }
    DSA_TRY(c.broadcast(data.data(), dtype::f32, 16, 0));
    return c.allreduce_sum(data.data(), dtype::f32, 16);
  });
  // Rank 1's broadcast receives rank 0's allreduce message (both are call #0).
  REQUIRE_FALSE(statuses[1].has_value());
  CHECK(statuses[1].err().code == errc::protocol);
  CHECK(statuses[1].err().message.find("collective") != std::string::npos);
  CHECK_FALSE(statuses[0].has_value());
}

TEST_CASE("bad arguments are errors naming the call, and abort the group") {
  auto statuses = run_statuses(3, {}, [](net::communicator& c, int) {
    std::vector<std::int32_t> data(5, 1);
    return c.allreduce_sum(data.data(), dtype::i32, 5);
  });
  for (const auto& s : statuses) {
    REQUIRE_FALSE(s.has_value());
    CHECK(s.err().code == errc::invalid_argument);
    CHECK(s.err().message.find("dtype i32 cannot be summed") != std::string::npos);
  }
  statuses = run_statuses(3, {}, [](net::communicator& c, int) {
    std::vector<float> data(5);
    return c.broadcast(data.data(), dtype::f32, 5, 3);
  });
  for (const auto& s : statuses) {
    REQUIRE_FALSE(s.has_value());
    CHECK(s.err().message.find("root 3 outside the group of 3") != std::string::npos);
  }
  statuses = run_statuses(2, {}, [](net::communicator& c, int) {
    std::vector<float> data(5);
    return c.allgather(data.data(), data.data(), static_cast<dtype>(77), 5);
  });
  for (const auto& s : statuses) {
    REQUIRE_FALSE(s.has_value());
    CHECK(s.err().message.find("allgather: unknown dtype (enum value 77)") != std::string::npos);
  }
  // One rank's bad argument: the others are woken by the abort instead of waiting.
  statuses = run_statuses(3, {}, [](net::communicator& c, int r) {
    std::vector<float> data(5);
    return c.allreduce_sum(r == 2 ? nullptr : data.data(), dtype::f32, r == 2 ? -1 : 5);
  });
  for (const auto& s : statuses)
    CHECK_FALSE(s.has_value());
  CHECK(statuses[2].err().code == errc::invalid_argument);
  CHECK(statuses[2].err().message.find("count -1 is negative") != std::string::npos);
}

} // namespace
} // namespace dsa::test
