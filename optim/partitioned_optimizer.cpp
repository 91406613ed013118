// A ZeRO partition's Adam / AdamW / LAMB update, piece by piece with the whole-tensor kernels.
#include "optim/partitioned_optimizer.hpp"

#include "core/file_backed.hpp"
#include "kernels/cpu/adam.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/lamb.hpp"
#include "optim/grad_clip.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace dsa::optim {
namespace {

bool is_float(dtype t) { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16; }

} // namespace

status check_flat(const tensor& t, const char* what, std::int64_t n, std::uint32_t rank, bool any_float) {
  const bool type_ok = any_float ? is_float(t.type()) : t.type() == dtype::f32;
  if (!t.defined() || !type_ok || !t.dev().is_cpu() || !t.is_contiguous() || t.numel() != n)
    return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: {} must be a contiguous CPU {} tensor of {} elements, got {}",
                      rank, what, any_float ? "f32/f16/bf16" : "f32", n, t.defined() ? t.describe() : "undefined");
  return {};
}

namespace {

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
                                                              std::uint32_t rank, const std::vector<tensor>& initial,
                                                              std::unique_ptr<chunked_state> store) {
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
  if (!store) {
    partition_state state{tensor::zeros({size}, dtype::f32), tensor::zeros({size}, dtype::f32),
                          tensor::zeros({size}, dtype::f32), 0};
    store = std::make_unique<resident_state>(state.master, state.exp_avg, state.exp_avg_sq);
  }
  if (store->numel() != size)
    return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: the state store holds {} elements, the partition {}",
                      rank, store->numel(), size);
  // Chunk by chunk: the masters from this rank's pieces, zeros elsewhere, moments 0.
  const std::int64_t lo = layout.partition(rank).lo;
  const auto pieces = layout.pieces(layout.partition(rank));
  DSA_TRY(store->sweep(0, all_arrays, [&](const state_chunk& c) -> status {
    const auto n = static_cast<std::size_t>(c.hi - c.lo);
    for (unsigned a = 0; a < state_arrays; ++a) std::memset(c.arrays[a], 0, n * sizeof(float));
    for (const auto& p : pieces) {
      const std::int64_t from = std::max(p.flat_offset - lo, c.lo), to = std::min(p.flat_offset - lo + p.count, c.hi);
      if (from >= to) continue;
      const tensor& t = initial[p.tensor];
      const std::int64_t element = p.tensor_offset + (from - (p.flat_offset - lo));
      const auto* src = static_cast<const char*>(t.raw_data()) + element * static_cast<std::int64_t>(dtype_size(t.type()));
      cpu::cast(c.arrays[master_array] + (from - c.lo), dtype::f32, src, t.type(), to - from);
      DSA_TRY(try_page_out(src, static_cast<std::size_t>(to - from) * dtype_size(t.type()))); // a stage built in a file
    }
    return {};
  }));
  return finish_create(cfg, std::move(layout), rank, std::move(store), 0);
}

expected<partitioned_optimizer> partitioned_optimizer::create(const optimizer_config& cfg, flat_layout layout,
                                                              std::uint32_t rank, partition_state state,
                                                              std::unique_ptr<chunked_state> store) {
  if (rank >= layout.ranks())
    return make_error(errc::invalid_argument, "partitioned optimizer: rank {} of {} ranks", rank, layout.ranks());
  const std::int64_t size = layout.partition_numel();
  DSA_TRY(check_flat(state.master, "master", size, rank, false));
  DSA_TRY(check_flat(state.exp_avg, "exp_avg", size, rank, false));
  DSA_TRY(check_flat(state.exp_avg_sq, "exp_avg_sq", size, rank, false));
  if (state.step < 0)
    return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: negative step count {}", rank, state.step);
  for (const auto& pad : padding_of(layout.pieces(layout.partition(rank)), layout.partition(rank)))
    for (const tensor* t : {&state.master, &state.exp_avg, &state.exp_avg_sq}) {
      const float* x = t->data<float>();
      for (std::int64_t i = pad.lo; i < pad.hi; ++i)
        if (x[i] != 0.0f || std::signbit(x[i]))
          return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: padding element {} of the partition is {}, not 0",
                            rank, i, x[i]);
    }
  if (store) {
    if (store->numel() != size)
      return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: the state store holds {} elements, the partition {}",
                        rank, store->numel(), size);
    DSA_TRY(write_arrays(*store, {state.master, state.exp_avg, state.exp_avg_sq}));
  } else {
    store = std::make_unique<resident_state>(std::move(state.master), std::move(state.exp_avg), std::move(state.exp_avg_sq));
  }
  return finish_create(cfg, std::move(layout), rank, std::move(store), state.step);
}

expected<partitioned_optimizer> partitioned_optimizer::create(const optimizer_config& cfg, flat_layout layout,
                                                              std::uint32_t rank, std::int64_t step,
                                                              const state_fill& fill,
                                                              std::unique_ptr<chunked_state> store) {
  if (rank >= layout.ranks())
    return make_error(errc::invalid_argument, "partitioned optimizer: rank {} of {} ranks", rank, layout.ranks());
  if (!store || store->numel() != layout.partition_numel())
    return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: a state filled by ranges needs a store of "
                      "{} elements", rank, layout.partition_numel());
  if (step < 0)
    return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: negative step count {}", rank, step);
  DSA_TRY(store->sweep(0, all_arrays, [&](const state_chunk& c) -> status {
    float* const arrays[3] = {c.arrays[master_array], c.arrays[exp_avg_array], c.arrays[exp_avg_sq_array]};
    return fill(c.lo, c.hi, arrays);
  }));
  return finish_create(cfg, std::move(layout), rank, std::move(store), step);
}

expected<partitioned_optimizer> partitioned_optimizer::finish_create(const optimizer_config& cfg, flat_layout layout,
                                                                     std::uint32_t rank,
                                                                     std::unique_ptr<chunked_state> store,
                                                                     std::int64_t step) {
  const bool onebit = cfg.compressed(); // 1-bit Adam, 0/1 Adam, 1-bit LAMB
  if (onebit && !dynamic_cast<const resident_state*>(store.get()))
    return make_error(errc::invalid_argument, "partitioned optimizer: {} keeps its state in memory, not in {}",
                      optimizer_name(cfg.type), store->where());
  if (cfg.type == optimizer_type::onebit_lamb && layout.alignment() % 2048 != 0)
    return make_error(errc::invalid_argument,
                      "partitioned optimizer: 1-bit LAMB needs the layout's alignment to be a multiple of 2048 "
                      "elements (its norm blocks), got {}", layout.alignment());
  if (cfg.type == optimizer_type::lamb && layout.alignment() % cpu::lamb_norm_block != 0)
    return make_error(errc::invalid_argument,
                      "partitioned optimizer: LAMB needs the flat layout's alignment to be a multiple of {} elements "
                      "(the norm block), got {}", cpu::lamb_norm_block, layout.alignment());
  // Chunks must start on alignment boundaries so LAMB's norm blocks stay whole.
  if (store->chunks() > 1 && store->chunk_numel() % layout.alignment() != 0)
    return make_error(errc::invalid_argument,
                      "partitioned optimizer, rank {}: state chunks of {} elements are not a multiple of the layout's "
                      "alignment ({} elements)", rank, store->chunk_numel(), layout.alignment());
  partitioned_optimizer opt(cfg, std::move(layout), rank);
  opt.store_ = std::move(store);
  opt.step_ = step;
  DSA_TRY(opt.init_scratch());
  if (onebit) DSA_TRY(opt.init_onebit());
  opt.store_->prefetch(all_arrays);
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

template <class Fn>
void partitioned_optimizer::each_piece_in(const state_chunk& c, Fn&& fn) const {
  const std::int64_t lo = partition().lo;
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const flat_piece& p = pieces_[i];
    const std::int64_t from = std::max(p.flat_offset - lo, c.lo), to = std::min(p.flat_offset - lo + p.count, c.hi);
    if (from >= to) continue;
    flat_piece part = p;
    part.tensor_offset = p.tensor_offset + (from - (p.flat_offset - lo));
    part.flat_offset = lo + from;
    part.count = to - from;
    fn(i, part);
  }
}

// The updated working weights of a step: written into a whole (partition_numel) tensor at
// their partition offsets, or into a scratch window handed to a sink once full. A chunk
// of the state is visited in windows of at most window() elements; whole: one window.
class partitioned_optimizer::working_out {
public:
  working_out() = default; // nothing to write
  explicit working_out(tensor whole) : whole_(std::move(whole)) {}
  working_out(working_sink sink, dtype type, std::int64_t window)
      : sink_(std::move(sink)), scratch_(tensor::zeros({std::max<std::int64_t>(window, 1)}, type)) {}

  bool wanted() const { return whole_.defined() || sink_; }
  dtype type() const { return whole_.defined() ? whole_.type() : scratch_.type(); }
  bool half() const { return wanted() && type() != dtype::f32; }
  std::int64_t window(std::int64_t chunk) const { return sink_ ? scratch_.numel() : std::max<std::int64_t>(chunk, 1); }
  // Element `at` of the partition, in a window starting at `lo`.
  void* at(std::int64_t lo, std::int64_t at) {
    if (!wanted()) return nullptr;
    auto* base = static_cast<std::byte*>(whole_.defined() ? whole_.raw_data() : scratch_.raw_data());
    const std::int64_t i = whole_.defined() ? at : at - lo;
    return base + static_cast<std::size_t>(i) * dtype_size(type());
  }
  std::uint16_t* half_at(std::int64_t lo, std::int64_t i) { return half() ? static_cast<std::uint16_t*>(at(lo, i)) : nullptr; }
  // A window starts: a sink's scratch is zeroed (the kernels write pieces only, padding stays 0).
  void begin(std::int64_t lo, std::int64_t hi) {
    if (sink_) std::memset(scratch_.raw_data(), 0, static_cast<std::size_t>(hi - lo) * dtype_size(type()));
  }
  // The masters of the window, when the working weights are f32 (they are the masters).
  void copy_masters(std::int64_t lo, std::int64_t hi, const float* master) {
    if (wanted() && !half()) std::memcpy(at(lo, lo), master, static_cast<std::size_t>(hi - lo) * sizeof(float));
  }
  void cast_masters(std::int64_t lo, std::int64_t hi, const float* master) {
    if (wanted()) cpu::cast(at(lo, lo), type(), master, dtype::f32, hi - lo);
  }
  status end(std::int64_t lo, std::int64_t hi) { return sink_ ? sink_(scratch_.slice_rows(0, hi - lo)) : status{}; }
  const tensor& whole() const { return whole_; }

private:
  tensor whole_;
  working_sink sink_;
  tensor scratch_;
};

namespace {
// Elements [lo, hi) of a chunk, as a chunk of their own.
state_chunk window_of(const state_chunk& c, std::int64_t lo, std::int64_t hi) {
  state_chunk w = c;
  w.lo = lo;
  w.hi = hi;
  for (unsigned a = 0; a < state_arrays; ++a)
    if (c.arrays[a]) w.arrays[a] = c.arrays[a] + (lo - c.lo);
  return w;
}

// fn(window) over a chunk's windows of at most `size` elements, stopping at an error.
template <class Fn>
status each_window(const state_chunk& c, std::int64_t size, Fn&& fn) {
  for (std::int64_t lo = c.lo; lo < c.hi; lo += size) DSA_TRY(fn(window_of(c, lo, std::min(c.hi, lo + size))));
  return {};
}
} // namespace

status partitioned_optimizer::step(const partition_step& in) {
  if (cfg_.compressed())
    return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: {} steps with step_onebit", rank_,
                      optimizer_name(cfg_.type));
  const std::int64_t size = layout_.partition_numel();
  DSA_TRY(check_flat(in.grad, "grad", size, rank_, false));
  if (in.working.defined()) DSA_TRY(check_flat(in.working, "working", size, rank_, true));
  if (in.working.defined() && in.sink)
    return make_error(errc::invalid_argument, "partitioned optimizer, rank {}: both a working tensor and a sink", rank_);
  if (in.ready && (cfg_.type == optimizer_type::lamb || in.grad_scale != 1.0 || in.sink))
    return make_error(errc::invalid_argument,
                      "partitioned optimizer, rank {}: a streamed update needs Adam, no gradient scaling and no sink", rank_);
  float* grad = in.grad.data<float>();
  // LAMB scales the whole partition first; Adam scales each window as it updates it (the
  // same products, one pass over a gradient partition that lives in a file).
  if (in.grad_scale != 1.0 && cfg_.type == optimizer_type::lamb) scale_in_place(grad, in.grad_scale, size);
  working_out out = in.sink ? working_out(in.sink, in.sink_type, in.sink_window) : working_out(in.working);
  ++step_;
  if (cfg_.type == optimizer_type::lamb) {
    DSA_TRY(step_lamb(grad, out, in.combine));
  } else {
    DSA_TRY(step_adam(grad, out, in));
  }
  if (out.half() && out.whole().defined()) zero_padding(out.whole());
  store_->prefetch(all_arrays); // the next step's first chunks, read while the stages compute
  return {};
}

status partitioned_optimizer::step_adam(float* grad, working_out& out, const partition_step& in) {
  const std::int64_t lo = partition().lo;
  // A gradient partition in a file (core/file_backed.hpp) is read a file-backed window at a
  // time at most, whatever the state's chunks (elementwise: the same values).
  const std::int64_t grad_window = is_file_backed(grad, sizeof(float))
                                       ? file_backed_window_bytes() / static_cast<std::int64_t>(sizeof(float))
                                       : std::numeric_limits<std::int64_t>::max();
  return store_->sweep_when(all_arrays, all_arrays, in.ready, [&](const state_chunk& chunk) -> status {
    return each_window(chunk, std::min(grad_window, out.window(chunk.hi - chunk.lo)), [&](const state_chunk& c) -> status {
      out.begin(c.lo, c.hi);
      if (in.grad_scale != 1.0) scale_in_place(grad + c.lo, in.grad_scale, c.hi - c.lo);
      each_piece_in(c, [&](std::size_t, const flat_piece& piece) {
        const std::int64_t at = piece.flat_offset - lo; // in the partition
        const std::int64_t in_chunk = at - c.lo;
        cpu::adam_params p;
        p.lr = static_cast<float>(lr_);
        p.beta1 = static_cast<float>(cfg_.beta1);
        p.beta2 = static_cast<float>(cfg_.beta2);
        p.eps = static_cast<float>(cfg_.eps);
        p.weight_decay = layout_.tensors()[piece.tensor].decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
        p.mode = cfg_.decoupled_decay() ? cpu::adam_mode::adamw : cpu::adam_mode::adam;
        p.correction = cfg_.bias_correction ? cpu::bias_correction::on : cpu::bias_correction::off;
        p.step = step_;
        cpu::adam_update(c.arrays[master_array] + in_chunk, c.arrays[exp_avg_array] + in_chunk,
                         c.arrays[exp_avg_sq_array] + in_chunk, grad + at, out.half_at(c.lo, at), out.type(), p,
                         piece.count);
      });
      out.copy_masters(c.lo, c.hi, c.arrays[master_array]);
      // A gradient partition in a file (file_backed.hpp) leaves memory window by window.
      DSA_TRY(try_page_out(grad + c.lo, static_cast<std::size_t>(c.hi - c.lo) * sizeof(float)));
      return out.end(c.lo, c.hi);
    });
  });
}

status partitioned_optimizer::step_lamb(float* grad, working_out& out, const norm_combine& combine) {
  const std::int64_t lo = partition().lo;
  const auto& tensors = layout_.tensors();
  std::vector<cpu::lamb_params> params(pieces_.size());
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    cpu::lamb_params& p = params[i];
    p.lr = static_cast<float>(lr_);
    p.beta1 = static_cast<float>(cfg_.beta1);
    p.beta2 = static_cast<float>(cfg_.beta2);
    p.eps = static_cast<float>(cfg_.eps);
    p.weight_decay = tensors[pieces_[i].tensor].decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    p.max_coeff = static_cast<float>(cfg_.max_coeff);
    p.min_coeff = static_cast<float>(cfg_.min_coeff);
    p.correction = cfg_.bias_correction ? cpu::bias_correction::on : cpu::bias_correction::off;
    p.step = step_;
  }
  std::fill(exchange_.begin(), exchange_.end(), 0.0);
  // Pass one, chunk by chunk: moments, update direction (into grad) and the block sums
  // (a part of a piece starts on a norm block: chunks and pieces are aligned).
  DSA_TRY(store_->sweep(all_arrays, array_bit(exp_avg_array) | array_bit(exp_avg_sq_array),
                        [&](const state_chunk& c) -> status {
    each_piece_in(c, [&](std::size_t i, const flat_piece& part) {
      const std::int64_t at = part.flat_offset - lo, in_chunk = at - c.lo;
      const std::int64_t block = (part.tensor_offset - pieces_[i].tensor_offset) / cpu::lamb_norm_block;
      double* sums = (exchange_at_[part.tensor] >= 0 ? exchange_.data() : local_.data()) + piece_sums_at_[i] + 2 * block;
      cpu::lamb_first_pass(c.arrays[exp_avg_array] + in_chunk, c.arrays[exp_avg_sq_array] + in_chunk, grad + at, sums,
                           c.arrays[master_array] + in_chunk, grad + at, params[i], part.count);
    });
    return {};
  }));
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
  // Each tensor's trust ratio from all of its blocks, in block order.
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
    lamb_coeffs_.push_back(cpu::lamb_trust_ratio(totals[0], totals[1], params[i]));
    lamb_sums_.insert(lamb_sums_.end(), {totals[0], totals[1]});
  }
  // Pass two, chunk by chunk: the masters (and half copies) move along the update.
  return store_->sweep(array_bit(master_array), array_bit(master_array), [&](const state_chunk& chunk) -> status {
    return each_window(chunk, out.window(chunk.hi - chunk.lo), [&](const state_chunk& c) -> status {
      out.begin(c.lo, c.hi);
      each_piece_in(c, [&](std::size_t i, const flat_piece& part) {
        const std::int64_t at = part.flat_offset - lo, in_chunk = at - c.lo;
        cpu::lamb_second_pass(c.arrays[master_array] + in_chunk, out.half_at(c.lo, at), grad + at, out.type(),
                              lamb_coeffs_[i], params[i], part.count);
      });
      out.copy_masters(c.lo, c.hi, c.arrays[master_array]);
      return out.end(c.lo, c.hi);
    });
  });
}

void partitioned_optimizer::zero_padding(const tensor& working) const {
  const std::size_t width = dtype_size(working.type());
  auto* out = static_cast<char*>(working.raw_data());
  for (const auto& pad : padding_of(pieces_, partition()))
    std::memset(out + pad.lo * static_cast<std::int64_t>(width), 0, static_cast<std::size_t>(pad.size()) * width);
}

status partitioned_optimizer::write_working(const tensor& working) const {
  DSA_TRY(check_flat(working, "working", layout_.partition_numel(), rank_, true));
  working_out out(working);
  return write_working(out);
}

status partitioned_optimizer::write_working(const working_sink& sink, dtype type, std::int64_t window) const {
  working_out out(sink, type, window);
  return write_working(out);
}

status partitioned_optimizer::write_working(working_out& out) const {
  DSA_TRY(store_->sweep(array_bit(master_array), 0, [&](const state_chunk& chunk) -> status {
    return each_window(chunk, out.window(chunk.hi - chunk.lo), [&](const state_chunk& c) -> status {
      out.cast_masters(c.lo, c.hi, c.arrays[master_array]);
      return out.end(c.lo, c.hi);
    });
  }));
  store_->prefetch(all_arrays); // a skipped step: the next update's first chunks all the same
  return {};
}

expected<partition_state> partitioned_optimizer::read_state(unsigned which) const {
  if (const auto* mem = dynamic_cast<const resident_state*>(store_.get())) {
    auto pick = [&](state_array a) { return which & array_bit(a) ? mem->array(a) : tensor(); };
    return partition_state{pick(master_array), pick(exp_avg_array), pick(exp_avg_sq_array), step_};
  }
  DSA_ASSIGN_OR_RETURN(auto arrays, read_arrays(*store_, which));
  return partition_state{std::move(arrays[0]), std::move(arrays[1]), std::move(arrays[2]), step_};
}

partition_state partitioned_optimizer::state() const {
  const auto* mem = dynamic_cast<const resident_state*>(store_.get());
  DSA_CHECK(mem != nullptr, "partitioned optimizer, rank {}: state() of a state in {} (use read_state)", rank_,
            store_->where());
  return {mem->array(master_array), mem->array(exp_avg_array), mem->array(exp_avg_sq_array), step_};
}

bool partitioned_optimizer::resident() const { return dynamic_cast<const resident_state*>(store_.get()) != nullptr; }

void partitioned_optimizer::restore_state(const partition_state& saved) {
  if (saved.master.defined()) {
    partition_state live = state();
    live.master.copy_from(saved.master);
    live.exp_avg.copy_from(saved.exp_avg);
    live.exp_avg_sq.copy_from(saved.exp_avg_sq);
  }
  step_ = saved.step;
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

std::int64_t partitioned_optimizer::scratch_bytes() const {
  return static_cast<std::int64_t>((local_.size() + exchange_.size()) * sizeof(double));
}

} // namespace dsa::optim
