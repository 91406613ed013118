// Test helpers: stage computes that wrap another and inject a fault.
#pragma once

#include "actors/compute.hpp"

#include <memory>
#include <stdexcept>

namespace dsa::test {

// A stage compute that passes every call to the one it wraps; tests override the
// calls they inject faults or signals into.
class delegating_stage : public actors::stage_compute {
public:
  explicit delegating_stage(std::unique_ptr<actors::stage_compute> inner) : inner_(std::move(inner)) {}
  void reserve_stash(std::uint32_t slots) override { inner_->reserve_stash(slots); }
  double forward(const actors::work_key& key, const std::vector<dsa::tensor>& in, const dsa::tensor& labels,
                 std::vector<dsa::tensor>& out) override {
    return inner_->forward(key, in, labels, out);
  }
  void backward(const actors::work_key& key, const dsa::tensor& g, dsa::tensor& gi) override { inner_->backward(key, g, gi); }
  std::vector<dsa::tensor> parameters() override { return inner_->parameters(); }
  std::vector<dsa::tensor> gradients() override { return inner_->gradients(); }
  void load_parameters(const std::vector<dsa::tensor>& u) override { inner_->load_parameters(u); }

private:
  std::unique_ptr<actors::stage_compute> inner_;
};

// Fails forward of `step` on the rank it wraps.
class throwing_stage : public delegating_stage {
public:
  throwing_stage(std::unique_ptr<actors::stage_compute> inner, std::uint32_t step)
      : delegating_stage(std::move(inner)), step_(step) {}
  double forward(const actors::work_key& key, const std::vector<dsa::tensor>& in, const dsa::tensor& labels,
                 std::vector<dsa::tensor>& out) override {
    if (key.step == step_) throw std::runtime_error("injected fault");
    return delegating_stage::forward(key, in, labels, out);
  }

private:
  std::uint32_t step_;
};

} // namespace dsa::test
