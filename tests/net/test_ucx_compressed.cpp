// The 1-bit compressed allreduce across 2 processes over UCX: each process's results,
// scales and error buffers equal the plain reference's (onebit_reference.hpp), bit for bit,
// and the transport counts the bytes it sent.
#include "io/net/compressed_allreduce.hpp"
#include "tests/net/net_support.hpp"
#include "tests/net/onebit_reference.hpp"
#include "tests/net/process_ranks.hpp"

#include <doctest/doctest.h>

#include <cstring>

namespace dsa::test {
namespace {

constexpr int calls = 3;
// Awkward sizes: below one byte of signs per rank, odd, and past a padding boundary.
constexpr std::int64_t counts[] = {1, 7, 1001, 4099};

std::vector<float> input(std::int64_t count, int call, int rank) {
  return random_vector(count, -1.0f, 1.0f, static_cast<std::uint32_t>(100000 * count + 1000 * call + rank));
}

void append(net::bytes& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + n);
}

// One tensor of `count` elements through `calls` allreduces on rank r: each result and its
// two scales, then the tensor's error buffers, appended to out.
status run_size(net::communicator& comm, int r, std::int64_t count, net::bytes& out) {
  net::onebit_errors errors;
  for (int k = 0; k < calls; ++k) {
    auto x = input(count, k, r);
    DSA_ASSIGN_OR_RETURN(auto report, net::compressed_allreduce(comm, x.data(), count, errors));
    // UCX counted the payloads and one 56-byte header per message (4 messages with 2 ranks).
    if (report.wire_bytes != report.bytes_sent + 4 * 56)
      return make_error(errc::runtime, "rank {}, {} elements: the transport counted {} bytes, expected {} + 224", r,
                        count, report.wire_bytes, report.bytes_sent);
    append(out, x.data(), x.size() * sizeof(float));
    append(out, &report.worker_scale, sizeof(float));
    append(out, &report.server_scale, sizeof(float));
  }
  append(out, errors.worker.data(), errors.worker.size() * sizeof(float));
  append(out, errors.server.data(), errors.server.size() * sizeof(float));
  return {};
}

} // namespace

TEST_CASE("ucx: the compressed allreduce over 2 processes equals the reference bit for bit, at awkward sizes") {
  constexpr int n = 2;
  auto outcomes = run_process_ranks(n, [](net::ucx_transport& t, int r, const std::vector<net::bytes>&)
                                           -> expected<net::bytes> {
    net::communicator comm(t);
    net::bytes out;
    for (const std::int64_t count : counts) DSA_TRY(run_size(comm, r, count, out));
    return out;
  });
  std::vector<net::bytes> expected(n);
  for (const std::int64_t count : counts) {
    std::vector<onebit::rank_state> states(n);
    for (int k = 0; k < calls; ++k) {
      std::vector<std::vector<float>> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(input(count, k, r));
      std::vector<float> worker_scales, server_scales;
      const auto result = onebit::allreduce(inputs, states, &worker_scales, &server_scales);
      for (int r = 0; r < n; ++r) {
        auto& e = expected[static_cast<std::size_t>(r)];
        append(e, result.data(), result.size() * sizeof(float));
        append(e, &worker_scales[static_cast<std::size_t>(r)], sizeof(float));
        append(e, &server_scales[static_cast<std::size_t>(r)], sizeof(float));
      }
    }
    for (int r = 0; r < n; ++r) {
      const auto& s = states[static_cast<std::size_t>(r)];
      append(expected[static_cast<std::size_t>(r)], s.worker.data(), s.worker.size() * sizeof(float));
      append(expected[static_cast<std::size_t>(r)], s.server.data(), s.server.size() * sizeof(float));
    }
  }
  for (int r = 0; r < n; ++r) {
    const auto& o = outcomes[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << o.error);
    REQUIRE(o.finished);
    REQUIRE(o.ok);
    CHECK(o.output.size() == expected[static_cast<std::size_t>(r)].size());
    CHECK(o.output == expected[static_cast<std::size_t>(r)]);
  }
}

} // namespace dsa::test
