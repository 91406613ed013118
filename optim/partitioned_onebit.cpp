// 1-bit Adam over a ZeRO partition; see partitioned_optimizer.hpp (step_onebit).
#include "optim/partitioned_optimizer.hpp"

#include "optim/grad_clip.hpp"
#include "optim/onebit_adam.hpp"
#include "optim/onebit_lamb.hpp"

#include <algorithm>
#include <cstring>

namespace dsa::optim {
namespace {

onebit_adam_params onebit_params(const optimizer_config& cfg, double lr) {
  onebit_adam_params p;
  set_compressed_params(p, cfg, lr, cfg.weight_decay);
  p.freeze_step = cfg.freeze_step;
  p.dummy_first_step = cfg.dummy_first_step;
  p.bias_correction = cfg.bias_correction;
  return p;
}

void copy_floats(float* to, const float* from, std::int64_t n) {
  std::memcpy(to, from, static_cast<std::size_t>(n) * sizeof(float));
}

} // namespace

status partitioned_optimizer::init_onebit() {
  const auto& tensors = layout_.tensors();
  group_offset_.assign(tensors.size(), 0);
  std::int64_t at = 0;
  for (const bool decay : {true, false}) {
    onebit_group g{decay ? "decay" : "no_decay", at, 0};
    for (std::size_t t = 0; t < tensors.size(); ++t)
      if (tensors[t].decay == decay) {
        group_offset_[t] = at;
        at += tensors[t].numel;
      }
    g.numel = at - g.offset;
    if (g.numel > 0) groups_.push_back(g);
  }
  // 1-bit LAMB exchanges both groups as one (the stage-0 shard's one group).
  if (cfg_.type == optimizer_type::onebit_lamb && !groups_.empty()) groups_ = {{onebit_lamb_group, 0, at}};
  whole_m_.assign(static_cast<std::size_t>(at), 0.0f);
  whole_m_valid_ = step_ == 0; // a fresh run: every rank's momentum is zero
  if (cfg_.type == optimizer_type::zeroone_adam) {
    zo_sched_ = zeroone_schedule::after(zeroone_params(), step_);
    zo_errors_reset_ = step_ > last_variance_step(zeroone_params()); // the channel's error buffers are loaded or zero
    for (auto* whole : {&zo_v_, &zo_u_, &zo_p_}) whole->assign(static_cast<std::size_t>(at), 0.0f);
  }
  if (cfg_.type == optimizer_type::onebit_lamb) {
    lamb_coeff_.assign(tensors.size(), 0.0f);
    lamb_fresh_.assign(static_cast<std::size_t>(layout_.partition_numel()), 0.0f); // set at the freeze
    lamb_factor_.assign(tensors.size(), 1.0f);
    for (const auto& t : tensors) {
      lamb_block_base_.push_back(lamb_blocks_);
      lamb_blocks_ += onebit_lamb_math::blocks_of(t.numel);
    }
  }
  return {};
}

void partitioned_optimizer::to_group_order(const float* layout_order, float* whole) const {
  const auto& tensors = layout_.tensors();
  for (std::size_t t = 0; t < tensors.size(); ++t)
    copy_floats(whole + group_offset_[t], layout_order + tensors[t].offset, tensors[t].numel);
}

status partitioned_optimizer::gather_group_order(const onebit_partition_step& in, const float* mine,
                                                 float* whole) const {
  std::vector<float> gathered(static_cast<std::size_t>(layout_.padded_numel()));
  DSA_TRY(in.gather(gathered.data(), mine));
  to_group_order(gathered.data(), whole);
  return {};
}

void partitioned_optimizer::mask_zero(float* whole) const {
  for (const auto& r : masked_)
    for (std::int64_t i = r.lo; i < r.hi; ++i) whole[i] *= 0.0f;
}

// The first compressed step since the warm-up or a resume: every rank's momentum partition,
// gathered and put in group order.
status partitioned_optimizer::gather_momentum(const onebit_partition_step& in, const float* mine) {
  if (whole_m_valid_) return {};
  DSA_TRY(gather_group_order(in, mine, whole_m_.data()));
  whole_m_valid_ = true;
  return {};
}

expected<partitioned_optimizer::onebit_views> partitioned_optimizer::onebit_begin(const onebit_partition_step& in) {
  const std::int64_t size = layout_.partition_numel();
  DSA_TRY(check_flat(in.grad, "grad", compressed_next() ? layout_.padded_numel() : size, rank_, false));
  DSA_TRY(check_flat(in.working, "working", size, rank_, true));
  partition_state st = state();
  onebit_views views{st.master.data<float>(), st.exp_avg.data<float>(), st.exp_avg_sq.data<float>(),
                     in.grad.data<float>()};
  if (in.grad_scale != 1.0) scale_in_place(views.grad, in.grad_scale, in.grad.numel());
  ++step_;
  return views;
}

bool partitioned_optimizer::compressed_next() const {
  if (cfg_.type == optimizer_type::zeroone_adam) return !zo_sched_.full(zeroone_params(), step_ + 1);
  // freeze_step 0 behaves as 1 (or 2 after a dummy first step), as in optim::onebit_adam and
  // onebit_lamb: onebit_math::first_local_step.
  return (cfg_.type == optimizer_type::onebit_adam || cfg_.type == optimizer_type::onebit_lamb) &&
         step_ >= onebit_math::first_local_step(cfg_.freeze_step, cfg_.dummy_first_step);
}

void partitioned_optimizer::mask_momentum(std::size_t t, std::int64_t from) {
  const flat_tensor& ft = layout_.tensors().at(t);
  from = std::clamp<std::int64_t>(from, 0, ft.numel);
  if (from < ft.numel) masked_.push_back({group_offset_.at(t) + from, group_offset_.at(t) + ft.numel});
}

std::vector<std::pair<std::string, std::int64_t>> partitioned_optimizer::onebit_groups() const {
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (const auto& g : groups_) out.emplace_back(g.name, g.numel);
  return out;
}

status partitioned_optimizer::dummy_exchange(const onebit_partition_step& in) {
  // DeepSpeed's initialization step: each group's exchange once on zeros, no update.
  for (const auto& g : groups_) {
    std::vector<float> zeros(static_cast<std::size_t>(g.numel), 0.0f);
    DSA_TRY(in.exchange(g.name, zeros.data(), g.numel, false));
  }
  return write_working(in.working);
}

status partitioned_optimizer::step_onebit(const onebit_partition_step& in) {
  if (cfg_.type == optimizer_type::onebit_lamb) return step_onebit_lamb(in);
  if (cfg_.type == optimizer_type::zeroone_adam) return step_zeroone(in);
  const bool compressed = compressed_next();
  const std::int64_t lo = partition().lo;
  const auto& tensors = layout_.tensors();
  const onebit_adam_params p = onebit_params(cfg_, lr_);
  DSA_ASSIGN_OR_RETURN(onebit_views views, onebit_begin(in));
  float *master = views.master, *m = views.m, *v = views.v, *grad = views.grad;
  if (p.dummy_first_step && step_ == 1) return dummy_exchange(in);
  if (!compressed) {
    for (const auto& piece : pieces_) {
      const std::int64_t at = piece.flat_offset - lo;
      onebit_math::warm_moments(m + at, v + at, grad + at, piece.count, p.beta1, p.beta2);
    }
    whole_m_valid_ = false;
  } else {
    DSA_TRY(gather_momentum(in, m));
    for (std::size_t t = 0; t < tensors.size(); ++t)
      onebit_math::local_momentum(whole_m_.data() + group_offset_[t], grad + tensors[t].offset, tensors[t].numel,
                                  p.beta1);
    for (const auto& g : groups_) DSA_TRY(in.exchange(g.name, whole_m_.data() + g.offset, g.numel, false));
    mask_zero(whole_m_.data());
    for (const auto& piece : pieces_)
      copy_floats(m + (piece.flat_offset - lo), whole_m_.data() + group_offset_[piece.tensor] + piece.tensor_offset,
                  piece.count);
  }
  const auto corrections = onebit_math::corrections(p, step_, onebit_math::variance_steps(p, step_));
  for (const auto& piece : pieces_) {
    const std::int64_t at = piece.flat_offset - lo;
    const float decay = tensors[piece.tensor].decay ? p.weight_decay : 0.0f;
    onebit_math::update(master + at, m + at, v + at, piece.count, p, decay, corrections);
  }
  return write_working(in.working);
}

} // namespace dsa::optim
