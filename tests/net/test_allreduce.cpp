// allreduce over the in-process transport: both paths, every dtype, awkward sizes,
// 1..5 ranks; ranks agree bit for bit and match a double reference.
#include "tests/net/net_support.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <thread>

namespace dsa::test {
namespace {

constexpr dtype all_types[] = {dtype::f32, dtype::f16, dtype::bf16};

std::vector<std::int64_t> awkward_sizes(int ranks) {
  return {0, 1, 7, 97, ranks * 1000 + 3};
}

enum class path { flat, ring, shared };

net::collective_options forced(path p) {
  net::collective_options o;
  o.flat_allreduce_below_bytes = p == path::flat ? std::numeric_limits<std::size_t>::max() : 0;
  o.shared_memory = p == path::shared; // ranks as threads share memory: that path, or the ring
  return o;
}

const char* path_name(path p) {
  return p == path::flat ? "flat" : p == path::ring ? "ring" : "shared memory";
}

// Runs one allreduce on `ranks` ranks; returns every rank's result.
std::vector<typed_buffer> run_allreduce(const std::vector<typed_buffer>& inputs,
                                        net::collective_options options) {
  std::vector<typed_buffer> results = inputs;
  const int ranks = static_cast<int>(inputs.size());
  run_ranks(ranks, [&](net::transport& t, int r) {
    net::communicator comm(t, options);
    auto& buf = results[static_cast<std::size_t>(r)];
    status s = comm.allreduce_sum(buf.data(), buf.type, buf.size());
    CHECK_MESSAGE(s.has_value(), (s ? "" : s.err().to_string()));
  });
  return results;
}

std::vector<typed_buffer> random_inputs(dtype type, std::int64_t count, int ranks,
                                        std::uint32_t seed) {
  std::vector<typed_buffer> inputs;
  for (int r = 0; r < ranks; ++r)
    inputs.push_back(random_buffer(type, count, seed, r));
  return inputs;
}

void check_same_on_every_rank(const std::vector<typed_buffer>& results) {
  for (std::size_t r = 1; r < results.size(); ++r) {
    INFO("rank " << r << " vs rank 0");
    CHECK(results[r] == results[0]);
  }
}

TEST_CASE(
    "allreduce: every rank gets the same bits, close to the double reference, on both paths") {
  for (int ranks = 1; ranks <= 5; ++ranks)
    for (dtype type : all_types)
      for (std::int64_t count : awkward_sizes(ranks))
        for (path p : {path::flat, path::ring, path::shared}) {
          INFO("ranks=" << ranks << " dtype=" << dtype_name(type) << " count=" << count
                        << " path=" << path_name(p));
          auto inputs =
              random_inputs(type, count, ranks, static_cast<std::uint32_t>(count + 7 * ranks));
          auto results = run_allreduce(inputs, forced(p));
          check_same_on_every_rank(results);
          auto expected = reference_sum(inputs);
          auto got = results[0].widened();
          DSA_CHECK_CLOSE(got.data(), expected.data(), count, sum_tolerance(type));
        }
}

constexpr std::int64_t order_count = 97;

// Runs the allreduce on `p` and checks every rank's result bit for bit against an fp32
// sum of each element over the ranks first_rank(i), first_rank(i)+1, ... (mod N),
// rounded once to the dtype.
void check_fp32_order(path p, std::uint32_t seed,
                      const std::function<int(std::int64_t, int, std::int64_t)>& first_rank,
                      std::int64_t count = order_count, int max_ranks = 5) {
  for (int ranks = 2; ranks <= max_ranks; ++ranks)
    for (dtype type : all_types) {
      INFO("ranks=" << ranks << " dtype=" << dtype_name(type) << " count=" << count);
      auto inputs = random_inputs(type, count, ranks, seed + static_cast<std::uint32_t>(ranks));
      auto results = run_allreduce(inputs, forced(p));
      typed_buffer expected(type, count);
      for (std::int64_t i = 0; i < count; ++i) {
        const int first = first_rank(i, ranks, count);
        float s = inputs[static_cast<std::size_t>(first)].get(i);
        for (int k = 1; k < ranks; ++k)
          s += inputs[static_cast<std::size_t>((first + k) % ranks)].get(i);
        expected.set(i, s);
      }
      for (int r = 0; r < ranks; ++r)
        CHECK(results[static_cast<std::size_t>(r)] == expected);
    }
}

TEST_CASE("flat allreduce sums in rank order 0..N-1 in fp32 and rounds once") {
  // The stated order, exactly: a rank that started from its own contribution, or summed
  // in arrival order, or rounded each partial sum to f16/bf16 would differ here.
  check_fp32_order(path::flat, 11u, [](std::int64_t, int, std::int64_t) { return 0; });
}

// The rank whose values start the ring's sum of element i: c+1 for chunk c.
int ring_first_rank(std::int64_t i, int ranks, std::int64_t count) {
  int c = 0; // the chunk holding element i
  while (net::partition(count, ranks, c).offset + net::partition(count, ranks, c).count <= i)
    ++c;
  return (c + 1) % ranks;
}

TEST_CASE("ring allreduce sums chunk c starting at rank c+1 in fp32 and rounds once") {
  check_fp32_order(path::ring, 23u, ring_first_rank);
}

TEST_CASE("ring allreduce keeps that order when chunks travel as several segments") {
  // Chunks of 2.5 and 1.7 segments (2 MiB of f32 each), the last segment short.
  check_fp32_order(path::ring, 29u, ring_first_rank, 2 * 1310720 + 1, 3);
}

TEST_CASE("shared-memory allreduce sums in the ring's order, also over many slot segments") {
  check_fp32_order(path::shared, 31u, ring_first_rank);
  // Chunks of 18 and 17+ segments of 64 Ki elements: more than the 16 slots of a ring,
  // so slots are reused within the call; the last segment short.
  check_fp32_order(path::shared, 37u, ring_first_rank, 2 * 18 * 65536 - 9, 3);
}

TEST_CASE("consecutive collectives of different sizes, dtypes and paths do not mix") {
  const int ranks = 4;
  const std::int64_t sizes[] = {97, 0, 5003, 1, 20000, 7, 4003};
  const int rounds = 14;
  std::vector<std::vector<typed_buffer>> inputs(rounds), results(rounds);
  for (int k = 0; k < rounds; ++k) {
    const dtype type = all_types[k % 3];
    inputs[static_cast<std::size_t>(k)] =
        random_inputs(type, sizes[k % 7], ranks, 100u + static_cast<std::uint32_t>(k));
    results[static_cast<std::size_t>(k)] = inputs[static_cast<std::size_t>(k)];
  }
  std::vector<std::uint64_t> calls(ranks);
  run_ranks(ranks, [&](net::transport& t, int r) {
    net::communicator comm(
        t); // default threshold: 20000 f32 and 5003 f32 take the ring, the rest the flat path
    for (int k = 0; k < rounds; ++k) {
      auto& buf = results[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
      CHECK(comm.allreduce_sum(buf.data(), buf.type, buf.size()).has_value());
      if (k % 4 == 1)
        CHECK(comm.barrier().has_value());
    }
    calls[static_cast<std::size_t>(r)] = comm.calls();
  });
  for (int k = 0; k < rounds; ++k) {
    INFO("round " << k);
    const auto& res = results[static_cast<std::size_t>(k)];
    check_same_on_every_rank(res);
    auto expected = reference_sum(inputs[static_cast<std::size_t>(k)]);
    auto got = res[0].widened();
    DSA_CHECK_CLOSE(got.data(), expected.data(), res[0].size(), sum_tolerance(res[0].type));
  }
  for (auto c : calls)
    CHECK(c == static_cast<std::uint64_t>(rounds + (rounds + 2) / 4));
}

TEST_CASE("communicators on different channels of one transport run concurrently without mixing") {
  // Each rank runs two threads, each with its own channel's communicator, issuing
  // allreduces of different sizes at the same time: the results must be each channel's own.
  const int ranks = 3, rounds = 6;
  const std::int64_t sizes[2] = {5003, 97};
  std::vector<typed_buffer> inputs[2], results[2];
  for (int ch = 0; ch < 2; ++ch) {
    inputs[ch] = random_inputs(dtype::f32, sizes[ch], ranks, 300u + static_cast<std::uint32_t>(ch));
    results[ch] = inputs[ch];
  }
  run_ranks(ranks, [&](net::transport& t, int r) {
    std::thread other([&] {
      net::communicator comm(t, {}, 7);
      CHECK(comm.channel() == 7u);
      for (int k = 0; k < rounds; ++k) {
        auto& buf = results[1][static_cast<std::size_t>(r)];
        if (k == 0) CHECK(comm.allreduce_sum(buf.data(), buf.type, buf.size()).has_value());
        else CHECK(comm.barrier().has_value());
      }
      CHECK(comm.calls() == static_cast<std::uint64_t>(rounds));
    });
    net::communicator comm(t, {}, 1);
    for (int k = 0; k < rounds; ++k) {
      auto& buf = results[0][static_cast<std::size_t>(r)];
      if (k == 0) CHECK(comm.allreduce_sum(buf.data(), buf.type, buf.size()).has_value());
      else CHECK(comm.barrier().has_value());
    }
    other.join();
  });
  for (int ch = 0; ch < 2; ++ch) {
    check_same_on_every_rank(results[ch]);
    auto expected = reference_sum(inputs[ch]);
    auto got = results[ch][0].widened();
    DSA_CHECK_CLOSE(got.data(), expected.data(), results[ch][0].size(), sum_tolerance(dtype::f32));
  }
}

} // namespace
} // namespace dsa::test
