// Adam / AdamW / LAMB over parameter groups, the BERT no-decay rule and state save/restore.
#include "optim/optimizer.hpp"

#include "kernels/cpu/adam.hpp"
#include "kernels/cpu/lamb.hpp"

#include <algorithm>
#include <set>

namespace dsa::optim {
namespace {

status check_f32(const tensor& t, const param_slot& slot, const char* what, std::int64_t numel) {
  if (!t.defined()) return make_error(errc::invalid_argument, "parameter '{}': {} is undefined", slot.name, what);
  if (t.type() != dtype::f32 || !t.dev().is_cpu() || !t.is_contiguous() || t.numel() != numel)
    return make_error(errc::invalid_argument, "parameter '{}': {} must be a contiguous CPU f32 tensor of {} elements, got {}",
                      slot.name, what, numel, t.describe());
  return {};
}

status check_slot(param_slot& slot) {
  if (!slot.param.defined()) return make_error(errc::invalid_argument, "parameter '{}' is undefined", slot.name);
  const std::int64_t n = slot.param.numel();
  DSA_TRY(check_f32(slot.param, slot, "param", n));
  DSA_TRY(check_f32(slot.grad, slot, "grad", n));
  if (!slot.m.defined()) slot.m = tensor::zeros(slot.param.shape(), dtype::f32);
  if (!slot.v.defined()) slot.v = tensor::zeros(slot.param.shape(), dtype::f32);
  DSA_TRY(check_f32(slot.m, slot, "exp_avg", n));
  DSA_TRY(check_f32(slot.v, slot, "exp_avg_sq", n));
  if (slot.half_copy.defined()) {
    const tensor& h = slot.half_copy;
    if ((h.type() != dtype::f16 && h.type() != dtype::bf16) || !h.is_contiguous() || h.numel() != n)
      return make_error(errc::invalid_argument, "parameter '{}': half copy must be contiguous f16/bf16 of {} elements, got {}",
                        slot.name, n, h.describe());
  }
  return {};
}

} // namespace

bool bert_no_decay(std::string_view hf_name) {
  constexpr std::string_view bias = "bias";
  bool ends_bias = hf_name.size() >= bias.size() && hf_name.substr(hf_name.size() - bias.size()) == bias;
  return ends_bias || hf_name.find("LayerNorm") != std::string_view::npos;
}

std::vector<param_group> bert_param_groups(std::vector<param_slot> params, double weight_decay, double lr) {
  param_group decay{"decay", {}, weight_decay, lr};
  param_group no_decay{"no_decay", {}, 0.0, lr};
  for (auto& p : params) (bert_no_decay(p.name) ? no_decay : decay).params.push_back(std::move(p));
  std::vector<param_group> out;
  if (!decay.params.empty()) out.push_back(std::move(decay));
  if (!no_decay.params.empty()) out.push_back(std::move(no_decay));
  return out;
}

expected<optimizer> optimizer::create(const optimizer_config& cfg, std::vector<param_group> groups) {
  if (cfg.compressed())
    return make_error(errc::invalid_argument,
                      "the compressed optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb) run in the runtime's shard, "
                      "not over parameter groups");
  std::set<std::string> names;
  std::int64_t largest = 0;
  for (auto& g : groups)
    for (auto& slot : g.params) {
      DSA_TRY(check_slot(slot));
      if (!names.insert(slot.name).second)
        return make_error(errc::invalid_argument, "parameter '{}' appears twice in the optimizer's groups", slot.name);
      largest = std::max(largest, slot.param.numel());
    }
  optimizer opt(cfg, std::move(groups));
  if (cfg.type == optimizer_type::lamb) opt.lamb_work_.resize(static_cast<std::size_t>(largest));
  return opt;
}

void optimizer::set_lr(double lr) {
  for (auto& g : groups_) g.lr = lr;
}

void optimizer::set_betas(double beta1, double beta2) {
  cfg_.beta1 = beta1;
  cfg_.beta2 = beta2;
}

cpu::adam_params adam_step_params(const optimizer_config& cfg, double lr, double weight_decay, std::int64_t step) {
  cpu::adam_params p;
  p.lr = static_cast<float>(lr);
  p.beta1 = static_cast<float>(cfg.beta1);
  p.beta2 = static_cast<float>(cfg.beta2);
  p.eps = static_cast<float>(cfg.eps);
  p.weight_decay = static_cast<float>(weight_decay);
  p.mode = cfg.decoupled_decay() ? cpu::adam_mode::adamw : cpu::adam_mode::adam;
  p.correction = cfg.bias_correction ? cpu::bias_correction::on : cpu::bias_correction::off;
  p.step = step;
  return p;
}

void optimizer::step() {
  stepping_ = false;
  ++step_;
  lamb_coeffs_.clear();
  for (auto& g : groups_)
    for (auto& slot : g.params) update(g, slot);
}

void optimizer::begin_step() {
  DSA_CHECK(cfg_.type == optimizer_type::adam || cfg_.type == optimizer_type::adamw,
            "optimizer: a step a parameter at a time needs Adam or AdamW, not {}", optimizer_name(cfg_.type));
  ++step_;
  lamb_coeffs_.clear();
  by_name_.clear();
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t i = 0; i < groups_[g].params.size(); ++i) by_name_[groups_[g].params[i].name] = {g, i};
  stepping_ = true;
}

status optimizer::step_param(const std::string& name) {
  if (!stepping_) return make_error(errc::invalid_argument, "optimizer: step_param('{}') before begin_step()", name);
  const auto at = by_name_.find(name);
  if (at == by_name_.end()) return make_error(errc::not_found, "optimizer: no parameter '{}' to step", name);
  param_group& g = groups_[at->second.first];
  update(g, g.params[at->second.second]);
  return {};
}

void optimizer::update(param_group& g, param_slot& slot) {
  const auto correction = cfg_.bias_correction ? cpu::bias_correction::on : cpu::bias_correction::off;
  std::uint16_t* half = slot.half_copy.defined() ? slot.half_copy.data<std::uint16_t>() : nullptr;
  dtype half_type = slot.half_copy.defined() ? slot.half_copy.type() : dtype::f16;
  const std::int64_t n = slot.param.numel();
  if (cfg_.type == optimizer_type::lamb) {
    cpu::lamb_params p;
    p.lr = static_cast<float>(g.lr);
    p.beta1 = static_cast<float>(cfg_.beta1);
    p.beta2 = static_cast<float>(cfg_.beta2);
    p.eps = static_cast<float>(cfg_.eps);
    p.weight_decay = static_cast<float>(g.weight_decay);
    p.max_coeff = static_cast<float>(cfg_.max_coeff);
    p.min_coeff = static_cast<float>(cfg_.min_coeff);
    p.correction = correction;
    p.step = step_;
    lamb_coeffs_.push_back(cpu::lamb_update(slot.param.data<float>(), slot.m.data<float>(), slot.v.data<float>(),
                                            slot.grad.data<float>(), lamb_work_.data(), half, half_type, p, n));
  } else {
    const cpu::adam_params p = adam_step_params(cfg_, g.lr, g.weight_decay, step_);
    cpu::adam_update(slot.param.data<float>(), slot.m.data<float>(), slot.v.data<float>(), slot.grad.data<float>(),
                     half, half_type, p, n);
  }
}

optimizer_state optimizer::state_views() const {
  optimizer_state s;
  s.step = step_;
  for (const auto& g : groups_)
    for (const auto& slot : g.params) {
      s.tensors.emplace(slot.name + ".exp_avg", slot.m);
      s.tensors.emplace(slot.name + ".exp_avg_sq", slot.v);
    }
  return s;
}

optimizer_state optimizer::save_state() const {
  optimizer_state s = state_views();
  for (auto& [name, t] : s.tensors) t = t.clone();
  return s;
}

status optimizer::load_state(const optimizer_state& state) {
  if (state.step < 0) return make_error(errc::format, "optimizer state: negative step count {}", state.step);
  // Check everything before changing anything, so a bad checkpoint leaves the optimizer as it was.
  for (int pass = 0; pass < 2; ++pass)
    for (auto& g : groups_)
      for (auto& slot : g.params)
        for (auto [suffix, dst] : {std::pair<const char*, tensor*>{".exp_avg", &slot.m}, {".exp_avg_sq", &slot.v}}) {
          std::string key = slot.name + suffix;
          auto it = state.tensors.find(key);
          if (it == state.tensors.end())
            return make_error(errc::not_found, "optimizer state: tensor '{}' is missing", key);
          const tensor& src = it->second;
          if (src.type() != dtype::f32 || src.numel() != dst->numel() || !src.is_contiguous())
            return make_error(errc::format, "optimizer state: tensor '{}' is {}, expected f32 with {} elements", key,
                              src.describe(), dst->numel());
          if (pass == 1) dst->copy_from(src.reshape(dst->shape()));
        }
  step_ = state.step;
  return {};
}

} // namespace dsa::optim
