// The NVMe engine actor and its ports; see nvme_engine_actor.hpp.
#include "actors/runtime_threads.hpp"
#include "actors/nvme_engine_actor.hpp"

#include "actors/protocol/protocol.hpp"
#include "core/log.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace dsa::actors {

struct nvme_engine_service::shared {
  struct entry {
    aio::aio_request request; // moved to the engine when it starts
    aio::aio_callback on_done;
    io_ticket ticket;
    aio::aio_op op = aio::aio_op::read;
    std::optional<aio::aio_completion> completion; // set by the engine's callback
  };
  std::vector<nvme_engine_options::engine> engines;
  mutable std::mutex mu; // guards everything below
  std::unordered_map<std::uint64_t, entry> entries;
  std::uint64_t next_id = 1;
  bool closed = false;
  caf::actor actor;
  nvme_engine_stats stats;
  std::promise<void> drained; // set by the actor once a drain finished
};

// The actor system lives on a thread of its own, made and destroyed there: CAF 0.17 keeps a
// thread-local reference to a system's logger in the thread that made it (and in any thread
// that makes a scoped_actor for it), and the system's destructor waits for that reference to
// go, so a system destroyed on another thread than the one that made it would wait for ever.
// The service therefore never makes a scoped_actor either: shutdown() waits on a promise.
struct nvme_engine_service::system_holder {
  std::thread thread;
  std::promise<void> stop; // the thread then destroys the system (which awaits the actor)
};

namespace {

using shared_table = nvme_engine_service::shared;

struct engine_state {
  std::shared_ptr<shared_table> table;
  std::unique_ptr<io_schedule> schedule;
  bool draining = false; // shutdown() asked; the table's `drained` is set once idle
  std::function<void()> on_drain;
};
using engine_actor = caf::stateful_actor<engine_state>;

// Starts what the credits allow (returns it); an engine's callback reports each end as nvme_ended.
std::vector<io_ticket> start_ready(engine_actor* self) {
  auto& st = self->state;
  auto admitted = st.schedule->admit();
  for (const io_ticket& t : admitted) {
    auto& table = *st.table;
    aio::aio_request request;
    {
      std::lock_guard<std::mutex> lock(table.mu);
      auto& e = table.entries.at(t.id);
      request = std::move(e.request);
      auto& peak = table.stats.peak_in_flight[t.engine];
      peak = std::max(peak, st.schedule->in_flight(t.engine));
    }
    const aio::aio_op op = request.op;
    std::string path = request.path;
    const std::size_t bytes = request.bytes;
    // The table by plain pointer: the actor keeps it until this request's nvme_ended, and
    // the engine's thread must never hold the last reference (the engine would join itself).
    auto id = table.engines[t.engine].submitter->submit(
        std::move(request), t.priority,
        [shared = &table, actor = caf::actor_cast<caf::actor>(self),
         id = t.id](aio::aio_completion&& c) {
          c.id = id; // the client's id, not the engine's
          {
            std::lock_guard<std::mutex> lock(shared->mu);
            shared->entries.at(id).completion = std::move(c);
          }
          caf::anon_send(actor, nvme_ended{id});
        });
    if (!id) { // the engine refused it: it ends now, with that error
      std::lock_guard<std::mutex> lock(table.mu);
      table.entries.at(t.id).completion =
          aio::aio_completion{t.id, op, std::move(path), bytes, false, id.err()};
      self->send(self, nvme_ended{t.id});
    }
  }
  return admitted;
}

// Request `id` ended: its credits come back, the counts take it, and the
// client's continuation runs (outside the table's lock: it may submit again).
void finish(engine_actor* self, std::uint64_t id) {
  auto& table = *self->state.table;
  shared_table::entry e;
  {
    std::lock_guard<std::mutex> lock(table.mu);
    auto it = table.entries.find(id);
    DSA_CHECK(it != table.entries.end() && it->second.completion,
              "nvme engine: request {} ended twice", id);
    e = std::move(it->second);
    table.entries.erase(it);
    auto& s = table.stats;
    ++s.requests;
    if (!e.completion->result)
      ++s.failed;
    else
      (e.op == aio::aio_op::read ? s.bytes_read : s.bytes_written) += e.completion->bytes;
  }
  self->state.schedule->ended(e.ticket);
  try {
    e.on_done(std::move(*e.completion));
  } catch (const std::exception& ex) {
    DSA_CHECK(false, "nvme engine: the continuation of request {} threw: {}", id, ex.what());
  }
}

void finish_drain(engine_actor* self) {
  auto& st = self->state;
  if (!st.draining || !st.schedule->idle())
    return;
  st.draining = false;
  self->quit();
  st.table->drained.set_value();
}

caf::behavior engine_behavior(engine_actor* self, std::shared_ptr<shared_table> table,
                              std::function<void()> on_drain) {
  std::vector<io_credits> credits;
  for (const auto& e : table->engines)
    credits.push_back(e.credits);
  self->state.table = std::move(table);
  self->state.schedule = std::make_unique<io_schedule>(std::move(credits));
  self->state.on_drain = std::move(on_drain);
  return {
      [=](const nvme_request& r) {
        auto& st = self->state;
        st.schedule->push(
            io_ticket{r.id, r.engine, static_cast<aio::io_priority>(r.priority), r.bytes});
        const auto started = start_ready(self);
        if (std::none_of(started.begin(), started.end(),
                         [&](const io_ticket& t) { return t.id == r.id; })) {
          std::lock_guard<std::mutex> lock(st.table->mu);
          ++st.table->stats.waited;
        }
      },
      [=](const nvme_ended& e) {
        finish(self, e.id);
        start_ready(self);
        finish_drain(self);
      },
      [=](drain_atom) {
        auto& st = self->state;
        st.draining = true;
        if (st.on_drain)
          st.on_drain();
        finish_drain(self);
      },
  };
}

class nvme_port final : public aio::submitter {
public:
  nvme_port(std::shared_ptr<nvme_engine_service> service, std::shared_ptr<shared_table> table,
            std::uint32_t engine)
      : service_(std::move(service)), table_(std::move(table)), engine_(engine) {}

  expected<std::uint64_t> submit(aio::aio_request request, aio::io_priority priority,
                                 aio::aio_callback on_done) override {
    DSA_TRY(aio::check_request(request, alignment()));
    auto& t = *table_;
    std::lock_guard<std::mutex> lock(t.mu);
    if (t.closed)
      return make_error(errc::runtime, "aio {} '{}': the NVMe engine actor of {} has stopped",
                        aio::aio_op_name(request.op), request.path, t.engines[engine_].name);
    const std::uint64_t id = t.next_id++;
    const nvme_request message{id, engine_, static_cast<std::uint8_t>(priority), request.bytes};
    shared_table::entry e;
    e.ticket = io_ticket{id, engine_, priority, request.bytes};
    e.op = request.op;
    e.request = std::move(request);
    e.on_done = std::move(on_done);
    t.entries.emplace(id, std::move(e));
    // Sent under the lock: shutdown() closes the table under it before it sends drain_atom,
    // so no request reaches the actor after the drain.
    caf::anon_send(t.actor, message);
    return id;
  }
  std::size_t alignment() const override { return table_->engines[engine_].submitter->alignment(); }

private:
  std::shared_ptr<nvme_engine_service> service_; // kept running while a store holds the port
  std::shared_ptr<shared_table> table_;
  std::uint32_t engine_;
};

} // namespace

expected<std::shared_ptr<nvme_engine_service>>
nvme_engine_service::start(nvme_engine_options options) {
  if (options.engines.empty())
    return make_error(errc::invalid_argument, "nvme engine: no aio engine to drive");
  for (const auto& e : options.engines)
    if (!e.submitter || e.credits.requests == 0 || e.credits.always == 0)
      return make_error(errc::invalid_argument,
                        "nvme engine: engine '{}' has no submitter or no credits", e.name);
  std::shared_ptr<nvme_engine_service> service(new nvme_engine_service());
  service->shared_ = std::make_shared<shared>();
  service->shared_->engines = std::move(options.engines);
  service->shared_->stats.peak_in_flight.assign(service->shared_->engines.size(), 0);
  service->system_ = std::make_unique<system_holder>();
  std::promise<caf::actor> spawned;
  auto actor = spawned.get_future();
  service->system_->thread = std::thread(
      [shared = service->shared_, on_drain = std::move(options.on_drain),
       spawned = std::move(spawned), stop = service->system_->stop.get_future()]() mutable {
        caf::actor_system_config cfg;
        announce_protocol(cfg);
        // One thread: the actor is all this system runs; sharing sleeps when idle.
        cfg.set("scheduler.policy", caf::atom("sharing"));
        cfg.set("scheduler.max-threads", std::size_t{1});
        cfg.set("logger.verbosity", caf::atom("quiet"));
        mark_runtime_threads(cfg);
        caf::actor_system system{cfg};
        spawned.set_value(system.spawn(engine_behavior, std::move(shared), std::move(on_drain)));
        stop.wait();
      });
  service->shared_->actor = actor.get();
  return service;
}

nvme_engine_service::~nvme_engine_service() {
  if (system_)
    shutdown();
}

std::shared_ptr<aio::submitter> nvme_engine_service::port(std::uint32_t engine) {
  DSA_CHECK(engine < shared_->engines.size(), "nvme engine: port {} of {}", engine,
            shared_->engines.size());
  // The port keeps this service (and so the actor) alive until the store holding it goes.
  return std::make_shared<nvme_port>(shared_from_this(), shared_, engine);
}

void nvme_engine_service::shutdown() {
  caf::actor actor;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->closed)
      return;
    shared_->closed = true;
    actor = shared_->actor;
  }
  auto drained = shared_->drained.get_future();
  caf::anon_send(actor, drain_atom::value);
  drained.wait();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->actor = nullptr; // the actor's state holds the table: no cycle left
  }
  system_->stop.set_value();
  system_->thread.join();
}

nvme_engine_stats nvme_engine_service::stats() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->stats;
}

std::string nvme_engine_service::report() const {
  const nvme_engine_stats s = stats();
  std::string line = fmt::format(
      "NVMe engine actor: {} requests ({:.1f} MiB read, {:.1f} MiB written, {} failed), {} "
      "waited for credits; at most in flight:",
      s.requests, static_cast<double>(s.bytes_read) / (1 << 20),
      static_cast<double>(s.bytes_written) / (1 << 20), s.failed, s.waited);
  for (std::size_t e = 0; e < shared_->engines.size(); ++e)
    line += fmt::format(" {} of {} on {}", s.peak_in_flight[e],
                        shared_->engines[e].credits.requests, shared_->engines[e].name);
  return line;
}

} // namespace dsa::actors
