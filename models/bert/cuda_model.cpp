// The GPU model's step: embeddings, layers, the MLM and NSP heads forward, then everything
// backward, all enqueued on the model's stream; one wait at the end reads the losses.
// The head follows pretraining_head.cpp: the MLM rows gathered, transform + GELU +
// LayerNorm, f32 logits against the tied word embedding plus the decoder bias, cross
// entropy; NSP from each sequence's first row through the pooler's tanh.
#include "models/bert/cuda_model_impl.hpp"

#include "kernels/cuda/activation.hpp"
#include "kernels/cuda/bias.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/loss.hpp"
#include "models/bert/bert_part.hpp"
#include "models/bert/bert_range.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace dsa::bert::gpu {
namespace {

// An array uploaded from a host vector (pageable: copied before cudaMemcpyAsync returns).
template <class T> device_array upload(const std::vector<T>& host, cudaStream_t stream) {
  device_array d(host.size() * sizeof(T), stream);
  if (!host.empty())
    check_cuda(cudaMemcpyAsync(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream),
               "uploading the batch");
  return d;
}

template <class T> std::vector<T> values(const tensor& t) {
  const auto* p = static_cast<const T*>(t.raw_data());
  return std::vector<T>(p, p + t.numel());
}

// C = op(A) op(B) (beta 0) or += (beta 1); A and B of the storage type, C f32 or storage.
struct gemm_runner {
  const pretraining_model::impl& m;
  void operator()(void* c, bool c_f32, const void* a, const void* b, std::int64_t rows, std::int64_t cols,
                  std::int64_t k, bool ta, bool tb, float beta, const char* what) const {
    cuda::gemm_call call;
    call.c = c;
    call.c_type = c_f32 ? cuda::elem::f32 : m.type;
    call.a = a;
    call.b = b;
    call.ab_type = m.type;
    call.shape.m = rows;
    call.shape.n = cols;
    call.shape.k = k;
    call.shape.trans_a = ta ? cpu::transpose::yes : cpu::transpose::no;
    call.shape.trans_b = tb ? cpu::transpose::yes : cpu::transpose::no;
    call.shape.beta = beta;
    const status s = m.engine->run(call, m.stream);
    if (!s)
      throw std::runtime_error(std::string("GPU BERT: ") + what + ": " + s.err().to_string());
  }
};

} // namespace

bert_losses pretraining_model::step(const bert_batch& batch, const forward_context& ctx, float loss_scale) {
  impl& m = *impl_;
  const bert_config& cfg = m.cfg;
  const status valid = validate_batch(batch, cfg, bert_range::whole(cfg));
  if (!valid)
    throw std::runtime_error("GPU BERT: " + valid.err().to_string());
  const std::int64_t B = batch.batch_size(), T = batch.seq_length(), H = cfg.hidden_size,
                     V = cfg.vocab_size, N = B * T, L = cfg.num_layers;
  const cuda::elem type = m.type;
  const auto es = static_cast<std::size_t>(cuda::elem_size(type));
  auto rows_of = [&](std::int64_t rows, std::int64_t cols) {
    return device_array(static_cast<std::size_t>(rows * cols) * es, m.stream);
  };
  auto floats = [&](std::int64_t n) { return device_array(static_cast<std::size_t>(n) * 4, m.stream); };
  const gemm_runner mm{m};
  const float hidden_p = ctx.rate(cfg.hidden_dropout);

  // The batch on the device: ids, token types, key mask; the MLM rows and labels as the CPU
  // head picks them; the NSP labels.
  const device_array ids = upload(values<std::int32_t>(batch.input_ids), m.stream);
  const device_array types = batch.token_type_ids.defined()
                                 ? upload(values<std::int32_t>(batch.token_type_ids), m.stream)
                                 : device_array();
  const tensor mask = key_mask_f32(batch);
  const device_array key_mask = mask.defined() ? upload(values<float>(mask), m.stream) : device_array();
  std::vector<std::int64_t> mlm_rows;
  std::vector<std::int32_t> mlm_labels;
  if (batch.masked_lm_positions.defined()) {
    const auto pos = values<std::int32_t>(batch.masked_lm_positions);
    const auto ids_host = values<std::int32_t>(batch.masked_lm_ids);
    const std::int64_t P = batch.masked_lm_positions.dim(1);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < P; ++j) {
        const auto slot = static_cast<std::size_t>(b * P + j);
        if (ids_host[slot] < 0 || pos[slot] == 0)
          continue;
        mlm_rows.push_back(b * T + pos[slot]);
        mlm_labels.push_back(ids_host[slot]);
      }
  }
  const auto M = static_cast<std::int64_t>(mlm_rows.size());
  {
    // The gradient's scatter back into the rows adds without atomics: a row masked twice
    // in one sequence would race, so it is refused (the CPU would add both).
    std::vector<std::int64_t> sorted = mlm_rows;
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    if (twice != sorted.end())
      throw std::runtime_error(fmt::format(
          "GPU BERT: batch tensor masked_lm_positions names position {} of sequence {} twice; "
          "the GPU head needs distinct masked positions",
          *twice % T, *twice / T));
  }
  const bool nsp = batch.next_sentence_labels.defined();
  std::vector<std::int32_t> nsp_labels = nsp ? values<std::int32_t>(batch.next_sentence_labels)
                                             : std::vector<std::int32_t>{};
  std::int64_t nsp_count = 0;
  for (std::int32_t l : nsp_labels)
    nsp_count += l >= 0 ? 1 : 0;
  std::vector<std::int64_t> cls_rows;
  for (std::int64_t b = 0; b < B; ++b)
    cls_rows.push_back(b * T);

  // Embeddings and layers.
  std::vector<device_array> hidden;
  hidden.push_back(rows_of(N, H));
  device_array emb_sum = rows_of(N, H), emb_mean = floats(N), emb_rstd = floats(N);
  const philox_stream emb_stream = ctx.stream(0, site::embeddings);
  check_cuda(cuda::embedding_forward(hidden[0].get(), emb_sum.get(), emb_mean.as<float>(), emb_rstd.as<float>(),
                                     ids.as<std::int32_t>(), types.as<std::int32_t>(), m.value(m.word),
                                     m.value(m.position), m.value(m.token_type), m.f32(m.embedding_gamma),
                                     m.f32(m.embedding_beta), cfg.layer_norm_eps, hidden_p, emb_stream, type, N,
                                     T, H, m.stream),
             "the embeddings");
  layer_shape shape;
  shape.batch = B;
  shape.seq = T;
  shape.hidden = H;
  shape.heads = cfg.num_heads;
  shape.intermediate = cfg.intermediate_size;
  shape.eps = cfg.layer_norm_eps;
  shape.hidden_dropout = hidden_p;
  shape.attention_dropout = ctx.rate(cfg.attention_dropout);
  shape.type = type;
  auto streams_of = [&](std::int64_t l) {
    const auto id = static_cast<std::uint32_t>(l);
    return layer_streams{ctx.stream(id, site::attention_probs), ctx.stream(id, site::attention_output),
                         ctx.stream(id, site::ffn_output)};
  };
  std::vector<layer_stash> stashes(static_cast<std::size_t>(L));
  for (std::int64_t l = 0; l < L; ++l) {
    hidden.push_back(rows_of(N, H));
    layer_forward(*m.engine, m.weights(m.layers[static_cast<std::size_t>(l)]), shape, streams_of(l),
                  hidden[static_cast<std::size_t>(l)].get(), key_mask.as<float>(),
                  hidden[static_cast<std::size_t>(l + 1)].get(), stashes[static_cast<std::size_t>(l)], m.stream);
  }
  const void* last = hidden.back().get();

  // MLM head forward; the cross entropy leaves the logits' gradient in their place.
  const device_array rows_dev = upload(mlm_rows, m.stream);
  const device_array labels_dev = upload(mlm_labels, m.stream);
  device_array masked, transform, gelu, normed, norm_mean, norm_rstd, logits, mlm_loss, mlm_correct;
  if (M > 0) {
    masked = rows_of(M, H);
    transform = rows_of(M, H);
    gelu = rows_of(M, H);
    normed = rows_of(M, H);
    norm_mean = floats(M);
    norm_rstd = floats(M);
    logits = floats(M * V);
    mlm_loss = floats(M);
    mlm_correct = floats(M);
    check_cuda(cuda::gather_rows(masked.get(), last, rows_dev.as<std::int64_t>(), type, M, H, m.stream),
               "gathering the masked rows");
    mm(transform.get(), false, masked.get(), m.value(m.transform), M, H, H, false, true, 0.0f, "the MLM transform");
    check_cuda(cuda::bias_gelu_forward(gelu.get(), transform.get(), m.f32(m.transform_bias), type, M, H, m.stream),
               "the MLM GELU");
    check_cuda(cuda::layernorm_forward(normed.get(), norm_mean.as<float>(), norm_rstd.as<float>(), gelu.get(),
                                       m.f32(m.transform_gamma), m.f32(m.transform_beta), cfg.layer_norm_eps, type,
                                       M, H, m.stream),
               "the MLM LayerNorm");
    mm(logits.get(), true, normed.get(), m.value(m.word), M, V, H, false, true, 0.0f, "the MLM decoder");
    check_cuda(cuda::bias_add(logits.get(), logits.as<float>(), m.f32(m.decoder_bias), cuda::elem::f32, M, V,
                              m.stream),
               "the decoder bias");
    check_cuda(cuda::cross_entropy(logits.get(), mlm_loss.as<float>(), mlm_correct.as<std::int32_t>(), logits.get(),
                                   labels_dev.as<std::int32_t>(), -1, loss_scale / static_cast<float>(M),
                                   cuda::elem::f32, M, V, m.stream),
               "the MLM cross entropy");
  }

  // NSP head forward.
  const device_array cls_dev = upload(cls_rows, m.stream);
  const device_array nsp_dev = upload(nsp_labels, m.stream);
  device_array cls, pre, pooled, nsp_logits, nsp_loss, nsp_correct;
  if (nsp) {
    cls = rows_of(B, H);
    pre = floats(B * H);
    pooled = rows_of(B, H);
    nsp_logits = floats(B * 2);
    nsp_loss = floats(B);
    nsp_correct = floats(B);
    check_cuda(cuda::gather_rows(cls.get(), last, cls_dev.as<std::int64_t>(), type, B, H, m.stream),
               "gathering the first rows");
    mm(pre.get(), true, cls.get(), m.value(m.pooler), B, H, H, false, true, 0.0f, "the pooler");
    check_cuda(cuda::bias_add(pooled.get(), pre.as<float>(), m.f32(m.pooler_bias), type, B, H, m.stream),
               "the pooler bias");
    check_cuda(cuda::tanh_forward(pooled.get(), pooled.get(), type, B * H, m.stream), "the pooler tanh");
    mm(nsp_logits.get(), true, pooled.get(), m.value(m.relationship), B, 2, H, false, true, 0.0f, "the NSP logits");
    check_cuda(cuda::bias_add(nsp_logits.get(), nsp_logits.as<float>(), m.f32(m.relationship_bias),
                              cuda::elem::f32, B, 2, m.stream),
               "the NSP bias");
    const float scale = nsp_count > 0 ? loss_scale / static_cast<float>(nsp_count) : 0.0f;
    check_cuda(cuda::cross_entropy(nsp_logits.get(), nsp_loss.as<float>(), nsp_correct.as<std::int32_t>(),
                                   nsp_logits.get(), nsp_dev.as<std::int32_t>(), -1, scale, cuda::elem::f32, B, 2,
                                   m.stream),
               "the NSP cross entropy");
  }

  // Backward: the heads into dh, the layers in reverse, the embeddings.
  device_array dh = rows_of(N, H);
  check_cuda(cudaMemsetAsync(dh.get(), 0, static_cast<std::size_t>(N * H) * es, m.stream), "clearing dh");
  // A loss gradient in f32 as the products read it (the storage type).
  auto as_storage = [&](device_array& f, std::int64_t n, device_array& keep) -> const void* {
    if (type == cuda::elem::f32)
      return f.get();
    keep = device_array(static_cast<std::size_t>(n) * es, m.stream);
    check_cuda(cuda::convert(keep.get(), type, f.get(), cuda::elem::f32, n, m.stream), "a loss gradient's copy");
    return keep.get();
  };
  if (M > 0) {
    check_cuda(cuda::bias_backward(m.grad(m.decoder_bias), logits.get(), cuda::elem::f32, M, V, m.stream),
               "the decoder bias gradient");
    device_array dl_copy;
    const void* dl = as_storage(logits, M * V, dl_copy);
    mm(m.grad(m.word), true, dl, normed.get(), V, H, M, true, false, 1.0f, "the decoder's weight gradient");
    device_array d = rows_of(M, H), dt = rows_of(M, H), dmasked = rows_of(M, H);
    mm(d.get(), false, dl, m.value(m.word), M, H, V, false, false, 0.0f, "the decoder's input gradient");
    check_cuda(cuda::layernorm_backward(d.get(), m.grad(m.transform_gamma), m.grad(m.transform_beta), d.get(),
                                        gelu.get(), norm_mean.as<float>(), norm_rstd.as<float>(),
                                        m.f32(m.transform_gamma), type, M, H, m.stream),
               "the MLM LayerNorm backward");
    check_cuda(cuda::bias_gelu_backward(dt.get(), d.get(), transform.get(), m.f32(m.transform_bias), type, M, H,
                                        m.stream),
               "the MLM GELU backward");
    check_cuda(cuda::bias_backward(m.grad(m.transform_bias), dt.get(), type, M, H, m.stream),
               "the transform bias gradient");
    mm(m.grad(m.transform), true, dt.get(), masked.get(), H, H, M, true, false, 1.0f, "the transform's weight gradient");
    mm(dmasked.get(), false, dt.get(), m.value(m.transform), M, H, H, false, false, 0.0f,
       "the transform's input gradient");
    check_cuda(cuda::scatter_add_rows(dh.get(), dmasked.get(), rows_dev.as<std::int64_t>(), type, M, H, m.stream),
               "scattering the masked rows' gradient");
  }
  if (nsp) {
    check_cuda(cuda::bias_backward(m.grad(m.relationship_bias), nsp_logits.get(), cuda::elem::f32, B, 2, m.stream),
               "the NSP bias gradient");
    device_array dl_copy;
    const void* dl = as_storage(nsp_logits, B * 2, dl_copy);
    mm(m.grad(m.relationship), true, dl, pooled.get(), 2, H, B, true, false, 1.0f, "the NSP weight gradient");
    device_array dpooled = rows_of(B, H), dpre = rows_of(B, H), dcls = rows_of(B, H);
    mm(dpooled.get(), false, dl, m.value(m.relationship), B, H, 2, false, false, 0.0f, "the NSP input gradient");
    check_cuda(cuda::tanh_backward(dpre.get(), dpooled.get(), pooled.get(), type, B * H, m.stream),
               "the pooler tanh backward");
    check_cuda(cuda::bias_backward(m.grad(m.pooler_bias), dpre.get(), type, B, H, m.stream),
               "the pooler bias gradient");
    mm(m.grad(m.pooler), true, dpre.get(), cls.get(), H, H, B, true, false, 1.0f, "the pooler's weight gradient");
    mm(dcls.get(), false, dpre.get(), m.value(m.pooler), B, H, H, false, false, 0.0f, "the pooler's input gradient");
    check_cuda(cuda::scatter_add_rows(dh.get(), dcls.get(), cls_dev.as<std::int64_t>(), type, B, H, m.stream),
               "scattering the first rows' gradient");
  }
  for (std::int64_t l = L - 1; l >= 0; --l) {
    device_array dprev = rows_of(N, H);
    const auto li = static_cast<std::size_t>(l);
    layer_backward(*m.engine, m.weights(m.layers[li]), m.grads(m.layers[li]), shape, streams_of(l), stashes[li],
                   dh.get(), dprev.get(), m.stream);
    stashes[li] = layer_stash{};
    dh = std::move(dprev);
  }
  check_cuda(cuda::embedding_backward(m.grad(m.word), m.grad(m.position), m.grad(m.token_type),
                                      m.grad(m.embedding_gamma), m.grad(m.embedding_beta), dh.get(), emb_sum.get(),
                                      emb_mean.as<float>(), emb_rstd.as<float>(), m.f32(m.embedding_gamma),
                                      ids.as<std::int32_t>(), types.as<std::int32_t>(),
                                      static_cast<std::int32_t>(cfg.pad_token_id), hidden_p, emb_stream, type, N, T,
                                      H, m.stream),
             "the embeddings backward");

  // The losses, once the stream has run everything.
  std::vector<float> mlm_l(static_cast<std::size_t>(M)), nsp_l(static_cast<std::size_t>(nsp ? B : 0));
  std::vector<std::int32_t> mlm_c(mlm_l.size()), nsp_c(nsp_l.size());
  auto fetch = [&](void* host, const device_array& dev, std::size_t bytes) {
    if (bytes > 0)
      check_cuda(cudaMemcpyAsync(host, dev.get(), bytes, cudaMemcpyDeviceToHost, m.stream), "reading the losses");
  };
  fetch(mlm_l.data(), mlm_loss, mlm_l.size() * 4);
  fetch(mlm_c.data(), mlm_correct, mlm_c.size() * 4);
  fetch(nsp_l.data(), nsp_loss, nsp_l.size() * 4);
  fetch(nsp_c.data(), nsp_correct, nsp_c.size() * 4);
  check_cuda(cudaStreamSynchronize(m.stream), "the step");
  bert_losses losses;
  double sum = 0.0;
  for (std::size_t i = 0; i < mlm_l.size(); ++i) {
    sum += mlm_l[i];
    losses.mlm_correct += mlm_c[i];
  }
  losses.mlm_count = M;
  losses.mlm_loss = M > 0 ? sum / static_cast<double>(M) : 0.0;
  sum = 0.0;
  for (std::size_t i = 0; i < nsp_l.size(); ++i) {
    sum += nsp_l[i];
    losses.nsp_correct += nsp_c[i];
  }
  losses.nsp_count = nsp_count;
  losses.nsp_loss = nsp_count > 0 ? sum / static_cast<double>(nsp_count) : 0.0;
  losses.total = losses.mlm_loss + losses.nsp_loss;
  return losses;
}

} // namespace dsa::bert::gpu
