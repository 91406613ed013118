// No actor waits on a device: a fake device under the real runtime. Each stage of a
// synthetic pipeline runs "on a device" that it must wait for before reading a host
// tensor, as the CUDA stage does (core/device_waits.hpp's device_wait before every
// synchronize); the run's waits all happen on the compute workers, none on a CAF
// scheduler thread. And the check itself: a wait inside an actor's handler is refused.
#include "actors/runtime_threads.hpp"
#include "core/device_waits.hpp"
#include "synthetic_run.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>

using namespace dsa;
using namespace dsa::actors;

namespace {

// A stage on a fake device: its work is "enqueued" and waited for (device_wait) before
// the results are read, then the synthetic stage computes them.
class fake_device_stage final : public stage_compute {
public:
  explicit fake_device_stage(std::unique_ptr<stage_compute> inner) : inner_(std::move(inner)) {}
  void reserve_stash(std::uint32_t slots) override { inner_->reserve_stash(slots); }
  double forward(const work_key& key, const std::vector<tensor>& in, const tensor& labels,
                 std::vector<tensor>& out) override {
    device_wait("fake device: synchronize after the forward");
    ++waits;
    return inner_->forward(key, in, labels, out);
  }
  void backward(const work_key& key, const tensor& grad_out, tensor& grad_in) override {
    device_wait("fake device: synchronize after the backward");
    ++waits;
    inner_->backward(key, grad_out, grad_in);
  }
  std::vector<tensor> parameters() override { return inner_->parameters(); }
  std::vector<tensor> gradients() override {
    device_wait("fake device: synchronize before the gradients' download");
    ++waits;
    return inner_->gradients();
  }
  tensor gradient(std::size_t index) override {
    device_wait("fake device: synchronize before a gradient's download");
    ++waits;
    return inner_->gradient(index);
  }
  void load_parameters(const std::vector<tensor>& updated) override { inner_->load_parameters(updated); }
  std::atomic<int> waits{0};

private:
  std::unique_ptr<stage_compute> inner_;
};

} // namespace

TEST_CASE("a fake device's waits happen on the compute workers, never on a CAF scheduler thread") {
  test::synthetic_model model;
  pipeline_options options;
  options.stages = 2;
  options.micro_batches = 3;
  options.steps = 2;
  test::synthetic_pipeline pipeline(model, options);
  std::vector<fake_device_stage*> fakes;
  for (auto& s : pipeline.stages) {
    auto fake = std::make_unique<fake_device_stage>(std::move(s));
    fakes.push_back(fake.get());
    s = std::move(fake);
  }
  const device_wait_counts before = device_waits();
  const run_result r = test::run_synthetic(pipeline, options);
  REQUIRE_MESSAGE(r.ok, r.error);
  const device_wait_counts after = device_waits();
  int waits = 0;
  for (auto* f : fakes) waits += f->waits;
  // Every forward and backward of every micro-batch waited, and the gradients were read.
  CHECK(waits >= static_cast<int>(2 * options.stages * options.micro_batches * options.steps));
  CHECK(after.total - before.total >= waits);
  CHECK(after.on_runtime == before.on_runtime);
}

TEST_CASE("a device wait inside an actor's handler is refused and counted; off the runtime's threads it is not") {
  CHECK_FALSE(is_runtime_thread());
  const device_wait_counts before = device_waits();
  device_wait("the test's own thread"); // not a runtime thread: allowed
  caf::actor_system_config cfg;
  mark_runtime_threads(cfg);
  cfg.set("scheduler.max-threads", std::size_t{1});
  cfg.set("logger.verbosity", caf::atom("quiet"));
  caf::actor_system system{cfg};
  auto waiter = system.spawn([]() -> caf::behavior {
    return {[](int) -> std::string {
      try {
        device_wait("cudaStreamSynchronize in a handler");
        return "allowed";
      } catch (const std::logic_error& e) {
        return e.what();
      }
    }};
  });
  std::string answer;
  caf::scoped_actor self{system};
  self->request(waiter, caf::infinite, 1)
      .receive([&](const std::string& s) { answer = s; }, [&](caf::error& e) { answer = system.render(e); });
  CHECK(answer.find("cudaStreamSynchronize in a handler: a host wait on a device on an actor runtime thread") !=
        std::string::npos);
  const device_wait_counts after = device_waits();
  CHECK(after.total - before.total == 2);
  CHECK(after.on_runtime - before.on_runtime == 1);
  self->send_exit(waiter, caf::exit_reason::user_shutdown);
}
