// Run control: stopping cleanly after a step (stop_after), the per-step hook
// (on_step), resuming at an absolute step (first_step, optimizer_start), and
// runs without a trace. Oracles: the plain-loop reference and an uninterrupted
// run of the same layout (bit for bit).
#include "actors/trace/trace_analysis.hpp"
#include "parameter_check.hpp"
#include "synthetic_run.hpp"
#include "tests/support/compare.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include <unistd.h>

using namespace dsa::actors;
using dsa::test::synthetic_model;
using dsa::test::synthetic_pipeline;

namespace {

const synthetic_model model{4, 5, 3, 0.05};

pipeline_options shape(std::uint32_t S, std::uint32_t M, std::uint32_t steps) {
  pipeline_options o;
  o.stages = S;
  o.micro_batches = M;
  o.steps = steps;
  return o;
}

// Bit for bit; names the first differing element.
void check_identical(const std::vector<dsa::tensor>& got, const std::vector<dsa::tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(got[i].shape() == want[i].shape());
    const float* a = got[i].data<float>();
    const float* b = want[i].data<float>();
    for (std::int64_t k = 0; k < got[i].numel(); ++k)
      if (std::memcmp(&a[k], &b[k], sizeof(float)) != 0) {
        FAIL_CHECK("tensor " << i << " element " << k << ": " << a[k] << " vs " << b[k]);
        break;
      }
  }
}

std::vector<std::uint32_t> span_steps(const trace_data& trace, const char* name, std::uint32_t stage) {
  std::vector<std::uint32_t> steps;
  for (const auto& r : stage_spans(trace, name, static_cast<std::int32_t>(stage))) steps.push_back(r.step);
  return steps;
}

// Notes the threads a stage compute runs on.
class thread_noting_compute : public stage_compute {
public:
  thread_noting_compute(std::unique_ptr<stage_compute> inner, std::set<std::thread::id>& threads, std::mutex& m)
      : inner_(std::move(inner)), threads_(threads), mutex_(m) {}
  void reserve_stash(std::uint32_t slots) override { inner_->reserve_stash(slots); }
  double forward(const work_key& key, const std::vector<dsa::tensor>& in, const dsa::tensor& labels,
                 std::vector<dsa::tensor>& out) override {
    note();
    return inner_->forward(key, in, labels, out);
  }
  void backward(const work_key& key, const dsa::tensor& grad_out, dsa::tensor& grad_in) override {
    note();
    inner_->backward(key, grad_out, grad_in);
  }
  std::vector<dsa::tensor> parameters() override { return inner_->parameters(); }
  std::vector<dsa::tensor> gradients() override { return inner_->gradients(); }
  void load_parameters(const std::vector<dsa::tensor>& updated) override { inner_->load_parameters(updated); }

private:
  void note() {
    std::lock_guard<std::mutex> lock(mutex_);
    threads_.insert(std::this_thread::get_id());
  }
  std::unique_ptr<stage_compute> inner_;
  std::set<std::thread::id>& threads_;
  std::mutex& mutex_;
};

// SGD that counts init calls.
class counting_sgd : public sgd {
public:
  counting_sgd(double lr, std::uint32_t accumulation) : sgd(lr, accumulation) {}
  void init(const std::vector<dsa::tensor>& initial) override {
    ++inits;
    sgd::init(initial);
  }
  int inits = 0;
};

} // namespace

TEST_CASE("run control: stop_after(1) ends a 5-step run ok after steps 0 and 1; no update of step >= 2") {
  const auto reference = dsa::test::run_reference(model, 4, 2);
  for (std::uint32_t S : {1u, 2u, 4u})
    for (std::uint32_t M : {1u, 4u})
      // One stage with one micro-batch races fastest into step 2: repeat it.
      for (int rep = 0; rep < (S == 1 && M == 1 ? 20 : 1); ++rep) {
        CAPTURE(S);
        CAPTURE(M);
        CAPTURE(rep);
        run_options options;
        options.pipeline = shape(S, M, 5);
        std::vector<std::uint32_t> asked;
        options.stop_after = [&](std::uint32_t k) {
          asked.push_back(k);
          return k == 1;
        };
        synthetic_pipeline pipe(model, options.pipeline);
        auto result = run_pipeline(options, pipe.parts());
        CAPTURE(result.error);
        REQUIRE(result.ok);
        CHECK(!result.failure);
        CHECK(result.steps_completed == 2);
        CHECK(result.losses.size() == 2);
        CHECK(asked == std::vector<std::uint32_t>{0, 1});
        for (std::uint32_t s = 0; s < S; ++s) {
          CAPTURE(s);
          // Every shard applied exactly the updates of steps 0 and 1; every stage loaded versions 1 and 2.
          CHECK(span_steps(result.trace, "optimizer", s) == std::vector<std::uint32_t>{0, 1});
          CHECK(span_steps(result.trace, "load", s) == std::vector<std::uint32_t>{1, 2});
          // Forwards of step 2 may have started (discarded); nothing of step 3 could.
          for (auto step : span_steps(result.trace, "forward", s)) CHECK(step <= 2);
        }
        if (M == 4) {
          // Stages hold version 2 and the optimizers the state after step 1: the plain loop's 2 steps.
          dsa::test::check_parameters_close(pipe.parameters(), reference.parameters);
          dsa::test::check_parameters_close(pipe.master(), reference.parameters);
        }
      }
}

TEST_CASE("run control: on_step is called once per step, in order, with the step's mean loss, off the compute threads") {
  const std::uint32_t M = 3, steps = 5;
  synthetic_model m = model;
  const auto reference = dsa::test::run_reference(m, M, steps);
  for (std::uint32_t S : {1u, 2u}) {
    CAPTURE(S);
    run_options options;
    options.pipeline = shape(S, M, steps);
    synthetic_pipeline pipe(m, options.pipeline);
    std::set<std::thread::id> compute_threads;
    std::mutex mutex;
    for (auto& stage : pipe.stages)
      stage = std::make_unique<thread_noting_compute>(std::move(stage), compute_threads, mutex);
    std::vector<step_summary> seen;
    std::set<std::thread::id> hook_threads;
    options.on_step = [&](const step_summary& s) {
      seen.push_back(s);
      hook_threads.insert(std::this_thread::get_id());
    };
    const auto t0 = std::chrono::steady_clock::now();
    auto result = run_pipeline(options, pipe.parts());
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CAPTURE(result.error);
    REQUIRE(result.ok);
    REQUIRE(seen.size() == steps);
    REQUIRE(result.losses.size() == steps);
    double wall = 0;
    for (std::uint32_t k = 0; k < steps; ++k) {
      CAPTURE(k);
      CHECK(seen[k].step == k);
      CHECK(seen[k].loss == result.losses[k]);
      const double tol = dsa::test::layout_equivalence.abs + dsa::test::layout_equivalence.rel * reference.losses[k];
      CHECK(std::abs(seen[k].loss - reference.losses[k]) <= tol);
      CHECK(seen[k].wall_s > 0);
      wall += seen[k].wall_s;
    }
    CHECK(wall <= elapsed);
    CHECK(seen.back().loss < seen.front().loss);
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& id : hook_threads) CHECK(compute_threads.count(id) == 0);
  }
}

TEST_CASE("run control: a step hook that throws fails the run naming the coordinator and the step") {
  for (int which = 0; which < 2; ++which) {
    CAPTURE(which);
    run_options options;
    options.pipeline = shape(2, 2, 5);
    if (which == 0)
      options.on_step = [](const step_summary& s) {
        if (s.step == 2) throw std::runtime_error("metrics file full");
      };
    else
      options.stop_after = [](std::uint32_t k) -> bool {
        if (k == 2) throw std::runtime_error("metrics file full");
        return false;
      };
    synthetic_pipeline pipe(model, options.pipeline);
    auto result = run_pipeline(options, pipe.parts());
    CHECK(!result.ok);
    REQUIRE(result.failure);
    CHECK(result.failure->actor == "coordinator");
    CHECK(result.failure->step == 2);
    CHECK(result.failure->why.find("metrics file full") != std::string::npos);
    CHECK(result.steps_completed == 3);
  }
}

TEST_CASE("run control: first_step 3 from the reference's step-3 parameters runs steps 3 and 4 to the 5-step result") {
  const std::uint32_t M = 4;
  const auto at3 = dsa::test::run_reference(model, M, 3);
  const auto at5 = dsa::test::run_reference(model, M, 5);
  for (std::uint32_t S : {1u, 2u})
    for (auto start : {optimizer_start::init_from_stages, optimizer_start::already_loaded}) {
      CAPTURE(S);
      CAPTURE(static_cast<int>(start));
      run_options options;
      options.pipeline = shape(S, M, 2);
      options.first_step = 3;
      options.optimizers = start;
      synthetic_pipeline pipe(model, options.pipeline);
      std::vector<counting_sgd*> counters;
      for (auto& o : pipe.optimizers) {
        auto counting = std::make_unique<counting_sgd>(model.lr, M);
        counters.push_back(counting.get());
        o = std::move(counting);
      }
      // What a checkpoint load does before run_pipeline: working parameters, then optimizer state.
      pipe.load(at3.parameters);
      if (start == optimizer_start::already_loaded)
        for (std::uint32_t s = 0; s < S; ++s) pipe.optimizers[s]->init(pipe.stages[s]->parameters());
      std::vector<std::uint32_t> steps_seen;
      options.on_step = [&](const step_summary& s) { steps_seen.push_back(s.step); };
      auto result = run_pipeline(options, pipe.parts());
      CAPTURE(result.error);
      REQUIRE(result.ok);
      for (auto* c : counters) CHECK(c->inits == 1);
      CHECK(result.steps_completed == 2);
      CHECK(steps_seen == std::vector<std::uint32_t>{3, 4});
      REQUIRE(result.losses.size() == 2);
      for (std::uint32_t i = 0; i < 2; ++i) {
        const double want = at5.losses[3 + i];
        CHECK(std::abs(result.losses[i] - want) <=
              dsa::test::layout_equivalence.abs + dsa::test::layout_equivalence.rel * want);
      }
      for (std::uint32_t s = 0; s < S; ++s) {
        CHECK(span_steps(result.trace, "optimizer", s) == std::vector<std::uint32_t>{3, 4});
        CHECK(span_steps(result.trace, "load", s) == std::vector<std::uint32_t>{4, 5});
        for (auto step : span_steps(result.trace, "forward", s)) CHECK((step == 3 || step == 4));
      }
      dsa::test::check_parameters_close(pipe.parameters(), at5.parameters);
    }
}

TEST_CASE("run control: stop after step 1, resume at step 2 with the same objects: the uninterrupted run bit for bit") {
  const std::uint32_t S = 2, M = 4, steps = 5;
  synthetic_pipeline whole(model, shape(S, M, steps));
  auto uninterrupted = dsa::test::run_synthetic(whole, shape(S, M, steps));
  REQUIRE(uninterrupted.ok);

  synthetic_pipeline pipe(model, shape(S, M, steps));
  run_options first;
  first.pipeline = shape(S, M, steps);
  first.stop_after = [](std::uint32_t k) { return k == 1; };
  auto stopped = run_pipeline(first, pipe.parts());
  REQUIRE(stopped.ok);
  REQUIRE(stopped.steps_completed == 2);
  // Discarded work of step 2 left partial gradients: reload the parameters (as a checkpoint load would).
  pipe.load(pipe.parameters());

  run_options second;
  second.pipeline = shape(S, M, steps - stopped.steps_completed);
  second.first_step = first.first_step + stopped.steps_completed;
  second.optimizers = optimizer_start::already_loaded;
  auto resumed = run_pipeline(second, pipe.parts());
  CAPTURE(resumed.error);
  REQUIRE(resumed.ok);
  CHECK(resumed.steps_completed == 3);
  check_identical(pipe.parameters(), whole.parameters());
  check_identical(pipe.master(), whole.master());
  for (std::uint32_t i = 0; i < 2; ++i) CHECK(stopped.losses[i] == uninterrupted.losses[i]);
  for (std::uint32_t i = 0; i < 3; ++i) CHECK(resumed.losses[i] == uninterrupted.losses[2 + i]);
}

TEST_CASE("run control: trace_mode::off records nothing and writes no trace file") {
  const auto dir = std::filesystem::temp_directory_path() / ("dsactor-test-" + std::to_string(::getpid()) + "-off");
  run_options options;
  options.pipeline = shape(2, 2, 3);
  options.trace = trace_mode::off;
  options.run_dir = dir.string();
  synthetic_pipeline pipe(model, options.pipeline);
  auto result = run_pipeline(options, pipe.parts());
  REQUIRE(result.ok);
  CHECK(result.trace.records.empty());
  CHECK(result.trace_path.empty());
  CHECK(!std::filesystem::exists(dir / "trace.dsat"));
  dsa::test::check_parameters_close(pipe.parameters(), dsa::test::reference_parameters(model, 2, 3));
  std::filesystem::remove_all(dir);
}

TEST_CASE("run control: on_step alone holds the next update, so the hook sees the optimizers' state of its step") {
  // A checkpoint written from on_step must hold exactly the state after that step,
  // even though the stages go on with the next step's forward and backward.
  const std::uint32_t M = 1, steps = 6;
  std::vector<std::vector<dsa::tensor>> expected;
  for (std::uint32_t k = 1; k <= steps; ++k) expected.push_back(dsa::test::reference_parameters(model, M, k));
  for (std::uint32_t S : {1u, 2u})
    for (int rep = 0; rep < 5; ++rep) {
      CAPTURE(S);
      CAPTURE(rep);
      run_options options;
      options.pipeline = shape(S, M, steps);
      synthetic_pipeline pipe(model, options.pipeline);
      std::vector<std::vector<dsa::tensor>> seen;
      options.on_step = [&](const step_summary&) {
        // A slow hook (a checkpoint being written): the state must not move under it.
        // The sleep only gives an unheld update the time to show; it decides nothing.
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        std::vector<dsa::tensor> copy;
        for (const auto& t : pipe.master()) copy.push_back(t.clone());
        seen.push_back(std::move(copy));
      };
      auto result = run_pipeline(options, pipe.parts());
      CAPTURE(result.error);
      REQUIRE(result.ok);
      REQUIRE(seen.size() == steps);
      for (std::uint32_t k = 0; k < steps; ++k) {
        CAPTURE(k);
        dsa::test::check_parameters_close(seen[k], expected[k]);
      }
    }
}
