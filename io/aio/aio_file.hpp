// Opening files for the NVMe engine: O_DIRECT first, buffered I/O where the file system
// refuses O_DIRECT (EINVAL at open), and the alignment O_DIRECT transfers need.
#pragma once

#include "core/error.hpp"
#include "io/ckpt/posix_file.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsa::aio {

enum class aio_op { read, write };
const char* aio_op_name(aio_op op);

// prefer: O_DIRECT, falling back to buffered I/O on EINVAL; buffered: never O_DIRECT.
enum class direct_io { prefer, buffered };

// The open(2) the engine calls; a test replaces it to act like a file system without O_DIRECT.
using open_fn = int (*)(const char* path, int flags, unsigned mode);

struct aio_file {
  ckpt::unique_fd fd;
  bool direct = false; // opened with O_DIRECT
};

// Opens `path` for `op`: reads O_RDONLY; writes O_WRONLY|O_CREAT (mode 0600, no O_TRUNC:
// the engine sets the length after writing). Errors name the file, the operation and errno.
expected<aio_file> open_aio_file(const std::string& path, aio_op op, direct_io mode,
                                 open_fn open_call);

// Alignment for O_DIRECT on the file system holding `dir`: its block size, at least 4096.
expected<std::size_t> direct_io_alignment(const std::string& dir);

inline std::uint64_t round_up(std::uint64_t n, std::uint64_t align) {
  return (n + align - 1) / align * align;
}

} // namespace dsa::aio
