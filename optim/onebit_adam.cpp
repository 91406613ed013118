// 1-bit Adam on one rank's flat parameters; see onebit_adam.hpp.
#include "optim/onebit_adam.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace dsa::optim {
namespace onebit_math {

void warm_moments(float* m, float* v, const float* g, std::int64_t n, float beta1, float beta2) {
  const float c1 = 1.0f - beta1, c2 = 1.0f - beta2;
  for (std::int64_t i = 0; i < n; ++i) {
    m[i] = beta1 * m[i] + c1 * g[i];
    v[i] = beta2 * v[i] + c2 * g[i] * g[i];
  }
}

void local_momentum(float* m, const float* g, std::int64_t n, float beta1) {
  const float c1 = 1.0f - beta1;
  for (std::int64_t i = 0; i < n; ++i) m[i] = beta1 * m[i] + c1 * g[i];
}

void apply_mask(float* m, const float* mask, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) m[i] *= mask[i];
}

std::pair<float, float> corrections(const onebit_adam_params& p, std::int64_t step, std::int64_t var_steps) {
  if (p.dummy_first_step && step > 0) --step; // the initialization step moved no momentum
  const float a1 = p.bias_correction ? static_cast<float>(1.0 / (1.0 - std::pow(double{p.beta1}, double(step)))) : 1.0f;
  const float a2 = p.bias_correction && var_steps > 0
                       ? static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{p.beta2}, double(var_steps))))
                       : 1.0f;
  return {a1, a2};
}

void update(float* param, const float* m, const float* v, std::int64_t n, const onebit_adam_params& p,
            float weight_decay, std::pair<float, float> corrections) {
  const auto [a1, a2] = corrections;
  for (std::int64_t i = 0; i < n; ++i) {
    float u = a1 * m[i] / (std::sqrt(v[i]) * a2 + p.eps);
    if (weight_decay > 0) u += weight_decay * param[i];
    param[i] -= p.lr * u;
  }
}

std::int64_t variance_steps(const onebit_adam_params& p, std::int64_t step) {
  const std::int64_t warm = std::min(step, first_local_step(p.freeze_step, p.dummy_first_step));
  return std::max<std::int64_t>(0, p.dummy_first_step && step > 0 ? warm - 1 : warm);
}

} // namespace onebit_math

onebit_adam::onebit_adam(onebit_adam_params params, std::int64_t numel)
    : compressed_optimizer(params, numel, "1-bit Adam") {
  DSA_CHECK(numel >= 0, "onebit_adam: {} elements", numel);
}

compressed_state onebit_adam::save() const { return save_moments(); }

status onebit_adam::load(const compressed_state& state) {
  DSA_TRY(check_state(state));
  take_moments(state);
  frozen_ = step_ >= onebit_math::first_local_step(p_.freeze_step, p_.dummy_first_step);
  var_steps_ = onebit_math::variance_steps(p_, step_);
  return {};
}

status onebit_adam::step(float* param, const float* grad, const momentum_exchange& exchange) {
  if (count_step()) {
    // DeepSpeed's initialization step: the exchange once (warming the channel), no update.
    std::vector<float> scratch(static_cast<std::size_t>(numel_), 0.0f);
    return exchange(scratch.data(), numel_);
  }
  if (!frozen_) {
    ++var_steps_;
    onebit_math::warm_moments(m_.data(), v_.data(), grad, numel_, p_.beta1, p_.beta2);
  } else {
    onebit_math::local_momentum(m_.data(), grad, numel_, p_.beta1);
    DSA_TRY(exchange(m_.data(), numel_));
    if (!mask_.empty()) onebit_math::apply_mask(m_.data(), mask_.data(), numel_);
  }
  onebit_math::update(param, m_.data(), v_.data(), numel_, p_, p_.weight_decay,
                      onebit_math::corrections(p_, step_, var_steps_));
  if (!frozen_ && step_ >= onebit_math::first_local_step(p_.freeze_step, p_.dummy_first_step)) frozen_ = true;
  return {};
}

} // namespace dsa::optim
