// 1-bit Adam on one rank's flat parameters; see onebit_adam.hpp.
#include "optim/onebit_adam.hpp"

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

status onebit_adam::step(float* param, const float* grad, const momentum_exchange& exchange) {
  ++step_;
  const float b1 = p_.beta1, b2 = p_.beta2, c1 = 1.0f - b1, c2 = 1.0f - b2;
  if (p_.dummy_first_step && step_ == 1) {
    // DeepSpeed's initialization step: the exchange once (warming the channel), no update.
    std::vector<float> scratch(static_cast<std::size_t>(numel_), 0.0f);
    return exchange(scratch.data(), numel_);
  }
  if (!frozen_) {
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
  for (std::int64_t i = 0; i < numel_; ++i) {
    const auto k = static_cast<std::size_t>(i);
    float update = m_[k] / (std::sqrt(v_[k]) + p_.eps);
    if (p_.weight_decay > 0) update += p_.weight_decay * param[i];
    param[i] -= p_.lr * update;
  }
  if (!frozen_ && step_ >= p_.freeze_step) frozen_ = true;
  return {};
}

} // namespace dsa::optim
