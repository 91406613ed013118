// Atomic replacement of files: temporary name, fsync, rename, directory fsync.
#include "io/ckpt/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

namespace dsa::ckpt {

std::string parent_directory(const std::string& path) {
  std::size_t end = path.size();
  while (end > 1 && path[end - 1] == '/')
    --end; // "dir/file/" names "dir/file"
  std::size_t slash = path.rfind('/', end - 1);
  if (slash == std::string::npos)
    return ".";
  if (slash == 0)
    return "/";
  return path.substr(0, slash);
}

expected<atomic_file> atomic_file::create(const std::string& path) {
  if (path.empty())
    return make_error(errc::invalid_argument, "atomic write to an empty path");
  std::string temp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  int fd = retry_eintr(
      [&] { return ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); });
  if (fd < 0)
    return make_error(errc::io, "cannot create temporary file '{}' for '{}': {}", temp, path,
                      std::strerror(errno));
  return atomic_file(path, std::move(temp), unique_fd(fd));
}

atomic_file::atomic_file(atomic_file&& other) noexcept
    : path_(std::move(other.path_)), temp_path_(std::move(other.temp_path_)),
      fd_(std::move(other.fd_)), bytes_written_(other.bytes_written_), pending_(other.pending_),
      failed_(other.failed_) {
  other.pending_ = false;
}

atomic_file& atomic_file::operator=(atomic_file&& other) noexcept {
  if (this != &other) {
    abandon();
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    fd_ = std::move(other.fd_);
    bytes_written_ = other.bytes_written_;
    pending_ = other.pending_;
    failed_ = other.failed_;
    other.pending_ = false;
  }
  return *this;
}

status atomic_file::write(const void* data, std::size_t bytes) {
  if (!pending_ || !fd_.valid())
    return make_error(errc::invalid_argument, "write to '{}' after commit or abandon", path_);
  if (failed_)
    return make_error(errc::io, "write to '{}' after an earlier write failed", path_);
  status st = write_all(fd_, temp_path_, data, bytes);
  if (!st) {
    failed_ = true;
    return st;
  }
  bytes_written_ += bytes;
  return {};
}

status atomic_file::commit() {
  if (!pending_ || !fd_.valid())
    return make_error(errc::invalid_argument, "commit of '{}' after commit or abandon", path_);
  if (failed_) {
    abandon();
    return make_error(errc::io, "not replacing '{}': an earlier write failed", path_);
  }
  status st = fsync_fd(fd_, temp_path_);
  if (st)
    st = fd_.close(temp_path_);
  if (st && retry_eintr([&] { return ::rename(temp_path_.c_str(), path_.c_str()); }) != 0)
    st = make_error(errc::io, "cannot rename '{}' to '{}': {}", temp_path_, path_,
                    std::strerror(errno));
  if (!st) {
    abandon();
    return st;
  }
  pending_ = false;
  // The rename is durable only once the directory entry is on disk.
  std::string dir = parent_directory(path_);
  int dfd = retry_eintr([&] { return ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); });
  if (dfd < 0)
    return make_error(errc::io, "cannot open directory '{}' of '{}': {}", dir, path_,
                      std::strerror(errno));
  unique_fd dir_fd(dfd);
  DSA_TRY(fsync_fd(dir_fd, dir));
  return dir_fd.close(dir);
}

void atomic_file::abandon() {
  if (!pending_)
    return;
  pending_ = false;
  fd_ = unique_fd();
  ::unlink(temp_path_.c_str()); // best effort: the error being reported is the earlier one
}

status write_file_atomic(const std::string& path, std::string_view contents) {
  DSA_ASSIGN_OR_RETURN(atomic_file file, atomic_file::create(path));
  DSA_TRY(file.write(contents));
  return file.commit();
}

expected<std::string> read_file(const std::string& path) {
  DSA_ASSIGN_OR_RETURN(unique_fd fd, open_for_read(path));
  DSA_ASSIGN_OR_RETURN(std::uint64_t size, file_size(fd, path));
  std::string out(static_cast<std::size_t>(size), '\0');
  DSA_TRY(pread_exact(fd, path, out.data(), out.size(), 0));
  return out;
}

} // namespace dsa::ckpt
