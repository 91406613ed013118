// Step hooks (metrics, progress, checkpoint writes) run off the CAF scheduler
// threads: while a hook blocks, the actors go on handling messages.
#include "synthetic_run.hpp"

#include "actors/run_actors.hpp"

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

namespace {

// Reports (1, micro-batch, step) as the forward metrics of every micro-batch.
class metric_compute : public stage_compute {
public:
  explicit metric_compute(std::unique_ptr<stage_compute> inner) : inner_(std::move(inner)) {}
  void reserve_stash(std::uint32_t slots) override { inner_->reserve_stash(slots); }
  double forward(const work_key& key, const std::vector<dsa::tensor>& in, const dsa::tensor& labels,
                 std::vector<dsa::tensor>& out) override {
    last_ = {1.0, static_cast<double>(key.micro_batch), static_cast<double>(key.step)};
    return inner_->forward(key, in, labels, out);
  }
  std::vector<double> forward_metrics() override { return last_; }
  void backward(const work_key& key, const dsa::tensor& grad_out, dsa::tensor& grad_in) override {
    inner_->backward(key, grad_out, grad_in);
  }
  std::vector<dsa::tensor> parameters() override { return inner_->parameters(); }
  std::vector<dsa::tensor> gradients() override { return inner_->gradients(); }
  void load_parameters(const std::vector<dsa::tensor>& updated) override { inner_->load_parameters(updated); }

private:
  std::unique_ptr<stage_compute> inner_;
  std::vector<double> last_;
};

} // namespace

TEST_CASE("step hooks: the last stage's forward metrics arrive summed per step, by message") {
  for (std::uint32_t S : {1u, 4u}) {
    CAPTURE(S);
    run_options options;
    options.pipeline.stages = S;
    options.pipeline.micro_batches = 4;
    options.pipeline.steps = 3;
    synthetic_pipeline pipe({4, 5, 3, 0.05}, options.pipeline);
    // Every stage reports metrics; only the last stage's are the step's.
    for (auto& stage : pipe.stages) stage = std::make_unique<metric_compute>(std::move(stage));
    std::vector<std::vector<double>> seen;
    options.on_step = [&](const step_summary& s) { seen.push_back(s.metrics); };
    auto result = run_pipeline(options, pipe.parts());
    CAPTURE(result.error);
    REQUIRE(result.ok);
    REQUIRE(seen.size() == 3);
    for (std::uint32_t k = 0; k < 3; ++k) {
      CAPTURE(k);
      // 4 micro-batches: count 4, micro-batch numbers 0+1+2+3, the step four times.
      CHECK(seen[k] == std::vector<double>{4.0, 6.0, 4.0 * k});
    }
  }
}

namespace {

// Counts fills; its position is the number of micro-batches filled so far.
class counting_source : public batch_source {
public:
  explicit counting_source(batch_source& inner) : inner_(inner) {}
  void fill(std::uint32_t step, std::uint32_t micro_batch, dsa::tensor& input, dsa::tensor& labels) override {
    inner_.fill(step, micro_batch, input, labels);
    ++filled_;
  }
  std::vector<std::uint64_t> position() const override { return {filled_, 7}; }

private:
  batch_source& inner_;
  std::uint64_t filled_ = 0;
};

} // namespace

TEST_CASE("step hooks: the data position after each step comes from the feeder by message") {
  run_options options;
  options.pipeline.stages = 2;
  options.pipeline.micro_batches = 3;
  options.pipeline.steps = 4;
  synthetic_pipeline pipe({4, 5, 3, 0.05}, options.pipeline);
  counting_source source(*pipe.source);
  auto parts = pipe.parts();
  parts.source = &source;
  std::vector<std::vector<std::uint64_t>> seen;
  options.on_step = [&](const step_summary& s) { seen.push_back(s.data_position); };
  auto result = run_pipeline(options, parts);
  CAPTURE(result.error);
  REQUIRE(result.ok);
  REQUIRE(seen.size() == 4);
  for (std::uint64_t k = 0; k < 4; ++k) {
    CAPTURE(k);
    // Taken right after the step's last fill: the feeder fills ahead, but not into the position.
    const std::vector<std::uint64_t> want{3 * (k + 1), 7};
    CHECK(seen[k] == want);
  }
  CHECK(result.last_data_position == seen.back()); // what a final checkpoint saves
}
