// Encoder layer composition: residuals, LayerNorms and hidden dropouts around
// the attention and feed-forward sublayers, for both LayerNorm placements.
#include "models/bert/encoder_layer.hpp"

#include "kernels/cpu/layernorm.hpp"
#include "models/bert/stored_precision.hpp"

#include <set>
#include <utility>
#include <vector>

namespace dsa::bert {
namespace {

struct norm_stash {
  tensor* input;
  tensor* mean;
  tensor* rstd;
};

// y: (N, C) = LN(x); keeps the input (as x_kept, or a copy in ctx.stash_type) and the
// mean unless normalize_invertible.
void norm_forward(const tensor& y, const tensor& x, const tensor& x_kept, const layernorm_params& p,
                  const bert_config& cfg, const forward_context& ctx, norm_stash keep_in) {
  const std::int64_t N = x.dim(0), C = x.dim(1);
  const bool invertible = cfg.memory.normalize_invertible;
  *keep_in.rstd = tensor::empty({N}, dtype::f32);
  if (!invertible) {
    *keep_in.input = x_kept.defined() ? x_kept : keep(x, ctx.stash_type);
    *keep_in.mean = tensor::empty({N}, dtype::f32);
  }
  cpu::layernorm_forward(y.data<float>(), invertible ? nullptr : keep_in.mean->data<float>(),
                         keep_in.rstd->data<float>(), x.data<float>(), p.weight.data<float>(),
                         p.bias.data<float>(), cfg.layer_norm_eps, N, C);
}

// A dropout whose gradient a LayerNorm's backward writes in its pass (to `out`; none when null).
struct dropout_after {
  float* out = nullptr;
  float p = 0.0f;
  philox_stream stream;
};

// dx: (N, C) = LN backward of dy, from the stashed input (read as stored) or else from the
// output y; then, when asked, `then.out` = the gradient of the dropout before that LayerNorm's
// residual sum (with the input, in the same pass: cpu::layernorm_backward_args).
void norm_backward(float* dx, const float* dy, const layernorm_params& p, const tensor& input,
                   const tensor& mean, const tensor& rstd, const tensor& output, const dropout_after& then = {}) {
  const std::int64_t N = rstd.dim(0), C = p.weight.dim(0);
  if (input.defined()) {
    DSA_CHECK(input.is_contiguous(), "norm_backward: a non-contiguous input {}", input.describe());
    cpu::layernorm_backward_args a;
    a.dx = dx;
    a.dgamma = p.dweight.data<float>();
    a.dbeta = p.dbias.data<float>();
    a.dy = dy;
    a.x = input.raw_data();
    a.x_type = input.type();
    a.mean = mean.data<float>();
    a.rstd = rstd.data<float>();
    a.gamma = p.weight.data<float>();
    a.dropped = then.out;
    a.p = then.p;
    a.stream = then.stream;
    cpu::layernorm_backward(cpu::active_isa(), a, N, C);
    return;
  }
  const tensor y = widen(output);
  cpu::layernorm_backward_from_output(dx, p.dweight.data<float>(), p.dbias.data<float>(), dy, y.data<float>(),
                                      rstd.data<float>(), p.weight.data<float>(), p.bias.data<float>(), N, C);
  if (then.out)
    dropout_apply_backward(then.out, dx, then.p, then.stream, N * C);
}

// A sublayer's exit in one pass (cpu::residual_layernorm_forward): the LayerNorm `norm` of
// residual + dropout(product + proj's bias). Returns the LayerNorm's output (f32). Fills
// keep_in as norm_forward does (the sum in ctx's stash type unless normalize_invertible, the
// mean, rstd), `sum` with the f32 sum when asked, and y_kept with the output's stash copy
// when asked: each written once, in the form that is read later.
tensor residual_exit(const float* product, const linear_params& proj, const tensor& residual, float rate,
                     const philox_stream& stream, const layernorm_params& norm, const bert_config& cfg, dtype kt,
                     norm_stash keep_in, tensor* sum, tensor* y_kept) {
  const std::int64_t N = residual.dim(0), C = residual.dim(1);
  const bool half = kt != dtype::f32, invertible = cfg.memory.normalize_invertible;
  cpu::residual_layernorm_args a;
  a.product = product;
  a.bias = proj.bias.data<float>();
  a.residual = residual.data<float>();
  a.p = rate;
  a.stream = stream;
  a.gamma = norm.weight.data<float>();
  a.beta = norm.bias.data<float>();
  a.eps = cfg.layer_norm_eps;
  a.half_type = half ? kt : dtype::bf16;
  tensor s;
  if (sum || (!invertible && !half)) {
    s = tensor::empty({N, C}, dtype::f32);
    a.sum = s.data<float>();
  }
  if (sum)
    *sum = s;
  *keep_in.rstd = tensor::empty({N}, dtype::f32);
  a.rstd = keep_in.rstd->data<float>();
  if (!invertible) {
    *keep_in.mean = tensor::empty({N}, dtype::f32);
    a.mean = keep_in.mean->data<float>();
    if (half) {
      *keep_in.input = tensor::empty({N, C}, kt);
      a.sum_half = keep_in.input->data<std::uint16_t>();
    } else {
      *keep_in.input = s;
    }
  }
  tensor y = tensor::empty({N, C}, dtype::f32);
  a.y = y.data<float>();
  if (y_kept && half) {
    *y_kept = tensor::empty({N, C}, kt);
    a.y_half = y_kept->data<std::uint16_t>();
  } else if (y_kept) {
    *y_kept = y;
  }
  cpu::residual_layernorm_forward(cpu::active_isa(), a, N, C);
  return y;
}

attention_dims dims_of(const tensor& x, const bert_config& cfg) {
  return attention_dims{x.dim(0), x.dim(1), cfg.hidden_size, cfg.num_heads};
}

tensor new_rows(std::int64_t rows, std::int64_t c) {
  return tensor::empty({rows, c}, dtype::f32);
}

} // namespace

std::size_t layer_stash::bytes() const {
  std::set<std::pair<const void*, std::size_t>> seen;
  std::size_t total = 0;
  for (const tensor* t : {&attention.x, &attention.q, &attention.k, &attention.v, &attention.probs,
                          &attention.probs_drop, &attention.context, &feed_forward.x,
                          &feed_forward.ff1, &feed_forward.gelu, &norm_a_in, &norm_a_mean,
                          &norm_a_rstd, &norm_o_in, &norm_o_mean, &norm_o_rstd, &output}) {
    if (!t->defined() || !seen.insert({t->storage_ptr().get(), t->byte_offset()}).second)
      continue;
    total += t->nbytes();
  }
  return total;
}

tensor encoder_layer_forward(const tensor& x_in, const tensor& x_kept, const float* key_mask,
                             const layer_params& stored, const bert_config& cfg, std::int64_t layer,
                             const forward_context& ctx, layer_stash& stash) {
  const attention_dims dims = dims_of(x_in, cfg);
  const std::int64_t N = dims.rows(), H = cfg.hidden_size;
  const tensor x = x_in.reshape({N, H});
  const tensor x_stash = x_kept.defined() ? x_kept.reshape({N, H}) : tensor{};
  const layer_params p = widen(stored);
  const auto id = static_cast<std::uint32_t>(layer);
  const float hidden_p = ctx.rate(cfg.hidden_dropout);
  const dtype kt = ctx.stash_type;
  stash = layer_stash{};
  stash.ctx = ctx;
  stash.layer = layer;
  norm_stash keep_a{&stash.norm_a_in, &stash.norm_a_mean, &stash.norm_a_rstd};
  norm_stash keep_o{&stash.norm_o_in, &stash.norm_o_mean, &stash.norm_o_rstd};

  tensor branch = new_rows(N, H);
  tensor y;
  if (cfg.norm == layer_norm_placement::post) {
    stash.attention.x = x_stash.defined() ? x_stash : keep(x, kt);
    attention_forward(branch.data<float>(), stash.attention, x, key_mask, p, dims,
                      ctx.rate(cfg.attention_dropout), ctx.stream(id, site::attention_probs),
                      cfg.memory, kt);
    const tensor h = residual_exit(branch.data<float>(), p.attention_out, x, hidden_p,
                                   ctx.stream(id, site::attention_output), p.attention_norm, cfg, kt, keep_a,
                                   nullptr, &stash.feed_forward.x);
    feed_forward_forward(branch.data<float>(), stash.feed_forward, h, p, cfg.memory, kt);
    y = residual_exit(branch.data<float>(), p.output, h, hidden_p, ctx.stream(id, site::ffn_output),
                      p.output_norm, cfg, kt, keep_o, nullptr,
                      cfg.memory.normalize_invertible ? &stash.output : nullptr);
  } else {
    tensor a_in = new_rows(N, H);
    norm_forward(a_in, x, x_stash, p.attention_norm, cfg, ctx, keep_a);
    stash.attention.x = keep(a_in, kt);
    attention_forward(branch.data<float>(), stash.attention, a_in, key_mask, p, dims,
                      ctx.rate(cfg.attention_dropout), ctx.stream(id, site::attention_probs),
                      cfg.memory, kt);
    tensor h;
    const tensor f_in = residual_exit(branch.data<float>(), p.attention_out, x, hidden_p,
                                      ctx.stream(id, site::attention_output), p.output_norm, cfg, kt, keep_o,
                                      &h, &stash.feed_forward.x);
    feed_forward_forward(branch.data<float>(), stash.feed_forward, f_in, p, cfg.memory, kt);
    // y = h + dropout(branch + bias): the exit without a LayerNorm.
    y = new_rows(N, H);
    cpu::residual_layernorm_args a;
    a.product = branch.data<float>();
    a.bias = p.output.bias.data<float>();
    a.residual = h.data<float>();
    a.p = hidden_p;
    a.stream = ctx.stream(id, site::ffn_output);
    a.sum = y.data<float>();
    cpu::residual_layernorm_forward(cpu::active_isa(), a, N, H);
  }
  return y.reshape(x_in.shape());
}

tensor encoder_layer_backward(const tensor& dy_in, const layer_stash& s, const layer_params& stored,
                              const bert_config& cfg) {
  const layer_params p = widen(stored);
  const attention_dims dims = dims_of(dy_in, cfg);
  const std::int64_t N = dims.rows(), H = cfg.hidden_size, n = N * H;
  const auto id = static_cast<std::uint32_t>(s.layer);
  const float hidden_p = s.ctx.rate(cfg.hidden_dropout);
  const float attention_p = s.ctx.rate(cfg.attention_dropout);
  const float* dy = dy_in.data<float>();
  tensor dx = new_rows(N, H);
  // Scratch that each use overwrites whole before reading (zero-filling it cost a pass).
  const auto dbranch = scratch_floats(n);

  if (cfg.norm == layer_norm_placement::post) {
    const auto dh = scratch_floats(n);
    // Each LayerNorm's backward also writes its sublayer's dropped-branch gradient.
    norm_backward(dh.get(), dy, p.output_norm, s.norm_o_in, s.norm_o_mean, s.norm_o_rstd, s.output,
                  {dbranch.get(), hidden_p, s.ctx.stream(id, site::ffn_output)});
    feed_forward_backward(dh.get(), dbranch.get(), s.feed_forward, p, write_mode::accumulate);
    float* dsum = dx.data<float>();
    norm_backward(dsum, dh.get(), p.attention_norm, s.norm_a_in, s.norm_a_mean, s.norm_a_rstd,
                  s.feed_forward.x, {dbranch.get(), hidden_p, s.ctx.stream(id, site::attention_output)});
    attention_backward(dsum, dbranch.get(), s.attention, p, dims, attention_p,
                       s.ctx.stream(id, site::attention_probs), write_mode::accumulate);
  } else {
    float* dh = dx.data<float>(); // dx accumulates dh, then the attention branch
    std::copy(dy, dy + n, dh);
    const auto dnormed = scratch_floats(n);
    dropout_apply_backward(dbranch.get(), dy, hidden_p, s.ctx.stream(id, site::ffn_output), n);
    feed_forward_backward(dnormed.get(), dbranch.get(), s.feed_forward, p, write_mode::overwrite);
    norm_backward(dnormed.get(), dnormed.get(), p.output_norm, s.norm_o_in, s.norm_o_mean,
                  s.norm_o_rstd, s.feed_forward.x);
    for (std::int64_t i = 0; i < n; ++i)
      dh[i] += dnormed[i];
    dropout_apply_backward(dbranch.get(), dh, hidden_p, s.ctx.stream(id, site::attention_output),
                           n);
    attention_backward(dnormed.get(), dbranch.get(), s.attention, p, dims, attention_p,
                       s.ctx.stream(id, site::attention_probs), write_mode::overwrite);
    norm_backward(dnormed.get(), dnormed.get(), p.attention_norm, s.norm_a_in, s.norm_a_mean,
                  s.norm_a_rstd, s.attention.x);
    for (std::int64_t i = 0; i < n; ++i)
      dh[i] += dnormed[i];
  }
  return dx.reshape(dy_in.shape());
}

std::size_t layer_stash_bytes(const bert_config& cfg, std::int64_t batch, std::int64_t seq,
                              run_mode mode, dtype stash_type) {
  const std::size_t N = static_cast<std::size_t>(batch * seq),
                    H = static_cast<std::size_t>(cfg.hidden_size);
  const std::size_t I = static_cast<std::size_t>(cfg.intermediate_size);
  const std::size_t scores = static_cast<std::size_t>(batch * cfg.num_heads * seq * seq);
  const memory_flags& f = cfg.memory;
  const bool attention_dropped = mode == run_mode::train && cfg.attention_dropout > 0.0f;
  std::size_t values = 0; // activations, in stash_type
  std::size_t stats = 0;  // per-row LayerNorm statistics, f32
  values += 5 * N * H;    // attention x, q, k, v, context
  values += scores;       // probs
  if (attention_dropped && !f.attn_dropout_checkpoint)
    values += scores;      // probs_drop
  values += N * H + N * I; // feed-forward x, ff1
  if (!f.gelu_checkpoint)
    values += N * I; // gelu
  stats += 2 * N;    // two rstd
  if (!f.normalize_invertible) {
    values += 2 * N * H; // two LayerNorm inputs
    stats += 2 * N;      // and their means
  }
  if (f.normalize_invertible && cfg.norm == layer_norm_placement::post)
    values += N * H; // output
  return values * dtype_size(stash_type) + stats * sizeof(float);
}

} // namespace dsa::bert
