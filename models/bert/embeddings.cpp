// Embedding sum, LayerNorm and dropout, forward and backward.
#include "models/bert/embeddings.hpp"

#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "models/bert/stored_precision.hpp"
#include "models/bert/weight_grads.hpp"

#include <vector>

namespace dsa::bert {
namespace {

std::size_t bytes_of(const tensor& t) {
  return t.defined() ? t.nbytes() : 0;
}

} // namespace

std::size_t embeddings_stash::bytes() const {
  return bytes_of(sum) + bytes_of(mean) + bytes_of(rstd);
}

tensor embeddings_forward(const embeddings_params& stored, const bert_config& cfg,
                          const bert_batch& batch, const forward_context& ctx,
                          embeddings_stash& stash) {
  const std::int64_t B = batch.batch_size(), T = batch.seq_length(), H = cfg.hidden_size, N = B * T;
  stash = embeddings_stash{};
  stash.ctx = ctx;
  stash.input_ids = batch.input_ids;
  stash.token_type_ids = batch.token_type_ids;
  stash.mean = tensor::empty({N}, dtype::f32);
  stash.rstd = tensor::empty({N}, dtype::f32);

  tensor sum = tensor::empty({N, H}, dtype::f32);
  float* e = sum.data<float>();
  // The word table is read row by row in its stored dtype: widening all of it would
  // cost a (V, H) f32 copy for B*T rows.
  cpu::embedding_forward(e, stored.word.raw_data(), stored.word.type(),
                         batch.input_ids.data<std::int32_t>(), N, cfg.vocab_size, H);
  const tensor pos_t = widen(stored.position), types_t = widen(stored.token_type);
  const float* pos = pos_t.data<float>();
  const float* types = types_t.data<float>();
  const std::int32_t* tt =
      batch.token_type_ids.defined() ? batch.token_type_ids.data<std::int32_t>() : nullptr;
  for (std::int64_t row = 0; row < N; ++row) {
    const float* prow = pos + (row % T) * H;
    const float* trow = types + (tt ? tt[row] : 0) * H;
    float* erow = e + row * H;
    for (std::int64_t c = 0; c < H; ++c)
      erow[c] += prow[c] + trow[c];
  }
  const layernorm_params norm = widen(stored.norm);
  tensor out = tensor::empty({B, T, H}, dtype::f32);
  cpu::layernorm_forward(out.data<float>(), stash.mean.data<float>(), stash.rstd.data<float>(), e,
                         norm.weight.data<float>(), norm.bias.data<float>(), cfg.layer_norm_eps, N,
                         H);
  stash.sum = keep(sum, ctx.stash_type);
  dropout_apply(out.data<float>(), out.data<float>(), ctx.rate(cfg.hidden_dropout),
                ctx.stream(0, site::embeddings), N * H);
  return out;
}

void embeddings_backward(const embeddings_params& p, const bert_config& cfg, const tensor& dout,
                         const embeddings_stash& stash) {
  const std::int64_t N = stash.sum.dim(0), H = cfg.hidden_size, T = dout.dim(1);
  float* d = dout.data<float>();
  dropout_apply_backward(d, d, stash.ctx.rate(cfg.hidden_dropout),
                         stash.ctx.stream(0, site::embeddings), N * H);
  cpu::layernorm_backward(d, p.norm.dweight.data<float>(), p.norm.dbias.data<float>(), d,
                          widen(stash.sum).data<float>(), stash.mean.data<float>(),
                          stash.rstd.data<float>(), widen(p.norm.weight).data<float>(), N, H);

  float* dpos = p.dposition.data<float>();
  float* dtypes = p.dtoken_type.data<float>();
  const std::int32_t* tt =
      stash.token_type_ids.defined() ? stash.token_type_ids.data<std::int32_t>() : nullptr;
  for (std::int64_t row = 0; row < N; ++row) {
    const float* drow = d + row * H;
    float* prow = dpos + (row % T) * H;
    float* trow = dtypes + (tt ? tt[row] : 0) * H;
    for (std::int64_t c = 0; c < H; ++c) {
      prow[c] += drow[c];
      trow[c] += drow[c];
    }
  }

  // Rows of the pad token are left out of the scatter (HF padding_idx semantics).
  const std::int32_t* ids = stash.input_ids.data<std::int32_t>();
  std::vector<std::int32_t> kept_ids;
  std::vector<float> kept_rows;
  bool any_pad = false;
  for (std::int64_t row = 0; row < N && !any_pad; ++row)
    any_pad = ids[row] == cfg.pad_token_id;
  if (deferred_weight_grads* deferral = weight_grad_deferral()) {
    // The word table's share of the tied embedding goes to W too, after the decoder's
    // product as in the plain backward: its rows and ids copied now.
    for (std::int64_t row = 0; row < N; ++row) {
      if (any_pad && ids[row] == cfg.pad_token_id)
        continue;
      kept_ids.push_back(ids[row]);
      kept_rows.insert(kept_rows.end(), d + row * H, d + (row + 1) * H);
    }
    const std::size_t bytes = kept_rows.size() * sizeof(float) + kept_ids.size() * sizeof(std::int32_t);
    deferral->record_work(
        [dword = p.dword, rows = std::move(kept_rows), row_ids = std::move(kept_ids), V = cfg.vocab_size, H] {
          cpu::embedding_backward(dword.data<float>(), rows.data(), row_ids.data(),
                                  static_cast<std::int64_t>(row_ids.size()), V, H);
        },
        bytes);
    return;
  }
  if (!any_pad) {
    cpu::embedding_backward(p.dword.data<float>(), d, ids, N, cfg.vocab_size, H);
    return;
  }
  for (std::int64_t row = 0; row < N; ++row) {
    if (ids[row] == cfg.pad_token_id)
      continue;
    kept_ids.push_back(ids[row]);
    kept_rows.insert(kept_rows.end(), d + row * H, d + (row + 1) * H);
  }
  cpu::embedding_backward(p.dword.data<float>(), kept_rows.data(), kept_ids.data(),
                          static_cast<std::int64_t>(kept_ids.size()), cfg.vocab_size, H);
}

} // namespace dsa::bert
