// Host tensor memory with a size-keyed cache of page blocks; see host_allocator.hpp.
#include "core/host_allocator.hpp"

#include "core/error.hpp"
#include "core/memory_stats.hpp"

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>

namespace dsa {
namespace {

constexpr std::size_t page = 4096;

std::size_t page_rounded(std::size_t bytes) { return (bytes + page - 1) / page * page; }

struct block_cache {
  std::mutex mutex;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks; // by page-rounded size
  std::int64_t limit = -1;
  host_cache_stats stats;

  std::int64_t limit_now() const {
    return limit >= 0 ? limit : memory_usage_of(device::cpu()).peak_bytes;
  }
  // Unmaps cached blocks until at most `keep` bytes are cached (mutex held).
  void shrink_to(std::int64_t keep) {
    for (auto it = free_blocks.begin(); it != free_blocks.end() && stats.cached_bytes > keep;) {
      auto& list = it->second;
      while (!list.empty() && stats.cached_bytes > keep) {
        ::munmap(list.back(), it->first);
        list.pop_back();
        stats.cached_bytes -= static_cast<std::int64_t>(it->first);
        stats.mapped_bytes -= static_cast<std::int64_t>(it->first);
      }
      it = list.empty() ? free_blocks.erase(it) : std::next(it);
    }
  }
};

block_cache& cache() {
  static block_cache* c = new block_cache; // never destroyed: tensors may outlive statics
  return *c;
}

void* map_pages(std::size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

} // namespace

void* host_allocate(std::size_t bytes) {
  if (bytes < large_block_bytes) {
    std::size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    void* p = std::aligned_alloc(64, rounded);
    DSA_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
    return p;
  }
  const std::size_t size = page_rounded(bytes);
  auto& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.stats.cached_bytes -= static_cast<std::int64_t>(size);
      ++c.stats.hits;
      return p;
    }
    ++c.stats.misses;
  }
  void* p = map_pages(size);
  if (p == nullptr) { // the cache's blocks of other sizes may be what the system lacks
    std::lock_guard<std::mutex> lock(c.mutex);
    c.shrink_to(0);
  }
  if (p == nullptr) p = map_pages(size);
  DSA_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats.mapped_bytes += static_cast<std::int64_t>(size);
  return p;
}

void host_free(void* ptr, std::size_t bytes) {
  if (bytes < large_block_bytes) {
    std::free(ptr);
    return;
  }
  const std::size_t size = page_rounded(bytes);
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.stats.cached_bytes + static_cast<std::int64_t>(size) <= c.limit_now()) {
    c.free_blocks[size].push_back(ptr);
    c.stats.cached_bytes += static_cast<std::int64_t>(size);
    return;
  }
  ::munmap(ptr, size);
  c.stats.mapped_bytes -= static_cast<std::int64_t>(size);
}

void set_host_cache_limit(std::int64_t bytes) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.limit = bytes < 0 ? -1 : bytes;
  c.shrink_to(c.limit_now());
}

host_cache_stats host_cache_usage() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

} // namespace dsa
