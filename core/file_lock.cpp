// flock-based ownership of a file; see file_lock.hpp.
#include "core/file_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

} // namespace dsa
