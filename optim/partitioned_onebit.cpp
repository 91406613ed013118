// 1-bit Adam over a ZeRO partition; see partitioned_optimizer.hpp (step_onebit).
#include "optim/partitioned_optimizer.hpp"

#include "optim/grad_clip.hpp"
#include "optim/onebit_adam.hpp"

#include <algorithm>
#include <cstring>

namespace dsa::optim {
namespace {

onebit_adam_params onebit_params(const optimizer_config& cfg, double lr) {
  onebit_adam_params p;
  p.lr = static_cast<float>(lr);
  p.beta1 = static_cast<float>(cfg.beta1);
  p.beta2 = static_cast<float>(cfg.beta2);
  p.eps = static_cast<float>(cfg.eps);
  p.weight_decay = static_cast<float>(cfg.weight_decay);
  p.freeze_step = cfg.freeze_step;
  p.dummy_first_step = cfg.dummy_first_step;
  p.bias_correction = cfg.bias_correction;
  return p;
}

} // namespace

status partitioned_optimizer::init_onebit() {
  whole_m_.assign(static_cast<std::size_t>(layout_.padded_numel()), 0.0f);
  mask_.assign(whole_m_.size(), 0.0f);
  for (const auto& t : layout_.tensors())
    std::fill(mask_.begin() + t.offset, mask_.begin() + t.offset + t.numel, 1.0f);
  std::int64_t largest = 0;
  for (const auto& [name, numel] : onebit_groups()) largest = std::max(largest, numel);
  group_scratch_.assign(static_cast<std::size_t>(largest), 0.0f);
  whole_m_valid_ = layout_.ranks() == 1 && step_ == 0;
  return {};
}

bool partitioned_optimizer::compressed_next() const {
  return cfg_.type == optimizer_type::onebit_adam && step_ >= cfg_.freeze_step;
}

void partitioned_optimizer::mask_momentum(std::size_t t, std::int64_t from) {
  const flat_tensor& ft = layout_.tensors().at(t);
  from = std::clamp<std::int64_t>(from, 0, ft.numel);
  std::fill(mask_.begin() + ft.offset + from, mask_.begin() + ft.offset + ft.numel, 0.0f);
}

std::vector<std::pair<std::string, std::int64_t>> partitioned_optimizer::onebit_groups() const {
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (const bool decay : {true, false}) {
    std::int64_t n = 0;
    for (const auto& t : layout_.tensors())
      if (t.decay == decay) n += t.numel;
    if (n > 0) out.emplace_back(decay ? "decay" : "no_decay", n);
  }
  return out;
}

status partitioned_optimizer::step_onebit(const onebit_partition_step& in) {
  const bool compressed = compressed_next();
  const std::int64_t size = layout_.partition_numel(), lo = partition().lo;
  DSA_TRY(check_flat(in.grad, "grad", compressed ? layout_.padded_numel() : size, rank_, false));
  DSA_TRY(check_flat(in.working, "working", size, rank_, true));
  const onebit_adam_params p = onebit_params(cfg_, lr_);
  partition_state st = state();
  float* master = st.master.data<float>();
  float* m = st.exp_avg.data<float>();
  float* v = st.exp_avg_sq.data<float>();
  float* grad = in.grad.data<float>();
  if (in.grad_scale != 1.0) scale_in_place(grad, in.grad_scale, in.grad.numel());
  // One group's exchange: its tensors' momentum gathered in layout order, exchanged, put back.
  auto exchange_groups = [&](float* whole, bool zeros) -> status {
    for (const auto& [name, numel] : onebit_groups()) {
      float* buf = group_scratch_.data();
      std::int64_t at = 0;
      for (const auto& t : layout_.tensors()) {
        if (t.decay != (name == "decay")) continue;
        if (zeros) std::memset(buf + at, 0, static_cast<std::size_t>(t.numel) * sizeof(float));
        else std::memcpy(buf + at, whole + t.offset, static_cast<std::size_t>(t.numel) * sizeof(float));
        at += t.numel;
      }
      DSA_TRY(in.exchange(name, buf, numel));
      if (zeros) continue;
      at = 0;
      for (const auto& t : layout_.tensors()) {
        if (t.decay != (name == "decay")) continue;
        std::memcpy(whole + t.offset, buf + at, static_cast<std::size_t>(t.numel) * sizeof(float));
        at += t.numel;
      }
    }
    return {};
  };
  ++step_;
  if (p.dummy_first_step && step_ == 1) return exchange_groups(nullptr, true); // DeepSpeed's initialization step
  const float* momentum = m; // what the update reads, indexed from the partition's start
  if (!compressed) {
    for (const auto& piece : pieces_) {
      const std::int64_t at = piece.flat_offset - lo;
      onebit_math::warm_moments(m + at, v + at, grad + at, piece.count, p.beta1, p.beta2);
    }
    whole_m_valid_ = layout_.ranks() == 1;
    if (whole_m_valid_) std::memcpy(whole_m_.data() + lo, m, static_cast<std::size_t>(size) * sizeof(float));
  } else {
    if (!whole_m_valid_) {
      // The first compressed step since the warm-up or a resume: every rank's momentum partition.
      DSA_TRY(in.gather(whole_m_.data(), m));
      whole_m_valid_ = true;
    }
    onebit_math::local_momentum(whole_m_.data(), grad, layout_.padded_numel(), p.beta1);
    DSA_TRY(exchange_groups(whole_m_.data(), false));
    onebit_math::apply_mask(whole_m_.data(), mask_.data(), layout_.padded_numel());
    std::memcpy(m, whole_m_.data() + lo, static_cast<std::size_t>(size) * sizeof(float));
    momentum = whole_m_.data() + lo;
  }
  const auto corrections = onebit_math::corrections(p, step_, onebit_math::variance_steps(p, step_));
  for (const auto& piece : pieces_) {
    const std::int64_t at = piece.flat_offset - lo;
    const float decay = layout_.tensors()[piece.tensor].decay ? p.weight_decay : 0.0f;
    onebit_math::update(master + at, momentum + at, v + at, piece.count, p, decay, corrections);
  }
  return write_working(in.working);
}

} // namespace dsa::optim
