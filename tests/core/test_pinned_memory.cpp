// core/pinned_memory.hpp: the one owner of page-locked host memory, against a fake pinning
// backend (the CUDA build installs cudaMallocHost; tools/gpu-check runs that one): pinned
// blocks counted and capped, a failed or capped pinning falling back to pageable memory
// with one warning per purpose, and every block given back to where it came from.
#include "core/pinned_memory.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <map>

namespace dsa::test {
namespace {

// A pinning that hands out aligned_alloc blocks, fails above `fail_above` bytes, and
// remembers what it holds.
struct fake_pinning {
  std::size_t fail_above = SIZE_MAX;
  std::map<void*, std::size_t> held;
  int unpinned = 0;

  pinned_backend backend() {
    pinned_backend b;
    b.name = "fakeMallocHost";
    b.pin = [this](std::size_t bytes, std::string& why) -> void* {
      if (bytes > fail_above) {
        why = "out of page-locked memory (fake)";
        return nullptr;
      }
      void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
      held[p] = bytes;
      return p;
    };
    b.unpin = [this](void* p) {
      REQUIRE(held.count(p) == 1); // only what it handed out comes back to it
      held.erase(p);
      std::free(p);
      ++unpinned;
    };
    return b;
  }
};

struct owner_reset {
  ~owner_reset() {
    pinned_owner::instance().reset_backend();
    pinned_owner::instance().set_limit(0);
  }
};

TEST_CASE("pinned memory: counted, capped, and pageable when pinning fails, without stopping") {
  owner_reset reset;
  auto& owner = pinned_owner::instance();
  fake_pinning fake;
  fake.fail_above = 1 << 20;
  owner.set_backend(fake.backend());
  owner.set_limit(3 << 20);
  const auto held_before = owner.pinned_bytes();
  const auto fallbacks_before = owner.pageable_fallbacks();

  auto a = owner.acquire(1 << 20, "stash");
  CHECK(a.pinned);
  CHECK(fake.held.count(a.ptr) == 1);
  CHECK(owner.pinned_bytes() == held_before + (1 << 20));
  std::memset(a.ptr, 7, a.bytes); // usable memory

  // The backend refuses 2 MiB: pageable memory instead, usable, not the backend's.
  auto big = owner.acquire(2 << 20, "gradient bucket");
  CHECK_FALSE(big.pinned);
  REQUIRE(big.ptr != nullptr);
  CHECK(fake.held.count(big.ptr) == 0);
  std::memset(big.ptr, 1, big.bytes);
  CHECK(owner.pageable_fallbacks() == fallbacks_before + 1);
  CHECK(owner.pinned_bytes() == held_before + (1 << 20));

  // The cap: 2 more pinned MiB fit (3 MiB in all), the next does not.
  auto b = owner.acquire(1 << 20, "stash");
  auto c = owner.acquire(1 << 20, "stash");
  CHECK((b.pinned && c.pinned));
  auto d = owner.acquire(1 << 20, "stash");
  CHECK_FALSE(d.pinned);
  CHECK(owner.pinned_bytes() == held_before + (3 << 20));
  CHECK(owner.peak_pinned_bytes() >= held_before + (3 << 20));

  for (auto* x : {&a, &big, &b, &c, &d}) owner.release(*x);
  CHECK(a.ptr == nullptr);
  CHECK(fake.held.empty()); // every pinned block went back to the backend
  CHECK(fake.unpinned == 3);
  CHECK(owner.pinned_bytes() == held_before);
  owner.release(a); // an empty block: nothing
}

TEST_CASE("pinned memory: without a backend (a CPU run) every block is pageable, silently") {
  owner_reset reset;
  auto& owner = pinned_owner::instance();
  owner.reset_backend();
  auto b = owner.acquire(4096, "readout");
  CHECK_FALSE(b.pinned);
  REQUIRE(b.ptr != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(b.ptr) % 64 == 0);
  owner.release(b);
  auto zero = owner.acquire(0, "readout"); // at least one byte, never null
  CHECK(zero.ptr != nullptr);
  owner.release(zero);
}

} // namespace
} // namespace dsa::test
