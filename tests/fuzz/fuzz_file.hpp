// For the fuzz targets whose parser reads a file by path: the input written into one
// memory file (memfd) per process, named by its /proc/self/fd path.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace dsa::fuzz {

inline std::string as_file(const std::uint8_t* data, std::size_t size) {
  static const int fd = [] {
    const int f = memfd_create("dsactor-fuzz", 0);
    if (f < 0) std::abort();
    return f;
  }();
  if (ftruncate(fd, 0) != 0) std::abort();
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<std::size_t>(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

} // namespace dsa::fuzz
