// The CUDA caching allocator: tensors on cuda:0 are accounted like CPU ones, freed
// blocks stay in the pool (no new reservation for a repeated step), stream-ordered
// allocation works on a caller's stream.
#include "kernels/cuda/cuda_allocator.hpp"

#include "core/memory_stats.hpp"
#include "core/tensor.hpp"
#include "tests/gpu/gpu_test_util.hpp"

#include <doctest/doctest.h>

using namespace dsa;

TEST_CASE("cuda tensors allocate through the caching allocator and are accounted") {
  cuda::caching_allocator& alloc = cuda::install_caching_allocator();
  const device dev = device::cuda(0);
  const memory_usage before = memory_usage_of(dev);
  const std::int64_t bytes = 3 * 1031 * 4;
  {
    tensor t = tensor::empty({3, 1031}, dtype::f32, dev);
    CHECK(memory_usage_of(dev).current_bytes == before.current_bytes + bytes);
    CHECK(alloc.usage(dev).used_bytes >= bytes);
    DSA_REQUIRE_CUDA(cudaMemset(t.raw_data(), 0, static_cast<std::size_t>(bytes)));
    DSA_REQUIRE_CUDA(cudaDeviceSynchronize());
  }
  CHECK(memory_usage_of(dev).current_bytes == before.current_bytes);
  CHECK(memory_usage_of(dev).peak_bytes >= before.current_bytes + bytes);
}

TEST_CASE("cuda caching allocator reuses freed blocks instead of reserving more") {
  cuda::caching_allocator& alloc = cuda::install_caching_allocator();
  const device dev = device::cuda(0);
  const std::size_t bytes = std::size_t{64} << 20;
  // One "step": allocate and free the same sizes; after the first, nothing new is reserved.
  auto step = [&] {
    void* a = alloc.allocate(bytes, dev);
    void* b = alloc.allocate(bytes / 3, dev);
    alloc.deallocate(b, bytes / 3, dev);
    alloc.deallocate(a, bytes, dev);
  };
  step();
  DSA_REQUIRE_CUDA(cudaDeviceSynchronize());
  const cuda::pool_usage after_first = alloc.usage(dev);
  CHECK(after_first.reserved_bytes >= static_cast<std::int64_t>(bytes));
  for (int i = 0; i < 5; ++i)
    step();
  DSA_REQUIRE_CUDA(cudaDeviceSynchronize());
  const cuda::pool_usage after_more = alloc.usage(dev);
  CHECK(after_more.reserved_bytes == after_first.reserved_bytes);
  CHECK(after_more.used_bytes == after_first.used_bytes);
}

TEST_CASE("cuda caching allocator orders allocations on a caller's stream") {
  cuda::caching_allocator& alloc = cuda::install_caching_allocator();
  const device dev = device::cuda(0);
  const test::test_stream stream;
  const std::size_t n = 4099;
  void* p = alloc.allocate_async(n * 4, dev, stream.get());
  DSA_REQUIRE_CUDA(cudaMemsetAsync(p, 0x3f, n * 4, stream.get()));
  std::vector<std::uint8_t> host(n * 4);
  DSA_REQUIRE_CUDA(cudaMemcpyAsync(host.data(), p, n * 4, cudaMemcpyDeviceToHost, stream.get()));
  alloc.deallocate_async(p, dev, stream.get());
  stream.sync();
  CHECK(host.front() == 0x3f);
  CHECK(host.back() == 0x3f);
}
