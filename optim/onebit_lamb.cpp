// 1-bit LAMB on one rank's parameters; see onebit_lamb.hpp.
#include "optim/onebit_lamb.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace dsa::optim {
namespace {

double norm(const float* x, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s);
}

} // namespace

onebit_lamb::onebit_lamb(onebit_lamb_params params, std::vector<std::int64_t> sizes)
    : p_(params), sizes_(std::move(sizes)) {
  for (std::int64_t n : sizes_) {
    DSA_CHECK(n > 0, "onebit_lamb: a tensor of {} elements", n);
    offsets_.push_back(numel_);
    numel_ += n;
  }
  m_.assign(static_cast<std::size_t>(numel_), 0.0f);
  v_ = m_;
  coeff_.assign(sizes_.size(), 0.0f);
  factor_.assign(sizes_.size(), 1.0f);
}

status onebit_lamb::set_mask(std::vector<float> mask) {
  if (!mask.empty() && static_cast<std::int64_t>(mask.size()) != numel_)
    return make_error(errc::invalid_argument, "1-bit LAMB: exp_avg_mask has {} elements, the parameters {}",
                      mask.size(), numel_);
  mask_ = std::move(mask);
  return {};
}

compressed_state onebit_lamb::save() const {
  compressed_state s = moments_state(step_, m_, v_);
  s.extra["coeff"] = coeff_;
  s.extra["factor"] = factor_;
  s.extra["scaling"] = scaling_;
  s.extra["exp_avg_sq_fresh"] = v_fresh_;
  return s;
}

status onebit_lamb::load(const compressed_state& state) {
  DSA_TRY(check_moments(state, numel_, "1-bit LAMB"));
  const auto get = [&](const char* name, std::size_t n, bool may_be_empty) -> expected<std::vector<float>> {
    auto it = state.extra.find(name);
    if (it == state.extra.end() || !(it->second.size() == n || (may_be_empty && it->second.empty())))
      return make_error(errc::invalid_argument, "1-bit LAMB state: '{}' missing or not {} values", name, n);
    return it->second;
  };
  const std::size_t tensors = sizes_.size();
  DSA_ASSIGN_OR_RETURN(auto coeff, get("coeff", tensors, false));
  DSA_ASSIGN_OR_RETURN(auto factor, get("factor", tensors, false));
  DSA_ASSIGN_OR_RETURN(auto scaling, get("scaling", tensors, true));
  DSA_ASSIGN_OR_RETURN(auto fresh, get("exp_avg_sq_fresh", static_cast<std::size_t>(numel_), true));
  m_ = state.exp_avg;
  v_ = state.exp_avg_sq;
  step_ = state.step;
  coeff_ = std::move(coeff);
  factor_ = std::move(factor);
  scaling_ = std::move(scaling);
  frozen_ = step_ >= p_.freeze_step;
  v_fresh_ = frozen_ && fresh.empty() ? v_ : std::move(fresh);
  return {};
}

float onebit_lamb::correction1() const {
  return p_.bias_correction ? static_cast<float>(1.0 / (1.0 - std::pow(double{p_.beta1}, double(step_)))) : 1.0f;
}

float onebit_lamb::correction2() const {
  const std::int64_t k = std::min(step_, p_.freeze_step);
  if (!p_.bias_correction || k == 0) return 1.0f;
  return static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{p_.beta2}, double(k))));
}

status onebit_lamb::step(float* param, const float* grad, const lamb_exchange& exchange) {
  ++step_;
  if (frozen_) return compressed(param, grad, exchange);
  warm_up(param, grad);
  if (step_ >= p_.freeze_step) {
    frozen_ = true;
    v_fresh_ = v_; // the fresh variance starts from the frozen one (corrected)
    const float a2 = correction2();
    if (a2 != 1.0f)
      for (float& x : v_fresh_) x *= a2 * a2;
  }
  return {};
}

void onebit_lamb::warm_up(float* param, const float* grad) {
  const float b1 = p_.beta1, b2 = p_.beta2, a1 = correction1(), a2 = correction2();
  std::vector<float> u;
  for (std::size_t t = 0; t < sizes_.size(); ++t) {
    const std::int64_t off = offsets_[t], n = sizes_[t];
    u.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(off + i);
      const float g = grad[off + i];
      m_[k] = b1 * m_[k] + (1.0f - b1) * g;
      v_[k] = b2 * v_[k] + (1.0f - b2) * g * g;
      u[static_cast<std::size_t>(i)] = a1 * m_[k] / (std::sqrt(v_[k]) * a2 + p_.eps) + p_.weight_decay * param[off + i];
    }
    const double pn = norm(param + off, n), un = norm(u.data(), n);
    float c = 1.0f;
    if (pn > 0 && un > 0) c = std::clamp(static_cast<float>(pn / un), p_.min_coeff, p_.max_coeff);
    if (c != 1.0f) coeff_[t] = p_.coeff_beta * coeff_[t] + (1.0f - p_.coeff_beta) * c;
    for (std::int64_t i = 0; i < n; ++i) param[off + i] -= p_.lr * c * u[static_cast<std::size_t>(i)];
  }
}

status onebit_lamb::compressed(float* param, const float* grad, const lamb_exchange& exchange) {
  const float b1 = p_.beta1, b2 = p_.beta2, a1 = correction1(), a2 = correction2();
  const std::size_t tensors = sizes_.size();
  if (scaling_.empty()) { // the first compressed step fixes each tensor's scaling
    std::vector<double> rms(tensors);
    double mean = 0;
    for (std::size_t t = 0; t < tensors; ++t) {
      rms[t] = norm(m_.data() + offsets_[t], sizes_[t]) / std::sqrt(static_cast<double>(sizes_[t]));
      mean += rms[t] / static_cast<double>(tensors);
    }
    scaling_.resize(tensors);
    for (std::size_t t = 0; t < tensors; ++t) scaling_[t] = rms[t] > 0 ? static_cast<float>(mean / rms[t]) : 1.0f;
  }
  const std::vector<float> previous = m_;
  for (std::size_t t = 0; t < tensors; ++t)
    for (std::int64_t i = 0; i < sizes_[t]; ++i) {
      const auto k = static_cast<std::size_t>(offsets_[t] + i);
      m_[k] = (b1 * m_[k] + (1.0f - b1) * grad[k]) * scaling_[t];
    }
  DSA_TRY(exchange(m_.data(), numel_));
  std::vector<float> u0, u;
  for (std::size_t t = 0; t < tensors; ++t) {
    const std::int64_t off = offsets_[t], n = sizes_[t];
    u0.resize(static_cast<std::size_t>(n));
    u.resize(static_cast<std::size_t>(n));
    float f = 0.0f;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(off + i);
      m_[k] /= scaling_[t];
      if (!mask_.empty()) m_[k] *= mask_[k];
      const float g = (m_[k] - b1 * previous[k]) / (1.0f - b1); // the averaged gradient it implies
      v_fresh_[k] = b2 * v_fresh_[k] + (1.0f - b2) * g * g;
      const float den = std::sqrt(v_[k]) * a2 + p_.eps;
      u0[static_cast<std::size_t>(i)] = a1 * m_[k] / den;
      u[static_cast<std::size_t>(i)] = u0[static_cast<std::size_t>(i)] + p_.weight_decay * param[off + i];
      f = std::max(f, den / (std::sqrt(v_fresh_[k]) + p_.eps));
    }
    if (p_.weight_decay > 0) {
      const double n0 = norm(u0.data(), n), nu = norm(u.data(), n);
      const float r = nu > 0 ? static_cast<float>(std::min(1.0, n0 / nu)) : 1.0f;
      f = f * r + (1.0f - r);
    }
    f = std::clamp(f, p_.factor_min, p_.factor_max);
    f = std::clamp(f, factor_[t] * (1.0f - p_.factor_threshold), factor_[t] * (1.0f + p_.factor_threshold));
    factor_[t] = f;
    const float scale = p_.lr * coeff_[t] * f;
    for (std::int64_t i = 0; i < n; ++i) param[off + i] -= scale * u[static_cast<std::size_t>(i)];
  }
  return {};
}

} // namespace dsa::optim
