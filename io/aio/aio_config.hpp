// The settings of the NVMe engine, named and defaulted as DeepSpeed's `[aio]` section
// (swap_tensor/constants.py), and the TOML text that pastes back into a config.
#pragma once

#include "core/error.hpp"

#include <cstddef>
#include <string>

namespace dsa::aio {

struct aio_config {
  std::size_t block_size = std::size_t{1} << 20; // bytes per iocb (the last one may be short)
  unsigned queue_depth = 8;                      // iocbs in flight per thread (ZeRO default)
  bool single_submit = false; // true: one io_submit per iocb; false: the batch in one call
  bool overlap_events = true; // true: refill as each completion arrives; false: wait for the batch
  unsigned intra_op_parallelism = 1; // worker threads, each with its own io_context

  // An errc::config error naming the key when a value is out of range.
  status validate() const;
  // "[aio]\nblock_size = ...\n..." with DeepSpeed's key names.
  std::string to_toml() const;
  // One line for logs: "block_size=1048576 queue_depth=8 ...".
  std::string summary() const;
};

} // namespace dsa::aio
