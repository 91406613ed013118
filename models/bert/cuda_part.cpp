// The GPU part's forward and backward: embeddings, layers and the heads, all enqueued on
// the part's stream; only losses() and span_logits() wait. The pre-training head follows
// pretraining_head.cpp: the MLM rows gathered, transform + GELU + LayerNorm, f32 logits
// against the tied word embedding plus the decoder bias, cross entropy; NSP from each
// sequence's first row through the pooler's tanh. The SQuAD head follows squad_head.cpp:
// f32 logits (2, rows) = qa_outputs x hidden^T plus the bias, and over each sequence's T
// positions a cross entropy for the start and one for the end (labels clamped to [0, T],
// T ignored), each the mean over counted sequences, the total their average.
#include "models/bert/cuda_part_impl.hpp"

#include "core/device_waits.hpp"
#include "kernels/cuda/activation.hpp"
#include "kernels/cuda/bias.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/loss.hpp"
#include "kernels/cuda/dropout.hpp"
#include "kernels/cuda/ordered_sums.hpp"
#include "models/bert/bert_part.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>
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
  const part::impl& m;
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

struct shapes {
  std::int64_t B, T, H, V, N;
};

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

// The head's forward on the range's last hidden states; fills the stash's head arrays.
void head_forward(const part::impl& m, const bert_batch& batch, const void* last, const shapes& s, float grad_scale,
                  part_stash& st) {
  const cuda::elem type = m.type;
  const auto es = static_cast<std::size_t>(cuda::elem_size(type));
  const gemm_runner mm{m};
  const std::int64_t B = s.B, T = s.T, H = s.H, V = s.V;
  auto rows_of = [&](std::int64_t rows, std::int64_t cols) {
    return device_array(static_cast<std::size_t>(rows * cols) * es, m.stream);
  };
  auto floats = [&](std::int64_t n) { return device_array(static_cast<std::size_t>(n) * 4, m.stream); };

  // The MLM rows and labels as the CPU head picks them; the NSP labels.
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
  const std::int64_t M = static_cast<std::int64_t>(mlm_rows.size());
  st.mlm_count = M;
  st.nsp = batch.next_sentence_labels.defined();
  const std::vector<std::int32_t> nsp_labels =
      st.nsp ? values<std::int32_t>(batch.next_sentence_labels) : std::vector<std::int32_t>{};
  st.nsp_count = 0;
  for (std::int32_t l : nsp_labels)
    st.nsp_count += l >= 0 ? 1 : 0;

  if (M > 0) {
    st.mlm_rows = upload(mlm_rows, m.stream);
    st.mlm_labels = upload(mlm_labels, m.stream);
    st.masked = rows_of(M, H);
    st.transform = rows_of(M, H);
    st.gelu = rows_of(M, H);
    st.normed = rows_of(M, H);
    st.norm_mean = floats(M);
    st.norm_rstd = floats(M);
    st.logits = floats(M * V);
    st.mlm_loss = floats(M);
    st.mlm_correct = floats(M);
    check_cuda(cuda::gather_rows(st.masked.get(), last, st.mlm_rows.as<std::int64_t>(), type, M, H, m.stream),
               "gathering the masked rows");
    mm(st.transform.get(), false, st.masked.get(), m.value(m.transform), M, H, H, false, true, 0.0f,
       "the MLM transform");
    check_cuda(cuda::bias_gelu_forward(st.gelu.get(), st.transform.get(), m.f32(m.transform_bias), type, M, H,
                                       m.stream),
               "the MLM GELU");
    check_cuda(cuda::layernorm_forward(st.normed.get(), st.norm_mean.as<float>(), st.norm_rstd.as<float>(),
                                       st.gelu.get(), m.f32(m.transform_gamma), m.f32(m.transform_beta),
                                       m.cfg.layer_norm_eps, type, M, H, m.stream),
               "the MLM LayerNorm");
    mm(st.logits.get(), true, st.normed.get(), m.value(m.decoder_word), M, V, H, false, true, 0.0f, "the MLM decoder");
    check_cuda(cuda::bias_add(st.logits.get(), st.logits.as<float>(), m.f32(m.decoder_bias), cuda::elem::f32, M, V,
                              m.stream),
               "the decoder bias");
    check_cuda(cuda::cross_entropy(st.logits.get(), st.mlm_loss.as<float>(), st.mlm_correct.as<std::int32_t>(),
                                   st.logits.get(), st.mlm_labels.as<std::int32_t>(), -1,
                                   grad_scale / static_cast<float>(M), cuda::elem::f32, M, V, m.stream),
               "the MLM cross entropy");
  }

  if (st.nsp) {
    std::vector<std::int64_t> cls_rows;
    for (std::int64_t b = 0; b < B; ++b)
      cls_rows.push_back(b * T);
    st.cls_rows = upload(cls_rows, m.stream);
    st.nsp_labels = upload(nsp_labels, m.stream);
    st.cls = rows_of(B, H);
    st.pre = floats(B * H);
    st.pooled = rows_of(B, H);
    st.nsp_logits = floats(B * 2);
    st.nsp_loss = floats(B);
    st.nsp_correct = floats(B);
    check_cuda(cuda::gather_rows(st.cls.get(), last, st.cls_rows.as<std::int64_t>(), type, B, H, m.stream),
               "gathering the first rows");
    mm(st.pre.get(), true, st.cls.get(), m.value(m.pooler), B, H, H, false, true, 0.0f, "the pooler");
    check_cuda(cuda::bias_add(st.pooled.get(), st.pre.as<float>(), m.f32(m.pooler_bias), type, B, H, m.stream),
               "the pooler bias");
    check_cuda(cuda::tanh_forward(st.pooled.get(), st.pooled.get(), type, B * H, m.stream), "the pooler tanh");
    mm(st.nsp_logits.get(), true, st.pooled.get(), m.value(m.relationship), B, 2, H, false, true, 0.0f,
       "the NSP logits");
    check_cuda(cuda::bias_add(st.nsp_logits.get(), st.nsp_logits.as<float>(), m.f32(m.relationship_bias),
                              cuda::elem::f32, B, 2, m.stream),
               "the NSP bias");
    const float scale = st.nsp_count > 0 ? grad_scale / static_cast<float>(st.nsp_count) : 0.0f;
    check_cuda(cuda::cross_entropy(st.nsp_logits.get(), st.nsp_loss.as<float>(), st.nsp_correct.as<std::int32_t>(),
                                   st.nsp_logits.get(), st.nsp_labels.as<std::int32_t>(), -1, scale,
                                   cuda::elem::f32, B, 2, m.stream),
               "the NSP cross entropy");
  }
}

// The head's backward into dh, (N, H), which it overwrites.
void head_backward(const part::impl& m, const shapes& s, part_stash& st, void* dh) {
  const cuda::elem type = m.type;
  const auto es = static_cast<std::size_t>(cuda::elem_size(type));
  const gemm_runner mm{m};
  const std::int64_t B = s.B, H = s.H, V = s.V, M = st.mlm_count;
  auto rows_of = [&](std::int64_t rows, std::int64_t cols) {
    return device_array(static_cast<std::size_t>(rows * cols) * es, m.stream);
  };
  check_cuda(cudaMemsetAsync(dh, 0, static_cast<std::size_t>(s.N * H) * es, m.stream), "clearing dh");
  // A loss gradient in f32 as the products read it (the storage type).
  auto as_storage = [&](device_array& f, std::int64_t n, device_array& keep) -> const void* {
    if (type == cuda::elem::f32)
      return f.get();
    keep = device_array(static_cast<std::size_t>(n) * es, m.stream);
    check_cuda(cuda::convert(keep.get(), type, f.get(), cuda::elem::f32, n, m.stream), "a loss gradient's copy");
    return keep.get();
  };
  if (M > 0) {
    check_cuda(cuda::bias_backward(m.grad(m.decoder_bias), st.logits.get(), cuda::elem::f32, M, V, m.stream),
               "the decoder bias gradient");
    device_array dl_copy;
    const void* dl = as_storage(st.logits, M * V, dl_copy);
    mm(m.grad(m.decoder_word), true, dl, st.normed.get(), V, H, M, true, false, 1.0f,
       "the decoder's weight gradient");
    device_array d = rows_of(M, H), dt = rows_of(M, H), dmasked = rows_of(M, H);
    mm(d.get(), false, dl, m.value(m.decoder_word), M, H, V, false, false, 0.0f, "the decoder's input gradient");
    norm_backward(m.deterministic, d.get(), m.grad(m.transform_gamma), m.grad(m.transform_beta), d.get(),
                  st.gelu.get(), st.norm_mean.as<float>(), st.norm_rstd.as<float>(), m.f32(m.transform_gamma), type, M,
                  H, m.stream, "the MLM LayerNorm backward");
    check_cuda(cuda::bias_gelu_backward(dt.get(), d.get(), st.transform.get(), m.f32(m.transform_bias), type, M, H,
                                        m.stream),
               "the MLM GELU backward");
    check_cuda(cuda::bias_backward(m.grad(m.transform_bias), dt.get(), type, M, H, m.stream),
               "the transform bias gradient");
    mm(m.grad(m.transform), true, dt.get(), st.masked.get(), H, H, M, true, false, 1.0f,
       "the transform's weight gradient");
    mm(dmasked.get(), false, dt.get(), m.value(m.transform), M, H, H, false, false, 0.0f,
       "the transform's input gradient");
    check_cuda(cuda::scatter_add_rows(dh, dmasked.get(), st.mlm_rows.as<std::int64_t>(), type, M, H, m.stream),
               "scattering the masked rows' gradient");
  }
  if (st.nsp) {
    check_cuda(cuda::bias_backward(m.grad(m.relationship_bias), st.nsp_logits.get(), cuda::elem::f32, B, 2,
                                   m.stream),
               "the NSP bias gradient");
    device_array dl_copy;
    const void* dl = as_storage(st.nsp_logits, B * 2, dl_copy);
    mm(m.grad(m.relationship), true, dl, st.pooled.get(), 2, H, B, true, false, 1.0f, "the NSP weight gradient");
    device_array dpooled = rows_of(B, H), dpre = rows_of(B, H), dcls = rows_of(B, H);
    mm(dpooled.get(), false, dl, m.value(m.relationship), B, H, 2, false, false, 0.0f, "the NSP input gradient");
    check_cuda(cuda::tanh_backward(dpre.get(), dpooled.get(), st.pooled.get(), type, B * H, m.stream),
               "the pooler tanh backward");
    check_cuda(cuda::bias_backward(m.grad(m.pooler_bias), dpre.get(), type, B, H, m.stream),
               "the pooler bias gradient");
    mm(m.grad(m.pooler), true, dpre.get(), st.cls.get(), H, H, B, true, false, 1.0f, "the pooler's weight gradient");
    mm(dcls.get(), false, dpre.get(), m.value(m.pooler), B, H, H, false, false, 0.0f, "the pooler's input gradient");
    check_cuda(cuda::scatter_add_rows(dh, dcls.get(), st.cls_rows.as<std::int64_t>(), type, B, H, m.stream),
               "scattering the first rows' gradient");
  }
}

// The SQuAD head's forward: logits (2, N), start row then end row, and with labels each
// side's cross entropy over the sequence's positions, the gradient left in the logits.
void squad_forward(const part::impl& m, const bert_batch& batch, const void* last, const shapes& s,
                   float grad_scale, part_stash& st) {
  const gemm_runner mm{m};
  const std::int64_t B = s.B, T = s.T, H = s.H, N = s.N;
  st.span_logits = device_array(static_cast<std::size_t>(2 * N) * 4, m.stream);
  float* start = st.span_logits.as<float>();
  float* end = start + N;
  mm(start, true, m.value(m.qa), last, 2, N, H, false, true, 0.0f, "the span logits");
  check_cuda(cuda::bias_add(start, start, m.f32(m.qa_bias), cuda::elem::f32, N, 1, m.stream), "the start bias");
  check_cuda(cuda::bias_add(end, end, m.f32(m.qa_bias) + 1, cuda::elem::f32, N, 1, m.stream), "the end bias");

  loss_readout& r = st.readout;
  r.at = loss_readout::layout{};
  r.at.squad = true;
  r.at.span_rows = B;
  r.at.span_seq = T;
  st.span_labels = batch.start_positions.defined();
  r.at.span_labels = st.span_labels;
  r.host.reserve(static_cast<std::size_t>(2 * N + 4 * B) * 4);
  if (!r.copied)
    check_cuda(cudaEventCreateWithFlags(&r.copied, cudaEventDisableTiming), "creating the losses' event");
  auto* base = static_cast<char*>(r.host.get());
  // The logits leave before the cross entropy overwrites them with its gradient.
  check_cuda(cudaMemcpyAsync(base, start, static_cast<std::size_t>(2 * N) * 4, cudaMemcpyDeviceToHost, m.stream),
             "reading the span logits");
  if (st.span_labels) {
    // HF's rule: positions clamped to [0, T]; T (an answer outside the window) is ignored.
    std::vector<std::int32_t> labels;
    for (const tensor* side : {&batch.start_positions, &batch.end_positions})
      for (std::int32_t v : values<std::int32_t>(*side))
        labels.push_back(static_cast<std::int32_t>(std::clamp<std::int64_t>(v, 0, T)));
    if (labels.size() != static_cast<std::size_t>(2 * B))
      throw std::runtime_error(fmt::format("GPU BERT: batch tensors start_positions and end_positions hold {} "
                                           "positions, expected {} each",
                                           labels.size() / 2, B));
    for (std::int64_t b = 0; b < B; ++b) {
      r.at.start_count += labels[static_cast<std::size_t>(b)] != T ? 1 : 0;
      r.at.end_count += labels[static_cast<std::size_t>(B + b)] != T ? 1 : 0;
    }
    st.span_label_ids = upload(labels, m.stream);
    st.span_loss = device_array(static_cast<std::size_t>(2 * B) * 4, m.stream);
    st.span_correct = device_array(static_cast<std::size_t>(2 * B) * 4, m.stream);
    const auto ignore = static_cast<std::int32_t>(T);
    for (int side = 0; side < 2; ++side) {
      const std::int64_t count = side == 0 ? r.at.start_count : r.at.end_count;
      const float scale = count > 0 ? grad_scale * (0.5f / static_cast<float>(count)) : 0.0f;
      float* logits = start + side * N;
      check_cuda(cuda::cross_entropy(logits, st.span_loss.as<float>() + side * B,
                                     st.span_correct.as<std::int32_t>() + side * B, logits,
                                     st.span_label_ids.as<std::int32_t>() + side * B, ignore, scale, cuda::elem::f32,
                                     B, T, m.stream),
                 side == 0 ? "the start cross entropy" : "the end cross entropy");
    }
    check_cuda(cudaMemcpyAsync(base + 2 * N * 4, st.span_loss.get(), static_cast<std::size_t>(2 * B) * 4,
                               cudaMemcpyDeviceToHost, m.stream),
               "reading the span losses");
    check_cuda(cudaMemcpyAsync(base + (2 * N + 2 * B) * 4, st.span_correct.get(), static_cast<std::size_t>(2 * B) * 4,
                               cudaMemcpyDeviceToHost, m.stream),
               "reading the span hits");
  }
  check_cuda(cudaEventRecord(r.copied, m.stream), "marking the span logits");
  r.valid = true;
}

// The SQuAD head's backward into dh, (N, H), which it overwrites: from the loss gradient in
// the logits, the bias and weight gradients and dh = dlogits^T qa_outputs.
void squad_backward(const part::impl& m, const shapes& s, const void* last, part_stash& st, void* dh) {
  const cuda::elem type = m.type;
  const auto es = static_cast<std::size_t>(cuda::elem_size(type));
  const std::int64_t H = s.H, N = s.N;
  if (!st.span_labels) { // an eval batch trained on: no loss, no gradient
    check_cuda(cudaMemsetAsync(dh, 0, static_cast<std::size_t>(N * H) * es, m.stream), "clearing dh");
    return;
  }
  const gemm_runner mm{m};
  float* dl = st.span_logits.as<float>();
  check_cuda(cuda::bias_backward(m.grad(m.qa_bias), dl, cuda::elem::f32, N, 1, m.stream), "the start bias gradient");
  check_cuda(cuda::bias_backward(m.grad(m.qa_bias) + 1, dl + N, cuda::elem::f32, N, 1, m.stream),
             "the end bias gradient");
  device_array copy;
  const void* d = dl;
  if (type != cuda::elem::f32) {
    copy = device_array(static_cast<std::size_t>(2 * N) * es, m.stream);
    check_cuda(cuda::convert(copy.get(), type, dl, cuda::elem::f32, 2 * N, m.stream), "the span gradient's copy");
    d = copy.get();
  }
  mm(m.grad(m.qa), true, d, last, 2, H, N, false, false, 1.0f, "the span head's weight gradient");
  mm(dh, false, d, m.value(m.qa), N, H, 2, true, false, 0.0f, "the span head's input gradient");
}

// The head's per-row losses and hits into the stash's pinned readout, then its event.
void enqueue_readout(const part::impl& m, part_stash& st) {
  loss_readout& r = st.readout;
  r.at = loss_readout::layout{};
  r.at.mlm_count = st.mlm_count;
  r.at.nsp_rows = st.nsp ? st.batch : 0;
  r.at.nsp_count = st.nsp_count;
  const auto rows = static_cast<std::size_t>(r.at.mlm_count + r.at.nsp_rows);
  r.host.reserve(std::max<std::size_t>(rows * 8, 8));
  if (!r.copied)
    check_cuda(cudaEventCreateWithFlags(&r.copied, cudaEventDisableTiming), "creating the losses' event");
  auto* base = static_cast<char*>(r.host.get());
  auto fetch = [&](std::size_t at, const device_array& dev, std::int64_t n) {
    if (n > 0)
      check_cuda(cudaMemcpyAsync(base + at, dev.get(), static_cast<std::size_t>(n) * 4, cudaMemcpyDeviceToHost,
                                 m.stream),
                 "reading the losses");
  };
  const auto M = static_cast<std::size_t>(r.at.mlm_count), B = static_cast<std::size_t>(r.at.nsp_rows);
  fetch(0, st.mlm_loss, r.at.mlm_count);
  fetch(M * 4, st.mlm_correct, r.at.mlm_count);
  fetch(M * 8, st.nsp_loss, r.at.nsp_rows);
  fetch(M * 8 + B * 4, st.nsp_correct, r.at.nsp_rows);
  check_cuda(cudaEventRecord(r.copied, m.stream), "marking the losses");
  r.valid = true;
}


} // namespace

const void* part::forward(device_array hidden_in, const bert_batch& batch, const forward_context& ctx,
                          float grad_scale, part_stash& st) {
  impl& m = *impl_;
  const bert_config& cfg = m.cfg;
  const status valid = validate_batch(batch, cfg, m.range);
  if (!valid)
    throw std::runtime_error("GPU BERT: " + valid.err().to_string());
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
  } else {
    if (!hidden_in.get())
      throw std::runtime_error(fmt::format("GPU BERT: range {} needs the previous stage's hidden states",
                                           m.range.to_string()));
    st.acts.push_back(std::move(hidden_in));
  }

  const layer_shape shape = shape_of(cfg, s, ctx, type, m.deterministic);
  st.layers.resize(m.layers.size());
  for (std::size_t k = 0; k < m.layers.size(); ++k) {
    st.acts.push_back(rows_of(s.N, s.H));
    layer_forward(*m.engine, m.weights(m.layers[k]), shape, streams_of(ctx, m.range.first_layer + static_cast<std::int64_t>(k)),
                  st.acts[k].get(), st.key_mask.as<float>(), st.acts[k + 1].get(), st.layers[k], m.stream);
    // Activation checkpointing: the layer keeps its input (acts[k]) only; the backward
    // runs its forward again, with the same dropout streams, before its backward.
    if (cfg.checkpoint_activations)
      st.layers[k] = layer_stash{};
  }
  if (!m.range.has_head()) {
    st.filled = true;
    return st.acts.back().get();
  }
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
    if (on_enqueued) on_enqueued(backward_options::head_done);
  } else if (!dy) {
    throw std::runtime_error(fmt::format("GPU BERT: range {} needs the next stage's gradient", m.range.to_string()));
  }
  const layer_shape shape = shape_of(cfg, s, st.ctx, m.type, m.deterministic);
  for (std::size_t k = m.layers.size(); k-- > 0;) {
    // Checkpointing: the layer's stash again, from its kept input; its output `again` lives
    // until the layer's backward is enqueued (normalize_invertible reads it there).
    device_array again;
    if (cfg.checkpoint_activations) {
      again = rows_of(s.N, s.H);
      layer_forward(*m.engine, m.weights(m.layers[k]), shape,
                    streams_of(st.ctx, m.range.first_layer + static_cast<std::int64_t>(k)), st.acts[k].get(),
                    st.key_mask.as<float>(), again.get(), st.layers[k], m.stream);
    }
    device_array dprev = rows_of(s.N, s.H);
    layer_backward(*m.engine, m.weights(m.layers[k]), m.grads(m.layers[k]), shape,
                   streams_of(st.ctx, m.range.first_layer + static_cast<std::int64_t>(k)), st.layers[k], cur,
                   dprev.get(), m.stream);
    st.layers[k] = layer_stash{};
    owned = std::move(dprev);
    cur = owned.get();
    if (on_enqueued) on_enqueued(m.range.first_layer + static_cast<std::int64_t>(k));
  }
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
  if (on_enqueued && m.range.has_embeddings()) on_enqueued(backward_options::embeddings_done);
  loss_readout kept = std::move(st.readout);
  st = part_stash{}; // frees in stream order, after the work above
  st.readout = std::move(kept);
  return owned;
}

} // namespace dsa::bert::gpu
