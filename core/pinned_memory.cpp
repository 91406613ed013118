// Pinned host memory through one owner; see pinned_memory.hpp.
#include "core/pinned_memory.hpp"

#include "core/error.hpp"
#include "core/log.hpp"

#include <algorithm>
#include <cstdlib>
#include <new>

namespace dsa {

pinned_owner& pinned_owner::instance() {
  static pinned_owner owner;
  return owner;
}

void pinned_owner::set_backend(pinned_backend backend) {
  std::lock_guard<std::mutex> lock(mutex_);
  backend_ = std::move(backend);
}

void pinned_owner::reset_backend() {
  std::lock_guard<std::mutex> lock(mutex_);
  backend_ = {};
}

std::int64_t pinned_owner::limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return limit_;
}

void pinned_owner::set_limit(std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = std::max<std::int64_t>(0, bytes);
}

pinned_block pinned_owner::acquire(std::size_t bytes, std::string_view what) {
  pinned_block b;
  b.bytes = std::max<std::size_t>(bytes, 1);
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto want = static_cast<std::int64_t>(b.bytes);
    if (!backend_.pin)
      why = "no pinning backend (no CUDA device in this process)";
    else if (limit_ > 0 && pinned_ + want > limit_)
      why = fmt::format("{} more bytes would pass the cap of {} pinned bytes ({} held)", want, limit_, pinned_);
    else if (void* p = backend_.pin(b.bytes, why)) {
      b.ptr = p;
      b.pinned = true;
      pinned_ += want;
      peak_ = std::max(peak_, pinned_);
      return b;
    } else if (why.empty()) {
      why = backend_.name + " failed";
    }
    ++fallbacks_;
    // No warning without a backend: a CPU run pins nothing and loses nothing.
    if (backend_.pin && warned_.insert(std::string(what)).second)
      log_warn("{}: {} bytes of page-locked memory not available ({}); using pageable memory, whose copies to "
               "and from the device are slower",
               what, b.bytes, why);
  }
  const std::size_t rounded = (b.bytes + 63) / 64 * 64;
  b.ptr = std::aligned_alloc(64, rounded);
  if (!b.ptr) throw std::bad_alloc();
  return b;
}

void pinned_owner::release(pinned_block& b) {
  if (!b.ptr) return;
  if (b.pinned) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (backend_.unpin) backend_.unpin(b.ptr);
    pinned_ -= static_cast<std::int64_t>(b.bytes);
  } else {
    std::free(b.ptr);
  }
  b = pinned_block{};
}

std::int64_t pinned_owner::pinned_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pinned_;
}

std::int64_t pinned_owner::peak_pinned_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

std::int64_t pinned_owner::pageable_fallbacks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fallbacks_;
}

} // namespace dsa
