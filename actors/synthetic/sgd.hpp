// A synthetic optimizer for runtime tests: plain SGD on fp32 master copies,
// p -= lr * g / accumulation (g summed over the step's micro-batches).
#pragma once

#include "actors/compute.hpp"

namespace dsa::actors {

class sgd : public optimizer_compute {
public:
  sgd(double lr, std::uint32_t accumulation) : lr_(lr), accumulation_(accumulation) {}

  void init(const std::vector<tensor>& initial) override;
  void update(std::uint32_t step, const std::vector<tensor>& grads, std::vector<tensor>& out) override;

  const std::vector<tensor>& master() const { return master_; }

private:
  double lr_;
  std::uint32_t accumulation_;
  std::vector<tensor> master_;
};

// The same rule on one tensor (the plain-loop reference uses it too).
void sgd_apply(tensor& param, const tensor& grad, double lr, std::uint32_t accumulation);

} // namespace dsa::actors
