// Atomic file replacement for checkpoint files (manifests, shards, weights):
// bytes go to "<path>.tmp.<pid>", which is fsynced, renamed over `path`, and
// the directory fsynced. Readers see the old file or the new one, never a mix.
// Also a whole-file reader with errors that name the path.
#pragma once

#include "core/error.hpp"
#include "io/ckpt/posix_file.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsa::ckpt {

// One pending replacement of `path`. Not thread-safe; one writer per target
// path per process (the temporary name only carries the pid). Destroying it
// before a successful commit() removes the temporary file and leaves `path` as
// it was.
class atomic_file {
public:
  // Creates (truncates) the temporary file next to `path`.
  static expected<atomic_file> create(const std::string& path);

  atomic_file(atomic_file&& other) noexcept;
  atomic_file& operator=(atomic_file&& other) noexcept;
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;
  ~atomic_file() { abandon(); }

  // Appends bytes. After a failure the file is poisoned: commit() refuses.
  status write(const void* data, std::size_t bytes);
  status write(std::string_view text) { return write(text.data(), text.size()); }

  // fsync, close, rename over path(), fsync the directory. On failure before the
  // rename, the temporary file is removed and path() is untouched.
  status commit();

  // Removes the temporary file (no-op after commit()).
  void abandon();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  std::uint64_t bytes_written() const { return bytes_written_; }

private:
  atomic_file(std::string path, std::string temp_path, unique_fd fd)
      : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(std::move(fd)) {}

  std::string path_;
  std::string temp_path_;
  unique_fd fd_;
  std::uint64_t bytes_written_ = 0;
  bool pending_ = true; // the temporary file exists and is ours to remove
  bool failed_ = false;
};

// Replaces `path` atomically with `contents`.
status write_file_atomic(const std::string& path, std::string_view contents);

// Reads a whole regular file. errc::not_found when it does not exist,
// errc::io for other failures; messages name the path and the errno text.
expected<std::string> read_file(const std::string& path);

// The directory holding `path` ("." for a bare file name).
std::string parent_directory(const std::string& path);

} // namespace dsa::ckpt
