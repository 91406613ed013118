// Forward/backward of a BERT range: embeddings, layers, final LayerNorm, head.
#include "models/bert/bert_part.hpp"

#include "kernels/cpu/layernorm.hpp"
#include "models/bert/stored_precision.hpp"

#include <algorithm>

namespace dsa::bert {

std::vector<std::size_t> parameters_finished_by(const bert_parameters& params, std::int64_t part) {
  const auto& entries = params.entries();
  const bert_range& range = params.range();
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string& name = entries[i].spec.name;
    std::int64_t owner = backward_options::head_done;
    if (range.has_embeddings() && name.rfind("bert.embeddings.", 0) == 0) {
      owner = backward_options::embeddings_done;
    } else {
      for (std::int64_t l = range.first_layer; l < range.last_layer; ++l)
        if (name.rfind(layer_prefix(l), 0) == 0) owner = l;
    }
    if (owner == part) out.push_back(i);
  }
  return out;
}

std::vector<std::size_t> parameters_read_by(const bert_parameters& params, std::int64_t part) {
  std::vector<std::size_t> out = parameters_finished_by(params, part);
  if (part != backward_options::head_done || !params.range().has_head() ||
      params.config().head != head_kind::pretraining)
    return out;
  const auto& entries = params.entries();
  for (std::size_t i = 0; i < entries.size(); ++i)
    if (entries[i].spec.name == word_embeddings_name() && std::find(out.begin(), out.end(), i) == out.end())
      out.push_back(i);
  return out;
}

namespace {

std::size_t bytes_of(const tensor& t) {
  return t.defined() ? t.nbytes() : 0;
}

} // namespace

std::size_t part_stash::bytes() const {
  std::size_t total = embeddings.bytes() + bytes_of(final_norm_in) + bytes_of(final_norm_mean) +
                      bytes_of(final_norm_rstd);
  for (const auto& l : layers)
    total += l.bytes();
  for (const auto& c : checkpoints)
    total += bytes_of(c);
  total += bytes_of(key_mask);
  return total;
}

tensor key_mask_f32(const bert_batch& batch) {
  const tensor& m = batch.attention_mask;
  if (!m.defined() || m.type() == dtype::f32)
    return m;
  tensor out = tensor::empty(m.shape(), dtype::f32);
  const std::int32_t* in = m.data<std::int32_t>();
  float* o = out.data<float>();
  for (std::int64_t i = 0; i < m.numel(); ++i)
    o[i] = in[i] != 0 ? 1.0f : 0.0f;
  return out;
}

bert_part::bert_part(const bert_config& cfg, const bert_range& range, dtype weights, bool gradients,
                     const bert_parameters::value_maker& make_value)
    : params_(cfg, range, weights, gradients, make_value) {}

expected<part_output> bert_part::forward(const tensor& hidden_in, const bert_batch& batch,
                                         const forward_context& ctx, part_stash& stash) const {
  const bert_config& cfg = config();
  const bert_range& r = range();
  DSA_TRY(validate_batch(batch, cfg, r));
  const std::int64_t B = batch.batch_size(), T = batch.seq_length(), H = cfg.hidden_size;
  stash = part_stash{};
  part_output out;

  tensor hidden;
  if (r.has_embeddings()) {
    enter(backward_options::embeddings_done);
    hidden = embeddings_forward(params_.embeddings(), cfg, batch, ctx, stash.embeddings);
    leave(backward_options::embeddings_done);
  } else {
    if (!hidden_in.defined() || hidden_in.type() != dtype::f32 ||
        hidden_in.shape() != shape_t{B, T, H})
      return make_error(
          errc::invalid_argument, "bert range {}: hidden input should be f32[{}, {}, {}], got {}",
          r.to_string(), B, T, H, hidden_in.defined() ? hidden_in.describe() : "undefined");
    hidden = hidden_in;
  }
  const tensor mask = key_mask_f32(batch);
  const float* key_mask = mask.defined() ? mask.data<float>() : nullptr;
  // Checkpointing: a layer keeps its input only (a reference: the layers make new outputs);
  // its stash is dropped as soon as its forward is done and rebuilt in the backward.
  const bool recompute = cfg.checkpoint_activations && ctx.mode == run_mode::train;
  if (recompute) {
    stash.checkpoints.resize(static_cast<std::size_t>(r.layer_count()));
    stash.key_mask = mask;
    stash.ctx = ctx;
  } else {
    stash.layers.resize(static_cast<std::size_t>(r.layer_count()));
  }
  tensor kept; // the previous layer's stashed output, shared as this layer's stashed input
  for (std::int64_t l = r.first_layer; l < r.last_layer; ++l) {
    const auto i = static_cast<std::size_t>(l - r.first_layer);
    layer_stash dropped;
    layer_stash& s = recompute ? dropped : stash.layers[i];
    if (recompute) stash.checkpoints[i] = hidden;
    enter(l);
    hidden = encoder_layer_forward(hidden, recompute ? tensor{} : kept, key_mask, params_.layer(l), cfg, l, ctx, s);
    leave(l);
    kept = s.output;
  }

  if (r.has_head()) {
    enter(backward_options::head_done);
    if (cfg.norm == layer_norm_placement::pre) {
      const layernorm_params n = widen(params_.final_norm());
      stash.final_norm_in = keep(hidden, ctx.stash_type);
      stash.final_norm_mean = tensor::empty({B * T}, dtype::f32);
      stash.final_norm_rstd = tensor::empty({B * T}, dtype::f32);
      tensor normed = tensor::empty({B, T, H}, dtype::f32);
      cpu::layernorm_forward(normed.data<float>(), stash.final_norm_mean.data<float>(),
                             stash.final_norm_rstd.data<float>(), hidden.data<float>(),
                             n.weight.data<float>(), n.bias.data<float>(), cfg.layer_norm_eps,
                             B * T, H);
      hidden = normed;
    }
    if (cfg.head == head_kind::pretraining)
      out.losses = pretraining_head_forward(hidden, batch, params_.pretraining_head(), cfg,
                                            stash.pretraining);
    else
      out.losses = squad_head_forward(hidden, batch, params_.squad_head(), stash.squad, out.squad);
    leave(backward_options::head_done);
  } else {
    out.hidden = hidden;
  }
  if (ctx.mode == run_mode::eval)
    stash = part_stash{};
  else
    stash.filled = true;
  return out;
}

tensor bert_part::backward(const tensor& dhidden_out, part_stash& stash,
                           const backward_options& options) const {
  const bert_config& cfg = config();
  const bert_range& r = range();
  DSA_CHECK(stash.filled, "bert range {}: backward without a train-mode forward (or twice)",
            r.to_string());
  tensor d;
  if (r.has_head()) {
    enter(backward_options::head_done);
    d = cfg.head == head_kind::pretraining
            ? pretraining_head_backward(stash.pretraining, params_.pretraining_head(), cfg,
                                        options.loss_scale)
            : squad_head_backward(stash.squad, params_.squad_head(), options.loss_scale);
    if (cfg.norm == layer_norm_placement::pre) {
      const layernorm_params n = widen(params_.final_norm());
      const std::int64_t rows = stash.final_norm_rstd.dim(0);
      cpu::layernorm_backward(
          d.data<float>(), n.dweight.data<float>(), n.dbias.data<float>(), d.data<float>(),
          widen(stash.final_norm_in).data<float>(), stash.final_norm_mean.data<float>(),
          stash.final_norm_rstd.data<float>(), n.weight.data<float>(), rows, cfg.hidden_size);
    }
    leave(backward_options::head_done);
    if (options.on_done) options.on_done(backward_options::head_done);
  } else {
    DSA_CHECK(dhidden_out.defined() && dhidden_out.type() == dtype::f32 &&
                  dhidden_out.is_contiguous() && dhidden_out.ndim() == 3 &&
                  dhidden_out.dim(2) == cfg.hidden_size,
              "bert range {}: backward needs a contiguous f32 (B, T, H) output gradient, got {}",
              r.to_string(), dhidden_out.defined() ? dhidden_out.describe() : "undefined");
    // Read only by the layers; the embeddings' backward works in place, so copy then.
    d = r.layer_count() == 0 ? dhidden_out.clone() : dhidden_out;
  }
  const bool recompute = !stash.checkpoints.empty();
  const float* key_mask = stash.key_mask.defined() ? stash.key_mask.data<float>() : nullptr;
  for (std::int64_t l = r.last_layer; l-- > r.first_layer;) {
    const auto i = static_cast<std::size_t>(l - r.first_layer);
    layer_stash recomputed;
    enter(l);
    if (recompute) // the layer's forward again, from its input, with the same dropout streams
      encoder_layer_forward(stash.checkpoints[i], tensor{}, key_mask, params_.layer(l), cfg, l, stash.ctx,
                            recomputed);
    d = encoder_layer_backward(d, recompute ? recomputed : stash.layers[i], params_.layer(l), cfg);
    leave(l);
    if (recompute) stash.checkpoints[i] = tensor{};
    else stash.layers[i] = layer_stash{}; // free as we go
    if (options.on_done) options.on_done(l);
  }
  if (r.has_embeddings()) {
    enter(backward_options::embeddings_done);
    embeddings_backward(params_.embeddings(), cfg, d, stash.embeddings);
    leave(backward_options::embeddings_done);
    d = tensor{};
    if (options.on_done) options.on_done(backward_options::embeddings_done);
  }
  stash = part_stash{};
  return d;
}

} // namespace dsa::bert
