// The compressed optimizers' overflow rule on local steps (actors/train/shard/onebit_channel.hpp):
// with gradients left on their ranks, an inf or NaN on any one rank must skip the step on
// every rank, or the ranks' parameters would part. Also the rescaling of the totals.
#include "actors/train/shard/onebit_channel.hpp"
#include "tests/net/net_support.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

namespace dsa::test {

TEST_CASE("onebit_channel: one rank's overflow on a local step makes every rank's totals non-finite") {
  constexpr int ranks = 3;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  // Per call, per rank: {sum_of_squares, own_sum_of_squares}.
  const std::vector<std::vector<std::pair<double, double>>> calls = {
      {{2.0, 1.0}, {2.0, 1.0}, {2.0, 1.0}}, // all finite
      {{2.0, 1.0}, {inf, 1.0}, {2.0, 1.0}}, // rank 1 overflowed
      {{2.0, 1.0}, {2.0, 1.0}, {2.0, nan}}, // rank 2's own share is NaN
      {{0.5, 0.25}, {0.5, 0.25}, {0.5, 0.25}}, // and finite again after
  };
  std::vector<std::vector<actors::grad_totals>> got(ranks);
  run_ranks(ranks, [&](net::transport& t, int r) {
    auto peers = std::make_shared<net::communicator>(t);
    train::onebit_channel channel(peers, nullptr, "shard");
    for (const auto& call : calls) {
      actors::grad_totals in;
      in.sum_of_squares = call[static_cast<std::size_t>(r)].first;
      in.own_sum_of_squares = call[static_cast<std::size_t>(r)].second;
      got[static_cast<std::size_t>(r)].push_back(channel.local_totals(in));
    }
  });
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    const auto& g = got[static_cast<std::size_t>(r)];
    REQUIRE(g.size() == calls.size());
    // Sums of gradients scaled by 1 / ranks: each rank's own mean has ranks^2 times the squares.
    CHECK(g[0].sum_of_squares == 2.0 * ranks * ranks);
    CHECK(g[0].own_sum_of_squares == 1.0 * ranks * ranks);
    for (std::size_t k : {std::size_t{1}, std::size_t{2}}) {
      CAPTURE(k);
      CHECK(std::isinf(g[k].sum_of_squares));
      CHECK(std::isinf(g[k].own_sum_of_squares));
    }
    CHECK(g[3].sum_of_squares == 0.5 * ranks * ranks);
  }
}

TEST_CASE("onebit_channel: only a local step's exchanges count as the compressed phase's") {
  constexpr int ranks = 2;
  std::vector<train::compressed_traffic> got(ranks);
  run_ranks(ranks, [&](net::transport& t, int r) {
    train::onebit_channel channel(std::make_shared<net::communicator>(t), nullptr, "shard");
    std::vector<float> values(100, 0.5f);
    // A step whose gradients were averaged but which exchanged (the dummy first step).
    REQUIRE(channel.exchange("all", values.data(), 100).has_value());
    channel.count_step(100, false);
    // Two local steps of one exchange each.
    for (int k = 0; k < 2; ++k) {
      REQUIRE(channel.exchange("all", values.data(), 100).has_value());
      channel.count_step(100, true);
    }
    got[static_cast<std::size_t>(r)] = channel.traffic();
  });
  for (const auto& t : got) {
    CHECK(t.steps == 3);
    CHECK(t.local_steps == 2);
    CHECK(t.exchanges == 2);
    CHECK(t.wire_bytes > 0);
    CHECK(t.local_fp16_bytes == 2 * t.fp16_bytes / 3);
  }
}

TEST_CASE("onebit_channel: on one rank the totals are the rank's own, with no exchange") {
  train::onebit_channel channel(nullptr, nullptr, "shard");
  actors::grad_totals in;
  in.sum_of_squares = std::numeric_limits<double>::infinity();
  in.own_sum_of_squares = 3.0;
  const auto out = channel.local_totals(in);
  CHECK(std::isinf(out.sum_of_squares));
  CHECK(out.own_sum_of_squares == 3.0);
}

} // namespace dsa::test
