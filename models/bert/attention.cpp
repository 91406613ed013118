// Self-attention forward/backward with batched GEMMs over heads: one per sequence, or with bf16
// operands one grouped call over every sequence.
#include "models/bert/attention.hpp"

#include "kernels/cpu/bias.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/softmax.hpp"
#include "models/bert/stored_precision.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <vector>

namespace dsa::bert {
namespace {

// One GEMM per sequence, batched over heads: operand head h starts at column h*d of
// a (T, H) block (row stride H) or at (T, T) block h of a score/prob tensor.
struct head_operand {
  cpu::gemm_operand base;
  std::int64_t ld, head_stride, seq_stride;
};

// Nothing to do after a sequence's product.
struct no_epilogue {
  void operator()(std::int64_t) const {}
};

// after(seq) runs on the thread that made sequence seq's product, right after it (while the
// product's rows are in cache), inside the same parallel region; after one grouped call for
// every sequence (bf16 operands), in a parallel loop of its own once the call returns.
template <class After = no_epilogue>
void per_head_gemm(float* c, std::int64_t ldc, std::int64_t c_head_stride,
                   std::int64_t c_seq_stride, head_operand a, cpu::transpose ta, head_operand b,
                   cpu::transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, float beta,
                   const attention_dims& dims, After after = {}) {
  cpu::gemm_shape s;
  s.m = m;
  s.n = n;
  s.k = k;
  s.trans_a = ta;
  s.trans_b = tb;
  s.lda = a.ld;
  s.ldb = b.ld;
  s.ldc = ldc;
  s.beta = beta;
  cpu::gemm_batch batch;
  batch.count = dims.heads;
  batch.stride_a = a.head_stride;
  batch.stride_b = b.head_stride;
  batch.stride_c = c_head_stride;
  // With bf16 operands every sequence's heads go to oneDNN as one call when it takes the
  // layout: its threads split the whole grid, where one call per sequence inside the region
  // below runs single-threaded, each thread's oneDNN allocating beside the other's from the
  // one malloc arena, and a thread whose sequences ran slower keeps the other waiting.
  if (cpu::gemm_batched_groups(c, a.base, b.base, s, batch, {dims.batch, a.seq_stride, b.seq_stride, c_seq_stride})) {
    if constexpr (!std::is_same_v<After, no_epilogue>) {
#pragma omp parallel for schedule(static) if (dims.batch > 1)
      for (std::int64_t seq = 0; seq < dims.batch; ++seq) after(seq);
    }
    return;
  }
  // One parallel region over the sequences rather than one (or, with bf16 operands, a few)
  // per sequence: each region wakes the sleeping OpenMP threads (OMP_WAIT_POLICY=passive),
  // which perf showed at ~12% of a bf16 run. Inside a region cpu::gemm_batched runs its
  // entries in order with the same blocks, so the f32 bits do not change.
#pragma omp parallel for schedule(static) if (dims.batch > 1)
  for (std::int64_t seq = 0; seq < dims.batch; ++seq) {
    cpu::gemm_batched(c + seq * c_seq_stride, a.base.advanced(seq * a.seq_stride),
                      b.base.advanced(seq * b.seq_stride), s, batch);
    after(seq);
  }
}

// The projections' weights, (H, H) each as stored (bf16 here), stacked into one (3H, H).
tensor stacked_weights(std::initializer_list<const linear_params*> parts, std::int64_t H) {
  const dtype type = (*parts.begin())->weight.type();
  tensor w = tensor::empty({static_cast<std::int64_t>(parts.size()) * H, H}, type);
  std::size_t at = 0;
  for (const linear_params* lp : parts) {
    DSA_CHECK(lp->weight.type() == type && lp->weight.is_contiguous() && lp->weight.numel() == H * H,
              "attention: projection weight {} does not stack with the others", lp->weight.describe());
    std::memcpy(static_cast<char*>(w.raw_data()) + at, lp->weight.raw_data(), lp->weight.nbytes());
    at += lp->weight.nbytes();
  }
  return w;
}

head_operand rows_of(cpu::gemm_operand p, const attention_dims& d) {
  return {p, d.hidden, d.head_size(), d.seq * d.hidden};
}
head_operand squares_of(cpu::gemm_operand p, const attention_dims& d) {
  return {p, d.seq, d.seq * d.seq, d.heads * d.seq * d.seq};
}

} // namespace

void attention_forward(float* out, attention_stash& stash, const tensor& x, const float* key_mask,
                       const layer_params& p, const attention_dims& dims, float dropout_p,
                       const philox_stream& stream, const memory_flags& flags, dtype stash_type) {
  const std::int64_t N = dims.rows(), H = dims.hidden, T = dims.seq, A = dims.heads,
                     d = dims.head_size();
  // The caller has stashed x (stash.x); with bf16 GEMM operands each product reads the
  // stash copies, so every activation is rounded to bf16 once.
  const cpu::gemm_operand x_in = gemm_source(x, stash.x);
  tensor q, k, v; // f32, where the products read f32
  if (stash_type != dtype::f32 && gemm_reads_stored(stash_type)) {
    // Only the bf16 Q, K, V are read: each projection's bias add writes them rounded, the
    // same bits as keep() of the f32 values. The three products run as one, x times the
    // stacked (3H, H) weights (one wider product and one oneDNN call instead of three; each
    // output still sums the same H terms), and each bias add reads its column block.
    const std::int64_t W = 3 * H;
    const tensor weights = stacked_weights({&p.query, &p.key, &p.value}, H);
    tensor product = tensor::empty({N, W}, dtype::f32);
    cpu::gemm_shape s;
    s.m = N;
    s.n = W;
    s.k = H;
    s.trans_b = cpu::transpose::yes;
    cpu::gemm(product.data<float>(), x_in, operand(weights), s);
    tensor* kept[] = {&stash.q, &stash.k, &stash.v};
    const linear_params* lp[] = {&p.query, &p.key, &p.value};
    for (int i = 0; i < 3; ++i) {
      *kept[i] = tensor::empty({N, H}, stash_type);
      cpu::bias_add_rounded(cpu::active_isa(), kept[i]->data<std::uint16_t>(), stash_type, product.data<float>() + i * H,
                            lp[i]->bias.data<float>(), N, H, W);
    }
  } else {
    q = tensor::empty({N, H}, dtype::f32);
    k = tensor::empty({N, H}, dtype::f32);
    v = tensor::empty({N, H}, dtype::f32);
    linear_forward(q.data<float>(), x_in, p.query, N);
    linear_forward(k.data<float>(), x_in, p.key, N);
    linear_forward(v.data<float>(), x_in, p.value, N);
    stash.q = keep(q, stash_type);
    stash.k = keep(k, stash_type);
    stash.v = keep(v, stash_type);
  }

  // scores(b, h) = Q_bh K_bh^T; the 1/sqrt(d) scale is applied inside the softmax.
  tensor scores = tensor::empty({dims.batch, A, T, T}, dtype::f32);
  per_head_gemm(scores.data<float>(), T, T * T, A * T * T, rows_of(gemm_source(q, stash.q), dims),
                cpu::transpose::no, rows_of(gemm_source(k, stash.k), dims), cpu::transpose::yes, T, T, d, 0.0f,
                dims);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  // The probabilities and their dropout in one pass over the scores, written only in the
  // forms read later: the stash (in stash_type) and the context product's input (the bf16
  // stash when the product reads it, else f32).
  const bool half = stash_type != dtype::f32, reads_half = half && gemm_reads_stored(stash_type);
  const bool drop = dropout_p > 0.0f, keep_drop = drop && !flags.attn_dropout_checkpoint;
  cpu::softmax_dropout_out written;
  written.half_type = half ? stash_type : dtype::bf16;
  tensor probs, dropped; // f32
  if (half) {
    stash.probs = tensor::empty(scores.shape(), stash_type);
    written.probs_half = stash.probs.data<std::uint16_t>();
  }
  if (!half || (!drop && !reads_half)) {
    probs = scores; // in place
    written.probs = probs.data<float>();
  }
  if (!half)
    stash.probs = probs;
  // Under attn_dropout_checkpoint the dropped probabilities are not stashed: with a product
  // that reads bf16 they still go to a bf16 buffer (the bits of rounding f32 ones).
  tensor dropped_rounded;
  if (drop && half && (keep_drop || reads_half)) {
    dropped_rounded = tensor::empty(scores.shape(), stash_type);
    written.dropped_half = dropped_rounded.data<std::uint16_t>();
    if (keep_drop)
      stash.probs_drop = dropped_rounded;
  }
  if (drop && (!half || !reads_half)) {
    dropped = tensor::empty(scores.shape(), dtype::f32);
    written.dropped = dropped.data<float>();
  }
  if (keep_drop && !half)
    stash.probs_drop = dropped;
  cpu::softmax_dropout_forward(cpu::active_isa(), written, scores.data<float>(), key_mask, scale, dropout_p, stream,
                               dims.batch, A, T, T);
  const cpu::gemm_operand used = drop ? gemm_source(dropped, dropped_rounded) : gemm_source(probs, stash.probs);
  scores = tensor{};

  // context(b, h) = P_bh V_bh, written straight into (B*T, H) rows.
  tensor context = tensor::empty({N, H}, dtype::f32);
  // With a half stash each sequence's context rows are rounded to it as they are made (keep's
  // bits, without a pass and a parallel region of their own).
  stash.context = half ? tensor::empty({N, H}, stash_type) : context;
  const auto round_rows = [&](std::int64_t seq) {
    if (!half)
      return;
    // In slices below cast's threshold for threads: inside this region a cast of its own
    // would open a nested (one-thread) team per sequence.
    constexpr std::int64_t slice = std::int64_t{1} << 16;
    for (std::int64_t at = seq * T * H, end = at + T * H; at < end; at += slice)
      cpu::cast(cpu::active_isa(), stash.context.data<std::uint16_t>() + at, stash_type, context.data<float>() + at,
                dtype::f32, std::min(slice, end - at));
  };
  per_head_gemm(context.data<float>(), H, d, T * H, squares_of(used, dims), cpu::transpose::no,
                rows_of(gemm_source(v, stash.v), dims), cpu::transpose::no, T, d, T, 0.0f, dims, round_rows);
  linear_product(out, gemm_source(context, stash.context), p.attention_out, N); // bias: the caller's
}

void attention_backward(float* dx, const float* dout, const attention_stash& stash,
                        const layer_params& p, const attention_dims& dims, float dropout_p,
                        const philox_stream& stream, write_mode dx_mode) {
  const std::int64_t N = dims.rows(), H = dims.hidden, T = dims.seq, A = dims.heads,
                     d = dims.head_size();
  const std::int64_t score_count = stash.probs.numel();
  // Every scratch buffer below is overwritten whole: the heads' column blocks tile H.
  DSA_CHECK(A * d == H, "attention: {} heads of {} do not tile hidden size {}", A, d, H);
  const auto dcontext = scratch_floats(N * H);
  linear_backward(dcontext.get(), dout, operand(gemm_input(stash.context)), p.attention_out, N,
                  write_mode::overwrite);

  // The probabilities the context used: stashed, recomputed, or the softmax output itself.
  // The softmax gradient reads them as stashed; they are widened whole only when the dropout
  // is recomputed from them (or dV's product takes f32).
  const bool recompute = dropout_p > 0.0f && !stash.probs_drop.defined();
  const tensor probs = recompute ? widen(stash.probs) : stash.probs;
  tensor used; // read by dV's product only
  if (dropout_p == 0.0f) {
    used = gemm_input(stash.probs);
  } else if (!recompute) {
    used = gemm_input(stash.probs_drop);
  } else {
    used = tensor::empty(probs.shape(), dtype::f32);
    dropout_apply(used.data<float>(), probs.data<float>(), dropout_p, stream, score_count);
  }

  const auto dq = scratch_floats(N * H), dk = scratch_floats(N * H), dv = scratch_floats(N * H);
  const shared_gemm_input dc_in(dcontext.get(), N * H); // read by dV's and dP's products
  // dV_bh = P_bh^T dC_bh
  per_head_gemm(dv.get(), H, d, T * H, squares_of(operand(used), dims), cpu::transpose::yes,
                rows_of(dc_in.operand(), dims), cpu::transpose::no, T, d, T, 0.0f, dims);
  used = tensor{};
  // dP_bh = dC_bh V_bh^T
  const auto dscores = scratch_floats(score_count);
  per_head_gemm(dscores.get(), T, T * T, A * T * T, rows_of(dc_in.operand(), dims),
                cpu::transpose::no, rows_of(operand(gemm_input(stash.v)), dims),
                cpu::transpose::yes, T, T, d, 0.0f, dims);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // dS, read by dQ's and dK's products: written rounded to bf16 only when they read bf16.
  const bool rounded = gemm_reads_stored(dtype::bf16);
  std::unique_ptr<std::uint16_t[]> ds_bf16(rounded ? new std::uint16_t[static_cast<std::size_t>(score_count)]
                                                   : nullptr);
  if (rounded)
    cpu::softmax_dropout_backward_bf16(cpu::active_isa(), ds_bf16.get(), dscores.get(), probs.raw_data(),
                                       probs.type(), scale, dropout_p, stream, dims.batch * A * T, T);
  else
    cpu::softmax_dropout_backward(cpu::active_isa(), dscores.get(), dscores.get(), probs.raw_data(), probs.type(),
                                  scale, dropout_p, stream, dims.batch * A * T, T);
  const cpu::gemm_operand ds_in =
      rounded ? cpu::gemm_operand{ds_bf16.get(), dtype::bf16} : cpu::gemm_operand{dscores.get()};
  // dQ_bh = dS_bh K_bh, dK_bh = dS_bh^T Q_bh
  per_head_gemm(dq.get(), H, d, T * H, squares_of(ds_in, dims), cpu::transpose::no,
                rows_of(operand(gemm_input(stash.k)), dims), cpu::transpose::no, T, d, T, 0.0f,
                dims);
  per_head_gemm(dk.get(), H, d, T * H, squares_of(ds_in, dims), cpu::transpose::yes,
                rows_of(operand(gemm_input(stash.q)), dims), cpu::transpose::no, T, d, T, 0.0f,
                dims);

  const tensor x_t = gemm_input(stash.x);
  const cpu::gemm_operand x = operand(x_t);
  linear_backward(dx, dq.get(), x, p.query, N, dx_mode);
  linear_backward(dx, dk.get(), x, p.key, N, write_mode::accumulate);
  linear_backward(dx, dv.get(), x, p.value, N, write_mode::accumulate);
}

} // namespace dsa::bert
