// 1-bit LAMB over a ZeRO partition; see partitioned_optimizer.hpp (step_onebit). Each step
// mirrors optim::onebit_lamb (onebit_lamb.cpp) on the stage-0 shard's groups: the same
// onebit_lamb_math functions on this rank's pieces, with whole-tensor norms from block sums
// that `sum` adds over the ranks and the factors' largest ratio from `max`.
#include "optim/partitioned_optimizer.hpp"

#include "optim/grad_clip.hpp"
#include "optim/onebit_adam.hpp"
#include "optim/onebit_lamb.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace dsa::optim {
namespace {

using namespace onebit_lamb_math;

onebit_lamb_params lamb_params(const optimizer_config& cfg, double lr, bool decay) {
  return onebit_lamb_params_of(cfg, lr, decay ? cfg.weight_decay : 0.0);
}

tensor floats(const std::vector<float>& v) {
  tensor t = tensor::empty({static_cast<std::int64_t>(v.size())}, dtype::f32);
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(float));
  return t;
}

} // namespace

status partitioned_optimizer::step_onebit_lamb(const onebit_partition_step& in) {
  const bool compressed = compressed_next();
  const std::int64_t size = layout_.partition_numel(), lo = partition().lo;
  const auto& tensors = layout_.tensors();
  DSA_ASSIGN_OR_RETURN(onebit_views views, onebit_begin(in));
  float *master = views.master, *m = views.m, *v = views.v, *grad = views.grad;
  const onebit_lamb_params base = lamb_params(cfg_, lr_, true);
  if (base.dummy_first_step && step_ == 1) return dummy_exchange(in); // the initialization step
  const auto [a1, a2] = corrections(base, step_);
  // Per piece: its tensor's block sums go to the tensor's blocks from the piece's first.
  auto block_at = [&](const flat_piece& piece) { return lamb_block_base_[piece.tensor] + piece.tensor_offset / lamb_block; };
  std::vector<double> sums(static_cast<std::size_t>(2 * lamb_blocks_), 0.0); // [p^2 or u0^2 | u^2]
  double* first = sums.data();
  double* second = sums.data() + lamb_blocks_;
  std::vector<std::vector<float>> u(pieces_.size()), u0;
  if (!compressed) {
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      const flat_piece& piece = pieces_[i];
      const std::int64_t at = piece.flat_offset - lo, n = piece.count;
      const onebit_lamb_params p = lamb_params(cfg_, lr_, tensors[piece.tensor].decay);
      onebit_math::warm_moments(m + at, v + at, grad + at, n, p.beta1, p.beta2);
      u[i].resize(static_cast<std::size_t>(n));
      direction(u[i].data(), m + at, v + at, master + at, n, a1, a2, p.eps, p.weight_decay);
      block_squares(master + at, n, first + block_at(piece));
      block_squares(u[i].data(), n, second + block_at(piece));
    }
    DSA_TRY(in.sum(sums));
    std::vector<float> trust_of(tensors.size(), 1.0f);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const std::int64_t blocks = blocks_of(tensors[t].numel), at = lamb_block_base_[t];
      const float c = trust(norm_of(first + at, blocks), norm_of(second + at, blocks), base);
      trust_of[t] = c;
      if (c != 1.0f) lamb_coeff_[t] = base.coeff_beta * lamb_coeff_[t] + (1.0f - base.coeff_beta) * c;
    }
    for (std::size_t i = 0; i < pieces_.size(); ++i)
      apply(master + (pieces_[i].flat_offset - lo), u[i].data(), pieces_[i].count, base.lr * trust_of[pieces_[i].tensor]);
    whole_m_valid_ = false;
    if (step_ >= onebit_math::first_local_step(cfg_.freeze_step, cfg_.dummy_first_step)) {
      // The fresh variance starts from the frozen one (corrected).
      std::copy(v, v + size, lamb_fresh_.begin());
      if (a2 != 1.0f)
        for (float& x : lamb_fresh_) x *= a2 * a2;
    }
    return write_working(in.working);
  }
  DSA_TRY(gather_momentum(in, m));
  if (lamb_scaling_.empty()) { // the first compressed step fixes each tensor's scaling
    std::vector<double> rms(tensors.size(), 0.0);
    double mean = 0; // summed in the stage-0 buffer's order: the decay group's tensors, then the others
    for (const bool decay : {true, false})
      for (std::size_t t = 0; t < tensors.size(); ++t) {
        if (tensors[t].decay != decay) continue;
        rms[t] = norm(whole_m_.data() + group_offset_[t], tensors[t].numel) / std::sqrt(static_cast<double>(tensors[t].numel));
        mean += rms[t] / static_cast<double>(tensors.size());
      }
    lamb_scaling_.assign(tensors.size(), 1.0f);
    for (std::size_t t = 0; t < tensors.size(); ++t) lamb_scaling_[t] = rms[t] > 0 ? static_cast<float>(mean / rms[t]) : 1.0f;
  }
  // m (the partition's, after the last exchange) is the previous momentum.
  std::vector<float> previous(m, m + size);
  for (std::size_t t = 0; t < tensors.size(); ++t)
    scaled_momentum(whole_m_.data() + group_offset_[t], grad + tensors[t].offset, tensors[t].numel, base.beta1,
                    lamb_scaling_[t]);
  for (const auto& g : groups_) DSA_TRY(in.exchange(g.name, whole_m_.data() + g.offset, g.numel, false));
  for (std::size_t t = 0; t < tensors.size(); ++t)
    unscale(whole_m_.data() + group_offset_[t], tensors[t].numel, lamb_scaling_[t]);
  mask_zero(whole_m_.data());
  std::vector<float> largest(tensors.size(), 0.0f);
  u0.resize(pieces_.size());
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const flat_piece& piece = pieces_[i];
    const std::int64_t at = piece.flat_offset - lo, n = piece.count;
    std::memcpy(m + at, whole_m_.data() + group_offset_[piece.tensor] + piece.tensor_offset,
                static_cast<std::size_t>(n) * sizeof(float));
    const onebit_lamb_params p = lamb_params(cfg_, lr_, tensors[piece.tensor].decay);
    u0[i].resize(static_cast<std::size_t>(n));
    u[i].resize(static_cast<std::size_t>(n));
    largest[piece.tensor] = fresh_step(lamb_fresh_.data() + at, u0[i].data(), u[i].data(), m + at, previous.data() + at,
                                       v + at, master + at, n, p, a1, a2, largest[piece.tensor]);
    block_squares(u0[i].data(), n, first + block_at(piece));
    block_squares(u[i].data(), n, second + block_at(piece));
  }
  DSA_TRY(in.max(largest));
  if (cfg_.weight_decay > 0) DSA_TRY(in.sum(sums));
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const onebit_lamb_params p = lamb_params(cfg_, lr_, tensors[t].decay);
    const std::int64_t blocks = blocks_of(tensors[t].numel), at = lamb_block_base_[t];
    const bool decay = p.weight_decay > 0;
    lamb_factor_[t] = factor(largest[t], decay ? norm_of(first + at, blocks) : 0.0,
                             decay ? norm_of(second + at, blocks) : 0.0, lamb_factor_[t], p);
  }
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const std::size_t t = pieces_[i].tensor;
    apply(master + (pieces_[i].flat_offset - lo), u[i].data(), pieces_[i].count,
          base.lr * lamb_coeff_[t] * lamb_factor_[t]);
  }
  return write_working(in.working);
}

std::map<std::string, tensor> partitioned_optimizer::lamb_state(const float* whole_fresh) const {
  std::map<std::string, tensor> out{{"coeff", floats(lamb_coeff_)}, {"factor", floats(lamb_factor_)},
                                    {"scaling", floats(lamb_scaling_)}};
  if (whole_fresh)
    for (const auto& t : layout_.tensors()) {
      tensor x = tensor::empty(t.shape, dtype::f32);
      std::memcpy(x.raw_data(), whole_fresh + t.offset, static_cast<std::size_t>(t.numel) * sizeof(float));
      out[t.name + ".exp_avg_sq_fresh"] = x;
    }
  return out;
}

status partitioned_optimizer::load_lamb_state(const std::map<std::string, tensor>& state) {
  const auto& tensors = layout_.tensors();
  auto read = [&](const std::string& name, std::size_t n, bool may_be_empty,
                  std::vector<float>& into) -> status {
    auto it = state.find(name);
    if (it == state.end() || it->second.type() != dtype::f32 ||
        !(it->second.numel() == static_cast<std::int64_t>(n) || (may_be_empty && it->second.numel() == 0)))
      return make_error(errc::invalid_argument, "1-bit LAMB state: '{}' missing or not {} f32 values{}", name, n,
                        it == state.end() ? "" : ", got " + it->second.describe());
    const float* p = it->second.data<float>();
    into.assign(p, p + it->second.numel());
    return {};
  };
  DSA_TRY(read("coeff", tensors.size(), false, lamb_coeff_));
  DSA_TRY(read("factor", tensors.size(), false, lamb_factor_));
  DSA_TRY(read("scaling", tensors.size(), true, lamb_scaling_));
  std::fill(lamb_fresh_.begin(), lamb_fresh_.end(), 0.0f);
  if (!compressed_next()) return {};
  const std::int64_t lo = partition().lo;
  const bool saved = std::any_of(tensors.begin(), tensors.end(),
                                 [&](const flat_tensor& t) { return state.count(t.name + ".exp_avg_sq_fresh") > 0; });
  if (!saved) {
    // Saved before the freeze that this run's settings put earlier: the fresh variance
    // starts from the variance now, as at a freeze (and as optim::onebit_lamb::load).
    partition_state st = this->state();
    const float* v = st.exp_avg_sq.data<float>();
    const float a2 = corrections(lamb_params(cfg_, lr_, true), step_).second;
    for (std::size_t i = 0; i < lamb_fresh_.size(); ++i) lamb_fresh_[i] = v[i] * (a2 * a2);
    return {};
  }
  for (const auto& piece : pieces_) {
    const auto& t = tensors[piece.tensor];
    auto it = state.find(t.name + ".exp_avg_sq_fresh");
    if (it == state.end() || it->second.type() != dtype::f32 || it->second.numel() != t.numel)
      return make_error(errc::invalid_argument, "1-bit LAMB state: '{}.exp_avg_sq_fresh' missing or not {} f32 values",
                        t.name, t.numel);
    std::memcpy(lamb_fresh_.data() + (piece.flat_offset - lo), it->second.data<float>() + piece.tensor_offset,
                static_cast<std::size_t>(piece.count) * sizeof(float));
  }
  return {};
}

} // namespace dsa::optim
