// One libaio context (io_setup/io_destroy) and the block loop that moves one contiguous range
// through it: cut into block_size iocbs, queue_depth in flight, each io_event.res checked.
// Used by one engine worker thread at a time; blocks in io_getevents.
#pragma once

#include "core/error.hpp"
#include "io/aio/aio_config.hpp"
#include "io/aio/aio_file.hpp"

#include <libaio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dsa::aio {

// One contiguous transfer: buffer[0, length) <-> file[file_offset, file_offset + length).
// For O_DIRECT, buffer, file_offset and length are multiples of the alignment.
struct transfer_range {
  int fd = -1;
  const std::string* path = nullptr; // for messages
  aio_op op = aio_op::read;
  char* buffer = nullptr;
  std::uint64_t file_offset = 0;
  std::size_t length = 0;
  // Reads: where the file's data ends; a block past it is expected to return only the bytes
  // before it (the padded tail of the last block). Writes ignore it.
  std::uint64_t file_end = 0;
  bool direct = false;
  std::size_t alignment = 4096;
};

class aio_context {
public:
  static expected<aio_context> create(const aio_config& config);
  aio_context(aio_context&& other) noexcept;
  aio_context& operator=(aio_context&&) = delete;
  aio_context(const aio_context&) = delete;
  ~aio_context();

  // Moves the range; returns after every iocb it submitted has completed (also on error).
  // A short completion is resubmitted for the remainder; negative res values, a completion
  // that makes no progress, or a remainder O_DIRECT cannot continue are errors naming the
  // file, the operation and the offset.
  status transfer(const transfer_range& range);

private:
  explicit aio_context(const aio_config& config) : config_(config) {}

  aio_config config_;
  io_context_t ctx_ = nullptr;
  std::vector<iocb> iocbs_;
  std::vector<io_event> events_;
  // Per iocb: bytes still expected from the request it carries.
  std::vector<std::size_t> expected_;
};

} // namespace dsa::aio
