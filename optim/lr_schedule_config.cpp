// read_lr_schedule: DeepSpeed's "scheduler": {type, params} section to a schedule.
#include "optim/lr_schedule.hpp"
#include "optim/param_reader.hpp"

namespace dsa::optim {
namespace {

using made_schedule = expected<std::unique_ptr<lr_schedule>>;

void read_warmup_type(param_reader& r, warmup_type& out) {
  std::string text = out == warmup_type::log ? "log" : "linear";
  r.read("warmup_type", text);
  if (text == "log") out = warmup_type::log;
  else if (text == "linear") out = warmup_type::linear;
  else
    r.invalid("warmup_type", "expected \"log\" or \"linear\", got \"" + text + "\"");
}

void positive(param_reader& r, const char* name, std::int64_t value) {
  if (value <= 0)
    r.invalid(name, "must be a positive integer");
}

// WarmupDecayLR, WarmupCosineLR: both step counts positive (an absent total is reported
// as missing already).
void decay_steps_positive(param_reader& r, std::int64_t warmup_num_steps, std::int64_t total_num_steps) {
  positive(r, "warmup_num_steps", warmup_num_steps);
  if (r.has("total_num_steps"))
    positive(r, "total_num_steps", total_num_steps);
}

made_schedule from_warmup_lr(param_reader& r, double optimizer_lr) {
  warmup_lr_params p;
  r.read("warmup_min_lr", p.warmup_min_lr);
  r.read("warmup_max_lr", p.warmup_max_lr);
  r.read("warmup_num_steps", p.warmup_num_steps);
  read_warmup_type(r, p.type);
  positive(r, "warmup_num_steps", p.warmup_num_steps);
  return make_warmup_lr(p, optimizer_lr);
}

made_schedule from_warmup_decay_lr(param_reader& r) {
  warmup_decay_lr_params p;
  r.require("total_num_steps", p.total_num_steps);
  r.read("warmup_min_lr", p.warmup_min_lr);
  r.read("warmup_max_lr", p.warmup_max_lr);
  r.read("warmup_num_steps", p.warmup_num_steps);
  read_warmup_type(r, p.type);
  decay_steps_positive(r, p.warmup_num_steps, p.total_num_steps);
  return make_warmup_decay_lr(p);
}

made_schedule from_warmup_cosine_lr(param_reader& r, double optimizer_lr) {
  warmup_cosine_lr_params p;
  r.require("total_num_steps", p.total_num_steps);
  r.read("warmup_min_ratio", p.warmup_min_ratio);
  r.read("warmup_num_steps", p.warmup_num_steps);
  r.read("cos_min_ratio", p.cos_min_ratio);
  read_warmup_type(r, p.type);
  decay_steps_positive(r, p.warmup_num_steps, p.total_num_steps);
  return make_warmup_cosine_lr(p, optimizer_lr);
}

made_schedule from_one_cycle(param_reader& r) {
  one_cycle_params p;
  r.require("cycle_min_lr", p.cycle_min_lr);
  r.require("cycle_max_lr", p.cycle_max_lr);
  r.read("decay_lr_rate", p.decay_lr_rate);
  r.read("cycle_first_step_size", p.cycle_first_step_size);
  r.read("cycle_second_step_size", p.cycle_second_step_size);
  r.read("cycle_first_stair_count", p.cycle_first_stair_count);
  r.read("cycle_second_stair_count", p.cycle_second_stair_count);
  r.read("decay_step_size", p.decay_step_size);
  r.read("cycle_momentum", p.cycle_momentum);
  r.read("cycle_min_mom", p.cycle_min_mom);
  r.read("cycle_max_mom", p.cycle_max_mom);
  r.read("decay_mom_rate", p.decay_mom_rate);
  positive(r, "cycle_first_step_size", p.cycle_first_step_size);
  if (p.cycle_second_step_size)
    positive(r, "cycle_second_step_size", *p.cycle_second_step_size);
  if (p.decay_step_size < 0)
    r.invalid("decay_step_size", "must be >= 0");
  return make_one_cycle(p);
}

made_schedule from_lr_range_test(param_reader& r) {
  lr_range_test_params p;
  r.read("lr_range_test_min_lr", p.lr_range_test_min_lr);
  r.read("lr_range_test_step_size", p.lr_range_test_step_size);
  r.read("lr_range_test_step_rate", p.lr_range_test_step_rate);
  r.read("lr_range_test_staircase", p.lr_range_test_staircase);
  positive(r, "lr_range_test_step_size", p.lr_range_test_step_size);
  return make_lr_range_test(p);
}

} // namespace

std::unique_ptr<lr_schedule> read_lr_schedule(const config& cfg, double optimizer_lr,
                                              config_problems& problems, std::string_view key) {
  const std::size_t problems_before = problems.size();
  param_reader top(cfg, std::string(key), problems);
  std::string type;
  top.require("type", type);
  top.accept("params");
  top.check_unknown();
  param_reader r(cfg, top.key("params"), problems);
  std::int64_t last_batch_iteration = -1;
  r.read("last_batch_iteration", last_batch_iteration);

  made_schedule made = make_error(errc::config, "no scheduler type");
  if (type == "WarmupLR") made = from_warmup_lr(r, optimizer_lr);
  else if (type == "WarmupDecayLR") made = from_warmup_decay_lr(r);
  else if (type == "WarmupCosineLR") made = from_warmup_cosine_lr(r, optimizer_lr);
  else if (type == "OneCycle") made = from_one_cycle(r);
  else if (type == "LRRangeTest") made = from_lr_range_test(r);
  else {
    if (top.has("type"))
      top.invalid("type",
                  "unknown scheduler \"" + type +
                      "\" (known: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)");
    // Without a known type the valid params are unknown: they are accepted unread.
    cfg.accept(top.key("params"));
    return nullptr;
  }
  r.check_unknown();
  // The constructors check what the reads above did not; their message names the parameter.
  if (!made && problems.size() == problems_before)
    problems.add(cfg.problem(problem_kind::invalid_value, top.key("params"), made.err().message));
  if (!made || problems.size() != problems_before)
    return nullptr;
  (*made)->set_last_batch_iteration(last_batch_iteration);
  return std::move(*made);
}

expected<std::unique_ptr<lr_schedule>> make_lr_schedule(const config& cfg, double optimizer_lr,
                                                        std::string_view key) {
  config_problems problems;
  auto made = read_lr_schedule(cfg, optimizer_lr, problems, key);
  DSA_TRY(problems.to_status());
  return made;
}

} // namespace dsa::optim
