// Page-locked (pinned) host memory through one owner. Every pinned block of the process is
// taken and given back here, so its bytes are counted in one place (the host budget applies
// to them like to any host memory) and capped: a pinning that fails, or that would pass the
// cap, falls back to ordinary pageable memory with one logged warning per purpose instead of
// stopping the run (DeepSpeed users hit pinned-buffer out-of-memory: #3000). A copy from
// pageable memory is slower (the driver stages it) but gives the same bytes.
//
// The pinning itself is a backend the CUDA build installs (cudaMallocHost / cudaFreeHost,
// models/bert/cuda_part_params.cpp); without one every block is pageable. Tests install a
// fake. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

namespace dsa {

struct pinned_backend {
  std::string name; // in warnings: "cudaMallocHost"
  // A pinned block of `bytes`, or null with `why` set.
  std::function<void*(std::size_t bytes, std::string& why)> pin;
  std::function<void(void* ptr)> unpin;
};

struct pinned_block {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  bool pinned = false; // false: the pageable fallback
};

class pinned_owner {
public:
  static pinned_owner& instance();

  // Installs the pinning (once per process in the CUDA build; a test's fake). Blocks taken
  // before keep the backend they came from only if it is the same: call it before any.
  void set_backend(pinned_backend backend);
  void reset_backend(); // none: pageable only (tests)
  // The most bytes pinned at once (0: no cap). Past it, blocks are pageable.
  void set_limit(std::int64_t bytes);

  // At least `bytes` (64-byte aligned), pinned when the backend and the cap allow. `what`
  // names the purpose in the one warning a fallback logs for it.
  pinned_block acquire(std::size_t bytes, std::string_view what);
  // Gives a block back (pinned or not) and clears it.
  void release(pinned_block& block);

  std::int64_t limit() const;             // the cap (0: none)
  std::int64_t pinned_bytes() const;      // held now
  std::int64_t peak_pinned_bytes() const; // the most held at once
  std::int64_t pageable_fallbacks() const; // blocks that could not be pinned

private:
  mutable std::mutex mutex_;
  pinned_backend backend_;
  std::int64_t limit_ = 0, pinned_ = 0, peak_ = 0, fallbacks_ = 0;
  std::set<std::string> warned_; // purposes whose fallback was logged
};

} // namespace dsa
