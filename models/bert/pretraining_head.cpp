// MLM + NSP head forward/backward.
#include "models/bert/pretraining_head.hpp"

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/gemm.hpp"
#include "models/bert/weight_grads.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cpu/loss.hpp"
#include "models/bert/linear.hpp"
#include "models/bert/stored_precision.hpp"

#include <algorithm>
#include <cstring>

namespace dsa::bert {
namespace {

constexpr std::int32_t ignore_label = -1;

// d *= scale, in place (the stash's logits gradients are read once, by the backward).
const float* scale_in_place(tensor& d, float scale) {
  float* x = d.data<float>();
  if (scale == 1.0f)
    return x;
  const std::int64_t n = d.numel();
#pragma omp parallel for simd schedule(static) if (n >= (1 << 16))
  for (std::int64_t i = 0; i < n; ++i) x[i] *= scale;
  return x;
}

void mlm_forward(const float* hidden, const bert_batch& batch, const pretraining_head_params& p,
                 const bert_config& cfg, pretraining_head_stash& s, bert_losses& losses) {
  const std::int64_t T = s.hidden_shape[1], H = cfg.hidden_size, V = cfg.vocab_size;
  const std::int32_t* pos = batch.masked_lm_positions.data<std::int32_t>();
  const std::int32_t* ids = batch.masked_lm_ids.data<std::int32_t>();
  const std::int64_t B = batch.masked_lm_positions.dim(0), P = batch.masked_lm_positions.dim(1);
  std::vector<std::int32_t> labels;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = 0; j < P; ++j) {
      const std::int64_t slot = b * P + j;
      if (ids[slot] < 0 || pos[slot] == 0)
        continue; // padding slot
      s.masked_rows.push_back(b * T + pos[slot]);
      labels.push_back(ids[slot]);
    }
  const auto M = static_cast<std::int64_t>(labels.size());
  if (M == 0)
    return;
  s.masked = tensor::empty({M, H}, dtype::f32);
  for (std::int64_t r = 0; r < M; ++r)
    std::memcpy(s.masked.data<float>() + r * H,
                hidden + s.masked_rows[static_cast<std::size_t>(r)] * H,
                static_cast<std::size_t>(H) * sizeof(float));
  s.transform = tensor::empty({M, H}, dtype::f32);
  s.gelu = tensor::empty({M, H}, dtype::f32);
  s.normed = tensor::empty({M, H}, dtype::f32);
  s.norm_mean = tensor::empty({M}, dtype::f32);
  s.norm_rstd = tensor::empty({M}, dtype::f32);
  linear_forward(s.transform.data<float>(), s.masked.data<float>(), p.transform, M);
  cpu::gelu_forward(s.gelu.data<float>(), s.transform.data<float>(), M * H);
  cpu::layernorm_forward(s.normed.data<float>(), s.norm_mean.data<float>(),
                         s.norm_rstd.data<float>(), s.gelu.data<float>(),
                         p.transform_norm.weight.data<float>(), p.transform_norm.bias.data<float>(),
                         cfg.layer_norm_eps, M, H);
  s.mlm_dlogits = tensor::empty({M, V}, dtype::f32);
  float* logits = s.mlm_dlogits.data<float>();
  cpu::gemm_shape g; // logits (M, V) = normed (M, H) W_word^T
  g.m = M;
  g.n = V;
  g.k = H;
  g.trans_b = cpu::transpose::yes;
  cpu::gemm(logits, s.normed.data<float>(), operand(p.word), g);
  // The decoder bias, the loss and its gradient in one pass over the logits.
  cpu::xent_sum x =
      cpu::cross_entropy_mean_grad(logits, p.decoder_bias.data<float>(), labels.data(), ignore_label, M, V);
  losses.mlm_loss = x.loss_sum / static_cast<double>(x.count);
  losses.mlm_count = x.count;
  losses.mlm_correct = x.correct;
}

void nsp_forward(const float* hidden, const bert_batch& batch, const pretraining_head_params& p,
                 const bert_config& cfg, pretraining_head_stash& s, bert_losses& losses) {
  const std::int64_t B = s.hidden_shape[0], T = s.hidden_shape[1], H = cfg.hidden_size;
  s.cls = tensor::empty({B, H}, dtype::f32);
  for (std::int64_t b = 0; b < B; ++b)
    std::memcpy(s.cls.data<float>() + b * H, hidden + b * T * H,
                static_cast<std::size_t>(H) * sizeof(float));
  s.pooled = tensor::empty({B, H}, dtype::f32);
  std::vector<float> pre(static_cast<std::size_t>(B * H)); // tanh's aliasing is unspecified
  linear_forward(pre.data(), s.cls.data<float>(), p.pooler, B);
  cpu::tanh_forward(s.pooled.data<float>(), pre.data(), B * H);
  s.nsp_dlogits = tensor::empty({B, 2}, dtype::f32);
  float* logits = s.nsp_dlogits.data<float>();
  linear_forward(logits, s.pooled.data<float>(), p.seq_relationship, B);
  const std::int32_t* labels = batch.next_sentence_labels.data<std::int32_t>();
  cpu::xent_sum x = cpu::cross_entropy_mean_grad(logits, nullptr, labels, ignore_label, B, 2);
  losses.nsp_count = x.count;
  losses.nsp_correct = x.correct;
  losses.nsp_loss = x.count > 0 ? x.loss_sum / static_cast<double>(x.count) : 0.0;
}

} // namespace

bert_losses pretraining_head_forward(const tensor& hidden, const bert_batch& batch,
                                     const pretraining_head_params& stored, const bert_config& cfg,
                                     pretraining_head_stash& stash) {
  const pretraining_head_params p = widen(stored);
  stash = pretraining_head_stash{};
  stash.hidden_shape = hidden.shape();
  bert_losses losses;
  if (batch.masked_lm_positions.defined())
    mlm_forward(hidden.data<float>(), batch, p, cfg, stash, losses);
  if (batch.next_sentence_labels.defined())
    nsp_forward(hidden.data<float>(), batch, p, cfg, stash, losses);
  losses.total = losses.mlm_loss + losses.nsp_loss;
  return losses;
}

tensor pretraining_head_backward(pretraining_head_stash& s,
                                 const pretraining_head_params& stored, const bert_config& cfg,
                                 float loss_scale) {
  const pretraining_head_params p = widen(stored);
  const std::int64_t B = s.hidden_shape[0], T = s.hidden_shape[1], H = cfg.hidden_size,
                     V = cfg.vocab_size;
  tensor dhidden = tensor::zeros(s.hidden_shape, dtype::f32);
  float* dh = dhidden.data<float>();
  if (s.mlm_dlogits.defined()) {
    const std::int64_t M = s.mlm_dlogits.dim(0);
    const float* dl = scale_in_place(s.mlm_dlogits, loss_scale);
    // Read by both products; the decoder bias's gradient in the same pass.
    const shared_gemm_input dl_in(dl, M, V, p.ddecoder_bias.data<float>());
    cpu::gemm_shape dw; // dW_word (V, H) += dl^T (V, M) normed (M, H)
    dw.m = V;
    dw.n = H;
    dw.k = M;
    dw.trans_a = cpu::transpose::yes;
    dw.beta = 1.0f;
    weight_gradient_product(p.dword, dl_in.operand(), M * V, s.normed.data<float>(), M * H, dw); // W
    std::vector<float> d(static_cast<std::size_t>(M * H)), dm(d.size());
    cpu::gemm_shape dn; // dnormed (M, H) = dl (M, V) W_word (V, H)
    dn.m = M;
    dn.n = H;
    dn.k = V;
    cpu::gemm(d.data(), dl_in.operand(), operand(p.word), dn);
    cpu::layernorm_backward(d.data(), p.transform_norm.dweight.data<float>(),
                            p.transform_norm.dbias.data<float>(), d.data(), s.gelu.data<float>(),
                            s.norm_mean.data<float>(), s.norm_rstd.data<float>(),
                            p.transform_norm.weight.data<float>(), M, H);
    cpu::gelu_backward(d.data(), d.data(), s.transform.data<float>(), M * H);
    linear_backward(dm.data(), d.data(), s.masked.data<float>(), p.transform, M,
                    write_mode::overwrite);
    for (std::int64_t r = 0; r < M; ++r) {
      float* row = dh + s.masked_rows[static_cast<std::size_t>(r)] * H;
      for (std::int64_t c = 0; c < H; ++c)
        row[c] += dm[static_cast<std::size_t>(r * H + c)];
    }
  }
  if (s.nsp_dlogits.defined()) {
    const float* dl = scale_in_place(s.nsp_dlogits, loss_scale);
    std::vector<float> dpooled(static_cast<std::size_t>(B * H)), dpre(dpooled.size()),
        dcls(dpooled.size());
    linear_backward(dpooled.data(), dl, s.pooled.data<float>(), p.seq_relationship, B,
                    write_mode::overwrite);
    cpu::tanh_backward(dpre.data(), dpooled.data(), s.pooled.data<float>(), B * H);
    linear_backward(dcls.data(), dpre.data(), s.cls.data<float>(), p.pooler, B,
                    write_mode::overwrite);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t c = 0; c < H; ++c)
        dh[b * T * H + c] += dcls[static_cast<std::size_t>(b * H + c)];
  }
  return dhidden;
}

} // namespace dsa::bert
