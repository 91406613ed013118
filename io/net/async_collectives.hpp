// Collectives that are enqueued and complete later, in the order they were enqueued: what
// the reducer uses for its gradient buckets and norm shares, whichever memory they live in.
// NCCL's stream-ordered collectives (device buffers) are the model; the host collectives
// (net::communicator, blocking, on host buffers) are its CPU implementation, running on a
// thread of their own so the caller can enqueue every bucket of a step and wait once.
//
// Every rank of the group enqueues the same operations in the same order (as with the
// blocking collectives). A buffer belongs to the group from its enqueue until its ticket is
// waited for. The first failed operation breaks the group: the operations after it are not
// run, every later enqueue is refused with that error, and a wait returns it for every
// ticket that had not completed by then (one that had still returns ok). A broken group
// cannot be resumed: the host one has aborted its transport, which wakes the peers; the
// NCCL one has aborted its communicator.
//
// Threads: one thread enqueues and waits (a rank's reducer worker).
#pragma once

#include "core/dtype.hpp"
#include "core/error.hpp"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace dsa::net {

class communicator;
class comms_logger;

enum class buffer_memory { host, device };

class async_collectives {
public:
  using ticket = std::uint64_t;
  virtual ~async_collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the buffers passed in must live.
  virtual buffer_memory memory() const = 0;
  // Enqueues the sum over the group of (count) f32/f16/bf16 elements at `data`, in place.
  virtual expected<ticket> all_reduce_sum(void* data, dtype type, std::int64_t count) = 0;
  // Enqueues the gather of every rank's (count) elements at `in` into `out` (size() x count,
  // rank r's at r x count), bytes unchanged.
  virtual expected<ticket> all_gather(void* out, const void* in, dtype type, std::int64_t count) = 0;
  // Returns once `t` and every operation enqueued before it completed: ok, or, when the
  // group broke before they all had, the error that broke it. A ticket not yet handed out is
  // an errc::invalid_argument.
  virtual status wait(ticket t) = 0;
};

// The CPU implementation: the blocking collectives of `comm` run on a thread of this
// object's, one at a time in ticket order; each is one call of the communicator, so the
// results are the blocking calls' bit for bit; an exception from a call (an allocation) is
// that operation's error. With a `logger`, each operation is recorded
// ("all_reduce", "all_gather") under `caller`, timed on that thread. The destructor drops
// what is still queued and waits for the operation in progress (a lost peer ends it with
// an error: the transport's abort wakes it).
class host_collectives final : public async_collectives {
public:
  host_collectives(std::shared_ptr<communicator> comm, comms_logger* logger = nullptr, std::string caller = {});
  ~host_collectives() override;
  host_collectives(const host_collectives&) = delete;
  host_collectives& operator=(const host_collectives&) = delete;

  int rank() const override;
  int size() const override;
  buffer_memory memory() const override { return buffer_memory::host; }
  expected<ticket> all_reduce_sum(void* data, dtype type, std::int64_t count) override;
  expected<ticket> all_gather(void* out, const void* in, dtype type, std::int64_t count) override;
  status wait(ticket t) override;

private:
  expected<ticket> enqueue(const char* op, std::int64_t bytes, std::function<status()> call);
  void loop();

  std::shared_ptr<communicator> comm_;
  comms_logger* logger_;
  std::string caller_;
  struct queued {
    ticket t;
    const char* op;
    std::int64_t bytes;
    std::function<status()> call;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<queued> queue_;
  ticket next_ = 1;     // the next ticket handed out
  ticket finished_ = 0; // every ticket up to this one has ended (ran, or was dropped after a failure)
  std::optional<ticket> failed_at_;
  std::optional<error> failure_;
  bool stop_ = false;
  std::thread thread_; // last: started once the rest is ready
};

} // namespace dsa::net
