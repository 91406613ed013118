// read_optimizer_config: DeepSpeed's "optimizer": {type, params} section.
#include "optim/optimizer.hpp"
#include "optim/param_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace dsa::optim {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

} // namespace

const char* optimizer_name(optimizer_type type) {
  switch (type) {
  case optimizer_type::adam: return "Adam";
  case optimizer_type::adamw: return "AdamW";
  case optimizer_type::lamb: return "Lamb";
  case optimizer_type::onebit_adam: return "OneBitAdam";
  case optimizer_type::zeroone_adam: return "ZeroOneAdam";
  case optimizer_type::onebit_lamb: return "OneBitLamb";
  }
  return "?";
}

namespace {

// The compressed optimizers' own params (deepspeed-notes.md §6.3-6.5).
void read_compressed_params(param_reader& r, optimizer_config& c) {
  // DeepSpeed's backend choice and CUDA-aware MPI: dsactor's own transport carries the
  // exchange, so they are accepted and change nothing; max_grad_norm and eps_inside_sqrt
  // are unused by DeepSpeed's implementations too.
  bool cuda_aware = false, eps_inside_sqrt = false;
  std::string backend;
  double max_grad_norm = 0;
  r.read("cuda_aware", cuda_aware);
  r.read("comm_backend_name", backend);
  r.read("max_grad_norm", max_grad_norm);
  r.read("eps_inside_sqrt", eps_inside_sqrt);
  bool amsgrad = false;
  r.read("amsgrad", amsgrad);
  if (amsgrad) r.invalid("amsgrad", "is not supported by the compressed optimizers (as in DeepSpeed)");
  auto positive = [&](const char* name, std::int64_t& v) {
    r.read(name, v);
    if (v < 1) r.invalid(name, "must be >= 1");
  };
  // dsactor's key: DeepSpeed always spends the first step on one exchange and no update.
  r.read("dummy_first_step", c.dummy_first_step);
  if (c.type == optimizer_type::zeroone_adam) {
    r.read("var_freeze_step", c.var_freeze_step);
    if (c.var_freeze_step < 0) r.invalid("var_freeze_step", "must be >= 0");
    positive("var_update_scaler", c.var_update_scaler);
    positive("local_step_scaler", c.local_step_scaler);
    positive("local_step_clipper", c.local_step_clipper);
    return;
  }
  r.read("freeze_step", c.freeze_step);
  if (c.freeze_step < 0) r.invalid("freeze_step", "must be >= 0");
  if (c.type != optimizer_type::onebit_lamb) return;
  r.read("coeff_beta", c.coeff_beta);
  if (!(c.coeff_beta >= 0.0 && c.coeff_beta < 1.0)) r.invalid("coeff_beta", "must be in [0, 1)");
  r.read("factor_max", c.factor_max);
  r.read("factor_min", c.factor_min);
  r.read("factor_threshold", c.factor_threshold);
  if (!(c.factor_min > 0.0)) r.invalid("factor_min", "must be > 0");
  else if (!(c.factor_min <= c.factor_max)) {
    if (r.has("factor_max")) r.invalid("factor_max", fmt::format("must be >= factor_min ({})", c.factor_min));
    else r.invalid("factor_min", fmt::format("must be <= factor_max ({}, the default)", c.factor_max));
  }
  if (!(c.factor_threshold >= 0.0)) r.invalid("factor_threshold", "must be >= 0");
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
  else if (t == "onebitadam") c.type = optimizer_type::onebit_adam;
  else if (t == "zerooneadam") c.type = optimizer_type::zeroone_adam;
  else if (t == "onebitlamb") c.type = optimizer_type::onebit_lamb;
  else {
    if (top.has("type"))
      top.invalid("type", "unknown optimizer \"" + type +
                              "\" (known: Adam, AdamW, Lamb, OneBitAdam, ZeroOneAdam, OneBitLamb)");
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
  if (c.lamb_like()) {
    r.read("max_coeff", c.max_coeff);
    r.read("min_coeff", c.min_coeff);
  } else if (!c.compressed()) {
    r.read("adam_w_mode", c.adam_w_mode);
  }
  if (c.compressed()) read_compressed_params(r, c);
  r.check_unknown();
  if (!(c.lr >= 0.0))
    r.invalid("lr", "must be >= 0");
  if (!(c.beta1 >= 0.0 && c.beta1 < 1.0 && c.beta2 >= 0.0 && c.beta2 < 1.0))
    r.invalid("betas", "each beta must be in [0, 1)");
  if (!(c.eps > 0.0))
    r.invalid("eps", "must be > 0");
  if (!(c.weight_decay >= 0.0))
    r.invalid("weight_decay", "must be >= 0");
  if (c.lamb_like() && !(c.min_coeff >= 0.0 && c.min_coeff <= c.max_coeff))
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
