// 0/1 Adam on one rank's flat parameters; see zeroone_adam.hpp.
#include "optim/zeroone_adam.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace dsa::optim {

void zeroone_schedule::end(const zeroone_adam_params& p, std::int64_t k) {
  if (k <= last_variance_step(p)) {
    if (k % var_interval == 0 && ++var_counter == p.var_update_scaler) {
      var_counter = 0;
      var_interval *= 2;
    }
  } else if (++local_counter == p.local_step_scaler) {
    local_counter = 0;
    local_interval = std::min(p.local_step_clipper, 2 * local_interval);
  }
}

zeroone_schedule zeroone_schedule::after(const zeroone_adam_params& p, std::int64_t k) {
  zeroone_schedule s;
  for (std::int64_t i = p.dummy_first_step ? 2 : 1; i <= k; ++i) {
    s.begin(p, i);
    s.end(p, i);
  }
  return s;
}

namespace zeroone_math {

float correction1(const zeroone_adam_params& p, std::int64_t step) {
  if (p.dummy_first_step) --step; // the initialization step moved no momentum
  return p.bias_correction ? static_cast<float>(1.0 / (1.0 - std::pow(double{p.beta1}, double(step)))) : 1.0f;
}

float correction2(const zeroone_adam_params& p, std::int64_t var_updates) {
  if (!p.bias_correction || var_updates == 0) return 1.0f;
  return static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{p.beta2}, double(var_updates))));
}

void full_moments(float* m, float* v, const float* g, std::int64_t n, float beta1, float beta2) {
  const float c1 = 1.0f - beta1, c2 = 1.0f - beta2;
  for (std::int64_t i = 0; i < n; ++i) {
    v[i] = beta2 * v[i] + c2 * g[i] * g[i];
    m[i] = beta1 * m[i] + c1 * g[i];
  }
}

void momentum(float* m, const float* g, std::int64_t n, float beta1) {
  const float c1 = 1.0f - beta1;
  for (std::int64_t i = 0; i < n; ++i) m[i] = beta1 * m[i] + c1 * g[i];
}

void update(float* param, const float* m, const float* v, std::int64_t n, const zeroone_adam_params& p, float decay,
            float a1, float a2) {
  for (std::int64_t i = 0; i < n; ++i) {
    float step = a1 * m[i] / (std::sqrt(v[i]) * a2 + p.eps);
    if (decay > 0) step += decay * param[i];
    param[i] -= p.lr * step;
  }
}

void local_move(float* param, const float* m, const float* v, float* u, std::int64_t n, const zeroone_adam_params& p,
                float decay, float a1, float a2) {
  for (std::int64_t i = 0; i < n; ++i) {
    float step = a1 * m[i] / (std::sqrt(v[i]) * a2 + p.eps);
    if (decay > 0) step += decay * param[i];
    const float delta = p.lr * step;
    param[i] -= delta;
    u[i] -= delta;
  }
}

void to_momentum_units(float* u, const float* v, std::int64_t n, float eps, float a2) {
  for (std::int64_t i = 0; i < n; ++i) u[i] *= std::sqrt(v[i]) * a2 + eps;
}

void rebuild_momentum(float* m, const float* u, std::int64_t n, float lrs, float a1) {
  for (std::int64_t i = 0; i < n; ++i) m[i] = -u[i] / (lrs * a1);
}

void resync(float* param, float* anchor, const float* u, const float* v, std::int64_t n, float eps, float a2) {
  for (std::int64_t i = 0; i < n; ++i) {
    // Back to the last synchronised point, exactly (DeepSpeed adds -u to the local
    // parameters, which rounds differently on every rank), then the agreed move.
    param[i] = anchor[i] + u[i] / (std::sqrt(v[i]) * a2 + eps);
    anchor[i] = param[i];
  }
}

} // namespace zeroone_math

zeroone_adam::zeroone_adam(zeroone_adam_params params, std::int64_t numel)
    : compressed_optimizer(params, numel, "0/1 Adam"), u_(m_) {
  DSA_CHECK(numel >= 0 && params.var_update_scaler > 0 && params.local_step_scaler > 0 &&
                params.local_step_clipper > 0,
            "zeroone_adam: {} elements, var_update_scaler {}, local_step_scaler {}, local_step_clipper {}", numel,
            params.var_update_scaler, params.local_step_scaler, params.local_step_clipper);
}

compressed_state zeroone_adam::save() const { return save_moments(); }

status zeroone_adam::load(const compressed_state& state) {
  DSA_TRY(check_state(state));
  take_moments(state);
  sched_ = zeroone_schedule::after(p_, step_);
  std::fill(u_.begin(), u_.end(), 0.0f);
  anchor_.clear();
  lrs_ = 0;
  errors_reset_ = step_ > last_variance_step(p_); // the caller's error buffers start at zero
  return {};
}

bool zeroone_adam::full_gradient_next() const { return sched_.full(p_, step_ + 1); }

void zeroone_adam::masked(float* values) const {
  if (mask_.empty()) return;
  for (std::int64_t i = 0; i < numel_; ++i) values[i] *= mask_[static_cast<std::size_t>(i)];
}

expected<bool> zeroone_adam::step(float* param, const float* grad, const compressed_exchange& exchange) {
  using namespace zeroone_math;
  const std::int64_t n = numel_;
  if (count_step()) { // DeepSpeed's initialization step
    std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
    DSA_TRY(exchange(zeros.data(), n, false));
    return true;
  }
  if (step_ <= last_variance_step(p_)) {
    const bool full = sched_.full(p_, step_);
    sched_.begin(p_, step_);
    if (full) {
      full_moments(m_.data(), v_.data(), grad, n, p_.beta1, p_.beta2);
    } else {
      std::vector<float> g(grad, grad + n);
      DSA_TRY(exchange(g.data(), n, false));
      masked(g.data());
      momentum(m_.data(), g.data(), n, p_.beta1);
    }
    update(param, m_.data(), v_.data(), n, p_, p_.weight_decay, correction1(p_, step_),
           correction2(p_, sched_.var_updates));
    sched_.end(p_, step_);
    return true;
  }
  // Phase B: a local step, and every local_interval steps the synchronisation.
  if (anchor_.empty()) anchor_.assign(param, param + n); // the ranks' common point
  momentum(m_.data(), grad, n, p_.beta1);
  lrs_ += p_.lr;
  const float a1 = correction1(p_, step_), a2 = correction2(p_, sched_.var_updates);
  local_move(param, m_.data(), v_.data(), u_.data(), n, p_, p_.weight_decay, a1, a2);
  const bool synced = sched_.syncs(step_);
  if (synced) {
    to_momentum_units(u_.data(), v_.data(), n, p_.eps, a2);
    DSA_TRY(exchange(u_.data(), n, !errors_reset_));
    errors_reset_ = true;
    masked(u_.data());
    rebuild_momentum(m_.data(), u_.data(), n, lrs_, a1);
    resync(param, anchor_.data(), u_.data(), v_.data(), n, p_.eps, a2);
    std::fill(u_.begin(), u_.end(), 0.0f);
    lrs_ = 0;
  }
  sched_.end(p_, step_);
  return synced;
}

} // namespace dsa::optim
