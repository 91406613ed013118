// 0/1 Adam over a ZeRO partition; see partitioned_optimizer.hpp (step_onebit).
#include "optim/partitioned_optimizer.hpp"

#include "kernels/cpu/convert.hpp"

#include <algorithm>
#include <cstring>

namespace dsa::optim {

zeroone_adam_params partitioned_optimizer::zeroone_params() const {
  zeroone_adam_params p;
  set_compressed_params(p, cfg_, lr_, cfg_.weight_decay);
  p.var_freeze_step = cfg_.var_freeze_step;
  p.var_update_scaler = cfg_.var_update_scaler;
  p.local_step_scaler = cfg_.local_step_scaler;
  p.local_step_clipper = cfg_.local_step_clipper;
  p.bias_correction = cfg_.bias_correction;
  p.dummy_first_step = cfg_.dummy_first_step;
  return p;
}

// Phase B's start (or a resume in it): every rank's masters, momentum and variance
// partitions gathered whole in group order. The partition's masters stay the synchronised
// point (the anchor) and its momentum the last agreed one.
status partitioned_optimizer::zeroone_gather_whole(const onebit_partition_step& in, const float* master,
                                                   const float* m, const float* v) {
  for (const auto& [mine, whole] : {std::pair{master, &zo_p_}, std::pair{m, &whole_m_}, std::pair{v, &zo_v_}})
    DSA_TRY(gather_group_order(in, mine, whole->data()));
  std::fill(zo_u_.begin(), zo_u_.end(), 0.0f);
  zo_lrs_ = 0;
  zo_whole_valid_ = true;
  return {};
}

status partitioned_optimizer::write_local_working(const tensor& whole_working) const {
  DSA_TRY(check_flat(whole_working, "whole working", layout_.padded_numel(), rank_, true));
  for (std::size_t t = 0; t < layout_.tensors().size(); ++t) {
    const flat_tensor& ft = layout_.tensors()[t];
    void* to = static_cast<char*>(whole_working.raw_data()) + ft.offset * static_cast<std::int64_t>(dtype_size(whole_working.type()));
    cpu::cast(to, whole_working.type(), zo_p_.data() + group_offset_[t], dtype::f32, ft.numel);
  }
  return {};
}

status partitioned_optimizer::step_zeroone(const onebit_partition_step& in) {
  using namespace zeroone_math;
  const zeroone_adam_params p = zeroone_params();
  const std::int64_t lo = partition().lo;
  const auto& tensors = layout_.tensors();
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  const bool full = !compressed_next();
  DSA_ASSIGN_OR_RETURN(onebit_views views, onebit_begin(in));
  float *master = views.master, *m = views.m, *v = views.v, *grad = views.grad;
  const std::int64_t k = step_;
  if (p.dummy_first_step && k == 1) return dummy_exchange(in);
  const auto decay_of = [&](std::size_t t) { return tensors[t].decay ? p.weight_decay : 0.0f; };
  if (k <= last_variance_step(p)) {
    zo_sched_.begin(p, k);
    if (full) {
      for (const auto& piece : pieces_) {
        const std::int64_t off = piece.flat_offset - lo;
        full_moments(m + off, v + off, grad + off, piece.count, p.beta1, p.beta2);
      }
    } else {
      // Every rank's whole gradient, exchanged by group as the stage-0 shard does.
      std::vector<float> g(whole_m_.size());
      to_group_order(grad, g.data());
      for (const auto& grp : groups_) DSA_TRY(in.exchange(grp.name, g.data() + grp.offset, grp.numel, false));
      mask_zero(g.data());
      for (const auto& piece : pieces_)
        momentum(m + (piece.flat_offset - lo), g.data() + group_offset_[piece.tensor] + piece.tensor_offset,
                 piece.count, p.beta1);
    }
    const float a1 = correction1(p, k), a2 = correction2(p, zo_sched_.var_updates);
    for (const auto& piece : pieces_) {
      const std::int64_t off = piece.flat_offset - lo;
      update(master + off, m + off, v + off, piece.count, p, decay_of(piece.tensor), a1, a2);
    }
    zo_sched_.end(p, k);
    zo_whole_valid_ = false;
    return write_working(in.working);
  }
  // Phase B: this rank's own whole parameters move; every local_interval steps the ranks
  // agree again.
  if (!zo_whole_valid_) DSA_TRY(zeroone_gather_whole(in, master, m, v));
  for (std::size_t t = 0; t < tensors.size(); ++t)
    momentum(whole_m_.data() + group_offset_[t], grad + tensors[t].offset, tensors[t].numel, p.beta1);
  zo_lrs_ += p.lr;
  const float a1 = correction1(p, k), a2 = correction2(p, zo_sched_.var_updates);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const std::int64_t go = group_offset_[t];
    local_move(zo_p_.data() + go, whole_m_.data() + go, zo_v_.data() + go, zo_u_.data() + go, tensors[t].numel, p,
               decay_of(t), a1, a2);
  }
  if (zo_sched_.syncs(k)) {
    const auto n = static_cast<std::int64_t>(zo_u_.size());
    to_momentum_units(zo_u_.data(), zo_v_.data(), n, p.eps, a2);
    for (const auto& grp : groups_)
      DSA_TRY(in.exchange(grp.name, zo_u_.data() + grp.offset, grp.numel, !zo_errors_reset_));
    zo_errors_reset_ = true;
    mask_zero(zo_u_.data());
    rebuild_momentum(whole_m_.data(), zo_u_.data(), n, zo_lrs_, a1);
    for (const auto& piece : pieces_) {
      const std::int64_t off = piece.flat_offset - lo, go = group_offset_[piece.tensor] + piece.tensor_offset;
      resync(master + off, master + off, zo_u_.data() + go, zo_v_.data() + go, piece.count, p.eps, a2);
      std::memcpy(m + off, whole_m_.data() + go, at(piece.count) * sizeof(float)); // the agreed momentum
    }
    // Every rank's moved anchor: the whole parameters again the same everywhere.
    DSA_TRY(gather_group_order(in, master, zo_p_.data()));
    std::fill(zo_u_.begin(), zo_u_.end(), 0.0f);
    zo_lrs_ = 0;
  }
  zo_sched_.end(p, k);
  return write_local_working(in.whole_working);
}

} // namespace dsa::optim
