// Unit tests of the stage scheduler on event sequences, without CAF.
#include "actors/stage_scheduler.hpp"
#include "pipeline_sim.hpp"

#include <doctest/doctest.h>

#include <algorithm>

using namespace dsa::actors;
using dsa::test::deepspeed_order;
using dsa::test::render_order;
using dsa::test::sim_options;
using dsa::test::simulate_pipeline;

namespace {

// The end of the last op on any stage, in unit times.
std::uint32_t makespan(const std::vector<std::vector<dsa::test::sim_op>>& ops) {
  std::uint32_t end = 0;
  for (const auto& stage : ops)
    for (const auto& op : stage) end = std::max(end, op.end);
  return end;
}

} // namespace

TEST_CASE("scheduler: last stage of 1F1B alternates forward and backward") {
  stage_scheduler s({1, 2, 3, 1}, schedule_policy::one_f_one_b(2, 1), {});
  for (std::uint32_t mb = 0; mb < 3; ++mb) {
    REQUIRE(s.on_input(0, mb, mb % 2));
    REQUIRE(s.on_labels(0, mb, mb % 2));
  }
  std::string order;
  while (auto w = s.pick()) {
    order += std::string(work_kind_name(w->kind)).substr(0, 1) + std::to_string(w->micro_batch);
    s.on_done(*w);
    if (w->kind == work_kind::backward) REQUIRE(s.on_grad_out_released(w->out_slot));
  }
  CHECK(order == "f0b0f1b1f2b2");
  CHECK(s.finished());
}

TEST_CASE("scheduler: a forward waits for a stash slot, an output slot and the parameter version") {
  stage_scheduler s({0, 2, 4, 2}, schedule_policy::one_f_one_b(2, 0), {1, 1});
  for (std::uint32_t mb = 0; mb < 4; ++mb) REQUIRE(s.on_input(0, mb, mb));
  auto f0 = s.pick();
  REQUIRE(f0);
  CHECK(f0->kind == work_kind::forward);
  CHECK(!s.pick()); // busy
  s.on_done(*f0);
  CHECK(!s.pick()); // the only output slot is held by F0's activation
  REQUIRE(s.on_out_released(f0->out_slot));
  auto f1 = s.pick();
  REQUIRE(f1);
  CHECK(f1->micro_batch == 1);
  s.on_done(*f1);
  REQUIRE(s.on_out_released(f1->out_slot));
  CHECK(!s.pick()); // stash full: 2 micro-batches in flight
  CHECK(s.in_flight() == 2);
  REQUIRE(s.on_grad(0, 0, 0));
  auto b0 = s.pick();
  REQUIRE(b0);
  CHECK(b0->kind == work_kind::backward);
  CHECK(b0->micro_batch == 0);
  s.on_done(*b0);
  auto f2 = s.pick();
  REQUIRE(f2);
  CHECK(f2->micro_batch == 2);
  s.on_done(*f2);
  REQUIRE(s.on_out_released(f2->out_slot));
  // Finish step 0: forward of step 1 must then wait for version 1.
  REQUIRE(s.on_grad(0, 1, 0));
  auto b1 = s.pick();
  s.on_done(*b1);
  auto f3 = s.pick();
  s.on_done(*f3);
  REQUIRE(s.on_out_released(f3->out_slot));
  REQUIRE(s.on_grad(0, 2, 0));
  REQUIRE(s.on_grad(0, 3, 0));
  for (int i = 0; i < 2; ++i) {
    auto b = s.pick();
    REQUIRE(b);
    CHECK(b->last_of_step == (i == 1));
    s.on_done(*b);
  }
  REQUIRE(s.on_input(1, 0, 0));
  CHECK(!s.pick()); // version 0 held, step 1 needs version 1
  REQUIRE(s.on_version(1, 0));
  CHECK(!s.pick()); // the load zeroes the gradients: it waits until the reducer gave them back
  REQUIRE(s.on_grads_released());
  auto load = s.pick();
  REQUIRE(load);
  CHECK(load->kind == work_kind::load);
  s.on_done(*load);
  CHECK(s.held_version() == 1);
  auto f = s.pick();
  REQUIRE(f);
  CHECK(f->step == 1);
}

TEST_CASE("scheduler: backward first picks the runnable backward over a runnable forward") {
  stage_scheduler s({0, 3, 4, 1}, schedule_policy::one_f_one_b(3, 0), {});
  for (std::uint32_t mb = 0; mb < 4; ++mb) REQUIRE(s.on_input(0, mb, mb));
  auto f0 = s.pick();
  s.on_done(*f0);
  REQUIRE(s.on_grad(0, 0, 0));
  auto next = s.pick();
  REQUIRE(next);
  CHECK(next->kind == work_kind::backward);
}

TEST_CASE("scheduler: GPipe runs every forward before the first backward") {
  auto ops = simulate_pipeline({3, 5, 1, schedule_kind::gpipe, 1, 1, {}});
  for (std::uint32_t s = 0; s < 3; ++s)
    CHECK(render_order(ops[s], 0) == "F0 F1 F2 F3 F4 B0 B1 B2 B3 B4");
}

TEST_CASE("scheduler: balanced 1F1B equals DeepSpeed's TrainSchedule order") {
  for (std::uint32_t S : {1u, 2u, 3u, 4u, 5u})
    for (std::uint32_t M : {1u, 2u, 4u, 7u, 8u})
      for (std::uint32_t backward_time : {1u, 2u}) {
        sim_options opt{S, M, 3, schedule_kind::one_f_one_b, 1, backward_time, 1, 1, {}};
        auto ops = simulate_pipeline(opt);
        for (std::uint32_t s = 0; s < S; ++s)
          for (std::uint32_t step = 0; step < 3; ++step) {
            CAPTURE(S);
            CAPTURE(M);
            CAPTURE(s);
            CAPTURE(step);
            CAPTURE(backward_time);
            CHECK(render_order(ops[s], step) == deepspeed_order(S, s, M));
          }
      }
}

TEST_CASE("scheduler: DeepSpeed reference order for S=4, M=8 matches the published table") {
  CHECK(deepspeed_order(4, 0, 8) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(deepspeed_order(4, 3, 8) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  CHECK(deepspeed_order(4, 2, 8) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
}

TEST_CASE("scheduler: the stash bound S - s holds under unbalanced stages") {
  for (std::uint32_t fwd : {1u, 3u})
    for (std::uint32_t bwd : {1u, 4u}) {
      sim_options opt{4, 8, 2, schedule_kind::one_f_one_b, fwd, bwd, 1, 0, 1, {1, 1}};
      auto ops = simulate_pipeline(opt);
      for (std::uint32_t s = 0; s < 4; ++s) {
        int in_flight = 0, peak = 0;
        for (const auto& op : ops[s]) {
          in_flight += op.kind == work_kind::forward ? 1 : -1;
          peak = std::max(peak, in_flight);
        }
        CHECK(peak <= int(4 - s));
        CHECK(in_flight == 0);
      }
    }
}

TEST_CASE("scheduler: deep 1F1B (S in {5, 8}, M >= 2S) keeps DeepSpeed's order and the ideal makespan") {
  // Unit forward and backward: a step takes 2 (M + S - 1) slots on every stage,
  // of which 2M compute, so each stage idles (S - 1) / (M + S - 1) of the run.
  const std::uint32_t steps = 2;
  for (std::uint32_t S : {5u, 8u})
    for (std::uint32_t M : {2 * S, 2 * S + 3, 32u}) {
      CAPTURE(S);
      CAPTURE(M);
      for (std::uint32_t backward_time : {2u, 3u}) { // the order holds under slower backwards too
        auto slow = simulate_pipeline({S, M, steps, schedule_kind::one_f_one_b, 1, backward_time, {}});
        for (std::uint32_t s = 0; s < S; ++s) CHECK(render_order(slow[s], 1) == deepspeed_order(S, s, M));
      }
      auto ops = simulate_pipeline({S, M, steps, schedule_kind::one_f_one_b, 1, 1, {}});
      for (std::uint32_t s = 0; s < S; ++s) {
        CAPTURE(s);
        for (std::uint32_t step = 0; step < steps; ++step) {
          CAPTURE(step);
          CHECK(render_order(ops[s], step) == deepspeed_order(S, s, M));
        }
        std::uint32_t busy = 0;
        for (const auto& op : ops[s]) busy += op.end - op.start;
        CHECK(busy == 2 * M * steps);
      }
      CHECK(makespan(ops) == 2 * (M + S - 1) * steps);
      const double idle = 1.0 - double(2 * M * steps) / double(makespan(ops));
      CHECK(idle == doctest::Approx(double(S - 1) / double(M + S - 1)));
    }
}

TEST_CASE("scheduler: deep GPipe (S in {5, 8}) keeps the ideal makespan") {
  // Unit costs: M + S - 1 forward slots, then as many backward slots, per step.
  for (std::uint32_t S : {5u, 8u})
    for (std::uint32_t M : {2 * S, 32u}) {
      CAPTURE(S);
      CAPTURE(M);
      auto ops = simulate_pipeline({S, M, 2, schedule_kind::gpipe, 1, 1, {}});
      CHECK(makespan(ops) == 2 * 2 * (M + S - 1));
    }
}

// The zero-bubble pick rule (load > B > F > W, W in micro-batch order, the step's last W
// publishing) in the unit-cost simulation, the gate, for the two memory bounds of the
// zero-bubble paper (each stage holds at most max_stashed micro-batches from forward to W;
// the simulation checks that bound, the deferred-W bound and that a step publishes only
// after all its W ran):
//  - max_stashed = S, 1F1B's activation memory (its first stage's S): ZB-H1, whose makespan
//    is M (F + B + W) + (S - 1)(F + B - W);
//  - max_stashed = 2S - 1: ZB-H2, M (F + B + W) + (S - 1)(F + B - 2W);
// ZB-H2 within one W-time, ZB-H1 within two (one but at equal costs with S >= 4, where the
// greedy rule loses one unit against the paper's hand-made table), or of the floor
// M (F + B + W) + (S - 1) F (the last stage starts (S - 1) F late; one step, no update
// between steps to hide it) where the formula passes below it; always below 1F1B's with
// the whole backward B + W.
TEST_CASE("scheduler: zero-bubble reaches ZB-H1's makespan at 1F1B's memory, ZB-H2's at 2S - 1 (S in {2, 4, 8})") {
  struct times {
    std::uint32_t f, b, w;
  };
  for (const times t : {times{1, 1, 1}, times{2, 2, 1}, times{2, 1, 1}, times{1, 1, 2}})
    for (std::uint32_t S : {2u, 4u, 8u})
      for (std::uint32_t M : {2 * S, 4 * S})
        for (const bool h2 : {false, true}) {
          CAPTURE(t.f);
          CAPTURE(t.b);
          CAPTURE(t.w);
          CAPTURE(S);
          CAPTURE(M);
          CAPTURE(h2);
          sim_options opt;
          opt.stages = S;
          opt.micro_batches = M;
          opt.schedule = schedule_kind::zero_bubble;
          opt.max_stashed = h2 ? 2 * S - 1 : 0;
          opt.forward_time = t.f;
          opt.backward_time = t.b;
          opt.weight_time = t.w;
          const std::uint32_t held = h2 ? 2 * S - 1 : S;
          for (std::uint32_t s = 0; s < S; ++s) {
            const auto policy = schedule_policy::make(opt.schedule, S, s, M, opt.max_stashed);
            CHECK(policy.stash_slots <= held);
            CHECK(policy.forward_ahead == S - s);
          }
          const auto ops = simulate_pipeline(opt);
          sim_options base = opt;
          base.schedule = schedule_kind::one_f_one_b;
          base.backward_time = t.b + t.w;
          const std::uint32_t one_f_one_b = makespan(simulate_pipeline(base));
          const std::int64_t work = M * (t.f + t.b + t.w);
          CHECK(one_f_one_b == work + (S - 1) * (t.f + t.b + t.w)); // 1F1B's bubble, (S - 1)(F + B + W)
          const std::int64_t paper =
              work + static_cast<std::int64_t>(S - 1) *
                         (static_cast<std::int64_t>(t.f + t.b) - (h2 ? 2 : 1) * static_cast<std::int64_t>(t.w));
          const std::int64_t floor = work + (S - 1) * t.f;
          const std::int64_t got = makespan(ops);
          const bool equal_costs = t.f == t.b && t.b == t.w;
          CHECK(got <= std::max(paper, floor) + (h2 || !equal_costs || S < 4 ? 1 : 2) * static_cast<std::int64_t>(t.w));
          CHECK(got >= floor);
          CHECK(got < one_f_one_b);
        }
}

TEST_CASE("scheduler: zero-bubble runs each W after its B, in micro-batch order, every step") {
  for (std::uint32_t D : {1u, 2u, 4u}) {
    CAPTURE(D);
    sim_options opt;
    opt.stages = 4;
    opt.micro_batches = 8;
    opt.steps = 3;
    opt.schedule = schedule_kind::zero_bubble;
    opt.max_stashed = 2 * opt.stages; // room for D everywhere
    opt.max_deferred_w = D;
    const auto ops = simulate_pipeline(opt); // bounds and publication checked inside
    for (std::uint32_t s = 0; s < opt.stages; ++s) {
      std::vector<std::pair<std::uint32_t, std::uint32_t>> b_done, w_order;
      for (const auto& op : ops[s]) {
        if (op.kind == work_kind::backward) b_done.push_back({op.step, op.micro_batch});
        if (op.kind == work_kind::weight) {
          CHECK(std::find(b_done.begin(), b_done.end(), std::pair{op.step, op.micro_batch}) != b_done.end());
          w_order.push_back({op.step, op.micro_batch});
        }
      }
      REQUIRE(w_order.size() == opt.steps * opt.micro_batches);
      CHECK(std::is_sorted(w_order.begin(), w_order.end()));
    }
    // A smaller bound costs time, never correctness; the order of one stage's work renders.
    CHECK(render_order(ops[3], 0).rfind("F0 B0", 0) == 0);
  }
}
