// flock-based ownership of a file; see file_lock.hpp.
#include "core/file_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace dsa {

expected<int> try_lock_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(errc::io, "cannot open the lock '{}': {}", path, std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(fd);
    if (e == EWOULDBLOCK) return -1;
    return make_error(errc::io, "cannot lock '{}': {}", path, std::strerror(e));
  }
  return fd;
}

bool remove_unowned_folder(const std::string& lock, const std::string& dir) {
  auto fd = try_lock_file(lock);
  if (!fd || *fd < 0) return false;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  ::unlink(lock.c_str()); // before the lock goes: no one can take the folder in between
  ::close(*fd);
  return true;
}

} // namespace dsa
