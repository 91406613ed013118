// The host side of a CUDA build, in the cpu suite (it needs no GPU): probing reports why
// there is no device, opening a missing device is an error that says so, and installing
// the caching allocator touches no CUDA API.
#include "core/tensor.hpp"
#include "kernels/cuda/cuda_allocator.hpp"
#include "kernels/cuda/device_context.hpp"

#include <doctest/doctest.h>

using namespace dsa;

TEST_CASE("probe_devices gives a count and a reason") {
  const cuda::device_probe probe = cuda::probe_devices();
  CHECK(probe.count >= 0);
  CHECK_FALSE(probe.message.empty());
  MESSAGE(probe.message);
}

TEST_CASE("opening a device that is not there is an unsupported error naming it") {
  auto opened = cuda::device_context::open(cuda::probe_devices().count + 3);
  REQUIRE_FALSE(opened.has_value());
  CHECK(opened.err().code == errc::unsupported);
  CHECK(opened.err().message.find("is not available") != std::string::npos);
  auto negative = cuda::device_context::open(-1);
  CHECK_FALSE(negative.has_value());
}

TEST_CASE("installing the caching allocator makes no CUDA call and keeps CPU tensors working") {
  cuda::install_caching_allocator();
  cuda::install_caching_allocator(); // idempotent
  tensor t = tensor::empty({3, 5}, dtype::f32, device::cpu());
  CHECK(t.numel() == 15);
}
