// Host memory for tensors. Blocks below `large_block_bytes` come from malloc; larger ones
// are whole pages (mmap) that go back, when freed, to a cache keyed by their page-rounded
// size, for the next tensor of that size: a training step allocates the same activations
// every time, so after the first step they come from the cache with no page fault, and
// they never share pages with the small, longer-lived objects of the malloc heap (which
// had fragmented it: a tiny model's resident set grew from 135 to 300 MB over its first
// 2,500 steps while its tensors never held more than 110 MB).
//
// The cache holds at most a limit of free bytes; a block freed beyond it is unmapped. The
// limit is the peak of the tensors' bytes so far (memory_stats.hpp) unless set: mapped
// memory then stays within twice the tensors' peak, and flat once that peak is reached.
// limits.host_memory sets 0 (every large block back to the system at once, so the plan
// bounds the peak).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsa {

constexpr std::size_t large_block_bytes = 256 * 1024;

void* host_allocate(std::size_t bytes);
void host_free(void* ptr, std::size_t bytes);

// Free bytes the cache may hold: >= 0 a fixed limit, -1 the tensors' peak (the default).
// A lower limit unmaps what it holds above it at once.
void set_host_cache_limit(std::int64_t bytes);

struct host_cache_stats {
  std::int64_t cached_bytes = 0; // free blocks held for reuse
  std::int64_t mapped_bytes = 0; // every large block, in use or cached
  std::int64_t hits = 0, misses = 0; // large allocations served from the cache, or mapped
};
host_cache_stats host_cache_usage();

} // namespace dsa
