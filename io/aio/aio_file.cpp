// Opening engine files with O_DIRECT and the buffered fallback.
#include "io/aio/aio_file.hpp"

#include "core/log.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>

#include <atomic>
#include <cstring>

namespace dsa::aio {

const char* aio_op_name(aio_op op) {
  return op == aio_op::read ? "read" : "write";
}

expected<aio_file> open_aio_file(const std::string& path, aio_op op, direct_io mode,
                                 open_fn open_call) {
  int flags = (op == aio_op::read ? O_RDONLY : O_WRONLY | O_CREAT) | O_CLOEXEC;
  auto attempt = [&](int f) {
    return ckpt::retry_eintr([&] { return open_call(path.c_str(), f, 0600); });
  };
  aio_file file;
  int fd = -1;
  if (mode == direct_io::prefer) {
    fd = attempt(flags | O_DIRECT);
    if (fd >= 0) {
      file.direct = true;
    } else if (errno == EINVAL) {
      // tmpfs before Linux 6.6, some FUSE and network file systems: no O_DIRECT. Said once
      // per process so a sweep over many files does not flood the log.
      static std::atomic<bool> said{false};
      if (!said.exchange(true))
        log_info("aio: '{}' does not support O_DIRECT; using buffered I/O (page cache) there",
                 path);
      fd = attempt(flags);
    }
  } else {
    fd = attempt(flags);
  }
  if (fd < 0) {
    int err = errno;
    return make_error(err == ENOENT ? errc::not_found : errc::io, "aio {}: cannot open '{}': {}",
                      aio_op_name(op), path, std::strerror(err));
  }
  file.fd = ckpt::unique_fd(fd);
  return file;
}

expected<std::size_t> direct_io_alignment(const std::string& dir) {
  struct statvfs st {};
  if (ckpt::retry_eintr([&] { return ::statvfs(dir.c_str(), &st); }) != 0)
    return ckpt::sys_error("cannot statvfs", dir, errno);
  std::size_t bsize = st.f_bsize;
  std::size_t align = 4096;
  // f_bsize is the file system block (4096 on ext4/xfs); a larger power of two wins.
  while (align < bsize && align < (std::size_t{1} << 20))
    align *= 2;
  return align;
}

} // namespace dsa::aio
