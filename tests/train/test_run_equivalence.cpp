// Parallel layouts: 2 and 4 pipeline stages give the parameters of 1 stage.
#include "tests/support/compare.hpp"
#include "tests/train/train_fixture.hpp"
#include "actors/trace/analysis/trace_summary.hpp"
#include "actors/schedule_policy.hpp"
#include "actors/trace/trace_analysis.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstring>

using namespace dsa;

namespace {

ckpt::named_tensors final_model(const std::string& root, std::uint32_t stages, const std::string& schedule,
                                const std::vector<std::string>& overrides = {}) {
  test::temp_dir dir;
  std::string cfg = test::tiny_config(dir.path(), fmt::format("\n[pipeline]\nstages = {}\nschedule = \"{}\"\n", stages, schedule));
  REQUIRE(test::run_config(dir.path(), "equiv", cfg, overrides) == 0);
  auto ck = test::load_run_checkpoint(dir.path() + "/ckpt", "latest");
  CHECK(ck.manifest.step == 5);
  (void)root;
  return ck.groups.at("model");
}

} // namespace

// Dropout is off. The stages run the same kernels on the same rows, so the only
// differences are summation orders: the tied word-embedding gradient (one buffer
// accumulating decoder and lookup contributions per micro-batch on one stage,
// two per-stage sums added on several) and the global norm (per-stage partial
// sums). Both are last-bit effects; tolerances.hpp: layout_equivalence.
TEST_CASE("2 and 4 pipeline stages equal 1 stage after 5 steps with gradient accumulation 4") {
  auto one = final_model("", 1, "1f1b");
  for (std::uint32_t stages : {2u, 4u}) {
    auto many = final_model("", stages, "1f1b");
    REQUIRE(many.size() == one.size());
    for (const auto& [name, t] : one) {
      INFO("stages " << stages << " tensor " << name);
      REQUIRE(many.count(name) == 1);
      DSA_CHECK_CLOSE(many.at(name).data<float>(), t.data<float>(), t.numel(), test::layout_equivalence);
    }
  }
}

// The zero-bubble schedule splits each backward into B and W and runs W later, in
// micro-batch order: the same sums in the same order as 1F1B, so the same bits, with
// dropout on, fp16 loss scaling and two data-parallel ranks too; every stage count and bound.
TEST_CASE("the zero-bubble schedule (pipeline.schedule = \"zb\") trains bit for bit as 1F1B") {
  const std::vector<std::vector<std::string>> variants{
      {},
      {"model.hidden_dropout=0.1", "model.attention_dropout=0.1", "fp16.enabled=true",
       "fp16.initial_scale_power=8", "devices.ranks=2"},
      // The speculative update at the step boundary (clipping that rolls it back, and fp16).
      {"pipeline.speculative_update=true", "gradient_clipping=0.05", "fp16.enabled=true",
       "fp16.initial_scale_power=8"}};
  for (const auto& v : variants)
    for (std::uint32_t stages : {2u, 4u}) {
      CAPTURE(stages);
      CAPTURE(v.size());
      auto a = final_model("", stages, "1f1b", v);
      const std::string zb_h2 = fmt::format("pipeline.max_stashed={}", 2 * stages - 1);
      for (const std::string& bound : {std::string("pipeline.max_deferred_w=1"), std::string("pipeline.max_deferred_w=0"), zb_h2}) {
        std::vector<std::string> o = v;
        o.push_back(bound);
        auto b = final_model("", stages, "zb", o);
        REQUIRE(b.size() == a.size());
        for (const auto& [name, t] : a) {
          INFO(bound << " " << name);
          CHECK(std::memcmp(b.at(name).raw_data(), t.raw_data(), static_cast<std::size_t>(t.numel()) * 4) == 0);
        }
      }
    }
}

TEST_CASE("the GPipe schedule gives the same parameters as 1F1B") {
  auto a = final_model("", 2, "1f1b");
  auto b = final_model("", 2, "gpipe");
  for (const auto& [name, t] : a) {
    INFO(name);
    DSA_CHECK_CLOSE(b.at(name).data<float>(), t.data<float>(), t.numel(), test::layout_equivalence);
  }
}

// Without clipping and loss scaling each shard updates as soon as its stage's
// gradients are reduced (grad_scope::per_stage); only the reducers of the tied
// embedding's holders exchange it. The result must still equal one stage's.
TEST_CASE("stages updating independently (no clipping) equal 1 stage, with a warm-up schedule") {
  std::vector<std::string> local{"gradient_clipping=0", "scheduler.type=\"WarmupLR\"",
                                 "scheduler.params.warmup_num_steps=3"};
  auto one = final_model("", 1, "1f1b", local);
  for (std::uint32_t stages : {2u, 4u}) {
    auto many = final_model("", stages, "1f1b", local);
    for (const auto& [name, t] : one) {
      INFO("stages " << stages << " tensor " << name);
      DSA_CHECK_CLOSE(many.at(name).data<float>(), t.data<float>(), t.numel(), test::layout_equivalence);
    }
  }
}

// A real zero-bubble run's trace: every micro-batch's W is a `weight` span of its own, after
// its B; a step's W run before the stage's reducer starts on that step's gradients (the
// last W publishes them); and a stage never holds more micro-batches whose B ran and W did
// not than its policy's deferred bound, nor more from forward to W than its stash.
TEST_CASE("zero-bubble runs keep their invariants in the trace: W after B, before publication, within the bound") {
  struct bounds {
    std::uint32_t stashed, deferred;
  };
  for (const bounds bd : {bounds{0, 1}, bounds{0, 0}, bounds{3, 0}}) {
    CAPTURE(bd.stashed);
    CAPTURE(bd.deferred);
    test::temp_dir dir;
    std::string cfg = test::tiny_config(dir.path(), fmt::format("\n[pipeline]\nstages = 2\nschedule = \"zb\"\n"
                                                                "max_stashed = {}\nmax_deferred_w = {}\n",
                                                                bd.stashed, bd.deferred));
    REQUIRE(test::run_config(dir.path(), "zb", cfg, {}) == 0);
    auto traces = actors::load_run_traces(dir.path() + "/run");
    REQUIRE(traces.has_value());
    const auto& t = traces->front().trace;
    const auto M = std::stoul(t.info_value("micro_batches"));
    const auto steps = 5u;
    for (std::int32_t s = 0; s < 2; ++s) {
      CAPTURE(s);
      const auto policy = actors::schedule_policy::zero_bubble(2, static_cast<std::uint32_t>(s), bd.stashed, bd.deferred);
      const auto F = actors::stage_spans(t, "forward", s);
      const auto B = actors::stage_spans(t, "backward", s), W = actors::stage_spans(t, "weight", s);
      REQUIRE(W.size() == M * steps);
      REQUIRE(B.size() == W.size());
      // Publication: the step's last W publishes the gradients at its end (inside its span),
      // so every other W of the step has ended, and the last one started, before the
      // reducer's first span of the step.
      for (std::uint32_t k = 0; k < steps; ++k) {
        std::uint64_t first_reduce = ~0ull;
        for (const auto& r : actors::stage_spans(t, "reduce", s))
          if (r.step == k) first_reduce = std::min(first_reduce, r.t0_ns);
        for (const auto& w : W)
          if (w.step == k) CHECK((w.micro_batch + 1 == M ? w.t0_ns : w.t1_ns) <= first_reduce);
      }
      // Each W after its B; the deferred count at every B's end within the bound.
      for (const auto& w : W) {
        bool after_b = false;
        for (const auto& b : B)
          if (b.step == w.step && b.micro_batch == w.micro_batch) after_b = b.t1_ns <= w.t0_ns;
        CHECK(after_b);
      }
      for (const auto& b : B) {
        std::size_t b_done = 0, w_done = 0;
        for (const auto& x : B) b_done += x.t1_ns <= b.t1_ns ? 1 : 0;
        for (const auto& x : W) w_done += x.t1_ns <= b.t1_ns ? 1 : 0;
        CHECK(b_done - w_done <= policy.max_deferred_w);
      }
      // Held from forward to W, counted as each forward starts (itself included).
      for (const auto& f : F) {
        std::size_t f_started = 0, w_done = 0;
        for (const auto& x : F) f_started += x.t0_ns <= f.t0_ns ? 1 : 0;
        for (const auto& x : W) w_done += x.t1_ns <= f.t0_ns ? 1 : 0;
        CHECK(f_started - w_done <= policy.stash_slots);
      }
    }
  }
}
