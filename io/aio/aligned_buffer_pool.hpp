// A fixed set of equally sized, aligned host buffers for O_DIRECT transfers, handed out
// and returned; optionally mlock'ed ("pinned") like DeepSpeed's swap buffers.
#pragma once

#include "core/error.hpp"

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace dsa::aio {

enum class memory_pinning { pageable, locked };

class aligned_buffer_pool;

// One buffer on loan from a pool; returns itself to the pool when destroyed. Move-only.
// The pool must outlive every buffer it lent.
class pool_buffer {
public:
  pool_buffer() = default;
  pool_buffer(pool_buffer&& other) noexcept;
  pool_buffer& operator=(pool_buffer&& other) noexcept;
  pool_buffer(const pool_buffer&) = delete;
  pool_buffer& operator=(const pool_buffer&) = delete;
  ~pool_buffer();

  void* data() const { return data_; }
  std::size_t size() const { return size_; } // bytes, a multiple of the pool's alignment
  bool valid() const { return data_ != nullptr; }

private:
  friend class aligned_buffer_pool;
  pool_buffer(aligned_buffer_pool* pool, std::size_t index, void* data, std::size_t size)
      : pool_(pool), index_(index), data_(data), size_(size) {}
  void give_back();

  aligned_buffer_pool* pool_ = nullptr;
  std::size_t index_ = 0;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

struct pool_options {
  std::size_t buffer_count = 4;
  std::size_t buffer_bytes = std::size_t{1} << 20; // rounded up to the alignment
  std::size_t alignment = 4096;                    // a power of two, at least 4096
  memory_pinning pinning = memory_pinning::pageable;
};

// Thread-safe. Buffers are zeroed once at creation (not on each loan).
class aligned_buffer_pool {
public:
  // Allocates every buffer now; mlock failure (RLIMIT_MEMLOCK) is an errc::io error saying so.
  static expected<std::unique_ptr<aligned_buffer_pool>> create(const pool_options& options);
  ~aligned_buffer_pool(); // every buffer must have been returned (checked)

  // A free buffer, or nullopt when all are on loan (never blocks: callable from an actor).
  std::optional<pool_buffer> try_acquire();
  std::size_t available() const;
  std::size_t buffer_count() const { return buffers_.size(); }
  std::size_t buffer_bytes() const { return buffer_bytes_; }
  std::size_t alignment() const { return alignment_; }

private:
  friend class pool_buffer;
  aligned_buffer_pool() = default;
  void release(std::size_t index);

  struct slot {
    void* data = nullptr;
    bool locked = false;
  };
  std::vector<slot> buffers_;
  std::size_t buffer_bytes_ = 0;
  std::size_t alignment_ = 0;
  mutable std::mutex mutex_;
  std::vector<std::size_t> free_; // indices of buffers not on loan
};

} // namespace dsa::aio
