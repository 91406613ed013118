// The GPU part's heads, enqueued on the part's stream: the pre-training head follows
// pretraining_head.cpp (the MLM rows gathered, transform + GELU + LayerNorm, f32 logits
// against the tied word embedding plus the decoder bias, cross entropy; NSP from each
// sequence's first row through the pooler's tanh), the SQuAD head squad_head.cpp (f32
// logits (2, rows) = qa_outputs x hidden^T plus the bias, and over each sequence's T
// positions a cross entropy for the start and one for the end, labels clamped to [0, T], T
// ignored, each the mean over counted sequences, the total their average).
#include "models/bert/cuda_part_impl.hpp"

#include "kernels/cuda/activation.hpp"
#include "kernels/cuda/bias.hpp"
#include "kernels/cuda/convert.hpp"
#include "kernels/cuda/embedding.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/loss.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace dsa::bert::gpu {

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

} // namespace dsa::bert::gpu
