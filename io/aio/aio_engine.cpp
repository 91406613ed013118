// The engine's threads: every request is split into one block-aligned share per thread; the
// first share to run opens the file, the last one to finish sets the length, closes the file
// and delivers the completion.
#include "io/aio/aio_engine.hpp"

#include "core/log.hpp"
#include "io/aio/aio_context.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

namespace dsa::aio {
namespace {

int default_open(const char* path, int flags, unsigned mode) {
  return ::open(path, flags, mode);
}

} // namespace

struct aio_engine::request_state {
  std::uint64_t id = 0;
  aio_request request;
  aio_callback on_done;
  std::once_flag open_once;
  aio_file file;
  bool opened = false;
  std::atomic<unsigned> shares_left{0};
  std::mutex mutex; // guards first_error
  std::optional<error> first_error;

  void fail(error e) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!first_error)
      first_error = std::move(e);
  }
  bool failed() {
    std::lock_guard<std::mutex> lock(mutex);
    return first_error.has_value();
  }
};

struct aio_engine::share {
  std::shared_ptr<request_state> state;
  std::size_t begin = 0; // byte range within the padded request
  std::size_t end = 0;
};

struct aio_engine::worker {
  explicit worker(aio_context c) : ctx(std::move(c)) {}
  aio_context ctx;
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<share> queue;
  bool stopping = false;
  std::thread thread;
};

aio_engine::aio_engine(const engine_options& options) : options_(options) {}

expected<std::unique_ptr<aio_engine>> aio_engine::create(const engine_options& options) {
  DSA_TRY(options.config.validate());
  std::size_t align = options.alignment;
  if (align < 4096 || (align & (align - 1)) != 0)
    return make_error(errc::invalid_argument,
                      "aio alignment {} is not a power of two of at least 4096", align);
  std::unique_ptr<aio_engine> engine(new aio_engine(options));
  if (!engine->options_.open_call)
    engine->options_.open_call = default_open;
  for (unsigned t = 0; t < options.config.intra_op_parallelism; ++t) {
    DSA_ASSIGN_OR_RETURN(aio_context ctx, aio_context::create(options.config));
    engine->workers_.push_back(std::make_unique<worker>(std::move(ctx)));
  }
  for (auto& w : engine->workers_) {
    worker* wp = w.get();
    wp->thread = std::thread([e = engine.get(), wp] {
      for (;;) {
        share s;
        {
          std::unique_lock<std::mutex> lock(wp->mutex);
          wp->wake.wait(lock, [&] { return wp->stopping || !wp->queue.empty(); });
          if (wp->queue.empty())
            return; // stopping, and every accepted share has run
          s = std::move(wp->queue.front());
          wp->queue.pop_front();
        }
        e->run_share(*wp, s);
      }
    });
  }
  log_debug("aio engine: {} alignment={} mode={}", options.config.summary(), align,
            options.mode == direct_io::prefer ? "O_DIRECT" : "buffered");
  return engine;
}

aio_engine::~aio_engine() {
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> lock(w->mutex);
    w->stopping = true;
    w->wake.notify_one();
  }
  for (auto& w : workers_)
    if (w->thread.joinable())
      w->thread.join();
}

expected<std::uint64_t> aio_engine::submit(aio_request request, aio_callback on_done) {
  DSA_TRY(check_request(request, alignment()));
  const std::size_t align = alignment();
  const std::size_t padded = padded_size(request.bytes);
  auto st = std::make_shared<request_state>();
  st->id = next_id_.fetch_add(1);
  st->request = std::move(request);
  st->on_done = std::move(on_done);
  // Even, block-aligned shares: thread t gets units [t·n/p, (t+1)·n/p) of the padded bytes.
  const std::size_t p = workers_.size();
  const std::size_t units = padded / align;
  st->shares_left = static_cast<unsigned>(p);
  for (std::size_t t = 0; t < p; ++t) {
    share s{st, t * units / p * align, (t + 1) * units / p * align};
    std::lock_guard<std::mutex> lock(workers_[t]->mutex);
    workers_[t]->queue.push_back(std::move(s));
    workers_[t]->wake.notify_one();
  }
  return st->id;
}

std::future<aio_completion> aio_engine::submit(aio_request request) {
  return submit_future(*this, std::move(request), io_priority::update);
}

expected<std::uint64_t> aio_engine::submit(aio_request request, io_priority, aio_callback on_done) {
  return submit(std::move(request), std::move(on_done));
}

void aio_engine::open_request(request_state& st) {
  const aio_request& req = st.request;
  auto file = open_aio_file(req.path, req.op, options_.mode, options_.open_call);
  if (!file) {
    st.fail(file.err());
    return;
  }
  st.file = std::move(*file);
  st.opened = true;
  if (req.op == aio_op::read || req.expect_file_size) {
    auto size = ckpt::file_size(st.file.fd, req.path);
    if (!size) {
      st.fail(size.err());
      return;
    }
    std::uint64_t want = req.expect_file_size.value_or(req.file_offset + req.bytes);
    if (*size != want)
      st.fail(make_error(errc::format, "aio {} '{}': the file has {} bytes, expected {}",
                         req.op == aio_op::read ? "read" : "write", req.path, *size, want));
  }
}

void aio_engine::run_share(worker& w, share& s) {
  request_state& st = *s.state;
  std::call_once(st.open_once, [&] { open_request(st); });
  if (s.end > s.begin && st.opened && !st.failed()) {
    const aio_request& req = st.request;
    transfer_range range;
    range.fd = st.file.fd.get();
    range.path = &req.path;
    range.op = req.op;
    range.buffer = static_cast<char*>(req.buffer) + s.begin;
    range.file_offset = req.file_offset + s.begin;
    range.length = s.end - s.begin;
    range.file_end = req.file_offset + req.bytes;
    range.direct = st.file.direct;
    range.alignment = alignment();
    if (auto done = w.ctx.transfer(range); !done)
      st.fail(done.err());
  }
  if (st.shares_left.fetch_sub(1) == 1) {
    auto keep = s.state; // the last share owns the state until the callback has run
    finish(st);
  }
}

void aio_engine::finish(request_state& st) {
  const aio_request& req = st.request;
  if (st.opened && req.op == aio_op::write && !st.failed()) {
    // Cut the padding written past the logical end (see aio_request).
    auto length = static_cast<off_t>(req.file_length.value_or(req.file_offset + req.bytes));
    if (ckpt::retry_eintr([&] { return ::ftruncate(st.file.fd.get(), length); }) != 0)
      st.fail(make_error(errc::io, "aio write '{}': cannot set the length to {}: {}", req.path,
                         length, std::strerror(errno)));
  }
  if (st.opened) {
    auto closed = st.file.fd.close(req.path);
    if (!closed && req.op == aio_op::write)
      st.fail(closed.err());
  }
  aio_completion c{st.id, req.op, req.path, req.bytes, st.file.direct, {}};
  if (st.first_error)
    c.result = *st.first_error;
  auto on_done = std::move(st.on_done);
  if (on_done)
    on_done(std::move(c));
}

} // namespace dsa::aio
