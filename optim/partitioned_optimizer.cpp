// A ZeRO partition's Adam / AdamW / LAMB update, piece by piece with the whole-tensor kernels.
#include "optim/partitioned_optimizer.hpp"

#include "kernels/cpu/adam.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/lamb.hpp"
#include "optim/grad_clip.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace dsa::optim {
namespace {

bool is_float(dtype t) { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16; }

status check_flat(const tensor& t, const char* what, std::int64_t n, std::uint32_t rank, bool any_float) {
  const bool type_ok = any_float ? is_float(t.type()) : t.type() == dtype::f32;
  if (!t.defined() || !type_ok || !t.dev().is_cpu() || !t.is_contiguous() || t.numel() != n)
    return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: {} must be a contiguous CPU {} tensor of {} elements, got {}",
                      rank, what, any_float ? "f32/f16/bf16" : "f32", n, t.defined() ? t.describe() : "undefined");
  return {};
}

// The flat ranges of a partition not covered by its pieces, relative to the partition start.
std::vector<flat_range> padding_of(const std::vector<flat_piece>& pieces, const flat_range& part) {
  std::vector<flat_range> out;
  std::int64_t at = part.lo;
  for (const auto& p : pieces) {
    if (p.flat_offset > at) out.push_back({at - part.lo, p.flat_offset - part.lo});
    at = p.flat_offset + p.count;
  }
  if (part.hi > at) out.push_back({at - part.lo, part.hi - part.lo});
  return out;
}

} // namespace

partitioned_optimizer::partitioned_optimizer(const optimizer_config& cfg, flat_layout layout, std::uint32_t rank)
    : cfg_(cfg), layout_(std::move(layout)), rank_(rank), lr_(cfg.lr) {
  pieces_ = layout_.pieces(layout_.partition(rank_));
}

expected<partitioned_optimizer> partitioned_optimizer::create(const optimizer_config& cfg, flat_layout layout,
                                                              std::uint32_t rank, const std::vector<tensor>& initial) {
  if (rank >= layout.ranks())
    return make_error(errc::invalid_argument, "partitioned optimizer: rank {} of {} ranks", rank, layout.ranks());
  const auto& tensors = layout.tensors();
  if (initial.size() != tensors.size())
    return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: {} initial tensors for {} parameters", rank,
                      initial.size(), tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const tensor& t = initial[i];
    if (!t.defined() || !is_float(t.type()) || !t.dev().is_cpu() || !t.is_contiguous() || t.shape() != tensors[i].shape)
      return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: parameter '{}' must be a contiguous CPU float tensor of shape {}, got {}",
                        rank, tensors[i].name, shape_string(tensors[i].shape), t.defined() ? t.describe() : "undefined");
  }
  const std::int64_t size = layout.partition_numel();
  partition_state state{tensor::zeros({size}, dtype::f32), tensor::zeros({size}, dtype::f32),
                        tensor::zeros({size}, dtype::f32), 0};
  const std::int64_t lo = layout.partition(rank).lo;
  float* master = state.master.data<float>();
  for (const auto& p : layout.pieces(layout.partition(rank))) {
    const tensor& t = initial[p.tensor];
    const auto* src = static_cast<const char*>(t.raw_data()) + p.tensor_offset * static_cast<std::int64_t>(dtype_size(t.type()));
    cpu::cast(master + (p.flat_offset - lo), dtype::f32, src, t.type(), p.count);
  }
  return create(cfg, std::move(layout), rank, std::move(state));
}

expected<partitioned_optimizer> partitioned_optimizer::create(const optimizer_config& cfg, flat_layout layout,
                                                              std::uint32_t rank, partition_state state) {
  if (rank >= layout.ranks())
    return make_error(errc::invalid_argument, "partitioned optimizer: rank {} of {} ranks", rank, layout.ranks());
  if (cfg.type == optimizer_type::lamb && layout.alignment() % cpu::lamb_norm_block != 0)
    return make_error(errc::invalid_argument,
                      "partitioned optimizer: LAMB needs the flat layout's alignment to be a multiple of {} elements "
                      "(the norm block), got {}", cpu::lamb_norm_block, layout.alignment());
  const std::int64_t size = layout.partition_numel();
  DSA_TRY(check_flat(state.master, "master", size, rank, false));
  DSA_TRY(check_flat(state.exp_avg, "exp_avg", size, rank, false));
  DSA_TRY(check_flat(state.exp_avg_sq, "exp_avg_sq", size, rank, false));
  if (state.step < 0)
    return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: negative step count {}", rank, state.step);
  partitioned_optimizer opt(cfg, std::move(layout), rank);
  for (const auto& pad : padding_of(opt.pieces_, opt.partition()))
    for (const tensor* t : {&state.master, &state.exp_avg, &state.exp_avg_sq}) {
      const float* x = t->data<float>();
      for (std::int64_t i = pad.lo; i < pad.hi; ++i)
        if (x[i] != 0.0f || std::signbit(x[i]))
          return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: padding element {} of the partition is {}, not 0",
                            rank, i, x[i]);
    }
  opt.state_ = std::move(state);
  DSA_TRY(opt.init_scratch());
  return opt;
}

status partitioned_optimizer::init_scratch() {
  if (cfg_.type != optimizer_type::lamb) return {};
  const auto& tensors = layout_.tensors();
  exchange_at_.assign(tensors.size(), -1);
  std::int64_t exchange = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t)
    if (layout_.spans_ranks(t)) {
      exchange_at_[t] = exchange;
      exchange += 2 * cpu::lamb_norm_blocks(tensors[t].numel);
    }
  exchange_.assign(static_cast<std::size_t>(exchange), 0.0);
  std::int64_t local = 0;
  for (const auto& p : pieces_) {
    if (p.tensor_offset % cpu::lamb_norm_block != 0)
      return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: piece of '{}' starts at element {}, not on a norm block",
                        rank_, tensors[p.tensor].name, p.tensor_offset);
    if (exchange_at_[p.tensor] >= 0) {
      piece_sums_at_.push_back(exchange_at_[p.tensor] + 2 * (p.tensor_offset / cpu::lamb_norm_block));
    } else {
      piece_sums_at_.push_back(local);
      local += 2 * cpu::lamb_norm_blocks(p.count);
    }
  }
  local_.assign(static_cast<std::size_t>(local), 0.0);
  return {};
}

void partitioned_optimizer::set_betas(double beta1, double beta2) {
  cfg_.beta1 = beta1;
  cfg_.beta2 = beta2;
}

status partitioned_optimizer::step(const partition_step& in) {
  const std::int64_t size = layout_.partition_numel();
  DSA_TRY(check_flat(in.grad, "grad", size, rank_, false));
  if (in.working.defined()) DSA_TRY(check_flat(in.working, "working", size, rank_, true));
  float* grad = in.grad.data<float>();
  if (in.grad_scale != 1.0) scale_in_place(grad, in.grad_scale, size);
  const bool half_out = in.working.defined() && in.working.type() != dtype::f32;
  std::uint16_t* half = half_out ? in.working.data<std::uint16_t>() : nullptr;
  const dtype half_type = half_out ? in.working.type() : dtype::f16;
  ++state_.step;
  if (cfg_.type == optimizer_type::lamb) {
    DSA_TRY(step_lamb(grad, half, half_type, in.combine));
  } else {
    step_adam(grad, half, half_type);
  }
  if (half_out) zero_padding(in.working);
  else if (in.working.defined()) std::memcpy(in.working.raw_data(), state_.master.raw_data(), state_.master.nbytes());
  return {};
}

void partitioned_optimizer::step_adam(float* grad, std::uint16_t* half, dtype half_type) {
  const std::int64_t lo = partition().lo;
  float* master = state_.master.data<float>();
  float* m = state_.exp_avg.data<float>();
  float* v = state_.exp_avg_sq.data<float>();
  for (const auto& piece : pieces_) {
    const std::int64_t at = piece.flat_offset - lo;
    cpu::adam_params p;
    p.lr = static_cast<float>(lr_);
    p.beta1 = static_cast<float>(cfg_.beta1);
    p.beta2 = static_cast<float>(cfg_.beta2);
    p.eps = static_cast<float>(cfg_.eps);
    p.weight_decay = layout_.tensors()[piece.tensor].decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    p.mode = cfg_.decoupled_decay() ? cpu::adam_mode::adamw : cpu::adam_mode::adam;
    p.correction = cfg_.bias_correction ? cpu::bias_correction::on : cpu::bias_correction::off;
    p.step = state_.step;
    cpu::adam_update(master + at, m + at, v + at, grad + at, half ? half + at : nullptr, half_type, p, piece.count);
  }
}

status partitioned_optimizer::step_lamb(float* grad, std::uint16_t* half, dtype half_type,
                                        const norm_combine& combine) {
  const std::int64_t lo = partition().lo;
  float* master = state_.master.data<float>();
  float* m = state_.exp_avg.data<float>();
  float* v = state_.exp_avg_sq.data<float>();
  const auto& tensors = layout_.tensors();
  std::vector<cpu::lamb_params> params(pieces_.size());
  std::fill(exchange_.begin(), exchange_.end(), 0.0);
  // Pass one: moments, update direction (into grad) and block sums of every piece.
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const flat_piece& piece = pieces_[i];
    cpu::lamb_params& p = params[i];
    p.lr = static_cast<float>(lr_);
    p.beta1 = static_cast<float>(cfg_.beta1);
    p.beta2 = static_cast<float>(cfg_.beta2);
    p.eps = static_cast<float>(cfg_.eps);
    p.weight_decay = tensors[piece.tensor].decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    p.max_coeff = static_cast<float>(cfg_.max_coeff);
    p.min_coeff = static_cast<float>(cfg_.min_coeff);
    p.correction = cfg_.bias_correction ? cpu::bias_correction::on : cpu::bias_correction::off;
    p.step = state_.step;
    const std::int64_t at = piece.flat_offset - lo;
    double* sums = (exchange_at_[piece.tensor] >= 0 ? exchange_.data() : local_.data()) + piece_sums_at_[i];
    cpu::lamb_first_pass(m + at, v + at, grad + at, sums, master + at, grad + at, p, piece.count);
  }
  // The block sums of tensors spanning ranks, from every rank.
  std::vector<double> combined;
  if (!exchange_.empty()) {
    if (!combine)
      return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: LAMB needs a combine function", rank_);
    auto summed = combine(exchange_);
    if (!summed)
      return make_error(summed.err().code, "partitioned optimizer, rank {}: exchanging LAMB norms: {}", rank_,
                        summed.err().message);
    if (summed->size() != exchange_.size())
      return make_error(errc::protocol, "partitioned optimizer, rank {}: combine returned {} LAMB norm sums, expected {}",
                        rank_, summed->size(), exchange_.size());
    combined = std::move(*summed);
  }
  // Pass two: each tensor's trust ratio from all of its blocks, in block order.
  lamb_coeffs_.clear();
  lamb_sums_.clear();
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const flat_piece& piece = pieces_[i];
    double totals[2] = {0.0, 0.0};
    if (exchange_at_[piece.tensor] >= 0)
      cpu::lamb_norm_totals(totals, combined.data() + exchange_at_[piece.tensor],
                            cpu::lamb_norm_blocks(tensors[piece.tensor].numel));
    else
      cpu::lamb_norm_totals(totals, local_.data() + piece_sums_at_[i], cpu::lamb_norm_blocks(piece.count));
    const float coeff = cpu::lamb_trust_ratio(totals[0], totals[1], params[i]);
    lamb_coeffs_.push_back(coeff);
    lamb_sums_.insert(lamb_sums_.end(), {totals[0], totals[1]});
    const std::int64_t at = piece.flat_offset - lo;
    cpu::lamb_second_pass(master + at, half ? half + at : nullptr, grad + at, half_type, coeff, params[i], piece.count);
  }
  return {};
}

void partitioned_optimizer::zero_padding(const tensor& working) const {
  const std::size_t width = dtype_size(working.type());
  auto* out = static_cast<char*>(working.raw_data());
  for (const auto& pad : padding_of(pieces_, partition()))
    std::memset(out + pad.lo * static_cast<std::int64_t>(width), 0, static_cast<std::size_t>(pad.size()) * width);
}

status partitioned_optimizer::write_working(const tensor& working) const {
  DSA_TRY(check_flat(working, "working", layout_.partition_numel(), rank_, true));
  cpu::cast(working.raw_data(), working.type(), state_.master.raw_data(), dtype::f32, layout_.partition_numel());
  return {};
}

double partitioned_optimizer::grad_sum_of_squares(const tensor& grad) const {
  DSA_CHECK(grad.type() == dtype::f32 && grad.is_contiguous() && grad.numel() == layout_.partition_numel(),
            "grad_sum_of_squares: rank {} needs f32[{}], got {}", rank_, layout_.partition_numel(), grad.describe());
  const std::int64_t lo = partition().lo;
  const float* g = grad.data<float>();
  double sum = 0.0;
  for (const auto& piece : pieces_) sum += sum_of_squares(g + (piece.flat_offset - lo), dtype::f32, piece.count);
  return sum;
}

std::vector<double> partitioned_optimizer::add_gathered(const std::vector<double>& gathered, std::uint32_t ranks) {
  DSA_CHECK(ranks >= 1 && gathered.size() % ranks == 0, "add_gathered: {} values over {} ranks", gathered.size(), ranks);
  const std::size_t per_rank = gathered.size() / ranks;
  std::vector<double> out(gathered.begin(), gathered.begin() + static_cast<std::ptrdiff_t>(per_rank));
  for (std::uint32_t r = 1; r < ranks; ++r)
    for (std::size_t i = 0; i < per_rank; ++i) out[i] += gathered[r * per_rank + i];
  return out;
}

std::int64_t partitioned_optimizer::state_bytes() const {
  return static_cast<std::int64_t>(state_.master.nbytes() + state_.exp_avg.nbytes() + state_.exp_avg_sq.nbytes());
}

std::int64_t partitioned_optimizer::scratch_bytes() const {
  return static_cast<std::int64_t>((local_.size() + exchange_.size()) * sizeof(double));
}

} // namespace dsa::optim
