// The device context on a GPU: copy-stream work ordered before compute-stream work by an
// event, and completion posted from a host callback (waited on here under a deadline).
#include "kernels/cuda/device_context.hpp"

#include "tests/gpu/gpu_test_util.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <vector>

using namespace dsa;

TEST_CASE("cuda device context orders streams by events and posts completion") {
  auto opened = cuda::device_context::open(0);
  REQUIRE_MESSAGE(opened.has_value(), (opened ? std::string() : opened.err().to_string()));
  cuda::device_context& ctx = **opened;
  const std::size_t n = 1 << 24;
  test::device_buffer a(n), b(n);
  std::vector<std::uint8_t> host(n);
  // copy stream fills a; compute stream copies a to b only after it.
  DSA_REQUIRE_CUDA(cudaMemsetAsync(a.as<void>(), 0x5a, n, ctx.copy()));
  REQUIRE(ctx.order(ctx.copy(), ctx.compute()).has_value());
  DSA_REQUIRE_CUDA(
      cudaMemcpyAsync(b.as<void>(), a.as<void>(), n, cudaMemcpyDeviceToDevice, ctx.compute()));
  DSA_REQUIRE_CUDA(
      cudaMemcpyAsync(host.data(), b.as<void>(), n, cudaMemcpyDeviceToHost, ctx.compute()));
  std::promise<void> done;
  auto posted = done.get_future();
  REQUIRE(ctx.when_done(ctx.compute(), [&done] { done.set_value(); }).has_value());
  REQUIRE(posted.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  CHECK(host.front() == 0x5a);
  CHECK(host[n / 2] == 0x5a);
  CHECK(host.back() == 0x5a);
}
