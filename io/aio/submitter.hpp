// What the NVMe engine's clients see: a request, its completion, and a submitter that
// takes requests with a priority and calls back once per accepted request. aio_engine
// is one (it runs requests in arrival order on its threads); the run's NVMe engine actor
// (actors/nvme_engine_actor.hpp) is another, which holds requests and starts them on an
// engine by priority within a bounded number in flight.
#pragma once

#include "core/error.hpp"
#include "io/aio/aio_file.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <optional>
#include <string>

namespace dsa::aio {

// What to move. Files are padded to the alignment on disk while written (O_DIRECT moves
// whole blocks; DeepSpeed #1070 lost unaligned tails), then cut back to their logical
// length with ftruncate, so a written file is exactly `file_offset + bytes` long.
struct aio_request {
  aio_op op = aio_op::read;
  std::string path;
  // Aligned to the engine's alignment, at least padded_size(bytes) bytes (the padding of a
  // read may be overwritten; that of a write is written, then cut off). The caller must not
  // touch it until the completion arrives.
  void* buffer = nullptr;
  std::size_t buffer_bytes = 0;
  std::size_t bytes = 0;         // logical bytes to move
  std::uint64_t file_offset = 0; // a multiple of the alignment
  // Reads: the size the file must have (default file_offset + bytes); another size is an
  // error naming the file. Writes: when set, the size the file must have before the write
  // (a file cut or removed under its writer is an error, not silently refilled).
  std::optional<std::uint64_t> expect_file_size;
  // Writes: the length the file is given afterwards instead of file_offset + bytes (a
  // range written into the middle of a file of this length, as the swap files are).
  std::optional<std::uint64_t> file_length;
};

struct aio_completion {
  std::uint64_t id = 0; // as returned by submit
  aio_op op = aio_op::read;
  std::string path;
  std::size_t bytes = 0;
  bool direct = false; // the file was opened with O_DIRECT (false: the buffered fallback)
  status result;       // an error names the file and the operation
};

// Runs exactly once per accepted request: on an engine thread (aio_engine) or on the NVMe
// engine actor. Must not block for long and must not destroy the submitter.
using aio_callback = std::function<void(aio_completion&&)>;

// Who waits for a request, most urgent first. A submitter that orders requests starts a
// more urgent one before any less urgent one still waiting (in arrival order within a class).
enum class io_priority : std::uint8_t {
  fetch = 0, // ZeRO-3: a parameter read a gather waits for
  update =
      1, // the optimizer's running update waits for it (its chunk's read, an unpipelined write)
  prefetch = 2,     // read ahead for the next update
  write_behind = 3, // written behind the update (pipeline_write)
};
constexpr std::size_t io_priorities = 4;
const char* io_priority_name(io_priority p);

class submitter {
public:
  virtual ~submitter() = default;
  // Queues the request and returns its id at once; on_done runs once when it has ended.
  // A malformed request (see check_request) or a submitter that has stopped is an error
  // and gets no completion.
  virtual expected<std::uint64_t> submit(aio_request request, io_priority priority,
                                         aio_callback on_done) = 0;
  // The alignment buffers, offsets and files need (the file system's O_DIRECT block).
  virtual std::size_t alignment() const = 0;
  std::size_t padded_size(std::size_t bytes) const { return round_up(bytes, alignment()); }
};

// errc::invalid_argument naming the file when the buffer or the offset is not aligned or
// the buffer cannot hold the padded bytes.
status check_request(const aio_request& request, std::size_t alignment);

// Submits with a future instead of a callback; a refused request yields a ready future
// holding the error.
std::future<aio_completion> submit_future(submitter& to, aio_request request, io_priority priority);

} // namespace dsa::aio
