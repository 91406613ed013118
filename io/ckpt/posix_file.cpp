// Checked POSIX file calls shared by the checkpoint writers and readers.
#include "io/ckpt/posix_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace dsa::ckpt {
namespace {

// Linux transfers at most about 2 GiB per read/write call; stay below it.
constexpr std::size_t max_chunk = std::size_t{1} << 30;

} // namespace

error sys_error(const std::string& what, const std::string& path, int err) {
  return make_error(errc::io, "{} '{}': {}", what, path, std::strerror(err));
}

unique_fd& unique_fd::operator=(unique_fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

unique_fd::~unique_fd() {
  if (fd_ >= 0)
    ::close(fd_);
}

int unique_fd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

status unique_fd::close(const std::string& path) {
  if (fd_ < 0)
    return {};
  int fd = release();
  if (::close(fd) != 0 && errno != EINTR)
    return sys_error("cannot close", path, errno);
  return {};
}

expected<unique_fd> open_for_read(const std::string& path) {
  int fd = retry_eintr([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); });
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT)
      return make_error(errc::not_found, "cannot open '{}': {}", path, std::strerror(err));
    return sys_error("cannot open", path, err);
  }
  return unique_fd(fd);
}

expected<std::uint64_t> file_size(const unique_fd& fd, const std::string& path) {
  struct stat st {};
  if (retry_eintr([&] { return ::fstat(fd.get(), &st); }) != 0)
    return sys_error("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode))
    return make_error(errc::io, "'{}' is not a regular file", path);
  return static_cast<std::uint64_t>(st.st_size);
}

status pread_exact(const unique_fd& fd, const std::string& path, void* dst, std::size_t bytes,
                   std::uint64_t offset) {
  auto* out = static_cast<unsigned char*>(dst);
  std::size_t done = 0;
  while (done < bytes) {
    std::size_t chunk = std::min(bytes - done, max_chunk);
    ssize_t n = retry_eintr(
        [&] { return ::pread(fd.get(), out + done, chunk, static_cast<off_t>(offset + done)); });
    if (n < 0)
      return sys_error("cannot read", path, errno);
    if (n == 0)
      return make_error(errc::io, "short read from '{}': {} of {} bytes at offset {}", path, done,
                        bytes, offset);
    done += static_cast<std::size_t>(n);
  }
  return {};
}

status write_all(const unique_fd& fd, const std::string& path, const void* src, std::size_t bytes) {
  const auto* in = static_cast<const unsigned char*>(src);
  std::size_t done = 0;
  while (done < bytes) {
    std::size_t chunk = std::min(bytes - done, max_chunk);
    ssize_t n = retry_eintr([&] { return ::write(fd.get(), in + done, chunk); });
    if (n < 0)
      return sys_error("cannot write", path, errno);
    if (n == 0)
      return make_error(errc::io, "cannot write '{}': no progress after {} bytes", path, done);
    done += static_cast<std::size_t>(n);
  }
  return {};
}

status fsync_fd(const unique_fd& fd, const std::string& path) {
  if (retry_eintr([&] { return ::fsync(fd.get()); }) != 0)
    return sys_error("cannot fsync", path, errno);
  return {};
}

} // namespace dsa::ckpt
