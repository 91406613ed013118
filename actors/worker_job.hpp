// Posting a job to an actor's compute_worker and reporting back by message.
#pragma once

#include "actors/compute_worker.hpp"
#include "actors/protocol/messages.hpp"

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <exception>
#include <functional>

namespace dsa::actors {

// Runs `job` (returning work_done) on `worker`. The actor is held weakly: if it
// is gone by the time the job ends, the result is dropped. An exception becomes
// work_failed{step, what}.
inline void post_job(caf::event_based_actor* self, compute_worker& worker, std::uint32_t step,
                     std::function<work_done()> job) {
  caf::weak_actor_ptr weak{self->ctrl()};
  worker.post([weak, step, job = std::move(job)] {
    work_done done;
    work_failed failed{step, {}};
    bool ok = true;
    try {
      done = job();
    } catch (const std::exception& e) {
      ok = false;
      failed.what = e.what();
    } catch (...) {
      ok = false;
      failed.what = "unknown exception";
    }
    if (auto strong = weak.lock()) {
      auto hdl = caf::actor_cast<caf::actor>(strong);
      if (ok) caf::anon_send(hdl, done);
      else caf::anon_send(hdl, failed);
    }
  });
}

} // namespace dsa::actors
