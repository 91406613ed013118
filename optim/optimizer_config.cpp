// read_optimizer_config: DeepSpeed's "optimizer": {type, params} section.
#include "optim/optimizer.hpp"
#include "optim/param_reader.hpp"

#include <algorithm>
#include <cctype>

namespace dsa::optim {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

} // namespace

optimizer_config read_optimizer_config(const config& cfg, config_problems& problems,
                                       std::string_view key) {
  param_reader top(cfg, std::string(key), problems);
  optimizer_config c;
  std::string type;
  top.require("type", type);
  top.accept("params");
  top.check_unknown();
  const std::string t = lower(type);
  if (t == "adam") c.type = optimizer_type::adam;
  else if (t == "adamw") c.type = optimizer_type::adamw;
  else if (t == "lamb") c.type = optimizer_type::lamb;
  else {
    if (top.has("type"))
      top.invalid("type", "unknown optimizer \"" + type + "\" (known: Adam, AdamW, Lamb)");
    // Without a known type the valid params are unknown: they are accepted unread.
    cfg.accept(top.key("params"));
    return c;
  }

  param_reader r(cfg, top.key("params"), problems);
  r.read("lr", c.lr);
  std::vector<double> betas{c.beta1, c.beta2};
  r.read("betas", betas);
  if (betas.size() != 2) {
    r.invalid("betas", "expected two numbers [beta1, beta2]");
    betas = {c.beta1, c.beta2};
  }
  c.beta1 = betas[0];
  c.beta2 = betas[1];
  r.read("eps", c.eps);
  r.read("weight_decay", c.weight_decay);
  r.read("bias_correction", c.bias_correction);
  if (c.type == optimizer_type::lamb) {
    r.read("max_coeff", c.max_coeff);
    r.read("min_coeff", c.min_coeff);
  } else {
    r.read("adam_w_mode", c.adam_w_mode);
  }
  r.check_unknown();
  if (!(c.lr >= 0.0))
    r.invalid("lr", "must be >= 0");
  if (!(c.beta1 >= 0.0 && c.beta1 < 1.0 && c.beta2 >= 0.0 && c.beta2 < 1.0))
    r.invalid("betas", "each beta must be in [0, 1)");
  if (!(c.eps > 0.0))
    r.invalid("eps", "must be > 0");
  if (!(c.weight_decay >= 0.0))
    r.invalid("weight_decay", "must be >= 0");
  if (c.type == optimizer_type::lamb && !(c.min_coeff >= 0.0 && c.min_coeff <= c.max_coeff))
    r.invalid("min_coeff", "must satisfy 0 <= min_coeff <= max_coeff");
  return c;
}

expected<optimizer_config> parse_optimizer_config(const config& cfg, std::string_view key) {
  config_problems problems;
  optimizer_config c = read_optimizer_config(cfg, problems, key);
  DSA_TRY(problems.to_status());
  return c;
}

} // namespace dsa::optim
