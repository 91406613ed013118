// 1-bit LAMB on one rank's parameters; see onebit_lamb.hpp.
#include "optim/onebit_lamb.hpp"

#include "optim/onebit_adam.hpp"
#include "optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace dsa::optim {
namespace onebit_lamb_math {

void block_squares(const float* x, std::int64_t n, double* sums) {
  for (std::int64_t b = 0; b * lamb_block < n; ++b) {
    double s = 0;
    const std::int64_t end = std::min(n, (b + 1) * lamb_block);
    for (std::int64_t i = b * lamb_block; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
    sums[b] = s;
  }
}

double norm_of(const double* sums, std::int64_t blocks) {
  double total = 0;
  for (std::int64_t b = 0; b < blocks; ++b) total += sums[b];
  return std::sqrt(total);
}

double norm(const float* x, std::int64_t n) {
  std::vector<double> sums(static_cast<std::size_t>(blocks_of(n)));
  block_squares(x, n, sums.data());
  return norm_of(sums.data(), blocks_of(n));
}

void direction(float* u, const float* m, const float* v, const float* p, std::int64_t n, float a1, float a2,
               float eps, float weight_decay) {
  for (std::int64_t i = 0; i < n; ++i) u[i] = a1 * m[i] / (std::sqrt(v[i]) * a2 + eps) + weight_decay * p[i];
}

void scaled_momentum(float* m, const float* g, std::int64_t n, float beta1, float scaling) {
  for (std::int64_t i = 0; i < n; ++i) m[i] = (beta1 * m[i] + (1.0f - beta1) * g[i]) * scaling;
}

void unscale(float* m, std::int64_t n, float scaling) {
  for (std::int64_t i = 0; i < n; ++i) m[i] /= scaling;
}

float fresh_step(float* v_fresh, float* u0, float* u, const float* m, const float* prev, const float* v,
                 const float* p, std::int64_t n, const onebit_lamb_params& params, float a1, float a2, float largest) {
  const float b1 = params.beta1, b2 = params.beta2, eps = params.eps;
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = (m[i] - b1 * prev[i]) / (1.0f - b1); // the averaged gradient it implies
    v_fresh[i] = b2 * v_fresh[i] + (1.0f - b2) * g * g;
    const float den = std::sqrt(v[i]) * a2 + eps;
    u0[i] = a1 * m[i] / den;
    u[i] = u0[i] + params.weight_decay * p[i];
    largest = std::max(largest, den / (std::sqrt(v_fresh[i]) + eps));
  }
  return largest;
}

float factor(float largest, double u0_norm, double u_norm, float last, const onebit_lamb_params& params) {
  float f = largest;
  if (params.weight_decay > 0) {
    const float r = u_norm > 0 ? static_cast<float>(std::min(1.0, u0_norm / u_norm)) : 1.0f;
    f = f * r + (1.0f - r);
  }
  f = std::clamp(f, params.factor_min, params.factor_max);
  return std::clamp(f, last * (1.0f - params.factor_threshold), last * (1.0f + params.factor_threshold));
}

float trust(double p_norm, double u_norm, const onebit_lamb_params& params) {
  if (p_norm > 0 && u_norm > 0) return std::clamp(static_cast<float>(p_norm / u_norm), params.min_coeff, params.max_coeff);
  return 1.0f;
}

void apply(float* p, const float* u, std::int64_t n, float scale) {
  for (std::int64_t i = 0; i < n; ++i) p[i] -= scale * u[i];
}

std::pair<float, float> corrections(const onebit_lamb_params& params, std::int64_t step) {
  if (!params.bias_correction) return {1.0f, 1.0f};
  const std::int64_t skipped = params.dummy_first_step && step > 0 ? 1 : 0; // the initialization step
  const float a1 = static_cast<float>(1.0 / (1.0 - std::pow(double{params.beta1}, double(step - skipped))));
  const std::int64_t warm = std::min(step, onebit_math::first_local_step(params.freeze_step, params.dummy_first_step));
  const std::int64_t k = std::max<std::int64_t>(0, warm - skipped);
  const float a2 = k == 0 ? 1.0f : static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(double{params.beta2}, double(k))));
  return {a1, a2};
}

} // namespace onebit_lamb_math

using namespace onebit_lamb_math;

namespace {

// The element count of the tensors (each > 0), with decays empty or one per tensor.
std::int64_t numel_of(const std::vector<std::int64_t>& sizes, const std::vector<float>& decays) {
  DSA_CHECK(decays.empty() || decays.size() == sizes.size(), "onebit_lamb: {} weight decays for {} tensors",
            decays.size(), sizes.size());
  std::int64_t numel = 0;
  for (std::int64_t n : sizes) {
    DSA_CHECK(n > 0, "onebit_lamb: a tensor of {} elements", n);
    numel += n;
  }
  return numel;
}

} // namespace

onebit_lamb_params onebit_lamb_params_of(const optimizer_config& cfg, double lr, double weight_decay) {
  onebit_lamb_params p;
  set_compressed_params(p, cfg, lr, weight_decay);
  p.freeze_step = cfg.freeze_step;
  p.max_coeff = static_cast<float>(cfg.max_coeff), p.min_coeff = static_cast<float>(cfg.min_coeff);
  p.coeff_beta = static_cast<float>(cfg.coeff_beta);
  p.factor_max = static_cast<float>(cfg.factor_max), p.factor_min = static_cast<float>(cfg.factor_min);
  p.factor_threshold = static_cast<float>(cfg.factor_threshold);
  p.bias_correction = cfg.bias_correction;
  p.dummy_first_step = cfg.dummy_first_step;
  return p;
}

onebit_lamb::onebit_lamb(onebit_lamb_params params, std::vector<std::int64_t> sizes, std::vector<float> decays)
    : compressed_optimizer(params, numel_of(sizes, decays), "1-bit LAMB"), sizes_(std::move(sizes)),
      decays_(std::move(decays)) {
  if (decays_.empty()) decays_.assign(sizes_.size(), p_.weight_decay);
  std::int64_t at = 0;
  for (std::int64_t n : sizes_) {
    offsets_.push_back(at);
    at += n;
  }
  coeff_.assign(sizes_.size(), 0.0f);
  factor_.assign(sizes_.size(), 1.0f);
}

compressed_state onebit_lamb::save() const {
  compressed_state s = save_moments();
  s.extra["coeff"] = coeff_;
  s.extra["factor"] = factor_;
  s.extra["scaling"] = scaling_;
  s.extra["exp_avg_sq_fresh"] = v_fresh_;
  return s;
}

status onebit_lamb::load(const compressed_state& state) {
  DSA_TRY(check_state(state));
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
  take_moments(state);
  coeff_ = std::move(coeff);
  factor_ = std::move(factor);
  scaling_ = std::move(scaling);
  frozen_ = step_ >= onebit_math::first_local_step(p_.freeze_step, p_.dummy_first_step);
  v_fresh_ = std::move(fresh);
  if (frozen_ && v_fresh_.empty()) start_fresh(); // saved before the freeze its settings now put earlier
  return {};
}

void onebit_lamb::start_fresh() {
  v_fresh_ = v_; // the fresh variance starts from the frozen one (corrected)
  const float a2 = correction2();
  if (a2 != 1.0f)
    for (float& x : v_fresh_) x *= a2 * a2;
}

onebit_lamb_params onebit_lamb::params_of(std::size_t t) const {
  onebit_lamb_params p = p_;
  p.weight_decay = decays_[t];
  return p;
}

float onebit_lamb::correction1() const { return corrections(p_, step_).first; }

float onebit_lamb::correction2() const { return corrections(p_, step_).second; }

status onebit_lamb::step(float* param, const float* grad, const lamb_exchange& exchange) {
  if (count_step()) { // DeepSpeed's initialization step
    std::vector<float> zeros(static_cast<std::size_t>(numel_), 0.0f);
    return exchange(zeros.data(), numel_);
  }
  if (frozen_) return compressed(param, grad, exchange);
  warm_up(param, grad);
  if (step_ >= onebit_math::first_local_step(p_.freeze_step, p_.dummy_first_step)) {
    frozen_ = true;
    start_fresh();
  }
  return {};
}

void onebit_lamb::warm_up(float* param, const float* grad) {
  const float a1 = correction1(), a2 = correction2();
  std::vector<float> u;
  for (std::size_t t = 0; t < sizes_.size(); ++t) {
    const std::int64_t off = offsets_[t], n = sizes_[t];
    u.resize(static_cast<std::size_t>(n));
    onebit_math::warm_moments(m_.data() + off, v_.data() + off, grad + off, n, p_.beta1, p_.beta2);
    direction(u.data(), m_.data() + off, v_.data() + off, param + off, n, a1, a2, p_.eps, decays_[t]);
    const float c = trust(norm(param + off, n), norm(u.data(), n), p_);
    if (c != 1.0f) coeff_[t] = p_.coeff_beta * coeff_[t] + (1.0f - p_.coeff_beta) * c;
    apply(param + off, u.data(), n, p_.lr * c);
  }
}

status onebit_lamb::compressed(float* param, const float* grad, const lamb_exchange& exchange) {
  const float a1 = correction1(), a2 = correction2();
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
    scaled_momentum(m_.data() + offsets_[t], grad + offsets_[t], sizes_[t], p_.beta1, scaling_[t]);
  DSA_TRY(exchange(m_.data(), numel_));
  std::vector<float> u0, u;
  for (std::size_t t = 0; t < tensors; ++t) {
    const std::int64_t off = offsets_[t], n = sizes_[t];
    const onebit_lamb_params pt = params_of(t);
    unscale(m_.data() + off, n, scaling_[t]);
    if (!mask_.empty()) onebit_math::apply_mask(m_.data() + off, mask_.data() + off, n);
    u0.resize(static_cast<std::size_t>(n));
    u.resize(static_cast<std::size_t>(n));
    const float largest = fresh_step(v_fresh_.data() + off, u0.data(), u.data(), m_.data() + off, previous.data() + off,
                                     v_.data() + off, param + off, n, pt, a1, a2, 0.0f);
    const bool decay = pt.weight_decay > 0;
    factor_[t] = factor(largest, decay ? norm(u0.data(), n) : 0.0, decay ? norm(u.data(), n) : 0.0, factor_[t], pt);
    apply(param + off, u.data(), n, p_.lr * coeff_[t] * factor_[t]);
  }
  return {};
}

} // namespace dsa::optim
