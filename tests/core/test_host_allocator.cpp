// Tests for core/host_allocator: large tensor blocks come back from the cache for the next
// tensor of their size, the cache holds no more than its limit, and a limit of 0 unmaps.
#include "core/host_allocator.hpp"
#include "core/memory_stats.hpp"
#include "core/tensor.hpp"

#include <doctest/doctest.h>

#include <cstring>

using namespace dsa;

namespace {

// The cache's state is process-wide: each case starts from an empty cache with its limit.
struct limit_scope {
  explicit limit_scope(std::int64_t bytes) {
    set_host_cache_limit(0);
    set_host_cache_limit(bytes);
  }
  ~limit_scope() { set_host_cache_limit(-1); }
};

} // namespace

TEST_CASE("host allocator: a freed large block serves the next tensor of its size, without a new mapping") {
  limit_scope scope(64 << 20);
  const shape_t shape{1024, 300}; // 1.2 MB of f32
  const void* first = nullptr;
  {
    tensor t = tensor::empty(shape, dtype::f32);
    first = t.raw_data();
    std::memset(t.raw_data(), 1, t.nbytes()); // its pages are touched
  }
  const host_cache_stats freed = host_cache_usage();
  CHECK(freed.cached_bytes >= 1024 * 300 * 4);
  const host_cache_stats before = host_cache_usage();
  tensor again = tensor::empty(shape, dtype::f32);
  const host_cache_stats after = host_cache_usage();
  CHECK(again.raw_data() == first);
  CHECK(after.hits == before.hits + 1);
  CHECK(after.misses == before.misses);
  CHECK(after.mapped_bytes == before.mapped_bytes);
  CHECK(after.cached_bytes == before.cached_bytes - static_cast<std::int64_t>((1024 * 300 * 4 + 4095) / 4096 * 4096));
  // Small tensors are malloc's: the cache does not see them.
  tensor small = tensor::empty({100}, dtype::f32);
  CHECK(host_cache_usage().misses == after.misses);
}

TEST_CASE("host allocator: the cache keeps at most its limit; a block freed beyond it is unmapped") {
  constexpr std::int64_t block = 1 << 20; // page-aligned already
  limit_scope scope(2 * block);
  const std::int64_t mapped0 = host_cache_usage().mapped_bytes;
  {
    std::vector<tensor> four;
    for (int i = 0; i < 4; ++i) four.push_back(tensor::empty({block}, dtype::u8));
    CHECK(host_cache_usage().mapped_bytes == mapped0 + 4 * block);
  }
  const host_cache_stats s = host_cache_usage();
  CHECK(s.cached_bytes == 2 * block);              // two kept for reuse
  CHECK(s.mapped_bytes == mapped0 + 2 * block);    // two unmapped
  set_host_cache_limit(0);                         // lowering the limit unmaps what is held
  CHECK(host_cache_usage().cached_bytes == 0);
  CHECK(host_cache_usage().mapped_bytes == mapped0);
}

TEST_CASE("host allocator: by default the cache holds at most the tensors' peak") {
  set_host_cache_limit(0);
  set_host_cache_limit(-1);
  memory_reset_peak(device::cpu());
  const std::int64_t live = memory_usage_of(device::cpu()).current_bytes;
  {
    tensor a = tensor::empty({3 << 20}, dtype::u8);
    tensor b = tensor::empty({1 << 20}, dtype::u8);
  }
  const std::int64_t peak = memory_usage_of(device::cpu()).peak_bytes;
  CHECK(peak >= live + (4 << 20));
  CHECK(host_cache_usage().cached_bytes <= peak);
  CHECK(host_cache_usage().cached_bytes == (4 << 20)); // both fit under that peak
}
