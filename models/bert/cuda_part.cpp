// The GPU part's forward and backward: embeddings, layers and the heads (cuda_part_head.cpp),
// all enqueued on the part's stream; only losses() and span_logits() wait.
#include "models/bert/cuda_part_impl.hpp"

#include "core/device_waits.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/dropout.hpp"
#include "kernels/cuda/ordered_sums.hpp"
#include "models/bert/bert_part.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>
#include <vector>

namespace dsa::bert::gpu {
namespace {


layer_shape shape_of(const bert_config& cfg, const shapes& s, const forward_context& ctx, cuda::elem type,
                     bool deterministic) {
  layer_shape shape;
  shape.batch = s.B;
  shape.seq = s.T;
  shape.hidden = cfg.hidden_size;
  shape.heads = cfg.num_heads;
  shape.intermediate = cfg.intermediate_size;
  shape.eps = cfg.layer_norm_eps;
  shape.hidden_dropout = ctx.rate(cfg.hidden_dropout);
  shape.attention_dropout = ctx.rate(cfg.attention_dropout);
  shape.type = type;
  shape.pre_norm = cfg.norm == layer_norm_placement::pre;
  shape.gelu_checkpoint = cfg.memory.gelu_checkpoint;
  shape.attn_dropout_checkpoint = cfg.memory.attn_dropout_checkpoint;
  shape.normalize_invertible = cfg.memory.normalize_invertible;
  shape.deterministic = deterministic;
  return shape;
}

layer_streams streams_of(const forward_context& ctx, std::int64_t layer) {
  const auto id = static_cast<std::uint32_t>(layer);
  return layer_streams{ctx.stream(id, site::attention_probs), ctx.stream(id, site::attention_output),
                       ctx.stream(id, site::ffn_output)};
}

// Rows grouped by key for ordered_row_scatter_add: keys ascending, each key's rows in row
// order; rows whose key is `skip` (the pad id; -1: none) left out.
part_stash::row_groups group_rows(const std::vector<std::int32_t>& key_of_row, std::int32_t skip, cudaStream_t stream) {
  std::vector<std::int32_t> order;
  for (std::size_t r = 0; r < key_of_row.size(); ++r)
    if (key_of_row[r] != skip || skip < 0)
      order.push_back(static_cast<std::int32_t>(r));
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return key_of_row[static_cast<std::size_t>(a)] < key_of_row[static_cast<std::size_t>(b)];
  });
  std::vector<std::int32_t> keys, offsets{0};
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::int32_t k = key_of_row[static_cast<std::size_t>(order[i])];
    if (keys.empty() || keys.back() != k) {
      if (!keys.empty())
        offsets.push_back(static_cast<std::int32_t>(i));
      keys.push_back(k);
    }
  }
  offsets.push_back(static_cast<std::int32_t>(order.size()));
  if (keys.empty())
    offsets = {0};
  part_stash::row_groups g;
  g.count = static_cast<std::int64_t>(keys.size());
  g.keys = upload(keys, stream);
  g.offsets = upload(offsets, stream);
  g.order = upload(order, stream);
  return g;
}

// The embeddings' backward in a fixed order (deterministic mode): in f32, d = the dropout
// backward of dy, dgamma and dbeta by ordered column sums, de = the LayerNorm input
// gradient, then each table's rows by ordered sums over the rows that read them.
// embedding_backward's arithmetic, without its atomics.
void embeddings_backward_ordered(const part::impl& m, const shapes& s, float rate, const void* dy, part_stash& st) {
  const std::int64_t n = s.N * s.H;
  device_array d(static_cast<std::size_t>(n) * 4, m.stream), x(static_cast<std::size_t>(n) * 4, m.stream);
  check_cuda(cuda::convert(d.get(), cuda::elem::f32, dy, m.type, n, m.stream), "widening the embeddings' gradient");
  check_cuda(cuda::convert(x.get(), cuda::elem::f32, st.emb_sum.get(), m.type, n, m.stream),
             "widening the embeddings' sum");
  check_cuda(cuda::dropout_backward(d.get(), d.get(), rate, st.ctx.stream(0, site::embeddings), cuda::elem::f32, n,
                                    m.stream),
             "the embeddings' dropout backward");
  norm_backward(true, d.get(), m.grad(m.embedding_gamma), m.grad(m.embedding_beta), d.get(), x.get(),
                st.emb_mean.as<float>(), st.emb_rstd.as<float>(), m.f32(m.embedding_gamma), cuda::elem::f32, s.N, s.H,
                m.stream, "the embeddings' LayerNorm backward");
  for (const auto& [table, rows, what] :
       {std::tuple{m.grad(m.word), &st.word_rows, "the word embedding's gradient"},
        std::tuple{m.grad(m.position), &st.position_rows, "the position embedding's gradient"},
        std::tuple{m.grad(m.token_type), &st.type_rows, "the token type embedding's gradient"}})
    check_cuda(cuda::ordered_row_scatter_add(table, d.get(), rows->keys.as<std::int32_t>(),
                                             rows->offsets.as<std::int32_t>(), rows->order.as<std::int32_t>(),
                                             cuda::elem::f32, rows->count, s.H, m.stream),
               what);
}



} // namespace

const void* part::forward(device_array hidden_in, const bert_batch& batch, const forward_context& ctx,
                          float grad_scale, part_stash& st) {
  impl& m = *impl_;
  const bert_config& cfg = m.cfg;
  const status valid = validate_batch(batch, cfg, m.range);
  if (!valid)
    throw std::runtime_error("GPU BERT: " + valid.err().to_string());
  if (!m.resident && !m.gate)
    throw std::runtime_error(fmt::format("GPU BERT: range {} has no resident parameters and needs a gate to bind them",
                                         m.range.to_string()));
  const shapes s{batch.batch_size(), batch.seq_length(), cfg.hidden_size, cfg.vocab_size,
                 batch.batch_size() * batch.seq_length()};
  const cuda::elem type = m.type;
  const auto es = static_cast<std::size_t>(cuda::elem_size(type));
  auto rows_of = [&](std::int64_t rows, std::int64_t cols) {
    return device_array(static_cast<std::size_t>(rows * cols) * es, m.stream);
  };
  auto floats = [&](std::int64_t n) { return device_array(static_cast<std::size_t>(n) * 4, m.stream); };
  {
    loss_readout kept = std::move(st.readout);
    st = part_stash{};
    st.readout = std::move(kept);
    st.readout.valid = false; // until this forward's head enqueues its copies
  }
  st.batch = s.B;
  st.seq = s.T;
  st.ctx = ctx;
  const tensor mask = key_mask_f32(batch);
  if (mask.defined())
    st.key_mask = upload(values<float>(mask), m.stream);

  if (m.range.has_embeddings()) {
    begin_part(m, backward_options::embeddings_done, false); // this part's weights are in
    const std::vector<std::int32_t> ids = values<std::int32_t>(batch.input_ids);
    st.ids = upload(ids, m.stream);
    std::vector<std::int32_t> types(ids.size(), 0);
    if (batch.token_type_ids.defined()) {
      types = values<std::int32_t>(batch.token_type_ids);
      st.types = upload(types, m.stream);
    }
    if (m.deterministic) { // the tables' rows, grouped for the ordered sums of the backward
      std::vector<std::int32_t> positions(ids.size());
      for (std::size_t r = 0; r < ids.size(); ++r)
        positions[r] = static_cast<std::int32_t>(static_cast<std::int64_t>(r) % s.T);
      st.word_rows = group_rows(ids, static_cast<std::int32_t>(cfg.pad_token_id), m.stream);
      st.position_rows = group_rows(positions, -1, m.stream);
      st.type_rows = group_rows(types, -1, m.stream);
    }
    st.acts.push_back(rows_of(s.N, s.H));
    st.emb_sum = rows_of(s.N, s.H);
    st.emb_mean = floats(s.N);
    st.emb_rstd = floats(s.N);
    check_cuda(cuda::embedding_forward(st.acts[0].get(), st.emb_sum.get(), st.emb_mean.as<float>(),
                                       st.emb_rstd.as<float>(), st.ids.as<std::int32_t>(),
                                       st.types.as<std::int32_t>(), m.value(m.word), m.value(m.position),
                                       m.value(m.token_type), m.f32(m.embedding_gamma), m.f32(m.embedding_beta),
                                       cfg.layer_norm_eps, ctx.rate(cfg.hidden_dropout),
                                       ctx.stream(0, site::embeddings), type, s.N, s.T, s.H, m.stream),
               "the embeddings");
    end_part(m, backward_options::embeddings_done);
  } else {
    if (!hidden_in.get())
      throw std::runtime_error(fmt::format("GPU BERT: range {} needs the previous stage's hidden states",
                                           m.range.to_string()));
    st.acts.push_back(std::move(hidden_in));
  }

  const layer_shape shape = shape_of(cfg, s, ctx, type, m.deterministic);
  st.layers.resize(m.layers.size());
  for (std::size_t k = 0; k < m.layers.size(); ++k) {
    const std::int64_t id = m.range.first_layer + static_cast<std::int64_t>(k);
    begin_part(m, id, false);
    st.acts.push_back(rows_of(s.N, s.H));
    layer_forward(*m.engine, m.weights(m.layers[k]), shape, streams_of(ctx, id),
                  st.acts[k].get(), st.key_mask.as<float>(), st.acts[k + 1].get(), st.layers[k], m.stream);
    // Activation checkpointing: the layer keeps its input (acts[k]) only; the backward
    // runs its forward again, with the same dropout streams, before its backward.
    if (cfg.checkpoint_activations)
      st.layers[k] = layer_stash{};
    end_part(m, id);
  }
  if (!m.range.has_head()) {
    st.filled = true;
    return st.acts.back().get();
  }
  begin_part(m, backward_options::head_done, false);
  // Pre-LN: the final LayerNorm over the last layer's output, the head's input.
  const void* last = st.acts.back().get();
  if (m.final_norm()) {
    st.final_normed = rows_of(s.N, s.H);
    st.final_mean = floats(s.N);
    st.final_rstd = floats(s.N);
    check_cuda(cuda::layernorm_forward(st.final_normed.get(), st.final_mean.as<float>(), st.final_rstd.as<float>(),
                                       last, m.f32(m.final_gamma), m.f32(m.final_beta), cfg.layer_norm_eps, type, s.N,
                                       s.H, m.stream),
               "the final LayerNorm (pre-LN)");
    last = st.final_normed.get();
  }
  if (m.squad()) {
    squad_forward(m, batch, last, s, grad_scale, st);
  } else {
    head_forward(m, batch, last, s, grad_scale, st);
    enqueue_readout(m, st);
  }
  end_part(m, backward_options::head_done);
  st.filled = true; // only now: a head that threw leaves neither a stash nor a readout to read
  return nullptr;
}

bert_losses part::losses(const part_stash& st) {
  const loss_readout& r = st.readout;
  if (!r.valid || !impl_->range.has_head())
    throw std::runtime_error("GPU BERT: losses() of a range without the head, or without a forward that finished");
  device_wait("cudaEventSynchronize (the head's losses)");
  check_cuda(cudaEventSynchronize(r.copied), "the forward");
  bert_losses losses;
  if (r.at.squad) {
    if (!r.at.span_labels)
      return losses; // logits only: no loss, as the CPU head without positions
    const auto B = static_cast<std::size_t>(r.at.span_rows);
    const auto logits = static_cast<std::size_t>(2 * r.at.span_rows * r.at.span_seq);
    const auto* f = static_cast<const float*>(r.host.get()) + logits;
    const auto* hits = static_cast<const std::int32_t*>(r.host.get()) + logits + 2 * B;
    double start = 0.0, end = 0.0;
    for (std::size_t k = 0; k < B; ++k) {
      start += f[k];
      end += f[B + k];
      losses.start_correct += hits[k];
      losses.end_correct += hits[B + k];
    }
    losses.start_count = r.at.start_count;
    losses.end_count = r.at.end_count;
    losses.start_loss = r.at.start_count > 0 ? start / static_cast<double>(r.at.start_count) : 0.0;
    losses.end_loss = r.at.end_count > 0 ? end / static_cast<double>(r.at.end_count) : 0.0;
    losses.total = 0.5 * (losses.start_loss + losses.end_loss);
    return losses;
  }
  const auto M = static_cast<std::size_t>(r.at.mlm_count), B = static_cast<std::size_t>(r.at.nsp_rows);
  const auto* f = static_cast<const float*>(r.host.get());
  const auto* i = static_cast<const std::int32_t*>(r.host.get());
  double sum = 0.0;
  for (std::size_t k = 0; k < M; ++k) {
    sum += f[k];
    losses.mlm_correct += i[M + k];
  }
  losses.mlm_count = r.at.mlm_count;
  losses.mlm_loss = M > 0 ? sum / static_cast<double>(M) : 0.0;
  sum = 0.0;
  for (std::size_t k = 0; k < B; ++k) {
    sum += f[2 * M + k];
    losses.nsp_correct += i[2 * M + B + k];
  }
  losses.nsp_count = r.at.nsp_count;
  losses.nsp_loss = r.at.nsp_count > 0 ? sum / static_cast<double>(r.at.nsp_count) : 0.0;
  losses.total = losses.mlm_loss + losses.nsp_loss;
  return losses;
}

squad_logits part::span_logits(const part_stash& st) {
  const loss_readout& r = st.readout;
  if (!r.valid || !r.at.squad)
    throw std::runtime_error("GPU BERT: span_logits() of a range without the SQuAD head, or without a forward that "
                             "finished");
  device_wait("cudaEventSynchronize (the span logits)");
  check_cuda(cudaEventSynchronize(r.copied), "the forward");
  const std::int64_t B = r.at.span_rows, T = r.at.span_seq;
  squad_logits out;
  out.start = tensor::empty({B, T}, dtype::f32);
  out.end = tensor::empty({B, T}, dtype::f32);
  const auto* f = static_cast<const float*>(r.host.get());
  std::copy(f, f + B * T, out.start.data<float>());
  std::copy(f + B * T, f + 2 * B * T, out.end.data<float>());
  return out;
}

device_array part::backward(const void* dy, part_stash& st, const std::function<void(std::int64_t part)>& on_enqueued) {
  impl& m = *impl_;
  if (!st.filled)
    throw std::runtime_error(fmt::format("GPU BERT: backward of range {} without its forward",
                                         m.range.to_string()));
  if (!m.resident && !m.gate)
    throw std::runtime_error(fmt::format("GPU BERT: range {} has no resident parameters and needs a gate to bind them",
                                         m.range.to_string()));
  const bert_config& cfg = m.cfg;
  const shapes s{st.batch, st.seq, cfg.hidden_size, cfg.vocab_size, st.batch * st.seq};
  const auto es = static_cast<std::size_t>(cuda::elem_size(m.type));
  auto rows_of = [&](std::int64_t rows, std::int64_t cols) {
    return device_array(static_cast<std::size_t>(rows * cols) * es, m.stream);
  };
  // cur: the gradient flowing down; owned: the array holding it once this part made it.
  device_array owned;
  const void* cur = dy;
  if (m.range.has_head()) {
    begin_part(m, backward_options::head_done, true);
    owned = rows_of(s.N, s.H);
    const void* head_in = m.final_norm() ? st.final_normed.get() : st.acts.back().get();
    if (m.squad())
      squad_backward(m, s, head_in, st, owned.get());
    else
      head_backward(m, s, st, owned.get());
    if (m.final_norm()) // through the final LayerNorm, from its input (the last layer's output)
      norm_backward(m.deterministic, owned.get(), m.grad(m.final_gamma), m.grad(m.final_beta), owned.get(),
                    st.acts.back().get(), st.final_mean.as<float>(), st.final_rstd.as<float>(), m.f32(m.final_gamma),
                    m.type, s.N, s.H, m.stream, "the final LayerNorm backward (pre-LN)");
    cur = owned.get();
    end_part(m, backward_options::head_done);
    if (on_enqueued) on_enqueued(backward_options::head_done);
  } else if (!dy) {
    throw std::runtime_error(fmt::format("GPU BERT: range {} needs the next stage's gradient", m.range.to_string()));
  }
  const layer_shape shape = shape_of(cfg, s, st.ctx, m.type, m.deterministic);
  for (std::size_t k = m.layers.size(); k-- > 0;) {
    const std::int64_t id = m.range.first_layer + static_cast<std::int64_t>(k);
    begin_part(m, id, true);
    // Checkpointing: the layer's stash again, from its kept input; its output `again` lives
    // until the layer's backward is enqueued (normalize_invertible reads it there).
    device_array again;
    if (cfg.checkpoint_activations) {
      again = rows_of(s.N, s.H);
      layer_forward(*m.engine, m.weights(m.layers[k]), shape,
                    streams_of(st.ctx, id), st.acts[k].get(),
                    st.key_mask.as<float>(), again.get(), st.layers[k], m.stream);
    }
    device_array dprev = rows_of(s.N, s.H);
    layer_backward(*m.engine, m.weights(m.layers[k]), m.grads(m.layers[k]), shape,
                   streams_of(st.ctx, id), st.layers[k], cur,
                   dprev.get(), m.stream);
    st.layers[k] = layer_stash{};
    owned = std::move(dprev);
    cur = owned.get();
    end_part(m, id);
    if (on_enqueued) on_enqueued(id);
  }
  if (m.range.has_embeddings()) begin_part(m, backward_options::embeddings_done, true);
  if (m.range.has_embeddings() && m.deterministic) {
    embeddings_backward_ordered(m, s, shape.hidden_dropout, cur, st);
    owned = device_array();
  } else if (m.range.has_embeddings()) {
    check_cuda(cuda::embedding_backward(m.grad(m.word), m.grad(m.position), m.grad(m.token_type),
                                        m.grad(m.embedding_gamma), m.grad(m.embedding_beta), cur,
                                        st.emb_sum.get(), st.emb_mean.as<float>(), st.emb_rstd.as<float>(),
                                        m.f32(m.embedding_gamma), st.ids.as<std::int32_t>(),
                                        st.types.as<std::int32_t>(), static_cast<std::int32_t>(cfg.pad_token_id),
                                        shape.hidden_dropout, st.ctx.stream(0, site::embeddings), m.type, s.N, s.T,
                                        s.H, m.stream),
               "the embeddings backward");
    owned = device_array();
  } else if (!owned.get()) { // no layers and no head: the gradient passes through
    owned = rows_of(s.N, s.H);
    check_cuda(cudaMemcpyAsync(owned.get(), dy, static_cast<std::size_t>(s.N * s.H) * es, cudaMemcpyDeviceToDevice,
                               m.stream),
               "passing the gradient on");
  }
  if (m.range.has_embeddings()) {
    end_part(m, backward_options::embeddings_done);
    if (on_enqueued) on_enqueued(backward_options::embeddings_done);
  }
  loss_readout kept = std::move(st.readout);
  st = part_stash{}; // frees in stream order, after the work above
  st.readout = std::move(kept);
  return owned;
}

} // namespace dsa::bert::gpu
