// Learning-rate schedules with DeepSpeed's names, defaults and formulas
// (runtime/lr_schedules.py): WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle,
// LRRangeTest. The only state is last_batch_iteration (-1 before the first step);
// the engine calls step() once per optimizer step that was not skipped.
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace dsa::optim {

enum class warmup_type : std::uint8_t { log, linear };

// WarmupLR: lr = min + (max - min) * gamma(t), gamma = ln(t+1)/ln(W) (log) or t/W (linear)
// for t < W, 1 afterwards; W = max(2, warmup_num_steps). At t = -1 (construction) and t = 0
// the lr is warmup_min_lr, so the first two optimizer steps run at warmup_min_lr.
struct warmup_lr_params {
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr; // none: the optimizer's lr
  std::int64_t warmup_num_steps = 1000;
  warmup_type type = warmup_type::log;
};

// WarmupDecayLR: WarmupLR, then gamma = max(0, (T - t) / max(1, T - W)).
// DeepSpeed's default warmup_max_lr here is 0.001 (not the optimizer's lr).
struct warmup_decay_lr_params {
  std::int64_t total_num_steps = 0; // required
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  std::int64_t warmup_num_steps = 1000;
  warmup_type type = warmup_type::log;
};

// WarmupCosineLR: lr = optimizer lr * ratio(t). ratio(-1) = 0; for t < W:
// warmup_min_ratio + gamma(t) (1 - warmup_min_ratio); afterwards
// max(0, c + (1 - c)(1 + cos(pi min(1, (t - W + 1) / max(1, T - W)))) / 2), c = cos_min_ratio.
struct warmup_cosine_lr_params {
  std::int64_t total_num_steps = 0; // required
  double warmup_min_ratio = 0.0;
  std::int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 1e-4;
  warmup_type type = warmup_type::log;
};

// OneCycle: with i = t + 1, total = s1 + s2, cycle = floor(1 + i/total), x = 1 + i/total - cycle,
// scale = x / (s1/total) if x <= s1/total else (x - 1) / (s1/total - 1); a stair count n > 0
// quantises scale to floor(position * n) / n of the current half. For t < total:
// lr = min + (max - min) scale, beta1 = max_mom - (max_mom - min_mom) scale. Afterwards
// lr = min / (1 + decay_lr_rate (t - total + 1) / decay_step_size) and
// beta1 = max_mom (1 + decay_mom_rate (t - total + 1) / decay_step_size), each only when its rate
// and decay_step_size are non-zero (else min lr / max mom). At t = -1: lr = min, beta1 = min_mom.
// Quirk kept from DeepSpeed: with cycle_momentum the schedule writes betas = (beta1, 0.99),
// overwriting the optimizer's beta2.
struct one_cycle_params {
  double cycle_min_lr = 0.0; // required
  double cycle_max_lr = 0.0; // required
  double decay_lr_rate = 0.0;
  std::int64_t cycle_first_step_size = 2000;
  std::optional<std::int64_t> cycle_second_step_size;   // none: cycle_first_step_size
  std::int64_t cycle_first_stair_count = 0;
  std::optional<std::int64_t> cycle_second_stair_count; // none: cycle_first_stair_count
  std::int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

// LRRangeTest: lr = min_lr (1 + step_rate * interval), interval = (t+1)/step_size, floored
// when staircase. At t = -1: min_lr.
struct lr_range_test_params {
  double lr_range_test_min_lr = 1e-3;
  std::int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

struct betas {
  double beta1;
  double beta2;
};

class lr_schedule {
public:
  virtual ~lr_schedule() = default;
  // DeepSpeed's type name ("WarmupLR", ...).
  virtual const char* name() const = 0;

  // Advances last_batch_iteration by one.
  void step() { ++last_batch_iteration_; }
  // The lr (and, for OneCycle with cycle_momentum, the betas) at the current iteration.
  double lr() const { return lr_at(last_batch_iteration_); }
  std::optional<betas> momentum() const { return betas_at(last_batch_iteration_); }

  // The whole state, for checkpoints.
  std::int64_t last_batch_iteration() const { return last_batch_iteration_; }
  void set_last_batch_iteration(std::int64_t t) { last_batch_iteration_ = t; }

  // Values at any iteration t >= -1, without changing state.
  virtual double lr_at(std::int64_t t) const = 0;
  virtual std::optional<betas> betas_at(std::int64_t /*t*/) const { return std::nullopt; }

protected:
  std::int64_t last_batch_iteration_ = -1;
};

// Constructors from plain parameter structs. optimizer_lr is the optimizer's configured lr
// (WarmupLR's default max, WarmupCosineLR's base). Invalid values (warmup_num_steps <= 0,
// step sizes <= 0, total_num_steps missing) are errors.
expected<std::unique_ptr<lr_schedule>> make_warmup_lr(const warmup_lr_params& p, double optimizer_lr);
expected<std::unique_ptr<lr_schedule>> make_warmup_decay_lr(const warmup_decay_lr_params& p);
expected<std::unique_ptr<lr_schedule>> make_warmup_cosine_lr(const warmup_cosine_lr_params& p, double optimizer_lr);
expected<std::unique_ptr<lr_schedule>> make_one_cycle(const one_cycle_params& p);
expected<std::unique_ptr<lr_schedule>> make_lr_range_test(const lr_range_test_params& p);

// From a config subtree `key` ("scheduler") holding type and params, as in a DeepSpeed
// config. Every problem is recorded in `problems`, naming the key
// ("scheduler.params.warmup_num_steps: expected an integer"); unknown keys under params
// come with a suggestion, an unknown type with the known ones. nullptr when the section
// has a problem.
std::unique_ptr<lr_schedule> read_lr_schedule(const config& cfg, double optimizer_lr,
                                              config_problems& problems,
                                              std::string_view key = "scheduler");
// As read_lr_schedule, with every problem in one error.
expected<std::unique_ptr<lr_schedule>> make_lr_schedule(const config& cfg, double optimizer_lr,
                                                        std::string_view key = "scheduler");

} // namespace dsa::optim
