// Step hooks (metrics, progress, checkpoint writes) run off the CAF scheduler
// threads: while a hook blocks, the stages go on with the next step.
#include "synthetic_run.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

using namespace dsa::actors;
using dsa::test::synthetic_pipeline;

namespace {

// Tells a waiting thread when a forward of `step` has started.
class forward_signal : public stage_compute {
public:
  forward_signal(std::unique_ptr<stage_compute> inner, std::uint32_t step) : inner_(std::move(inner)), step_(step) {}
  void reserve_stash(std::uint32_t slots) override { inner_->reserve_stash(slots); }
  double forward(const work_key& key, const dsa::tensor& in, const dsa::tensor& labels, dsa::tensor& out) override {
    if (key.step == step_) {
      std::lock_guard<std::mutex> lock(mutex_);
      seen_ = true;
      cv_.notify_all();
    }
    return inner_->forward(key, in, labels, out);
  }
  void backward(const work_key& key, const dsa::tensor& grad_out, dsa::tensor& grad_in) override {
    inner_->backward(key, grad_out, grad_in);
  }
  std::vector<dsa::tensor> parameters() override { return inner_->parameters(); }
  std::vector<dsa::tensor> gradients() override { return inner_->gradients(); }
  void load_parameters(const std::vector<dsa::tensor>& updated) override { inner_->load_parameters(updated); }

  // True once the forward started; false when `limit` passed first (a bug: nothing else can start it).
  bool wait(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, limit, [&] { return seen_; });
  }

private:
  std::unique_ptr<stage_compute> inner_;
  std::uint32_t step_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool seen_ = false;
};

} // namespace

TEST_CASE("step hooks: a blocking hook does not hold the only CAF scheduler thread") {
  run_options options;
  options.pipeline.stages = 2;
  options.pipeline.micro_batches = 2;
  options.pipeline.steps = 3;
  options.scheduler_threads = 1; // a hook on a scheduler thread would stop every actor
  synthetic_pipeline pipe({4, 5, 3, 0.05}, options.pipeline);
  auto signal = std::make_unique<forward_signal>(std::move(pipe.stages[0]), 1);
  forward_signal* first = signal.get();
  pipe.stages[0] = std::move(signal);
  bool next_step_started = false;
  // The hook of step 0 waits for stage 0's forward of step 1, which needs only
  // messages between actors (version 1 is loaded before step 0 completes). The
  // limit only ends a broken run: a passing run returns as soon as it starts.
  options.on_step = [&](const step_summary& s) {
    if (s.step == 0) next_step_started = first->wait(std::chrono::seconds(120));
  };
  auto result = run_pipeline(options, pipe.parts());
  CAPTURE(result.error);
  CHECK(result.ok);
  CHECK(next_step_started);
  CHECK(result.steps_completed == 3);
}
