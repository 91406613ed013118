// Thin checked wrappers over POSIX file calls: an owning descriptor, reads and
// writes that loop over partial transfers and retry EINTR, and errors that
// name the path, the call and the errno text.
#pragma once

#include "core/error.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dsa::ckpt {

// Retries a system call while it fails with EINTR; returns its last result.
template <class Fn> auto retry_eintr(Fn&& fn) -> decltype(fn()) {
  decltype(fn()) r;
  do {
    r = fn();
  } while (r == -1 && errno == EINTR);
  return r;
}

// An errc::io error "<what> '<path>': <strerror(err)>".
error sys_error(const std::string& what, const std::string& path, int err);

// Owns a file descriptor; closes it (ignoring errors) on destruction.
// Use close() where a close failure must be reported (after writing).
class unique_fd {
public:
  unique_fd() = default;
  explicit unique_fd(int fd) : fd_(fd) {}
  unique_fd(unique_fd&& other) noexcept : fd_(other.release()) {}
  unique_fd& operator=(unique_fd&& other) noexcept;
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  // Closes and reports failure (EINTR is not retried: the descriptor is gone either way).
  status close(const std::string& path);

private:
  int fd_ = -1;
};

// Opens `path` read-only.
expected<unique_fd> open_for_read(const std::string& path);
// Size in bytes of an open file.
expected<std::uint64_t> file_size(const unique_fd& fd, const std::string& path);
// Reads exactly `bytes` at `offset`; a short read (end of file) is an errc::io error.
status pread_exact(const unique_fd& fd, const std::string& path, void* dst, std::size_t bytes,
                   std::uint64_t offset);
// Writes all `bytes`, looping over partial writes.
status write_all(const unique_fd& fd, const std::string& path, const void* src, std::size_t bytes);
// fsync with the error naming the path.
status fsync_fd(const unique_fd& fd, const std::string& path);

} // namespace dsa::ckpt
