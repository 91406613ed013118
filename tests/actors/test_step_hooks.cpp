// Step hooks (metrics, progress, checkpoint writes) run off the CAF scheduler
// threads: while a hook blocks, the actors go on handling messages.
#include "synthetic_run.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include <chrono>
#include <future>

using namespace dsa::actors;
using dsa::test::synthetic_pipeline;

TEST_CASE("step hooks: a blocking hook does not hold the only CAF scheduler thread") {
  run_options options;
  options.pipeline.stages = 2;
  options.pipeline.micro_batches = 2;
  options.pipeline.steps = 3;
  options.scheduler_threads = 1; // a hook on a scheduler thread would stop every actor
  synthetic_pipeline pipe({4, 5, 3, 0.05}, options.pipeline);
  // A probe actor in the run's actor system: it answers a message only if a
  // scheduler thread is free to run it.
  std::promise<void> answered;
  caf::actor probe;
  options.on_spawned = [&](const run_actors& a) {
    probe = a.coordinator.home_system().spawn([&](caf::event_based_actor*) -> caf::behavior {
      return {[&](int) { answered.set_value(); }};
    });
  };
  bool probe_ran = false;
  // The hook of step 0 asks the probe and waits. The limit only ends a broken
  // run: a passing run goes on as soon as the probe ran.
  options.on_step = [&](const step_summary& s) {
    if (s.step != 0) return;
    caf::anon_send(probe, 1);
    probe_ran = answered.get_future().wait_for(std::chrono::seconds(60)) == std::future_status::ready;
    caf::anon_send_exit(probe, caf::exit_reason::user_shutdown);
  };
  auto result = run_pipeline(options, pipe.parts());
  CAPTURE(result.error);
  CHECK(result.ok);
  CHECK(probe_ran);
  CHECK(result.steps_completed == 3);
}
