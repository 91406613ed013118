// What the compressed optimizers (1-bit Adam, 0/1 Adam, 1-bit LAMB) share on one rank:
// their common hyperparameters, the rule for the last step of their full-precision phase,
// the exchange of 1-bit Adam and 1-bit LAMB, and the state all three keep (step count,
// moments, exp_avg_mask) with its setters and checkpoint fields. Each algorithm's own file
// (onebit_adam.hpp, zeroone_adam.hpp, onebit_lamb.hpp) keeps the rest.
#pragma once

#include "core/error.hpp"
#include "optim/compressed_state.hpp"

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace dsa::optim {

struct optimizer_config;

// The hyperparameters all three take, the first fields of each one's params (a braced list
// of those params starts with these, in this order).
struct compressed_params {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// p's common fields from the optimizer's config (betas, eps), `lr` and `weight_decay`.
void set_compressed_params(compressed_params& p, const optimizer_config& cfg, double lr, double weight_decay);

// The last step of the full-precision phase (1-bit Adam's and 1-bit LAMB's warm-up before
// freeze_step, 0/1 Adam's phase A up to var_freeze_step): `freeze_step`, but at least one
// such step always runs (0 behaves as 1), and after a dummy first step too (0 or 1 behave
// as 2), as in DeepSpeed, whose initialization step leaves its optimizer in that phase.
inline std::int64_t last_full_precision_step(std::int64_t freeze_step, bool dummy_first_step) {
  const std::int64_t least = dummy_first_step ? 2 : 1;
  return freeze_step < least ? least : freeze_step;
}

// Replaces (count) values with their compressed average over the ranks.
using momentum_exchange = std::function<status(float* values, std::int64_t count)>;

// The state every compressed optimizer keeps for numel flat f32 parameters. Params derives
// from compressed_params and has dummy_first_step. `name` ("1-bit Adam") heads its errors.
template <class Params> class compressed_optimizer {
public:
  std::int64_t step_count() const { return step_; }
  const std::vector<float>& exp_avg() const { return m_; }
  const std::vector<float>& exp_avg_sq() const { return v_; }
  // exp_avg_mask: 1 keeps, 0 zeroes each exchanged value; empty: none. Its size must be numel.
  status set_mask(std::vector<float> mask) {
    if (!mask.empty() && static_cast<std::int64_t>(mask.size()) != numel_)
      return make_error(errc::invalid_argument, "{}: exp_avg_mask has {} elements, the parameters {}", name_,
                        mask.size(), numel_);
    mask_ = std::move(mask);
    return {};
  }
  // The learning rate of the next steps (a schedule's).
  void set_lr(float lr) { p_.lr = lr; }
  // The betas of the next steps (a momentum schedule's, e.g. OneCycle's cycle_momentum).
  void set_betas(float beta1, float beta2) { p_.beta1 = beta1, p_.beta2 = beta2; }

protected:
  compressed_optimizer(Params params, std::int64_t numel, const char* name)
      : p_(params), numel_(numel), m_(static_cast<std::size_t>(numel), 0.0f),
        v_(static_cast<std::size_t>(numel), 0.0f), name_(name) {}

  // The step count and moments for a checkpoint (copies).
  compressed_state save_moments() const { return moments_state(step_, m_, v_); }
  // Whether the moments of `state` fit numel: an error naming this optimizer if not.
  status check_state(const compressed_state& state) const { return check_moments(state, numel_, name_); }
  // Takes the step count and moments of a checked state (copies).
  void take_moments(const compressed_state& state) {
    m_ = state.exp_avg;
    v_ = state.exp_avg_sq;
    step_ = state.step;
  }
  // Counts a step; true for DeepSpeed's initialization step (step 1 with dummy_first_step),
  // which only runs the exchange once and updates nothing.
  bool count_step() {
    ++step_;
    return p_.dummy_first_step && step_ == 1;
  }

  Params p_;
  std::int64_t numel_;
  std::vector<float> m_, v_, mask_;
  std::int64_t step_ = 0;

private:
  const char* name_;
};

} // namespace dsa::optim
