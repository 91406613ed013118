// The NVMe engine actor of a rank (DESIGN.md's `nvme engine` role): every swap read and
// write of the rank's optimizer shards (io/aio/swap_store.hpp) and ZeRO-3 parameter
// stores (actors/train/stage/param_store.hpp) is a message to it. A client's submit, on a
// port (an aio::submitter), puts the request in the engine's request table and sends
// nvme_request; the actor starts requests on the rank's aio engines by priority while
// their credits allow (nvme_engine_state.hpp), an engine thread reports each end as
// nvme_ended, and the actor accounts it and runs the client's continuation. Nothing in
// the actor blocks. (The trace shows the transfers as the shards' swap_read/swap_write
// spans, which know their step; the engine's requests do not, so they have no lane.)
//
// The actor lives in a small actor system of its own (one scheduler thread, on a thread of
// its own, which makes and destroys the system), as long as
// the rank's stores: the optimizer's first writes and a resume happen before the run's
// actors start, and its read-back for the final checkpoint after they stop, yet they go
// through the same actor; and no pipeline actor's work can delay a completion.
#pragma once

#include "actors/nvme_engine_state.hpp"
#include "core/error.hpp"
#include "io/aio/submitter.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dsa::actors {

struct nvme_engine_options {
  struct engine {
    std::shared_ptr<aio::submitter> submitter; // an aio_engine (a fake in tests)
    io_credits credits;
    std::string name; // for errors and the report: the swap folder
  };
  std::vector<engine> engines;
  // Tests: runs on the actor when shutdown() reached it (requests may still be waiting).
  std::function<void()> on_drain;
};

struct nvme_engine_stats {
  std::uint64_t requests = 0, failed = 0; // ended
  std::uint64_t bytes_read = 0, bytes_written = 0;
  std::uint64_t waited = 0;                // requests that could not start when they arrived
  std::vector<std::size_t> peak_in_flight; // [engine]
};

class nvme_engine_service : public std::enable_shared_from_this<nvme_engine_service> {
public:
  static expected<std::shared_ptr<nvme_engine_service>> start(nvme_engine_options options);
  // shutdown(), then the actor system goes.
  ~nvme_engine_service();
  nvme_engine_service(const nvme_engine_service&) = delete;
  nvme_engine_service& operator=(const nvme_engine_service&) = delete;

  // The client side for engine `engine`: its submit sends the request to the actor (the
  // priority orders it), its completion runs on the actor. The port keeps the service.
  std::shared_ptr<aio::submitter> port(std::uint32_t engine);
  // Waits until every accepted request has ended and its continuation has run, then stops
  // the actor; a submit after it is an error naming the engine. Idempotent.
  void shutdown();
  nvme_engine_stats stats() const;
  // One line for the log: requests, bytes, peak in flight against the credits.
  std::string report() const;

  struct shared; // the request table, shared with the ports, the actor and the engines' callbacks

private:
  nvme_engine_service() = default;
  std::shared_ptr<shared> shared_;
  struct system_holder;
  std::unique_ptr<system_holder> system_; // last: goes first
};

} // namespace dsa::actors
