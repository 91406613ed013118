// Every message struct of the dsactor protocol. Messages carry slot references
// and numbers, never pointers: each process resolves a slot_ref through its own
// slot_table, so the same types work inside one process and across processes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

namespace dsa::actors {

// One buffer of one edge of the plan.
struct slot_ref {
  std::uint32_t edge = 0;
  std::uint32_t slot = 0;
};

// Producer -> consumer: the slot holds readable data for (step, micro_batch).
// seq counts the produced messages on this edge from 0 (per-edge FIFO check, trace flow id).
struct produced {
  slot_ref ref;
  std::uint32_t step = 0;
  std::uint32_t micro_batch = 0;
  std::uint64_t bytes = 0;
  std::uint64_t seq = 0;
};

// Consumer -> producer: the consumer is done with the slot (a credit back).
struct released {
  slot_ref ref;
  std::uint64_t seq = 0;
};

// Stage -> coordinator when step `step` is complete on the stage: its last
// backward ran and the updated parameters (version step + 1) are loaded.
// loss: sum of micro-batch losses of the step (last stage only, 0 elsewhere).
// metrics: the element-wise sum of the step's stage_compute::forward_metrics
// (last stage only, empty elsewhere).
struct step_report {
  std::uint32_t stage = 0;
  std::uint32_t step = 0;
  double loss = 0;
  std::vector<double> metrics;
};

// Optimizer shard -> coordinator: the update of `step` is applied (or skipped)
// and its parameter version (step + 1) has been sent to the stage.
// sum_of_squares: the stage's share of the step's gradient sum of squares.
struct update_report {
  std::uint32_t stage = 0;
  std::uint32_t step = 0;
  double sum_of_squares = 0;
  bool skipped = false;
};

// Feeder -> coordinator after the last micro-batch of `step` was filled: the
// data source's position then (batch_source::position), for the step's checkpoint.
struct data_position {
  std::uint32_t step = 0;
  std::vector<std::uint64_t> position;
};

// Reducer -> every other reducer (global totals): stage `stage`'s share of the
// step's gradient sum of squares (a tied parameter counted by its owner only).
struct grad_partial {
  std::uint32_t stage = 0;
  std::uint32_t step = 0;
  double sum_of_squares = 0;
};

// Reducer -> its optimizer shard: the slot in `data` holds the step's reduced
// f32 gradients; the totals are those of grad_totals (compute.hpp).
struct reduced {
  produced data;
  double sum_of_squares = 0;
  double own_sum_of_squares = 0;
  bool global = true;
};

// Reducer -> its optimizer shard, with speculation (pipeline.speculative_update): the
// reduced slot of `step` holds final gradients; the totals follow in `reduced`. The
// shard may start an update that assumes no clipping and no overflow meanwhile.
struct reduced_early {
  std::uint32_t step = 0;
  double own_sum_of_squares = 0;
};

// Reducer -> its optimizer shard, for a shard that streams its update
// (optimizer_compute::stream_elements): the gradients of parameters [first, end) of the
// stage are final in the reduced slot of `step`. Sent as backward finishes them (first
// decreasing, the last with first 0), before the step's `reduced`.
struct reduced_part {
  std::uint32_t step = 0;
  std::uint32_t first = 0;
};

// Worker thread -> its own actor: a unit of work finished. kind and value depend
// on the actor: a stage's work_kind and the micro-batch loss of a last-stage
// forward; a reducer's job (gather, tied sum, tied copy) and the sum of squares it
// took; a shard's update (1 applied, 0 skipped) and its stage's share of the norm.
// metrics: a stage forward's stage_compute::forward_metrics.
// position: after a feeder's fill of a step's last micro-batch, batch_source::position.
struct work_done {
  std::uint32_t kind = 0;
  std::uint32_t step = 0;
  std::uint32_t micro_batch = 0;
  double value = 0;
  std::vector<double> metrics;
  std::vector<std::uint64_t> position;
};

// Worker thread -> its own actor: a unit of work threw; the actor then fails.
struct work_failed {
  std::uint32_t step = 0;
  std::string what;
};

// A stage's worker -> its stage actor, during or right after the step's last
// backward: gradient bucket `bucket` of `step` is in its slot of the grads edge;
// the actor sends `produced` for it to the reducer. Arrives before that
// backward's work_done (one sender, one mailbox).
struct grads_ready {
  std::uint32_t step = 0;
  std::uint32_t bucket = 0;
};

// A client of the NVMe engine actor -> the actor: request `id` waits to start on engine
// `engine` (the request itself, buffer and continuation, stays in the engine's request
// table in this process: like a slot, it is referenced, never sent). priority: an
// aio::io_priority; bytes: what it moves (its credits).
struct nvme_request {
  std::uint64_t id = 0;
  std::uint32_t engine = 0;
  std::uint8_t priority = 0;
  std::uint64_t bytes = 0;
};

// An aio engine thread -> the NVMe engine actor: request `id` ended (its completion waits
// in the request table).
struct nvme_ended {
  std::uint64_t id = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, slot_ref& x) {
  return f(caf::meta::type_name("slot_ref"), x.edge, x.slot);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, produced& x) {
  return f(caf::meta::type_name("produced"), x.ref, x.step, x.micro_batch, x.bytes, x.seq);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, released& x) {
  return f(caf::meta::type_name("released"), x.ref, x.seq);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_report& x) {
  return f(caf::meta::type_name("step_report"), x.stage, x.step, x.loss, x.metrics);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, update_report& x) {
  return f(caf::meta::type_name("update_report"), x.stage, x.step, x.sum_of_squares, x.skipped);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, grad_partial& x) {
  return f(caf::meta::type_name("grad_partial"), x.stage, x.step, x.sum_of_squares);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reduced& x) {
  return f(caf::meta::type_name("reduced"), x.data, x.sum_of_squares, x.own_sum_of_squares, x.global);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reduced_early& x) {
  return f(caf::meta::type_name("reduced_early"), x.step, x.own_sum_of_squares);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reduced_part& x) {
  return f(caf::meta::type_name("reduced_part"), x.step, x.first);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, work_done& x) {
  return f(caf::meta::type_name("work_done"), x.kind, x.step, x.micro_batch, x.value, x.metrics, x.position);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, data_position& x) {
  return f(caf::meta::type_name("data_position"), x.step, x.position);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, grads_ready& x) {
  return f(caf::meta::type_name("grads_ready"), x.step, x.bucket);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, work_failed& x) {
  return f(caf::meta::type_name("work_failed"), x.step, x.what);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, nvme_request& x) {
  return f(caf::meta::type_name("nvme_request"), x.id, x.engine, x.priority, x.bytes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, nvme_ended& x) {
  return f(caf::meta::type_name("nvme_ended"), x.id);
}

} // namespace dsa::actors
