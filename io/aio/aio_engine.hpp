// The NVMe engine: reads and writes whole files (or aligned ranges) between caller buffers
// and files with libaio and O_DIRECT, on its own threads. Callers post requests and get one
// completion per request, on an engine thread, as a callback (an actor's callback sends
// itself a message) or a future. Nothing here blocks the caller on I/O.
#pragma once

#include "core/error.hpp"
#include "io/aio/aio_config.hpp"
#include "io/aio/aio_file.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
  // error naming the file. Writes: when set, the size the file must already have before
  // the write (a swap file written whole before: one cut under the run fails naming it
  // instead of being extended with zeros); unset, anything goes.
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

// Runs on an engine thread, exactly once per accepted request. Must not block for long and
// must not destroy the engine.
using aio_callback = std::function<void(aio_completion&&)>;

struct engine_options {
  aio_config config;
  std::size_t alignment = 4096; // direct_io_alignment(dir) for the files' file system
  direct_io mode = direct_io::prefer;
  open_fn open_call = nullptr; // nullptr: ::open
};

class aio_engine {
public:
  // Starts config.intra_op_parallelism threads, each with its own io_context.
  static expected<std::unique_ptr<aio_engine>> create(const engine_options& options);
  // Finishes every accepted request (their callbacks run), then joins the threads.
  ~aio_engine();
  aio_engine(const aio_engine&) = delete;
  aio_engine& operator=(const aio_engine&) = delete;

  // Queues the request and returns its id at once; a malformed request (unaligned buffer or
  // offset, buffer too small) is an errc::invalid_argument error and gets no completion.
  expected<std::uint64_t> submit(aio_request request, aio_callback on_done);
  // The same with a future; a malformed request yields a ready future holding the error.
  std::future<aio_completion> submit(aio_request request);

  std::size_t alignment() const { return options_.alignment; }
  std::size_t padded_size(std::size_t bytes) const { return round_up(bytes, alignment()); }
  const aio_config& config() const { return options_.config; }

private:
  struct request_state;
  struct share;
  struct worker;
  explicit aio_engine(const engine_options& options);
  void run_share(worker& w, share& s);
  void open_request(request_state& st);
  void finish(request_state& st);

  engine_options options_;
  std::vector<std::unique_ptr<worker>> workers_;
  std::atomic<std::uint64_t> next_id_{1};
};

} // namespace dsa::aio
