// Timed sequential transfers for `dsactor bench aio` and `dsactor nvme-tune`: the NVMe engine
// and plain pwrite/pread peers on one file, each validated against the written pattern.
#pragma once

#include "core/error.hpp"
#include "io/aio/aio_config.hpp"

#include <cstddef>
#include <string>

namespace dsa::tools {

struct transfer_rates {
  double write_gbps = 0;
  double read_gbps = 0;
  bool direct = false; // the engine used O_DIRECT
};

// A file in `dir` written and read back whole `reps` times through an engine with `config`;
// the best time of each direction. The read-back is compared with what was written.
expected<transfer_rates> measure_engine(const std::string& dir, const aio::aio_config& config,
                                        std::size_t bytes, int reps);

enum class posix_mode { direct, buffered };
// The same with pwrite/pread loops of `block_size` bytes. Buffered: the write time includes
// fdatasync, and the pages are dropped (posix_fadvise DONTNEED) before the read.
expected<transfer_rates> measure_posix(const std::string& dir, posix_mode mode,
                                       std::size_t block_size, std::size_t bytes, int reps);

// "ext4", "xfs", "tmpfs", ... for the file system holding `dir` (or its magic number in hex).
std::string file_system_name(const std::string& dir);

int bench_aio_main(int argc, char** argv);

} // namespace dsa::tools
