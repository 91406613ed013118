// Event simulation of stage schedulers; see pipeline_sim.hpp.
#include "pipeline_sim.hpp"

#include "actors/feed_state.hpp"
#include "core/error.hpp"

#include <fmt/format.h>
#include <map>
#include <optional>

namespace dsa::test {

using namespace dsa::actors;

namespace {

// The simulated actors follow the protocol; an error here is a bug in the simulation or the scheduler.
void must(const status& st) { DSA_CHECK(st.has_value(), "{}", st.has_value() ? "" : st.err().message); }

struct running {
  stage_work work;
  std::uint32_t end;
};

struct sim {
  explicit sim(const sim_options& o)
      : opt(o), feeder(feed_slots_for(o.stages), o.micro_batches, o.steps, 0), ops(o.stages), busy(o.stages) {
    for (std::uint32_t s = 0; s < o.stages; ++s)
      stages.emplace_back(stage_position{s, o.stages, o.micro_batches, o.steps},
                          schedule_policy::make(o.schedule, o.stages, s, o.micro_batches, o.max_stashed, o.max_deferred_w),
                          o.credits);
    weights_done.assign(o.stages, 0);
    feed();
  }

  // The real feeder's rule with instant fills: a slot comes back once the first
  // stage gave its input back and the last stage its labels (both after their forward).
  void feed() {
    while (auto fill = feeder.start_fill()) {
      feeder.on_filled();
      must(stages[0].on_input(fill->step, fill->micro_batch, fill->slot));
      must(stages[opt.stages - 1].on_labels(fill->step, fill->micro_batch, fill->slot));
    }
  }

  void give_back_feed(feed_edge edge, std::uint32_t slot) {
    must(feeder.on_released(edge, slot));
  }

  void complete(std::uint32_t s, const stage_work& w) {
    stages[s].on_done(w);
    const bool last = s + 1 == opt.stages;
    if (w.kind == work_kind::forward) {
      if (s == 0) give_back_feed(feed_edge::input, w.in_slot);
      if (last) give_back_feed(feed_edge::labels, w.labels_slot);
      if (s > 0) must(stages[s - 1].on_out_released(w.in_slot));
      if (!last) must(stages[s + 1].on_input(w.step, w.micro_batch, w.out_slot));
    } else if (w.kind == work_kind::backward) {
      if (!last) must(stages[s + 1].on_grad_out_released(w.in_slot));
      if (s > 0) must(stages[s - 1].on_grad(w.step, w.micro_batch, w.out_slot));
    } else if (w.kind == work_kind::weight) {
      ++weights_done[s];
    }
    if (w.kind != work_kind::forward && w.kind != work_kind::load && w.last_of_step) {
      // Publication: under a split backward every W of the step has run.
      if (opt.schedule == schedule_kind::zero_bubble)
        DSA_CHECK(weights_done[s] == (w.step + 1) * opt.micro_batches, "stage {}: step {} published after {} W",
                  s, w.step, weights_done[s]);
      must(stages[s].on_grads_released()); // an instant reducer and optimizer
      if (w.step + 1 < opt.steps) must(stages[s].on_version(w.step + 1, 0));
    }
    feed();
  }

  void run() {
    std::uint32_t now = 0;
    for (;;) {
      for (std::uint32_t s = 0; s < opt.stages; ++s)
        if (busy[s] && busy[s]->end == now) {
          auto w = busy[s]->work;
          busy[s].reset();
          complete(s, w);
        }
      bool any = false;
      for (std::uint32_t s = 0; s < opt.stages; ++s) {
        if (!busy[s]) start(s, now);
        any = any || busy[s].has_value();
      }
      if (!any) break;
      ++now;
      DSA_CHECK(now < 100000, "simulation does not finish");
    }
    for (auto& st : stages) DSA_CHECK(st.finished(), "deadlock: {}", st.describe());
  }

  void start(std::uint32_t s, std::uint32_t now) {
    auto w = stages[s].pick();
    if (!w) return;
    std::uint32_t dur = 0; // loads are instant
    if (w->kind == work_kind::forward) dur = opt.forward_time;
    if (w->kind == work_kind::backward) dur = opt.backward_time;
    if (w->kind == work_kind::weight) dur = opt.weight_time;
    const schedule_policy policy =
        schedule_policy::make(opt.schedule, opt.stages, s, opt.micro_batches, opt.max_stashed, opt.max_deferred_w);
    DSA_CHECK(stages[s].in_flight() + stages[s].deferred() <= policy.stash_slots, "stage {}: {} stashed, {} slots", s,
              stages[s].in_flight() + stages[s].deferred(), policy.stash_slots);
    DSA_CHECK(!policy.split_backward || stages[s].deferred() <= policy.max_deferred_w, "stage {}: {} W deferred", s,
              stages[s].deferred());
    if (w->kind != work_kind::load) ops[s].push_back({w->kind, w->step, w->micro_batch, now, now + dur});
    if (dur == 0) {
      complete(s, *w);
      start(s, now);
      return;
    }
    busy[s] = running{*w, now + dur};
  }

  sim_options opt;
  feed_state feeder;
  std::vector<stage_scheduler> stages;
  std::vector<std::vector<sim_op>> ops;
  std::vector<std::optional<running>> busy;
  std::vector<std::uint32_t> weights_done;
};

} // namespace

std::vector<std::vector<sim_op>> simulate_pipeline(const sim_options& opt) {
  sim s(opt);
  s.run();
  return s.ops;
}

std::string deepspeed_order(std::uint32_t stages, std::uint32_t stage, std::uint32_t micro_batches) {
  // TrainSchedule: 2(M + S - 1) ticks; forwards on ticks of the stage's parity.
  const long S = stages, s = stage, M = micro_batches;
  std::string out;
  for (long t = 0; t < 2 * (M + S - 1); ++t) {
    bool even_t = t % 2 == 0, even_s = s % 2 == 0;
    bool forward = even_t == even_s;
    long mb;
    if (forward) mb = even_t ? t / 2 - s / 2 : (t - 1) / 2 - s / 2;
    else mb = even_t ? t / 2 - S + (s + 1) / 2 : (t - 1) / 2 - S + 1 + s / 2;
    if (mb < 0 || mb >= M) continue;
    out += fmt::format("{}{}{} ", out.empty() ? "" : "", forward ? 'F' : 'B', mb);
  }
  if (!out.empty()) out.pop_back();
  return out;
}

std::string render_order(const std::vector<sim_op>& ops, std::uint32_t step) {
  std::string out;
  for (const auto& op : ops) {
    if (op.step != step) continue;
    out += fmt::format("{}{} ", op.kind == work_kind::forward ? 'F' : op.kind == work_kind::weight ? 'W' : 'B',
                       op.micro_batch);
  }
  if (!out.empty()) out.pop_back();
  return out;
}

} // namespace dsa::test
