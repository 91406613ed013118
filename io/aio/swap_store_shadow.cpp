// The swap store's speculative sweeps (second files, committed or discarded) and its
// ranged reads outside a sweep; see swap_store.hpp.
#include "io/aio/swap_flight.hpp"
#include "io/aio/swap_store.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace dsa::aio {

status swap_store::read_range(optim::state_array a, std::int64_t lo, std::int64_t count, float* out) {
  if (lo < 0 || count < 0 || lo + count > options_.numel)
    return make_error(errc::invalid_argument, "swap store '{}/{}': elements [{}, {}) of {}", options_.dir,
                      options_.name, lo, lo + count, options_.numel);
  if (!(written_.load() & (1u << a)))
    return make_error(errc::protocol, "swap store '{}/{}': read before the state was written", options_.dir, options_.name);
  if (count == 0) return {};
  const std::uint64_t align = std::max<std::uint64_t>(4096, engine_->alignment());
  const auto file_bytes = static_cast<std::uint64_t>(options_.numel) * sizeof(float);
  const auto first = static_cast<std::uint64_t>(lo) * sizeof(float), last = first + static_cast<std::uint64_t>(count) * sizeof(float);
  const std::uint64_t start = first / align * align, padded = (last - start + align - 1) / align * align;
  std::unique_ptr<void, void (*)(void*)> buffer(std::aligned_alloc(align, padded), std::free);
  if (!buffer) return make_error(errc::io, "swap store '{}/{}': no memory for a {}-byte read", options_.dir, options_.name, padded);
  aio_request r;
  r.op = aio_op::read;
  {
    std::lock_guard<std::mutex> lock(flight_->mu); // the files trade places at a commit
    r.path = paths_[a];
  }
  r.buffer = buffer.get();
  r.buffer_bytes = padded;
  r.bytes = static_cast<std::size_t>(std::min(start + padded, file_bytes) - start);
  r.file_offset = start;
  r.expect_file_size = file_bytes;
  aio_completion done = submit_future(*engine_, std::move(r), io_priority::update).get();
  if (!done.result) return done.result;
  bytes_read_ += done.bytes;
  std::memcpy(out, static_cast<const std::byte*>(buffer.get()) + (first - start), last - first);
  return {};
}

status swap_store::begin_shadow() {
  auto& f = *flight_;
  std::unique_lock<std::mutex> lock(f.mu);
  if (shadow_open_) return make_error(errc::protocol, "swap store '{}/{}': a speculation began twice", options_.dir, options_.name);
  // Writes behind the last sweep go to the usual files: they end first. A prefetch's reads
  // of the usual files stay: the speculative sweep reads the state from there.
  f.cv.wait(lock, [&] {
    return std::none_of(f.slots.begin(), f.slots.end(), [](const flight::slot& s) { return s.state == flight::use::writing; });
  });
  if (f.failed) return settle(lock);
  shadow_open_ = true;
  shadow_round_ = 0;
  deferred_prefetch_ = 0;
  return {};
}

status swap_store::commit_shadow() {
  auto& f = *flight_;
  unsigned prefetch_next = 0;
  {
    std::unique_lock<std::mutex> lock(f.mu);
    if (!shadow_open_) return make_error(errc::protocol, "swap store '{}/{}': commit without a speculation", options_.dir, options_.name);
    f.cv.wait(lock, [&] { return f.quiet(); });
    shadow_open_ = false;
    if (f.failed) return settle(lock);
    for (unsigned a = 0; a < optim::state_arrays; ++a) {
      if (!(shadow_round_ & (1u << a))) continue;
      std::swap(paths_[a], shadow_paths_[a]); // the written files are the state now
      const bool old_full = (written_.load() & (1u << a)) != 0;
      written_ |= 1u << a;
      shadow_full_ = old_full ? (shadow_full_ | (1u << a)) : (shadow_full_ & ~(1u << a));
    }
    prefetch_next = deferred_prefetch_;
    deferred_prefetch_ = 0;
  }
  prefetch(prefetch_next);
  return {};
}

status swap_store::discard_shadow() {
  auto& f = *flight_;
  std::unique_lock<std::mutex> lock(f.mu);
  if (!shadow_open_) return make_error(errc::protocol, "swap store '{}/{}': discard without a speculation", options_.dir, options_.name);
  f.cv.wait(lock, [&] { return f.quiet(); });
  shadow_open_ = false;
  shadow_full_ |= shadow_round_; // written: the files have their whole length now
  deferred_prefetch_ = 0;        // the redone sweep reads the state itself
  if (f.failed) return settle(lock);
  return {};
}

} // namespace dsa::aio
