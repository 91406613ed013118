// Static and dynamic loss scaling with DeepSpeed's update rules and log lines.
#include "optim/loss_scaler.hpp"

#include "core/log.hpp"
#include "optim/param_reader.hpp"

#include <algorithm>
#include <cmath>

namespace dsa::optim {
namespace {

constexpr double scale_factor = 2.0;

// Python's int() of a float scale: truncation toward zero.
std::int64_t py_int(double x) { return static_cast<std::int64_t>(x); }

} // namespace

loss_scaler::loss_scaler(const loss_scaler_params& params, int rank) : params_(params), rank_(rank) {
  DSA_CHECK(params.loss_scale >= 0.0, "loss_scale must be >= 0, got {}", params.loss_scale);
  DSA_CHECK(params.loss_scale_window >= 1, "loss_scale_window must be >= 1, got {}", params.loss_scale_window);
  DSA_CHECK(params.hysteresis >= 1, "hysteresis must be >= 1, got {}", params.hysteresis);
  state_.cur_scale = dynamic() ? std::ldexp(1.0, static_cast<int>(params.initial_scale_power)) : params.loss_scale;
  state_.cur_hysteresis = params.hysteresis;
}

std::string loss_scaler::overflow_prefix() const {
  return fmt::format("[deepspeed] OVERFLOW! Rank {} Skipping step.", rank_);
}

bool loss_scaler::window_elapsed() const {
  std::int64_t stable = state_.cur_iter - state_.last_overflow_iter - 1;
  return stable > 0 && stable % params_.loss_scale_window == 0;
}

loss_scale_update loss_scaler::update_fp16_optimizer(bool overflow) {
  loss_scale_update out;
  if (overflow) {
    double next = std::max(state_.cur_scale / scale_factor, params_.min_loss_scale);
    out.skip_step = true;
    out.message = fmt::format("{} Attempted loss scale: {}, reducing to {}", overflow_prefix(),
                              py_int(state_.cur_scale), py_int(next));
    state_.cur_scale = next;
    state_.last_overflow_iter = state_.cur_iter;
  } else if (window_elapsed()) {
    state_.cur_scale *= scale_factor;
  }
  return out;
}

expected<loss_scale_update> loss_scaler::update_zero(bool overflow) {
  loss_scale_update out;
  if (overflow) {
    out.skip_step = true;
    if (params_.hysteresis == 1 || state_.cur_hysteresis == 1) {
      if (state_.cur_scale == params_.min_loss_scale)
        return make_error(errc::runtime,
                          "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.");
      double next = std::max(state_.cur_scale / scale_factor, params_.min_loss_scale);
      out.message = fmt::format("{} Attempted loss scale: {}, reducing to {}", overflow_prefix(),
                                py_int(state_.cur_scale), py_int(next));
      state_.cur_scale = next;
    } else {
      out.message = fmt::format("{} Attempted loss scale: {}, but hysteresis is {}. Reducing hysteresis to {}",
                                overflow_prefix(), py_int(state_.cur_scale), state_.cur_hysteresis,
                                state_.cur_hysteresis - 1);
      state_.cur_hysteresis -= 1;
    }
    state_.last_overflow_iter = state_.cur_iter;
  } else {
    if (params_.consecutive_hysteresis) state_.cur_hysteresis = params_.hysteresis;
    if (window_elapsed()) {
      state_.cur_hysteresis = params_.hysteresis;
      state_.cur_scale *= scale_factor;
    }
  }
  return out;
}

expected<loss_scale_update> loss_scaler::update(bool overflow) {
  loss_scale_update out;
  if (!dynamic()) {
    out.skip_step = overflow;
    if (overflow)
      out.message = fmt::format("Grad overflow on iteration: {}. Using static loss scale of: {}", state_.cur_iter,
                                state_.cur_scale);
  } else if (params_.flavour == loss_scaler_flavour::fp16_optimizer) {
    out = update_fp16_optimizer(overflow);
  } else {
    DSA_ASSIGN_OR_RETURN(out, update_zero(overflow));
  }
  state_.cur_iter += 1;
  if (rank_ == 0 && !out.message.empty()) log_info("{}", out.message);
  return out;
}

loss_scaler_params read_loss_scaler_params(const config& cfg, loss_scaler_flavour flavour,
                                           config_problems& problems, std::string_view key) {
  loss_scaler_params p;
  p.flavour = flavour;
  param_reader r(cfg, std::string(key), problems);
  bool enabled = false;
  r.read("enabled", enabled);
  r.read("loss_scale", p.loss_scale);
  r.read("initial_scale_power", p.initial_scale_power);
  r.read("loss_scale_window", p.loss_scale_window);
  r.read("hysteresis", p.hysteresis);
  r.read("consecutive_hysteresis", p.consecutive_hysteresis);
  r.read("min_loss_scale", p.min_loss_scale);
  if (p.loss_scale < 0.0)
    r.invalid("loss_scale", "must be >= 0 (0 selects dynamic scaling)");
  if (p.initial_scale_power < 0 || p.initial_scale_power > 64)
    r.invalid("initial_scale_power", "must be in [0, 64]");
  if (p.loss_scale_window < 1)
    r.invalid("loss_scale_window", "must be >= 1");
  if (p.hysteresis < 1)
    r.invalid("hysteresis", "must be >= 1");
  if (!(p.min_loss_scale > 0.0))
    r.invalid("min_loss_scale", "must be > 0");
  (void)enabled; // whether fp16 is on is the caller's decision; the key is still validated here
  return p;
}

expected<loss_scaler_params>
parse_loss_scaler_params(const config& cfg, loss_scaler_flavour flavour, std::string_view key) {
  config_problems problems;
  loss_scaler_params p = read_loss_scaler_params(cfg, flavour, problems, key);
  DSA_TRY(problems.to_status());
  return p;
}

} // namespace dsa::optim
