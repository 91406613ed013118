// 1-bit Adam on one rank's flat parameters; see onebit_adam.hpp.
#include "optim/onebit_adam.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace dsa::optim {

onebit_adam::onebit_adam(onebit_adam_params params, std::int64_t numel)
    : p_(params), numel_(numel), m_(static_cast<std::size_t>(numel), 0.0f), v_(static_cast<std::size_t>(numel), 0.0f) {
  DSA_CHECK(numel >= 0, "onebit_adam: {} elements", numel);
}

status onebit_adam::set_mask(std::vector<float> mask) {
  if (!mask.empty() && static_cast<std::int64_t>(mask.size()) != numel_)
    return make_error(errc::invalid_argument, "1-bit Adam: exp_avg_mask has {} elements, the parameters {}",
                      mask.size(), numel_);
  mask_ = std::move(mask);
  return {};
}

compressed_state onebit_adam::save() const { return moments_state(step_, m_, v_); }

status onebit_adam::load(const compressed_state& state) {
  DSA_TRY(check_moments(state, numel_, "1-bit Adam"));
  m_ = state.exp_avg;
  v_ = state.exp_avg_sq;
  step_ = state.step;
  frozen_ = step_ >= p_.freeze_step;
  var_steps_ = std::min(step_, p_.freeze_step);
  return {};
}

status onebit_adam::step(float* param, const float* grad, const momentum_exchange& exchange) {
  ++step_;
  const float b1 = p_.beta1, b2 = p_.beta2, c1 = 1.0f - b1, c2 = 1.0f - b2;
  if (p_.dummy_first_step && step_ == 1) {
    // DeepSpeed's initialization step: the exchange once (warming the channel), no update.
    std::vector<float> scratch(static_cast<std::size_t>(numel_), 0.0f);
    return exchange(scratch.data(), numel_);
  }
  if (!frozen_) {
    ++var_steps_;
    for (std::int64_t i = 0; i < numel_; ++i) {
      const float g = grad[i];
      m_[static_cast<std::size_t>(i)] = b1 * m_[static_cast<std::size_t>(i)] + c1 * g;
      v_[static_cast<std::size_t>(i)] = b2 * v_[static_cast<std::size_t>(i)] + c2 * g * g;
    }
  } else {
    for (std::int64_t i = 0; i < numel_; ++i)
      m_[static_cast<std::size_t>(i)] = b1 * m_[static_cast<std::size_t>(i)] + c1 * grad[i];
    DSA_TRY(exchange(m_.data(), numel_));
    if (!mask_.empty())
      for (std::int64_t i = 0; i < numel_; ++i) m_[static_cast<std::size_t>(i)] *= mask_[static_cast<std::size_t>(i)];
  }
  const float a1 = p_.bias_correction ? static_cast<float>(1.0 / (1.0 - std::pow(double{b1}, double(step_)))) : 1.0f;
  const float a2 = p_.bias_correction && var_steps_ > 0
                       ? static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{b2}, double(var_steps_))))
                       : 1.0f;
  for (std::int64_t i = 0; i < numel_; ++i) {
    const auto k = static_cast<std::size_t>(i);
    float update = a1 * m_[k] / (std::sqrt(v_[k]) * a2 + p_.eps);
    if (p_.weight_decay > 0) update += p_.weight_decay * param[i];
    param[i] -= p_.lr * update;
  }
  if (!frozen_ && step_ >= p_.freeze_step) frozen_ = true;
  return {};
}

} // namespace dsa::optim
