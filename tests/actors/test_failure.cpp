// Faults: a compute that throws makes the run end with an error naming the
// actor and the step, and every actor stops (the run returns; nothing hangs).
#include "synthetic_run.hpp"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace dsa::actors;
using dsa::test::synthetic_pipeline;

namespace {

enum class fault { forward_throws, bad_gradients };

// Wraps a stage compute; in step `fail_step` its forward throws, or it hands
// out gradients of the wrong shape.
class failing_compute : public stage_compute {
public:
  failing_compute(std::unique_ptr<stage_compute> inner, std::uint32_t fail_step, fault kind = fault::forward_throws)
      : inner_(std::move(inner)), fail_step_(fail_step), kind_(kind) {}
  void reserve_stash(std::uint32_t slots) override { inner_->reserve_stash(slots); }
  double forward(const work_key& key, const std::vector<dsa::tensor>& in, const dsa::tensor& labels,
                 std::vector<dsa::tensor>& out) override {
    if (kind_ == fault::forward_throws && key.step == fail_step_) throw std::runtime_error("injected fault");
    return inner_->forward(key, in, labels, out);
  }
  void backward(const work_key& key, const dsa::tensor& grad_out, dsa::tensor& grad_in) override {
    last_backward_ = key.step;
    inner_->backward(key, grad_out, grad_in);
  }
  std::vector<dsa::tensor> parameters() override { return inner_->parameters(); }
  std::vector<dsa::tensor> gradients() override {
    auto g = inner_->gradients();
    if (kind_ == fault::bad_gradients && last_backward_ == fail_step_) g[0] = dsa::tensor::zeros({3}, dsa::dtype::f32);
    return g;
  }
  void load_parameters(const std::vector<dsa::tensor>& updated) override { inner_->load_parameters(updated); }

private:
  std::unique_ptr<stage_compute> inner_;
  std::uint32_t fail_step_;
  fault kind_;
  std::uint32_t last_backward_ = ~0u;
};

// Throws in update of `fail_step`.
class failing_optimizer : public sgd {
public:
  failing_optimizer(std::uint32_t accumulation, std::uint32_t fail_step) : sgd(0.05, accumulation), fail_(fail_step) {}
  bool update(std::uint32_t step, const grad_totals& totals, std::vector<dsa::tensor>& out) override {
    if (step == fail_) throw std::runtime_error("optimizer fault");
    return sgd::update(step, totals, out);
  }

private:
  std::uint32_t fail_;
};

} // namespace

TEST_CASE("failure: a stage compute throwing in step 2 on stage 1 ends the run naming both") {
  for (std::uint32_t S : {2u, 4u})
    for (std::uint32_t M : {1u, 4u}) {
      CAPTURE(S);
      CAPTURE(M);
      pipeline_options options;
      options.stages = S;
      options.micro_batches = M;
      options.steps = 5;
      synthetic_pipeline pipe({4, 5, 3, 0.05}, options);
      pipe.stages[1] = std::make_unique<failing_compute>(std::move(pipe.stages[1]), 2);
      auto result = dsa::test::run_synthetic(pipe, options);
      CHECK(!result.ok);
      REQUIRE(result.failure);
      CHECK(result.failure->actor == "stage 1");
      CHECK(result.failure->step == 2);
      CHECK(result.failure->why.find("injected fault") != std::string::npos);
      CHECK(result.error.find("stage 1 failed in step 2") != std::string::npos);
      MESSAGE(result.error);
    }
}

TEST_CASE("failure: an optimizer update throwing ends the run naming the shard") {
  pipeline_options options;
  options.stages = 2;
  options.micro_batches = 4;
  options.steps = 4;
  synthetic_pipeline pipe({4, 5, 3, 0.05}, options);
  pipe.optimizers[0] = std::make_unique<failing_optimizer>(4, 1);
  auto result = dsa::test::run_synthetic(pipe, options);
  CHECK(!result.ok);
  REQUIRE(result.failure);
  CHECK(result.failure->actor == "optimizer 0");
  CHECK(result.failure->step == 1);
}

TEST_CASE("failure: gradients that do not fit the optimizer's buffers end the run naming the reducer") {
  for (std::uint32_t S : {1u, 2u}) {
    CAPTURE(S);
    pipeline_options options;
    options.stages = S;
    options.micro_batches = 2;
    options.steps = 4;
    synthetic_pipeline pipe({4, 5, 3, 0.05}, options);
    pipe.stages[S - 1] = std::make_unique<failing_compute>(std::move(pipe.stages[S - 1]), 2, fault::bad_gradients);
    auto result = dsa::test::run_synthetic(pipe, options);
    CHECK(!result.ok);
    REQUIRE(result.failure);
    CHECK(result.failure->actor == "reducer " + std::to_string(S - 1));
    CHECK(result.failure->step == 2);
    CHECK(result.failure->why.find("does not fit the optimizer's buffer") != std::string::npos);
    CHECK(result.steps_completed <= 2); // never past the broken step
  }
}
