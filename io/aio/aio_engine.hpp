// The NVMe engine: reads and writes whole files (or aligned ranges) between caller buffers
// and files with libaio and O_DIRECT, on its own threads. Callers post requests and get one
// completion per request, on an engine thread, as a callback or a future; requests run in
// arrival order (the run orders them by priority in its NVMe engine actor,
// actors/nvme_engine_actor.hpp). Nothing here blocks the caller on I/O.
#pragma once

#include "core/error.hpp"
#include "io/aio/aio_config.hpp"
#include "io/aio/aio_file.hpp"
#include "io/aio/submitter.hpp"

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

struct engine_options {
  aio_config config;
  std::size_t alignment = 4096; // direct_io_alignment(dir) for the files' file system
  direct_io mode = direct_io::prefer;
  open_fn open_call = nullptr; // nullptr: ::open
};

class aio_engine final : public submitter {
public:
  // Starts config.intra_op_parallelism threads, each with its own io_context.
  static expected<std::unique_ptr<aio_engine>> create(const engine_options& options);
  // Finishes every accepted request (their callbacks run), then joins the threads.
  ~aio_engine() override;
  aio_engine(const aio_engine&) = delete;
  aio_engine& operator=(const aio_engine&) = delete;

  // Queues the request and returns its id at once; a malformed request (unaligned buffer or
  // offset, buffer too small) is an errc::invalid_argument error and gets no completion.
  expected<std::uint64_t> submit(aio_request request, aio_callback on_done);
  // The same with a future; a malformed request yields a ready future holding the error.
  std::future<aio_completion> submit(aio_request request);
  // The submitter's form: the priority is ignored (requests run in arrival order).
  expected<std::uint64_t> submit(aio_request request, io_priority priority, aio_callback on_done) override;

  std::size_t alignment() const override { return options_.alignment; }
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
