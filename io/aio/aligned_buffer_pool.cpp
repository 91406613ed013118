// The aligned (and optionally locked) buffer pool.
#include "io/aio/aligned_buffer_pool.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace dsa::aio {

pool_buffer::pool_buffer(pool_buffer&& other) noexcept
    : pool_(other.pool_), index_(other.index_), data_(other.data_), size_(other.size_) {
  other.pool_ = nullptr;
  other.data_ = nullptr;
}

pool_buffer& pool_buffer::operator=(pool_buffer&& other) noexcept {
  if (this != &other) {
    give_back();
    pool_ = other.pool_;
    index_ = other.index_;
    data_ = other.data_;
    size_ = other.size_;
    other.pool_ = nullptr;
    other.data_ = nullptr;
  }
  return *this;
}

pool_buffer::~pool_buffer() {
  give_back();
}

void pool_buffer::give_back() {
  if (pool_)
    pool_->release(index_);
  pool_ = nullptr;
  data_ = nullptr;
}

expected<std::unique_ptr<aligned_buffer_pool>>
aligned_buffer_pool::create(const pool_options& options) {
  std::size_t align = options.alignment;
  if (align < 4096 || (align & (align - 1)) != 0)
    return make_error(errc::invalid_argument,
                      "buffer pool alignment {} is not a power of two of at least 4096", align);
  if (options.buffer_count == 0 || options.buffer_bytes == 0)
    return make_error(errc::invalid_argument, "buffer pool of {} buffers of {} bytes is empty",
                      options.buffer_count, options.buffer_bytes);
  std::unique_ptr<aligned_buffer_pool> pool(new aligned_buffer_pool());
  pool->alignment_ = align;
  pool->buffer_bytes_ = (options.buffer_bytes + align - 1) / align * align;
  for (std::size_t i = 0; i < options.buffer_count; ++i) {
    void* p = nullptr;
    if (int rc = ::posix_memalign(&p, align, pool->buffer_bytes_); rc != 0)
      return make_error(errc::io, "cannot allocate buffer {} of {} bytes aligned to {}: {}", i,
                        pool->buffer_bytes_, align, std::strerror(rc));
    std::memset(p, 0, pool->buffer_bytes_); // also faults the pages in before any timing
    pool->buffers_.push_back({p, false});
    pool->free_.push_back(options.buffer_count - 1 - i); // hand out buffer 0 first
    if (options.pinning == memory_pinning::locked) {
      if (::mlock(p, pool->buffer_bytes_) != 0)
        return make_error(errc::io,
                          "cannot mlock buffer {} of {} bytes: {} (the memlock limit, ulimit -l, "
                          "bounds pinned memory)",
                          i, pool->buffer_bytes_, std::strerror(errno));
      pool->buffers_.back().locked = true;
    }
  }
  return pool;
}

aligned_buffer_pool::~aligned_buffer_pool() {
  DSA_CHECK(free_.size() == buffers_.size(), "buffer pool destroyed with {} of {} buffers on loan",
            buffers_.size() - free_.size(), buffers_.size());
  for (auto& b : buffers_) {
    if (b.locked)
      ::munlock(b.data, buffer_bytes_);
    std::free(b.data);
  }
}

std::optional<pool_buffer> aligned_buffer_pool::try_acquire() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_.empty())
    return std::nullopt;
  std::size_t index = free_.back();
  free_.pop_back();
  return pool_buffer(this, index, buffers_[index].data, buffer_bytes_);
}

std::size_t aligned_buffer_pool::available() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return free_.size();
}

void aligned_buffer_pool::release(std::size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(index);
}

} // namespace dsa::aio
