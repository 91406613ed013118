// LR schedules: the formulas of DeepSpeed's runtime/lr_schedules.py, in double.
#include "optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace dsa::optim {
namespace {

constexpr double pi = 3.14159265358979323846;

// Warm-up fraction shared by WarmupLR, WarmupDecayLR and WarmupCosineLR (t in [0, W)).
double warmup_gamma(std::int64_t t, std::int64_t warmup_steps, warmup_type type) {
  if (type == warmup_type::log) return std::log(static_cast<double>(t + 1)) / std::log(static_cast<double>(warmup_steps));
  return static_cast<double>(t) / static_cast<double>(warmup_steps);
}

class warmup_lr final : public lr_schedule {
public:
  // total_steps < 0: no decay (WarmupLR); otherwise WarmupDecayLR.
  warmup_lr(double min_lr, double max_lr, std::int64_t warmup_steps, warmup_type type, std::int64_t total_steps)
      : min_(min_lr), max_(max_lr), warmup_(std::max<std::int64_t>(2, warmup_steps)), type_(type),
        total_(total_steps) {}
  const char* name() const override { return total_ < 0 ? "WarmupLR" : "WarmupDecayLR"; }
  double lr_at(std::int64_t t) const override {
    if (t < 0) return min_;
    return min_ + (max_ - min_) * gamma(t);
  }

private:
  double gamma(std::int64_t t) const {
    if (t < warmup_) return warmup_gamma(t, warmup_, type_);
    if (total_ < 0) return 1.0;
    return std::max(0.0, static_cast<double>(total_ - t) / std::max(1.0, static_cast<double>(total_ - warmup_)));
  }
  double min_, max_;
  std::int64_t warmup_;
  warmup_type type_;
  std::int64_t total_;
};

class warmup_cosine_lr final : public lr_schedule {
public:
  warmup_cosine_lr(const warmup_cosine_lr_params& p, double base_lr)
      : p_(p), warmup_(std::max<std::int64_t>(2, p.warmup_num_steps)), base_(base_lr) {}
  const char* name() const override { return "WarmupCosineLR"; }
  double lr_at(std::int64_t t) const override { return t < 0 ? 0.0 : base_ * ratio(t); }

private:
  double ratio(std::int64_t t) const {
    if (t < warmup_) return p_.warmup_min_ratio + warmup_gamma(t, warmup_, p_.type) * (1.0 - p_.warmup_min_ratio);
    double progress = static_cast<double>(t - warmup_ + 1) /
                      static_cast<double>(std::max<std::int64_t>(1, p_.total_num_steps - warmup_));
    double cosine = (1.0 + std::cos(pi * std::min(1.0, progress))) / 2.0;
    return std::max(0.0, p_.cos_min_ratio + (1.0 - p_.cos_min_ratio) * cosine);
  }
  warmup_cosine_lr_params p_;
  std::int64_t warmup_;
  double base_;
};

class one_cycle final : public lr_schedule {
public:
  explicit one_cycle(const one_cycle_params& p)
      : p_(p), first_(static_cast<double>(p.cycle_first_step_size)),
        second_(static_cast<double>(p.cycle_second_step_size.value_or(p.cycle_first_step_size))),
        total_(first_ + second_), ratio_(first_ / total_),
        second_stairs_(p.cycle_second_stair_count.value_or(p.cycle_first_stair_count)),
        decay_lr_(p.decay_step_size != 0 && p.decay_lr_rate != 0.0),
        decay_mom_(p.decay_step_size != 0 && p.decay_mom_rate != 0.0) {}
  const char* name() const override { return "OneCycle"; }

  double lr_at(std::int64_t t) const override {
    if (t < 0) return p_.cycle_min_lr;
    if (static_cast<double>(t) < total_) return p_.cycle_min_lr + (p_.cycle_max_lr - p_.cycle_min_lr) * scale(t);
    if (!decay_lr_) return p_.cycle_min_lr;
    return p_.cycle_min_lr / (1.0 + p_.decay_lr_rate * decay_interval(t));
  }

  std::optional<betas> betas_at(std::int64_t t) const override {
    if (!p_.cycle_momentum) return std::nullopt;
    if (t < 0) return betas{p_.cycle_min_mom, 0.99};
    if (static_cast<double>(t) < total_)
      return betas{p_.cycle_max_mom - (p_.cycle_max_mom - p_.cycle_min_mom) * scale(t), 0.99};
    if (!decay_mom_) return betas{p_.cycle_max_mom, 0.99};
    return betas{p_.cycle_max_mom * (1.0 + p_.decay_mom_rate * decay_interval(t)), 0.99};
  }

private:
  double decay_interval(std::int64_t t) const {
    return (static_cast<double>(t) - total_ + 1.0) / static_cast<double>(p_.decay_step_size);
  }
  double scale(std::int64_t t) const {
    double i = static_cast<double>(t + 1);
    double cycle = std::floor(1.0 + i / total_);
    double x = 1.0 + i / total_ - cycle;
    double s;
    std::int64_t stairs;
    if (x <= ratio_) {
      s = x / ratio_;
      stairs = p_.cycle_first_stair_count;
    } else {
      s = (x - 1.0) / (ratio_ - 1.0);
      stairs = second_stairs_;
    }
    if (stairs > 0) {
      // Quantised from the integer offset in the cycle, not from s, so a half-cycle boundary
      // cannot land a stair low through rounding.
      double in_cycle = std::fmod(i, total_);
      double position = in_cycle <= first_ ? in_cycle * static_cast<double>(stairs) / first_
                                           : (total_ - in_cycle) * static_cast<double>(stairs) / second_;
      s = std::floor(position) / static_cast<double>(stairs);
    }
    return s;
  }
  one_cycle_params p_;
  double first_, second_, total_, ratio_;
  std::int64_t second_stairs_;
  bool decay_lr_, decay_mom_;
};

class lr_range_test final : public lr_schedule {
public:
  explicit lr_range_test(const lr_range_test_params& p) : p_(p) {}
  const char* name() const override { return "LRRangeTest"; }
  double lr_at(std::int64_t t) const override {
    if (t < 0) return p_.lr_range_test_min_lr;
    double interval = static_cast<double>(t + 1) / static_cast<double>(p_.lr_range_test_step_size);
    if (p_.lr_range_test_staircase) interval = std::floor(interval);
    return p_.lr_range_test_min_lr * (1.0 + p_.lr_range_test_step_rate * interval);
  }

private:
  lr_range_test_params p_;
};

status check_positive(std::int64_t value, const char* name) {
  if (value <= 0) return make_error(errc::invalid_argument, "{} must be a positive integer, got {}", name, value);
  return {};
}

} // namespace

expected<std::unique_ptr<lr_schedule>> make_warmup_lr(const warmup_lr_params& p, double optimizer_lr) {
  DSA_TRY(check_positive(p.warmup_num_steps, "warmup_num_steps"));
  return std::unique_ptr<lr_schedule>(std::make_unique<warmup_lr>(
      p.warmup_min_lr, p.warmup_max_lr.value_or(optimizer_lr), p.warmup_num_steps, p.type, -1));
}

expected<std::unique_ptr<lr_schedule>> make_warmup_decay_lr(const warmup_decay_lr_params& p) {
  DSA_TRY(check_positive(p.warmup_num_steps, "warmup_num_steps"));
  DSA_TRY(check_positive(p.total_num_steps, "total_num_steps"));
  return std::unique_ptr<lr_schedule>(std::make_unique<warmup_lr>(p.warmup_min_lr, p.warmup_max_lr,
                                                                  p.warmup_num_steps, p.type, p.total_num_steps));
}

expected<std::unique_ptr<lr_schedule>> make_warmup_cosine_lr(const warmup_cosine_lr_params& p, double optimizer_lr) {
  DSA_TRY(check_positive(p.warmup_num_steps, "warmup_num_steps"));
  DSA_TRY(check_positive(p.total_num_steps, "total_num_steps"));
  return std::unique_ptr<lr_schedule>(std::make_unique<warmup_cosine_lr>(p, optimizer_lr));
}

expected<std::unique_ptr<lr_schedule>> make_one_cycle(const one_cycle_params& p) {
  DSA_TRY(check_positive(p.cycle_first_step_size, "cycle_first_step_size"));
  if (p.cycle_second_step_size) DSA_TRY(check_positive(*p.cycle_second_step_size, "cycle_second_step_size"));
  if (p.decay_step_size < 0)
    return make_error(errc::invalid_argument, "decay_step_size must be >= 0, got {}", p.decay_step_size);
  return std::unique_ptr<lr_schedule>(std::make_unique<one_cycle>(p));
}

expected<std::unique_ptr<lr_schedule>> make_lr_range_test(const lr_range_test_params& p) {
  DSA_TRY(check_positive(p.lr_range_test_step_size, "lr_range_test_step_size"));
  return std::unique_ptr<lr_schedule>(std::make_unique<lr_range_test>(p));
}

} // namespace dsa::optim
