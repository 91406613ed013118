// The shared-memory allreduce over the in-process transport (ranks as threads of one
// process share memory as processes of one host do): the ring's bits, whatever the sizes,
// dtypes, buffer alignments and call sequences; the ring when ranks say they are on
// different hosts. Between processes: tests/net/test_ucx.cpp.
#include "io/net/shared_allreduce.hpp"
#include "tests/net/net_support.hpp"

#include <doctest/doctest.h>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>

namespace dsa::test {
namespace {

constexpr dtype all_types[] = {dtype::f32, dtype::f16, dtype::bf16};

net::collective_options through(bool shared, std::uint64_t host = 0) {
  net::collective_options o;
  o.flat_allreduce_below_bytes = 0; // every size takes the ring or shared memory
  o.shared_memory = shared;
  o.host_number = host;
  return o;
}

// Runs the allreduce of `inputs` with options_of(rank); rank r's buffer starts
// shift_of(r) elements into a larger allocation (other page offsets than malloc's).
std::vector<typed_buffer> run(const std::vector<typed_buffer>& inputs,
                              const std::function<net::collective_options(int)>& options_of,
                              const std::function<std::int64_t(int)>& shift_of) {
  std::vector<typed_buffer> results = inputs;
  const int ranks = static_cast<int>(inputs.size());
  run_ranks(ranks, [&](net::transport& t, int r) {
    net::communicator comm(t, options_of(r));
    auto& out = results[static_cast<std::size_t>(r)];
    const std::size_t width = dtype_size(out.type), at = static_cast<std::size_t>(shift_of(r)) * width;
    std::vector<std::byte> room(out.bytes.size() + at + width);
    std::memcpy(room.data() + at, out.bytes.data(), out.bytes.size());
    status s = comm.allreduce_sum(room.data() + at, out.type, out.size());
    CHECK_MESSAGE(s.has_value(), (s ? "" : s.err().to_string()));
    std::memcpy(out.bytes.data(), room.data() + at, out.bytes.size());
  });
  return results;
}

std::vector<typed_buffer> inputs_for(dtype type, std::int64_t count, int ranks, std::uint32_t seed) {
  std::vector<typed_buffer> inputs;
  for (int r = 0; r < ranks; ++r)
    inputs.push_back(random_buffer(type, count, seed, r));
  return inputs;
}

TEST_CASE("shared-memory allreduce gives the ring's bits on every rank at awkward sizes") {
  for (int ranks = 1; ranks <= 4; ++ranks)
    for (dtype type : all_types)
      for (std::int64_t count :
           {std::int64_t{0}, std::int64_t{1}, std::int64_t{2}, std::int64_t{97},
            std::int64_t{ranks * 1000 + 3}, std::int64_t{65537}, std::int64_t{ranks * 3 * 65536 + 11}}) {
        INFO("ranks=" << ranks << " dtype=" << dtype_name(type) << " count=" << count);
        auto inputs = inputs_for(type, count, ranks, static_cast<std::uint32_t>(count + 5 * ranks));
        auto ring = run(inputs, [](int) { return through(false); }, [](int) { return 0; });
        // Every rank's buffer at another page offset, some of them odd elements apart.
        auto shared = run(inputs, [](int) { return through(true); },
                          [](int r) { return std::int64_t{r * 301}; });
        for (int r = 0; r < ranks; ++r)
          CHECK(shared[static_cast<std::size_t>(r)] == ring[0]);
        auto expected = reference_sum(inputs);
        auto got = shared[0].widened();
        DSA_CHECK_CLOSE(got.data(), expected.data(), count, sum_tolerance(type));
      }
}

TEST_CASE("ranks that report different hosts take the ring, with the same bits") {
  const int ranks = 3;
  const std::int64_t count = 200003;
  for (dtype type : all_types) {
    INFO("dtype=" << dtype_name(type));
    auto inputs = inputs_for(type, count, ranks, 41u);
    auto ring = run(inputs, [](int) { return through(false); }, [](int) { return 0; });
    // Every rank elsewhere, and only the last one elsewhere: both fall back on every rank.
    auto apart = run(inputs, [](int r) { return through(true, 100u + static_cast<std::uint64_t>(r)); },
                     [](int) { return 0; });
    auto one_off = run(inputs, [](int r) { return through(true, r == ranks - 1 ? 7u : 5u); },
                       [](int) { return 0; });
    for (int r = 0; r < ranks; ++r) {
      CHECK(apart[static_cast<std::size_t>(r)] == ring[0]);
      CHECK(one_off[static_cast<std::size_t>(r)] == ring[0]);
    }
  }
}

TEST_CASE("consecutive shared-memory allreduces of changing sizes and dtypes do not mix") {
  // One communicator per rank for every call: the slots and counters of one call must
  // not leak into the next, whether it is longer, shorter or empty.
  const int ranks = 3, rounds = 9;
  const std::int64_t sizes[] = {1100017, 5, 0, 300007, 65536 * 3, 1};
  std::vector<std::vector<typed_buffer>> inputs(rounds), shared(rounds);
  for (int k = 0; k < rounds; ++k) {
    inputs[static_cast<std::size_t>(k)] =
        inputs_for(all_types[k % 3], sizes[k % 6], ranks, 500u + static_cast<std::uint32_t>(k));
    shared[static_cast<std::size_t>(k)] = inputs[static_cast<std::size_t>(k)];
  }
  run_ranks(ranks, [&](net::transport& t, int r) {
    net::communicator comm(t, through(true));
    for (int k = 0; k < rounds; ++k) {
      auto& buf = shared[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)];
      status s = comm.allreduce_sum(buf.data(), buf.type, buf.size());
      CHECK_MESSAGE(s.has_value(), (s ? "" : s.err().to_string()));
      if (k % 4 == 2)
        CHECK(comm.barrier().has_value());
    }
  });
  for (int k = 0; k < rounds; ++k) {
    INFO("round " << k);
    auto ring = run(inputs[static_cast<std::size_t>(k)], [](int) { return through(false); },
                    [](int) { return 0; });
    for (int r = 0; r < ranks; ++r)
      CHECK(shared[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)] == ring[0]);
  }
}

TEST_CASE("a rank waiting on shared memory fails when the group is aborted instead of hanging") {
  // Rank 1 maps the regions, waits until rank 0 has mapped them too (an abort during the
  // mapping would fail rank 0 there instead), then aborts the group instead of taking part
  // in the sum: rank 0, waiting for rank 1's values, must return the abort as an error.
  const std::int64_t count = 3 * 65536 + 5;
  net::wire_header call;
  call.kind = net::op_kind::allreduce_shared;
  call.type = dtype::f32;
  call.count = count;
  std::vector<std::string> errors(2);
  std::mutex mu;
  std::condition_variable cv;
  int connected = 0;
  run_ranks(2, [&](net::transport& t, int r) {
    auto regions = net::shared_regions::connect(t, call, 1u);
    {
      std::lock_guard<std::mutex> lk(mu);
      ++connected;
    }
    cv.notify_all();
    if (!regions || *regions == nullptr) {
      errors[static_cast<std::size_t>(r)] = regions ? "no regions" : regions.err().to_string();
      return;
    }
    if (r == 1) {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return connected == 2; });
      t.abort(make_error(errc::runtime, "rank 1 gave up"));
      return;
    }
    std::vector<float> data(static_cast<std::size_t>(count), 1.0f);
    status s = (*regions)->allreduce(t, call, data.data(), {0, 0});
    errors[0] = s ? "" : s.err().to_string();
  });
  CHECK(errors[1].empty());
  CHECK(errors[0].find("rank 1 gave up") != std::string::npos);
  CHECK(errors[0].find("shared-memory allreduce") != std::string::npos);
}

} // namespace
} // namespace dsa::test
