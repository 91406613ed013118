// The host implementation of the asynchronous collectives; see async_collectives.hpp.
#include "io/net/async_collectives.hpp"

#include "io/net/communicator.hpp"
#include "io/net/comms_logger.hpp"

#include <chrono>
#include <exception>

namespace dsa::net {

host_collectives::host_collectives(std::shared_ptr<communicator> comm, comms_logger* logger, std::string caller)
    : comm_(std::move(comm)), logger_(logger), caller_(std::move(caller)) {
  DSA_CHECK(comm_ != nullptr, "host_collectives: no communicator");
  thread_ = std::thread([this] { loop(); });
}

host_collectives::~host_collectives() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

int host_collectives::rank() const { return comm_->rank(); }
int host_collectives::size() const { return comm_->size(); }

expected<async_collectives::ticket> host_collectives::all_reduce_sum(void* data, dtype type, std::int64_t count) {
  communicator* c = comm_.get();
  return enqueue("all_reduce", count * static_cast<std::int64_t>(dtype_size(type)),
                 [c, data, type, count] { return c->allreduce_sum(data, type, count); });
}

expected<async_collectives::ticket> host_collectives::all_gather(void* out, const void* in, dtype type,
                                                                 std::int64_t count) {
  communicator* c = comm_.get();
  // Each rank's part of the communicator's allgather is exactly its `count` elements.
  const std::int64_t total = count * c->size();
  return enqueue("all_gather", total * static_cast<std::int64_t>(dtype_size(type)),
                 [c, out, in, type, total] { return c->allgather(out, in, type, total); });
}

expected<async_collectives::ticket> host_collectives::enqueue(const char* op, std::int64_t bytes,
                                                              std::function<status()> call) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_) return *failure_;
  const ticket t = next_++;
  queue_.push_back({t, op, bytes, std::move(call)});
  cv_.notify_all();
  return t;
}

status host_collectives::wait(ticket t) {
  std::unique_lock<std::mutex> lock(mu_);
  if (t == 0 || t >= next_)
    return make_error(errc::invalid_argument, "host collectives of rank {}: wait for ticket {}, but {} were handed out",
                      comm_->rank(), t, next_ - 1);
  cv_.wait(lock, [&] { return finished_ >= t || (failed_at_ && *failed_at_ <= t); });
  if (failed_at_ && *failed_at_ <= t) return *failure_;
  return {};
}

void host_collectives::loop() {
  for (;;) {
    queued q;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      q = std::move(queue_.front());
      queue_.pop_front();
    }
    const bool timed = logger_ && logger_->profiles(q.op);
    const auto start = std::chrono::steady_clock::now();
    status s;
    try {
      s = q.call();
    } catch (const std::exception& e) { // as a failed call: the group breaks, the caller hears of it
      s = make_error(errc::runtime, "host collectives of rank {}: {} failed: {}", comm_->rank(), q.op, e.what());
      comm_->abort(s.err()); // the peers are in the same call: wake them
    }
    if (s && timed)
      logger_->record(q.op, q.bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                      caller_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = q.t;
      if (!s && !failure_) {
        failed_at_ = q.t;
        failure_ = s.err();
        // What was enqueued after it never runs: the group is broken.
        if (!queue_.empty()) finished_ = queue_.back().t;
        queue_.clear();
      }
    }
    cv_.notify_all();
  }
}

} // namespace dsa::net
