// make_lr_schedule: DeepSpeed's "scheduler": {type, params} section to a schedule.
#include "optim/lr_schedule.hpp"
#include "optim/param_reader.hpp"

namespace dsa::optim {
namespace {

status read_warmup_type(param_reader& r, warmup_type& out) {
  std::string text = out == warmup_type::log ? "log" : "linear";
  DSA_TRY(r.read("warmup_type", text));
  if (text == "log") out = warmup_type::log;
  else if (text == "linear") out = warmup_type::linear;
  else return r.value_error("warmup_type", "expected \"log\" or \"linear\", got \"" + text + "\"");
  return {};
}

expected<std::unique_ptr<lr_schedule>> from_warmup_lr(param_reader& r, double optimizer_lr) {
  warmup_lr_params p;
  DSA_TRY(r.read("warmup_min_lr", p.warmup_min_lr));
  DSA_TRY(r.read("warmup_max_lr", p.warmup_max_lr));
  DSA_TRY(r.read("warmup_num_steps", p.warmup_num_steps));
  DSA_TRY(read_warmup_type(r, p.type));
  if (p.warmup_num_steps <= 0) return r.value_error("warmup_num_steps", "must be a positive integer");
  return make_warmup_lr(p, optimizer_lr);
}

expected<std::unique_ptr<lr_schedule>> from_warmup_decay_lr(param_reader& r) {
  warmup_decay_lr_params p;
  DSA_TRY(r.require("total_num_steps", p.total_num_steps));
  DSA_TRY(r.read("warmup_min_lr", p.warmup_min_lr));
  DSA_TRY(r.read("warmup_max_lr", p.warmup_max_lr));
  DSA_TRY(r.read("warmup_num_steps", p.warmup_num_steps));
  DSA_TRY(read_warmup_type(r, p.type));
  if (p.warmup_num_steps <= 0) return r.value_error("warmup_num_steps", "must be a positive integer");
  if (p.total_num_steps <= 0) return r.value_error("total_num_steps", "must be a positive integer");
  return make_warmup_decay_lr(p);
}

expected<std::unique_ptr<lr_schedule>> from_warmup_cosine_lr(param_reader& r, double optimizer_lr) {
  warmup_cosine_lr_params p;
  DSA_TRY(r.require("total_num_steps", p.total_num_steps));
  DSA_TRY(r.read("warmup_min_ratio", p.warmup_min_ratio));
  DSA_TRY(r.read("warmup_num_steps", p.warmup_num_steps));
  DSA_TRY(r.read("cos_min_ratio", p.cos_min_ratio));
  DSA_TRY(read_warmup_type(r, p.type));
  if (p.warmup_num_steps <= 0) return r.value_error("warmup_num_steps", "must be a positive integer");
  if (p.total_num_steps <= 0) return r.value_error("total_num_steps", "must be a positive integer");
  return make_warmup_cosine_lr(p, optimizer_lr);
}

expected<std::unique_ptr<lr_schedule>> from_one_cycle(param_reader& r) {
  one_cycle_params p;
  DSA_TRY(r.require("cycle_min_lr", p.cycle_min_lr));
  DSA_TRY(r.require("cycle_max_lr", p.cycle_max_lr));
  DSA_TRY(r.read("decay_lr_rate", p.decay_lr_rate));
  DSA_TRY(r.read("cycle_first_step_size", p.cycle_first_step_size));
  DSA_TRY(r.read("cycle_second_step_size", p.cycle_second_step_size));
  DSA_TRY(r.read("cycle_first_stair_count", p.cycle_first_stair_count));
  DSA_TRY(r.read("cycle_second_stair_count", p.cycle_second_stair_count));
  DSA_TRY(r.read("decay_step_size", p.decay_step_size));
  DSA_TRY(r.read("cycle_momentum", p.cycle_momentum));
  DSA_TRY(r.read("cycle_min_mom", p.cycle_min_mom));
  DSA_TRY(r.read("cycle_max_mom", p.cycle_max_mom));
  DSA_TRY(r.read("decay_mom_rate", p.decay_mom_rate));
  if (p.cycle_first_step_size <= 0) return r.value_error("cycle_first_step_size", "must be a positive integer");
  if (p.cycle_second_step_size && *p.cycle_second_step_size <= 0)
    return r.value_error("cycle_second_step_size", "must be a positive integer");
  if (p.decay_step_size < 0) return r.value_error("decay_step_size", "must be >= 0");
  return make_one_cycle(p);
}

expected<std::unique_ptr<lr_schedule>> from_lr_range_test(param_reader& r) {
  lr_range_test_params p;
  DSA_TRY(r.read("lr_range_test_min_lr", p.lr_range_test_min_lr));
  DSA_TRY(r.read("lr_range_test_step_size", p.lr_range_test_step_size));
  DSA_TRY(r.read("lr_range_test_step_rate", p.lr_range_test_step_rate));
  DSA_TRY(r.read("lr_range_test_staircase", p.lr_range_test_staircase));
  if (p.lr_range_test_step_size <= 0) return r.value_error("lr_range_test_step_size", "must be a positive integer");
  return make_lr_range_test(p);
}

} // namespace

expected<std::unique_ptr<lr_schedule>> make_lr_schedule(const config& cfg, double optimizer_lr, std::string_view key) {
  param_reader top(cfg, std::string(key));
  std::string type;
  DSA_TRY(top.require("type", type));
  param_reader r(cfg, top.key("params"));
  std::int64_t last_batch_iteration = -1;
  DSA_TRY(r.read("last_batch_iteration", last_batch_iteration));

  expected<std::unique_ptr<lr_schedule>> made = make_error(errc::config, "unset");
  if (type == "WarmupLR") made = from_warmup_lr(r, optimizer_lr);
  else if (type == "WarmupDecayLR") made = from_warmup_decay_lr(r);
  else if (type == "WarmupCosineLR") made = from_warmup_cosine_lr(r, optimizer_lr);
  else if (type == "OneCycle") made = from_one_cycle(r);
  else if (type == "LRRangeTest") made = from_lr_range_test(r);
  else
    return top.value_error("type", "unknown scheduler \"" + type +
                                       "\" (expected WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest)");
  if (!made) return made.err();
  DSA_TRY(r.reject_unknown());
  top.accept("params");
  DSA_TRY(top.reject_unknown());
  (*made)->set_last_batch_iteration(last_batch_iteration);
  return made;
}

} // namespace dsa::optim
