// What every runtime actor of one process shares: the plan, the slot table,
// the trace recorder. Passed to the actors when they are spawned.
#pragma once

#include "actors/data_parallel.hpp"
#include "actors/plan.hpp"
#include "actors/slot_table.hpp"
#include "actors/trace/trace_recorder.hpp"

#include <memory>

namespace dsa::actors {

struct actor_setup {
  std::shared_ptr<const pipeline_plan> plan;
  std::shared_ptr<slot_table> slots;
  trace_recorder* trace = nullptr; // may be null: no tracing
  data_parallel_options dp;        // this run's rank among the data-parallel replicas
  // The job's transport when the pipeline's stages run in several processes (the
  // plan's placement); null otherwise. A failure aborts it.
  net::transport* world = nullptr;
  // The transport a failure aborts: the job's, else the data-parallel group's (may be null).
  net::transport* job() const { return world ? world : dp.transport; }
};

} // namespace dsa::actors
