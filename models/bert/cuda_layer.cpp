// The GPU encoder layer: products through cuBLASLt, everything between them in the fused
// CUDA kernels. Attention keeps Q, K, V and the gradients it forms head-major (batch, heads,
// seq, d), so each of its products is one strided-batched call over all sequences and
// heads (per-sequence calls batched over heads took 384 launches a layer at batch 64).
#include "models/bert/cuda_layer.hpp"

#include "kernels/cuda/activation.hpp"
#include "kernels/cuda/bias.hpp"
#include "kernels/cuda/dropout.hpp"
#include "kernels/cuda/heads.hpp"
#include "kernels/cuda/layernorm.hpp"
#include "kernels/cuda/ordered_sums.hpp"
#include "kernels/cuda/residual.hpp"
#include "kernels/cuda/residual_layernorm.hpp"
#include "kernels/cuda/softmax.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace dsa::bert::gpu {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(fmt::format("GPU encoder layer: {} failed: {}", what, cudaGetErrorString(e)));
}

void check(const status& s, const char* what) {
  if (!s)
    throw std::runtime_error(fmt::format("GPU encoder layer: {} failed: {}", what, s.err().to_string()));
}

std::size_t bytes(const layer_shape& s, std::int64_t n) {
  return static_cast<std::size_t>(n) * static_cast<std::size_t>(cuda::elem_size(s.type));
}

// One product: C = alpha op(A) op(B) + beta C, all of the storage type unless c_f32.
struct product {
  std::int64_t m, n, k;
  bool ta, tb;
  std::int64_t lda, ldb, ldc;
  float beta;
};

void run_product(cuda::gemm_engine& engine, const layer_shape& s, void* c, bool c_f32, const void* a,
                 const void* b, const product& p, const cpu::gemm_batch& batch, const float* bias,
                 cudaStream_t stream, const char* what) {
  cuda::gemm_call call;
  call.c = c;
  call.c_type = c_f32 ? cuda::elem::f32 : s.type;
  call.a = a;
  call.b = b;
  call.ab_type = s.type;
  call.shape.m = p.m;
  call.shape.n = p.n;
  call.shape.k = p.k;
  call.shape.trans_a = p.ta ? cpu::transpose::yes : cpu::transpose::no;
  call.shape.trans_b = p.tb ? cpu::transpose::yes : cpu::transpose::no;
  call.shape.lda = p.lda;
  call.shape.ldb = p.ldb;
  call.shape.ldc = p.ldc;
  call.shape.beta = p.beta;
  call.batch = batch;
  if (bias) {
    call.epilogue = cuda::gemm_epilogue::bias;
    call.bias = bias;
    call.bias_type = cuda::elem::f32;
  }
  check(engine.run(call, stream), what);
}

// out (rows, out_f) = in (rows, in_f) W^T (+ bias), W: (out_f, in_f).
void linear(cuda::gemm_engine& e, const layer_shape& s, void* out, const void* in, const void* weight,
            const float* bias, std::int64_t out_f, std::int64_t in_f, cudaStream_t stream,
            const char* what) {
  run_product(e, s, out, false, in, weight, {s.rows(), out_f, in_f, false, true, 0, 0, 0, 0.0f}, {},
              bias, stream, what);
}

// din (rows, in_f) = dout W (beta 0) or += (beta 1).
void linear_dgrad(cuda::gemm_engine& e, const layer_shape& s, void* din, const void* dout,
                  const void* weight, std::int64_t out_f, std::int64_t in_f, float beta,
                  cudaStream_t stream, const char* what) {
  run_product(e, s, din, false, dout, weight, {s.rows(), in_f, out_f, false, false, 0, 0, 0, beta}, {},
              nullptr, stream, what);
}

// dW (out_f, in_f) f32 += dout^T in.
void linear_wgrad(cuda::gemm_engine& e, const layer_shape& s, float* dw, const void* dout, const void* in,
                  std::int64_t out_f, std::int64_t in_f, cudaStream_t stream, const char* what) {
  run_product(e, s, dw, true, dout, in, {out_f, in_f, s.rows(), true, false, 0, 0, 0, 1.0f}, {},
              nullptr, stream, what);
}

// Attention's products, one strided-batched call over every (sequence, head): operands are
// head-major (batch, heads, seq, d) blocks ("heads") or (batch, heads, seq, seq) scores.
struct head_operand {
  const void* base;
  bool square;
};

void attention_product(cuda::gemm_engine& e, const layer_shape& s, void* c, bool c_square,
                       head_operand a, bool ta, head_operand b, bool tb, std::int64_t m,
                       std::int64_t n, std::int64_t k, cudaStream_t stream, const char* what) {
  const std::int64_t T = s.seq, d = s.head_size();
  auto ld = [&](bool square) { return square ? T : d; };
  auto stride = [&](bool square) { return square ? T * T : T * d; };
  const cpu::gemm_batch batch{s.batch * s.heads, stride(a.square), stride(b.square), stride(c_square)};
  run_product(e, s, c, false, a.base, b.base, {m, n, k, ta, tb, ld(a.square), ld(b.square), ld(c_square), 0.0f},
              batch, nullptr, stream, what);
}

void check_shape(const layer_shape& s) {
  if (s.batch <= 0 || s.seq <= 0 || s.hidden <= 0 || s.heads <= 0 || s.intermediate <= 0 ||
      s.hidden % s.heads != 0)
    throw std::runtime_error(fmt::format(
        "GPU encoder layer: batch {}, seq {}, hidden {}, heads {}, intermediate {}: sizes must be "
        "positive and the heads must divide the hidden size",
        s.batch, s.seq, s.hidden, s.heads, s.intermediate));
}

// The fused exit's backward (residual_layernorm_backward), its parameter gradients through
// the kernel's atomics, or in deterministic mode summed in order from dy and the branch's
// gradient afterwards (dy is not overwritten: dresidual never aliases it here).
void exit_backward(const layer_shape& s, void* dresidual, void* dbranch, float* dgamma, float* dbeta, float* dbias,
                   const void* dy, const void* sum, const device_array& mean, const device_array& rstd,
                   const float* gamma, const philox_stream& rng, cudaStream_t stream, const char* what) {
  const bool det = s.deterministic;
  check(cuda::residual_layernorm_backward(dresidual, dbranch, det ? nullptr : dgamma, det ? nullptr : dbeta,
                                          det ? nullptr : dbias, dy, sum, mean.as<float>(), rstd.as<float>(),
                                          gamma, s.hidden_dropout, rng, s.type, s.rows(), s.hidden, stream),
        what);
  if (!det)
    return;
  check(cuda::layernorm_param_backward(dgamma, dbeta, dy, sum, mean.as<float>(), rstd.as<float>(), s.type,
                                       s.rows(), s.hidden, stream),
        what);
  check(cuda::bias_backward(dbias, dbranch, s.type, s.rows(), s.hidden, stream), what);
}

// A LayerNorm's input for its backward: the stashed one, or under normalize_invertible
// (`stashed` empty) rebuilt from its output into `rebuilt`.
const void* norm_input(const layer_shape& s, const device_array& stashed, device_array& rebuilt, const void* output,
                       const device_array& mean, const device_array& rstd, const float* gamma, const float* beta,
                       cudaStream_t stream) {
  if (stashed.get())
    return stashed.get();
  rebuilt = device_array(bytes(s, s.rows() * s.hidden), stream);
  check(cuda::layernorm_invert(rebuilt.get(), output, mean.as<float>(), rstd.as<float>(), gamma, beta, s.type,
                               s.rows(), s.hidden, stream),
        "a LayerNorm input from its output (normalize_invertible)");
  return rebuilt.get();
}

} // namespace

void norm_backward(bool deterministic, void* dx, float* dgamma, float* dbeta, const void* dy, const void* x,
                   const float* mean, const float* rstd, const float* gamma, cuda::elem type, std::int64_t rows,
                   std::int64_t c, cudaStream_t stream, const char* what) {
  if (deterministic)
    check(cuda::layernorm_param_backward(dgamma, dbeta, dy, x, mean, rstd, type, rows, c, stream), what);
  check(cuda::layernorm_backward(dx, deterministic ? nullptr : dgamma, deterministic ? nullptr : dbeta, dy, x, mean,
                                 rstd, gamma, type, rows, c, stream),
        what);
}

device_array::device_array(std::size_t bytes, cudaStream_t stream) : device_array(bytes, stream, nullptr) {}

device_array::device_array(std::size_t bytes, cudaStream_t stream, cudaMemPool_t from) : stream_(stream) {
  const cudaError_t e = from ? cudaMallocFromPoolAsync(&ptr_, bytes == 0 ? 1 : bytes, from, stream)
                             : cudaMallocAsync(&ptr_, bytes == 0 ? 1 : bytes, stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); // clear it, so the next launcher's cudaGetLastError is its own
    ptr_ = nullptr;
    // What the device had: the pool's bytes in use and reserved, the driver's free bytes.
    int device = -1;
    std::uint64_t used = 0, reserved = 0;
    std::size_t free = 0, total = 0;
    cudaMemPool_t pool = nullptr;
    if (cudaGetDevice(&device) == cudaSuccess && (from || cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess)) {
      if (from) pool = from;
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    }
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) free = total = 0;
    (void)cudaGetLastError();
    throw std::runtime_error(fmt::format(
        "GPU memory: cudaMallocAsync of {} bytes on cuda:{} failed: {} (its pool: {} bytes in use, {} reserved; the "
        "device: {} of {} bytes free)",
        bytes, device, cudaGetErrorString(e), used, reserved, free, total));
  }
}

device_array::~device_array() {
  if (ptr_)
    cudaFreeAsync(ptr_, stream_);
}

device_array::device_array(device_array&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), stream_(other.stream_) {}

device_array& device_array::operator=(device_array&& other) noexcept {
  if (this != &other) {
    if (ptr_)
      cudaFreeAsync(ptr_, stream_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    stream_ = other.stream_;
  }
  return *this;
}

void layer_forward(cuda::gemm_engine& e, const layer_weights& w, const layer_shape& s,
                   const layer_streams& streams, const void* x, const float* key_mask, void* y,
                   layer_stash& st, cudaStream_t stream) {
  check_shape(s);
  const std::int64_t N = s.rows(), H = s.hidden, I = s.intermediate, T = s.seq, A = s.heads,
                     d = s.head_size();
  const std::int64_t scores = s.batch * A * T * T;
  st = layer_stash{};
  st.x = x;
  // Pre-LN: the attention reads a = LN_a(x); post-LN: x itself.
  const void* attention_in = x;
  if (s.pre_norm) {
    st.a_in = device_array(bytes(s, N * H), stream);
    st.mean_a = device_array(static_cast<std::size_t>(N) * 4, stream);
    st.rstd_a = device_array(static_cast<std::size_t>(N) * 4, stream);
    check(cuda::layernorm_forward(st.a_in.get(), st.mean_a.as<float>(), st.rstd_a.as<float>(), x,
                                  w.attention_norm_gamma, w.attention_norm_beta, s.eps, s.type, N, H, stream),
          "the attention LayerNorm (pre-LN)");
    attention_in = st.a_in.get();
  }
  st.q = device_array(bytes(s, N * H), stream);
  st.k = device_array(bytes(s, N * H), stream);
  st.v = device_array(bytes(s, N * H), stream);
  // Q, K, V head-major: each projection's f32 product, its f32 bias added and rounded once
  // (as the CPU's bias add and cast) by the copy into the heads layout.
  device_array product(static_cast<std::size_t>(N * H) * 4, stream);
  for (const auto& [out, weight, bias, what] :
       {std::tuple{&st.q, w.query, w.query_bias, "the query projection"},
        std::tuple{&st.k, w.key, w.key_bias, "the key projection"},
        std::tuple{&st.v, w.value, w.value_bias, "the value projection"}}) {
    run_product(e, s, product.get(), true, attention_in, weight, {N, H, H, false, true, 0, 0, 0, 0.0f}, {},
                nullptr, stream, what);
    check(cuda::split_heads(out->get(), s.type, product.get(), cuda::elem::f32, bias, s.batch, T,
                            A, d, stream),
          what);
  }
  product = device_array();

  // Scores Q K^T per head, then probabilities (in place) and their dropout.
  st.probs = device_array(bytes(s, scores), stream);
  attention_product(e, s, st.probs.get(), true, {st.q.get(), false}, false, {st.k.get(), false},
                    true, T, T, d, stream, "the attention scores");
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const bool drop = s.attention_dropout > 0.0f;
  device_array dropped; // moved into the stash unless attn_dropout_checkpoint
  if (drop)
    dropped = device_array(bytes(s, scores), stream);
  check(cuda::softmax_dropout_forward(st.probs.get(), drop ? dropped.get() : nullptr,
                                      st.probs.get(), key_mask, scale, s.attention_dropout,
                                      streams.attention_probs, s.type, s.batch, A, T, T, stream),
        "the attention softmax");
  const void* used = drop ? dropped.get() : st.probs.get();

  // Context P V per head, then back into (rows, hidden) for the output projection.
  {
    device_array context_heads(bytes(s, N * H), stream);
    attention_product(e, s, context_heads.get(), false, {used, true}, false, {st.v.get(), false},
                      false, T, d, T, stream, "the attention context");
    st.context = device_array(bytes(s, N * H), stream);
    check(cuda::merge_heads(st.context.get(), context_heads.get(), s.type, s.batch, T, A, d, stream),
          "the context's rows");
  }
  if (!s.attn_dropout_checkpoint)
    st.dropped = std::move(dropped);
  dropped = device_array(); // freed in stream order, after the context product read it
  device_array branch(bytes(s, N * H), stream);
  linear(e, s, branch.get(), st.context.get(), w.attention_out, nullptr, H, H, stream,
         "the attention output projection");

  // Post-LN: h = LN_a(x + dropout(branch + bo)), the feed-forward's input. Pre-LN: the
  // residual stream h = x + dropout(branch + bo) (kept as sum_o, the output LayerNorm's
  // input) and the feed-forward's input LN_o(h) (kept as h), in the same fused pass.
  st.h = device_array(bytes(s, N * H), stream);
  if (s.pre_norm) {
    st.sum_o = device_array(bytes(s, N * H), stream);
    st.mean_o = device_array(static_cast<std::size_t>(N) * 4, stream);
    st.rstd_o = device_array(static_cast<std::size_t>(N) * 4, stream);
    check(cuda::residual_layernorm_forward(st.h.get(), st.sum_o.get(), st.mean_o.as<float>(), st.rstd_o.as<float>(),
                                           branch.get(), w.attention_out_bias, x, w.output_norm_gamma,
                                           w.output_norm_beta, s.hidden_dropout, streams.attention_output, s.eps,
                                           s.type, N, H, stream),
          "the attention exit (pre-LN)");
  } else {
    if (!s.normalize_invertible) // else rebuilt from h by the backward
      st.sum_a = device_array(bytes(s, N * H), stream);
    st.mean_a = device_array(static_cast<std::size_t>(N) * 4, stream);
    st.rstd_a = device_array(static_cast<std::size_t>(N) * 4, stream);
    check(cuda::residual_layernorm_forward(st.h.get(), st.sum_a.get(), st.mean_a.as<float>(), st.rstd_a.as<float>(),
                                           branch.get(), w.attention_out_bias, x, w.attention_norm_gamma,
                                           w.attention_norm_beta, s.hidden_dropout, streams.attention_output, s.eps,
                                           s.type, N, H, stream),
          "the attention exit");
  }

  // Feed-forward: gelu(h W1^T + b1) W2^T; then post-LN y = LN_o(h + dropout(. + b2)),
  // pre-LN y = sum_o + dropout(. + b2).
  st.ff1 = device_array(bytes(s, N * I), stream);
  device_array gelu(bytes(s, N * I), stream);
  linear(e, s, st.ff1.get(), st.h.get(), w.intermediate, nullptr, I, H, stream,
         "the first feed-forward projection");
  check(cuda::bias_gelu_forward(gelu.get(), st.ff1.get(), w.intermediate_bias, s.type, N, I,
                                stream),
        "bias + GELU");
  linear(e, s, branch.get(), gelu.get(), w.output, nullptr, H, I, stream,
         "the second feed-forward projection");
  if (!s.gelu_checkpoint)
    st.gelu = std::move(gelu);
  gelu = device_array();
  st.y = y;
  if (s.pre_norm) {
    check(cuda::bias_dropout_residual(y, branch.get(), w.output_bias, st.sum_o.get(), s.hidden_dropout,
                                      streams.ffn_output, s.type, N, H, stream),
          "the feed-forward exit (pre-LN)");
    if (s.normalize_invertible)
      st.sum_o = device_array(); // freed in stream order once read; rebuilt from h by the backward
    return;
  }
  if (!s.normalize_invertible) // else rebuilt from y by the backward
    st.sum_o = device_array(bytes(s, N * H), stream);
  st.mean_o = device_array(static_cast<std::size_t>(N) * 4, stream);
  st.rstd_o = device_array(static_cast<std::size_t>(N) * 4, stream);
  check(cuda::residual_layernorm_forward(y, st.sum_o.get(), st.mean_o.as<float>(),
                                         st.rstd_o.as<float>(), branch.get(), w.output_bias,
                                         st.h.get(), w.output_norm_gamma, w.output_norm_beta,
                                         s.hidden_dropout, streams.ffn_output, s.eps, s.type, N, H,
                                         stream),
        "the feed-forward exit");
}

void layer_backward(cuda::gemm_engine& e, const layer_weights& w, const layer_grads& g,
                    const layer_shape& s, const layer_streams& streams, const layer_stash& st,
                    const void* dy, void* dx, cudaStream_t stream) {
  check_shape(s);
  const std::int64_t N = s.rows(), H = s.hidden, I = s.intermediate, T = s.seq, A = s.heads,
                     d = s.head_size();
  const std::int64_t scores = s.batch * A * T * T;

  const bool pre = s.pre_norm;
  const auto hidden_bytes = bytes(s, N * H);
  // The feed-forward exit: dh (the residual's gradient) and the branch's, through dropout.
  // Pre-LN (y = sum_o + dropout(branch + b2)): dh is dy, the branch's gradient dy through
  // the dropout mask.
  device_array dh(hidden_bytes, stream), dbranch(hidden_bytes, stream);
  if (pre) {
    check(cudaMemcpyAsync(dh.get(), dy, hidden_bytes, cudaMemcpyDeviceToDevice, stream), "copying dy (pre-LN)");
    check(cuda::dropout_backward(dbranch.get(), dy, s.hidden_dropout, streams.ffn_output, s.type, N * H, stream),
          "the feed-forward exit's dropout backward (pre-LN)");
    check(cuda::bias_backward(g.output_bias, dbranch.get(), s.type, N, H, stream),
          "the second projection's bias gradient");
  } else {
    device_array rebuilt;
    const void* sum_o = norm_input(s, st.sum_o, rebuilt, st.y, st.mean_o, st.rstd_o, w.output_norm_gamma,
                                   w.output_norm_beta, stream);
    exit_backward(s, dh.get(), dbranch.get(), g.output_norm_gamma, g.output_norm_beta, g.output_bias, dy, sum_o,
                  st.mean_o, st.rstd_o, w.output_norm_gamma, streams.ffn_output, stream,
                  "the feed-forward exit's backward");
  }
  // Pre-LN: the feed-forward input's gradient, then LN_o's backward, then added to dh.
  device_array dffn_in;
  if (pre)
    dffn_in = device_array(hidden_bytes, stream);
  {
    device_array dgelu(bytes(s, N * I), stream), dff1(bytes(s, N * I), stream);
    device_array gelu_again; // gelu_checkpoint: the GELU output made again from ff1
    const void* gelu = st.gelu.get();
    if (!gelu) {
      gelu_again = device_array(bytes(s, N * I), stream);
      check(cuda::bias_gelu_forward(gelu_again.get(), st.ff1.get(), w.intermediate_bias, s.type, N, I, stream),
            "bias + GELU again (gelu_checkpoint)");
      gelu = gelu_again.get();
    }
    linear_wgrad(e, s, g.output, dbranch.get(), gelu, H, I, stream,
                 "the second projection's weight gradient");
    linear_dgrad(e, s, dgelu.get(), dbranch.get(), w.output, H, I, 0.0f, stream,
                 "the second projection's input gradient");
    check(cuda::bias_gelu_backward(dff1.get(), dgelu.get(), st.ff1.get(), w.intermediate_bias,
                                   s.type, N, I, stream),
          "bias + GELU backward");
    check(cuda::bias_backward(g.intermediate_bias, dff1.get(), s.type, N, I, stream),
          "the first projection's bias gradient");
    linear_wgrad(e, s, g.intermediate, dff1.get(), st.h.get(), I, H, stream,
                 "the first projection's weight gradient");
    linear_dgrad(e, s, pre ? dffn_in.get() : dh.get(), dff1.get(), w.intermediate, I, H, pre ? 0.0f : 1.0f, stream,
                 "the first projection's input gradient");
  }

  if (pre) {
    // LN_o's backward from its input sum_o, added to dh: the residual stream's gradient. The
    // attention exit h = x + dropout(branch + bo): dx starts as dh, the branch's gradient is
    // dh through the dropout mask.
    device_array rebuilt;
    const void* sum_o = norm_input(s, st.sum_o, rebuilt, st.h.get(), st.mean_o, st.rstd_o, w.output_norm_gamma,
                                   w.output_norm_beta, stream);
    norm_backward(s.deterministic, dffn_in.get(), g.output_norm_gamma, g.output_norm_beta, dffn_in.get(), sum_o,
                  st.mean_o.as<float>(), st.rstd_o.as<float>(), w.output_norm_gamma, s.type, N, H, stream,
                  "the output LayerNorm backward (pre-LN)");
    check(cuda::add_into(dh.get(), dffn_in.get(), s.type, N * H, stream), "dh += the LayerNorm's gradient");
    dffn_in = device_array();
    check(cudaMemcpyAsync(dx, dh.get(), hidden_bytes, cudaMemcpyDeviceToDevice, stream), "copying dh (pre-LN)");
    check(cuda::dropout_backward(dbranch.get(), dh.get(), s.hidden_dropout, streams.attention_output, s.type, N * H,
                                 stream),
          "the attention exit's dropout backward (pre-LN)");
    check(cuda::bias_backward(g.attention_out_bias, dbranch.get(), s.type, N, H, stream),
          "the attention output's bias gradient");
  } else {
    // The attention exit: dx starts as the residual's gradient.
    device_array rebuilt;
    const void* sum_a = norm_input(s, st.sum_a, rebuilt, st.h.get(), st.mean_a, st.rstd_a, w.attention_norm_gamma,
                                   w.attention_norm_beta, stream);
    exit_backward(s, dx, dbranch.get(), g.attention_norm_gamma, g.attention_norm_beta, g.attention_out_bias,
                  dh.get(), sum_a, st.mean_a, st.rstd_a, w.attention_norm_gamma, streams.attention_output, stream,
                  "the attention exit's backward");
  }
  device_array dcontext(bytes(s, N * H), stream);
  linear_wgrad(e, s, g.attention_out, dbranch.get(), st.context.get(), H, H, stream,
               "the attention output's weight gradient");
  linear_dgrad(e, s, dcontext.get(), dbranch.get(), w.attention_out, H, H, 0.0f, stream,
               "the attention output's input gradient");

  // Attention, head-major: dV = P^T dC, dP = dC V^T, dS through dropout and softmax,
  // dQ = dS K, dK = dS^T Q; then dQ, dK, dV back into rows.
  const bool drop = s.attention_dropout > 0.0f;
  device_array dropped_again; // attn_dropout_checkpoint: the mask applied to probs again
  if (drop && !st.dropped.get()) {
    dropped_again = device_array(bytes(s, scores), stream);
    check(cuda::dropout_forward(dropped_again.get(), nullptr, st.probs.get(), s.attention_dropout,
                                streams.attention_probs, s.type, scores, stream),
          "the attention dropout again (attn_dropout_checkpoint)");
  }
  const void* used = drop ? (st.dropped.get() ? st.dropped.get() : dropped_again.get()) : st.probs.get();
  device_array dq(bytes(s, N * H), stream), dk(bytes(s, N * H), stream), dv(bytes(s, N * H), stream);
  {
    device_array dc(bytes(s, N * H), stream), dqh(bytes(s, N * H), stream),
        dkh(bytes(s, N * H), stream), dvh(bytes(s, N * H), stream);
    check(cuda::split_heads(dc.get(), s.type, dcontext.get(), s.type, nullptr, s.batch, T, A, d, stream),
          "the context gradient's heads");
    device_array dscores(bytes(s, scores), stream);
    attention_product(e, s, dvh.get(), false, {used, true}, true, {dc.get(), false}, false, T, d, T,
                      stream, "dV");
    attention_product(e, s, dscores.get(), true, {dc.get(), false}, false, {st.v.get(), false}, true,
                      T, T, d, stream, "dP");
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    check(cuda::softmax_dropout_backward(dscores.get(), dscores.get(), st.probs.get(), scale,
                                         s.attention_dropout, streams.attention_probs, s.type,
                                         s.batch * A * T, T, stream),
          "the attention softmax backward");
    attention_product(e, s, dqh.get(), false, {dscores.get(), true}, false, {st.k.get(), false},
                      false, T, d, T, stream, "dQ");
    attention_product(e, s, dkh.get(), false, {dscores.get(), true}, true, {st.q.get(), false},
                      false, T, d, T, stream, "dK");
    for (const auto& [rows, heads] : {std::pair{&dq, &dqh}, std::pair{&dk, &dkh}, std::pair{&dv, &dvh}})
      check(cuda::merge_heads(rows->get(), heads->get(), s.type, s.batch, T, A, d, stream),
            "an attention gradient's rows");
  }

  // The projections: weight and bias gradients, and dx += each input gradient. Pre-LN: their
  // input was a = LN_a(x); its gradient gathers in da, then LN_a's backward adds to dx.
  device_array da;
  if (pre)
    da = device_array(hidden_bytes, stream);
  struct projection {
    const device_array* grad;
    const void* weight;
    float *dweight, *dbias;
  };
  for (const projection& p : {projection{&dq, w.query, g.query, g.query_bias},
                              projection{&dk, w.key, g.key, g.key_bias},
                              projection{&dv, w.value, g.value, g.value_bias}}) {
    linear_wgrad(e, s, p.dweight, p.grad->get(), pre ? st.a_in.get() : st.x, H, H, stream,
                 "a projection's weight gradient");
    check(cuda::bias_backward(p.dbias, p.grad->get(), s.type, N, H, stream), "a projection's bias gradient");
    const bool first = p.grad == &dq;
    linear_dgrad(e, s, pre ? da.get() : dx, p.grad->get(), p.weight, H, H, pre && first ? 0.0f : 1.0f, stream,
                 "a projection's input gradient");
  }
  if (pre) {
    norm_backward(s.deterministic, da.get(), g.attention_norm_gamma, g.attention_norm_beta, da.get(), st.x,
                  st.mean_a.as<float>(), st.rstd_a.as<float>(), w.attention_norm_gamma, s.type, N, H, stream,
                  "the attention LayerNorm backward (pre-LN)");
    check(cuda::add_into(dx, da.get(), s.type, N * H, stream), "dx += the LayerNorm's gradient");
  }
}

} // namespace dsa::bert::gpu
