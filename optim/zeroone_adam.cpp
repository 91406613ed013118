// 0/1 Adam on one rank's flat parameters; see zeroone_adam.hpp.
#include "optim/zeroone_adam.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace dsa::optim {

zeroone_adam::zeroone_adam(zeroone_adam_params params, std::int64_t numel)
    : p_(params), numel_(numel), m_(static_cast<std::size_t>(numel), 0.0f), v_(m_), u_(m_) {
  DSA_CHECK(numel >= 0 && params.var_update_scaler > 0 && params.local_step_scaler > 0 &&
                params.local_step_clipper > 0,
            "zeroone_adam: {} elements, var_update_scaler {}, local_step_scaler {}, local_step_clipper {}", numel,
            params.var_update_scaler, params.local_step_scaler, params.local_step_clipper);
}

status zeroone_adam::set_mask(std::vector<float> mask) {
  if (!mask.empty() && static_cast<std::int64_t>(mask.size()) != numel_)
    return make_error(errc::invalid_argument, "0/1 Adam: exp_avg_mask has {} elements, the parameters {}",
                      mask.size(), numel_);
  mask_ = std::move(mask);
  return {};
}

compressed_state zeroone_adam::save() const { return moments_state(step_, m_, v_); }

status zeroone_adam::load(const compressed_state& state) {
  DSA_TRY(check_moments(state, numel_, "0/1 Adam"));
  m_ = state.exp_avg;
  v_ = state.exp_avg_sq;
  step_ = state.step;
  var_interval_ = 1, var_counter_ = 0, var_updates_ = 0, local_interval_ = 1, local_counter_ = 0;
  for (std::int64_t k = 1; k <= step_; ++k) { // the schedule, as step() advances it
    if (k <= p_.var_freeze_step) {
      if (k % var_interval_ == 0) ++var_updates_;
      if (k % var_interval_ == 0 && ++var_counter_ == p_.var_update_scaler) {
        var_counter_ = 0;
        var_interval_ *= 2;
      }
    } else if (++local_counter_ == p_.local_step_scaler) {
      local_counter_ = 0;
      local_interval_ = std::min(p_.local_step_clipper, 2 * local_interval_);
    }
  }
  std::fill(u_.begin(), u_.end(), 0.0f);
  anchor_.clear();
  lrs_ = 0;
  errors_reset_ = step_ > p_.var_freeze_step; // the caller's error buffers start at zero
  return {};
}

float zeroone_adam::correction1() const {
  return p_.bias_correction ? static_cast<float>(1.0 / (1.0 - std::pow(double{p_.beta1}, double(step_)))) : 1.0f;
}

float zeroone_adam::correction2() const {
  if (!p_.bias_correction || var_updates_ == 0) return 1.0f;
  return static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{p_.beta2}, double(var_updates_))));
}

bool zeroone_adam::full_gradient_next() const {
  const std::int64_t next = step_ + 1;
  return next <= p_.var_freeze_step && next % var_interval_ == 0;
}

void zeroone_adam::masked(float* values) const {
  if (mask_.empty()) return;
  for (std::int64_t i = 0; i < numel_; ++i) values[i] *= mask_[static_cast<std::size_t>(i)];
}

expected<bool> zeroone_adam::step(float* param, const float* grad, const compressed_exchange& exchange) {
  ++step_;
  const float b1 = p_.beta1, b2 = p_.beta2, c1 = 1.0f - b1, c2 = 1.0f - b2;
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  if (step_ <= p_.var_freeze_step) {
    const bool full = step_ % var_interval_ == 0;
    if (full) {
      ++var_updates_;
      for (std::int64_t i = 0; i < numel_; ++i) {
        const float g = grad[i];
        v_[at(i)] = b2 * v_[at(i)] + c2 * g * g;
        m_[at(i)] = b1 * m_[at(i)] + c1 * g;
      }
    } else {
      std::vector<float> g(grad, grad + numel_);
      DSA_TRY(exchange(g.data(), numel_, false));
      masked(g.data());
      for (std::int64_t i = 0; i < numel_; ++i) m_[at(i)] = b1 * m_[at(i)] + c1 * g[at(i)];
    }
    const float a1 = correction1(), a2 = correction2();
    for (std::int64_t i = 0; i < numel_; ++i) {
      float update = a1 * m_[at(i)] / (std::sqrt(v_[at(i)]) * a2 + p_.eps);
      if (p_.weight_decay > 0) update += p_.weight_decay * param[i];
      param[i] -= p_.lr * update;
    }
    if (full && ++var_counter_ == p_.var_update_scaler) {
      var_counter_ = 0;
      var_interval_ *= 2;
    }
    return true;
  }
  // Phase B: a local step, and every local_interval_ steps the synchronisation.
  if (anchor_.empty()) anchor_.assign(param, param + numel_); // the ranks' common point
  for (std::int64_t i = 0; i < numel_; ++i) m_[at(i)] = b1 * m_[at(i)] + c1 * grad[i];
  lrs_ += p_.lr;
  const float a1 = correction1(), a2 = correction2();
  for (std::int64_t i = 0; i < numel_; ++i) {
    float update = a1 * m_[at(i)] / (std::sqrt(v_[at(i)]) * a2 + p_.eps);
    if (p_.weight_decay > 0) update += p_.weight_decay * param[i];
    const float delta = p_.lr * update;
    param[i] -= delta;
    u_[at(i)] -= delta;
  }
  bool synced = false;
  if (step_ % local_interval_ == 0) {
    for (std::int64_t i = 0; i < numel_; ++i) u_[at(i)] *= std::sqrt(v_[at(i)]) * a2 + p_.eps; // in momentum units
    DSA_TRY(exchange(u_.data(), numel_, !errors_reset_));
    errors_reset_ = true;
    masked(u_.data());
    for (std::int64_t i = 0; i < numel_; ++i) {
      m_[at(i)] = -u_[at(i)] / (lrs_ * a1);
      // Back to the last synchronised point, exactly (DeepSpeed adds -u, which rounds
      // differently on every rank), then the agreed move.
      param[i] = anchor_[at(i)] + u_[at(i)] / (std::sqrt(v_[at(i)]) * a2 + p_.eps);
      anchor_[at(i)] = param[i];
      u_[at(i)] = 0;
    }
    lrs_ = 0;
    synced = true;
  }
  if (++local_counter_ == p_.local_step_scaler) {
    local_counter_ = 0;
    local_interval_ = std::min(p_.local_step_clipper, 2 * local_interval_);
  }
  return synced;
}

} // namespace dsa::optim
