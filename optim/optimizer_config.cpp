// parse_optimizer_config: DeepSpeed's "optimizer": {type, params} section.
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

expected<optimizer_config> parse_optimizer_config(const config& cfg, std::string_view key) {
  param_reader top(cfg, std::string(key));
  std::string type;
  DSA_TRY(top.require("type", type));
  optimizer_config c;
  const std::string t = lower(type);
  if (t == "adam") c.type = optimizer_type::adam;
  else if (t == "adamw") c.type = optimizer_type::adamw;
  else if (t == "lamb") c.type = optimizer_type::lamb;
  else return top.value_error("type", "unsupported optimizer \"" + type + "\" (expected Adam, AdamW or Lamb)");

  param_reader r(cfg, top.key("params"));
  DSA_TRY(r.read("lr", c.lr));
  std::vector<double> betas{c.beta1, c.beta2};
  DSA_TRY(r.read("betas", betas));
  if (betas.size() != 2) return r.value_error("betas", "expected two numbers [beta1, beta2]");
  c.beta1 = betas[0];
  c.beta2 = betas[1];
  DSA_TRY(r.read("eps", c.eps));
  DSA_TRY(r.read("weight_decay", c.weight_decay));
  DSA_TRY(r.read("bias_correction", c.bias_correction));
  if (c.type == optimizer_type::lamb) {
    DSA_TRY(r.read("max_coeff", c.max_coeff));
    DSA_TRY(r.read("min_coeff", c.min_coeff));
  } else {
    DSA_TRY(r.read("adam_w_mode", c.adam_w_mode));
  }
  if (!(c.lr >= 0.0)) return r.value_error("lr", "must be >= 0");
  for (int i = 0; i < 2; ++i)
    if (!(betas[i] >= 0.0 && betas[i] < 1.0)) return r.value_error("betas", "each beta must be in [0, 1)");
  if (!(c.eps > 0.0)) return r.value_error("eps", "must be > 0");
  if (!(c.weight_decay >= 0.0)) return r.value_error("weight_decay", "must be >= 0");
  if (c.type == optimizer_type::lamb && !(c.min_coeff >= 0.0 && c.min_coeff <= c.max_coeff))
    return r.value_error("min_coeff", "must satisfy 0 <= min_coeff <= max_coeff");
  DSA_TRY(r.reject_unknown());
  top.accept("params");
  DSA_TRY(top.reject_unknown());
  return c;
}

} // namespace dsa::optim
