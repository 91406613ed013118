// The libaio block loop: submission in batches or one by one, refill on each completion or
// per batch, and a check of every completion against the bytes it was asked for.
#include "io/aio/aio_context.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

namespace dsa::aio {

expected<aio_context> aio_context::create(const aio_config& config) {
  DSA_TRY(config.validate());
  aio_context c(config);
  if (int rc = io_setup(static_cast<int>(config.queue_depth), &c.ctx_); rc < 0)
    return make_error(errc::io, "io_setup({}) failed: {} (see /proc/sys/fs/aio-max-nr)",
                      config.queue_depth, std::strerror(-rc));
  c.iocbs_.resize(config.queue_depth);
  c.events_.resize(config.queue_depth);
  c.expected_.resize(config.queue_depth);
  return c;
}

aio_context::aio_context(aio_context&& other) noexcept
    : config_(other.config_), ctx_(other.ctx_), iocbs_(std::move(other.iocbs_)),
      events_(std::move(other.events_)), expected_(std::move(other.expected_)) {
  other.ctx_ = nullptr;
}

aio_context::~aio_context() {
  if (ctx_)
    io_destroy(ctx_);
}

status aio_context::transfer(const transfer_range& r) {
  const std::string& path = *r.path;
  std::vector<std::size_t> free_slots(config_.queue_depth);
  for (std::size_t i = 0; i < free_slots.size(); ++i)
    free_slots[i] = free_slots.size() - 1 - i;
  std::vector<iocb*> pending; // prepared, not yet accepted by io_submit (new or remainders)
  std::size_t next = 0;       // first byte of the range not yet prepared
  long inflight = 0;
  std::optional<error> failed;

  auto prepare = [&](std::size_t slot, char* buf, std::uint64_t offset, std::size_t len,
                     std::size_t expect) {
    iocb* cb = &iocbs_[slot];
    if (r.op == aio_op::read)
      io_prep_pread(cb, r.fd, buf, len, static_cast<long long>(offset));
    else
      io_prep_pwrite(cb, r.fd, buf, len, static_cast<long long>(offset));
    expected_[slot] = expect;
    pending.push_back(cb);
  };
  auto fail = [&](error e) {
    if (!failed)
      failed = std::move(e);
  };

  for (;;) {
    if (!failed && (config_.overlap_events || inflight == 0)) {
      while (!free_slots.empty() && next < r.length) {
        std::size_t len = std::min(config_.block_size, r.length - next);
        std::uint64_t offset = r.file_offset + next;
        std::size_t expect = len;
        if (r.op == aio_op::read)
          expect = offset >= r.file_end ? 0 : std::min<std::uint64_t>(len, r.file_end - offset);
        if (expect > 0) {
          prepare(free_slots.back(), r.buffer + next, offset, len, expect);
          free_slots.pop_back();
        }
        next += len;
      }
      std::size_t i = 0;
      while (i < pending.size()) {
        long n = config_.single_submit ? 1 : static_cast<long>(pending.size() - i);
        int rc = io_submit(ctx_, n, pending.data() + i);
        if (rc == -EINTR || rc == -EAGAIN)
          continue; // EAGAIN cannot persist: at most queue_depth iocbs are ever in flight
        if (rc < 0) {
          fail(make_error(errc::io, "aio {} '{}': io_submit at offset {}: {}", aio_op_name(r.op),
                          path, pending[i]->u.c.offset, std::strerror(-rc)));
          for (; i < pending.size(); ++i)
            free_slots.push_back(static_cast<std::size_t>(pending[i] - iocbs_.data()));
          break;
        }
        i += static_cast<std::size_t>(rc);
        inflight += rc;
      }
      pending.clear();
    }
    if (inflight == 0) {
      if (failed || (next >= r.length && pending.empty()))
        break;
      continue; // remainders of short completions wait in `pending`
    }
    // After a failure, drain: the buffer must not be in use when transfer returns.
    long min_events = (config_.overlap_events && !failed) ? 1 : inflight;
    int n = io_getevents(ctx_, min_events, inflight, events_.data(), nullptr);
    if (n == -EINTR)
      continue;
    DSA_CHECK(n >= 0, "io_getevents on '{}': {}", path, std::strerror(-n));
    inflight -= n;
    for (int e = 0; e < n; ++e) {
      iocb* cb = events_[e].obj;
      auto slot = static_cast<std::size_t>(cb - iocbs_.data());
      auto res = static_cast<long>(events_[e].res);
      std::size_t expect = expected_[slot];
      std::uint64_t offset = cb->u.c.offset;
      if (res < 0) {
        fail(make_error(errc::io, "aio {} '{}' at offset {} ({} bytes): {}", aio_op_name(r.op),
                        path, offset, cb->u.c.nbytes, std::strerror(static_cast<int>(-res))));
      } else if (static_cast<std::size_t>(res) < expect && !failed) {
        auto done = static_cast<std::size_t>(res);
        if (done == 0) {
          fail(make_error(errc::io,
                          "aio {} '{}' at offset {}: no progress with {} bytes left (file "
                          "shortened, or device full)",
                          aio_op_name(r.op), path, offset, expect));
        } else if (r.direct && done % r.alignment != 0) {
          fail(make_error(errc::io,
                          "aio {} '{}' at offset {}: short transfer of {} of {} bytes that "
                          "O_DIRECT cannot continue (unaligned)",
                          aio_op_name(r.op), path, offset, done, expect));
        } else {
          // A short completion: ask again for the rest of this block.
          prepare(slot, static_cast<char*>(cb->u.c.buf) + done, offset + done,
                  cb->u.c.nbytes - done, expect - done);
          continue;
        }
      }
      free_slots.push_back(slot);
    }
  }
  if (failed)
    return *failed;
  return {};
}

} // namespace dsa::aio
