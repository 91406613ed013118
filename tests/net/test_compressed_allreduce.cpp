// The 1-bit kernels and the compressed allreduce against the plain reference
// (onebit_reference.hpp), bit for bit: signs, scales, worker and server errors, results,
// at awkward sizes and 2, 3, 4 and 8 ranks, over several calls (the errors carry over);
// and what error feedback is for: the results' running mean approaches the true mean.
#include "io/net/compressed_allreduce.hpp"
#include "kernels/cpu/onebit.hpp"
#include "tests/net/net_support.hpp"
#include "tests/net/onebit_reference.hpp"
#include "tests/support/isa_paths.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <mutex>

namespace dsa::test {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace

TEST_CASE("onebit kernels: packed MSB first, zero as +1, the scale the RMS, errors and expansions as the reference, "
          "on every path the CPU has") {
  for (const cpu::isa path : isa_paths()) {
    CAPTURE(cpu::isa_name(path));
    // A known byte: + - + + - - - + (zero and minus zero count as +1).
    std::vector<float> x = {1.0f, -2.0f, 0.0f, -0.0f, -1.0f, -3.0f, -0.5f, 4.0f};
    std::vector<float> error(8, 0.0f), ref_error(8, 0.0f);
    std::uint8_t byte = 0;
    const float scale = cpu::onebit_compress(path, x.data(), error.data(), &byte, 8);
    CHECK(byte == 0b10110001);
    CHECK(scale == doctest::Approx(std::sqrt((1 + 4 + 0 + 0 + 1 + 9 + 0.25 + 16) / 8.0)));
    const auto ref = onebit::compress(x, ref_error);
    CHECK(ref.bits[0] == byte);
    CHECK(ref.scale == scale);
    CHECK(same_bits(error, ref_error));
    for (std::int64_t n : {0, 8, 16, 24, 1000, 4104}) {
      CAPTURE(n);
      auto values = random_vector(n, -2.0f, 2.0f, 7);
      auto carried = random_vector(n, -0.1f, 0.1f, 8);
      std::vector<float> mine = carried, theirs = carried;
      std::vector<std::uint8_t> bits(static_cast<std::size_t>(n / 8));
      const float s = cpu::onebit_compress(path, values.data(), mine.data(), bits.data(), n);
      const auto r = onebit::compress(values, theirs);
      CHECK(s == r.scale);
      CHECK(bits == r.bits);
      CHECK(same_bits(mine, theirs));
      CHECK(cpu::onebit_sum_of_squares(path, values.data(), n) == onebit::sum_of_squares(values));
      std::vector<float> acc = random_vector(n, -1.0f, 1.0f, 9), ref_acc = acc, out(static_cast<std::size_t>(n));
      cpu::onebit_accumulate(path, bits.data(), 0.75f, acc.data(), n);
      cpu::onebit_expand(path, bits.data(), -1.5f, out.data(), n);
      for (std::int64_t i = 0; i < n; ++i) {
        const float sign = onebit::sign_of(bits, static_cast<std::size_t>(i));
        ref_acc[static_cast<std::size_t>(i)] += 0.75f * sign;
        CHECK(out[static_cast<std::size_t>(i)] == -1.5f * sign);
      }
      CHECK(same_bits(acc, ref_acc));
    }
    // The sum of squares of a length that is not a multiple of 8 (the tail as the reference).
    auto odd = random_vector(13, -1.0f, 1.0f, 3);
    CHECK(cpu::onebit_sum_of_squares(path, odd.data(), 13) == onebit::sum_of_squares(odd));
  }
}

TEST_CASE("compressed allreduce: every rank gets the reference's result, scales and errors, bit for bit, call after "
          "call") {
  for (int ranks : {2, 3, 4, 8})
    for (std::int64_t count : {std::int64_t{1}, std::int64_t{7}, std::int64_t{8 * ranks - 1},
                               onebit::padded(1, ranks) + 1, std::int64_t{1000}, std::int64_t{4099}}) {
      CAPTURE(ranks);
      CAPTURE(count);
      constexpr int calls = 3;
      std::vector<onebit::rank_state> ref_states(static_cast<std::size_t>(ranks));
      std::vector<std::vector<std::vector<float>>> inputs(calls);
      std::vector<std::vector<float>> expected(calls);
      std::vector<std::vector<float>> worker_scales(calls), server_scales(calls);
      for (int k = 0; k < calls; ++k) {
        for (int r = 0; r < ranks; ++r)
          inputs[k].push_back(random_vector(count, -1.0f, 1.0f, static_cast<std::uint32_t>(100 * k + r)));
        expected[k] = onebit::allreduce(inputs[k], ref_states, &worker_scales[k], &server_scales[k]);
      }
      std::mutex mu;
      run_ranks(ranks, [&](net::transport& t, int r) {
        net::communicator comm(t);
        net::onebit_errors errors;
        for (int k = 0; k < calls; ++k) {
          std::vector<float> x = inputs[k][static_cast<std::size_t>(r)];
          auto report = net::compressed_allreduce(comm, x.data(), count, errors);
          std::lock_guard<std::mutex> lock(mu);
          REQUIRE_MESSAGE(report.has_value(), (report ? "" : report.err().to_string()));
          CHECK(same_bits(x, expected[k]));
          CHECK(report->worker_scale == worker_scales[k][static_cast<std::size_t>(r)]);
          CHECK(report->server_scale == server_scales[k][static_cast<std::size_t>(r)]);
          const std::int64_t padded = net::onebit_padded(count, ranks);
          CHECK(report->bytes_sent == 2u * static_cast<std::uint64_t>(ranks - 1) *
                                          (static_cast<std::uint64_t>(padded / ranks / 8) + 4));
          // The transport counted those payloads and one header per message: (n-1)
          // messages in the all-to-all and in each of the three ring allgathers.
          CHECK(report->wire_bytes == report->bytes_sent + 4u * static_cast<std::uint64_t>(ranks - 1) * 56u);
        }
        std::lock_guard<std::mutex> lock(mu);
        CHECK(same_bits(errors.worker, ref_states[static_cast<std::size_t>(r)].worker));
        CHECK(same_bits(errors.server, ref_states[static_cast<std::size_t>(r)].server));
      });
    }
}

TEST_CASE("compressed allreduce: padding, an empty tensor, and error buffers of the wrong size") {
  CHECK(net::onebit_padded(0, 4) == 0);
  CHECK(net::onebit_padded(1, 2) == 16);  // 2 * lcm(2, 8)
  CHECK(net::onebit_padded(1, 3) == 72);  // 3 * 24
  CHECK(net::onebit_padded(72, 3) == 72);
  CHECK(net::onebit_padded(73, 3) == 144);
  CHECK(net::onebit_padded(1, 8) == 64);
  run_ranks(2, [&](net::transport& t, int) {
    net::communicator comm(t);
    net::onebit_errors errors;
    errors.worker.assign(3, 1.0f);
    errors.server.assign(2, 1.0f);
    auto empty = net::compressed_allreduce(comm, nullptr, 0, errors);
    CHECK(empty.has_value());
    CHECK(errors.worker.empty()); // zeroed, as DeepSpeed does for an empty tensor
    CHECK(errors.server.empty());
    std::vector<float> x(10, 1.0f);
    errors.worker.assign(5, 0.0f);
    errors.server.assign(8, 0.0f);
    auto wrong = net::compressed_allreduce(comm, x.data(), 10, errors);
    REQUIRE_FALSE(wrong.has_value());
    CHECK(wrong.err().message.find("expected 16 (worker) and 8 (server)") != std::string::npos);
  });
}

// Error feedback: what one call's 1-bit result misses is carried into the next, so over
// many calls with the same inputs the results' mean approaches the ranks' true mean, while
// a single call is off by about the inputs' own size.
TEST_CASE("compressed allreduce: with error feedback the running mean of the results approaches the true mean") {
  constexpr int ranks = 4, calls = 400;
  constexpr std::int64_t count = 256;
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < ranks; ++r) inputs.push_back(random_vector(count, -1.0f, 1.0f, static_cast<std::uint32_t>(r)));
  std::vector<double> truth(count, 0.0);
  for (const auto& in : inputs)
    for (std::int64_t i = 0; i < count; ++i) truth[static_cast<std::size_t>(i)] += in[static_cast<std::size_t>(i)] / ranks;
  std::vector<onebit::rank_state> states(ranks);
  std::vector<double> sum(count, 0.0);
  double first_error = 0;
  for (int k = 0; k < calls; ++k) {
    const auto out = onebit::allreduce(inputs, states);
    double err = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      sum[static_cast<std::size_t>(i)] += out[static_cast<std::size_t>(i)];
      err = std::max(err, std::abs(out[static_cast<std::size_t>(i)] - truth[static_cast<std::size_t>(i)]));
    }
    if (k == 0) first_error = err;
  }
  double mean_error = 0;
  for (std::int64_t i = 0; i < count; ++i)
    mean_error = std::max(mean_error, std::abs(sum[static_cast<std::size_t>(i)] / calls - truth[static_cast<std::size_t>(i)]));
  CHECK(first_error > 0.2);
  CHECK(mean_error < 0.02);
}

} // namespace dsa::test
