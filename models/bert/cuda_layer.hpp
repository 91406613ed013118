// One BERT encoder layer on the GPU, forward and backward, composed from the CUDA kernels
// (kernels/cuda/) and cuBLASLt GEMMs (cuda::gemm_engine). The same arithmetic as
// encoder_layer_forward / encoder_layer_backward on the CPU, with the same dropout streams,
// so a GPU layer compares with the CPU layer with dropout on. Post-LN (BERT's):
//   h = LN_a(x + drop(attention(x) + bo));   y = LN_o(h + drop(W2 gelu(W1 h + b1) + b2))
// pre-LN:
//   h = x + drop(attention(LN_a(x)) + bo);   y = h + drop(W2 gelu(W1 LN_o(h) + b1) + b2)
// Activations, their gradients and the weight copies the products read are of one storage
// type (f32, f16 or bf16); biases, LayerNorm parameters, statistics and every parameter
// gradient are f32. Everything is enqueued on the caller's stream; nothing waits on the host.
// DeepSpeed's three memory flags trade backward compute for stash memory (layer_shape).
#pragma once

#include "core/philox.hpp"
#include "kernels/cuda/elem.hpp"
#include "kernels/cuda/gemm.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::bert::gpu {

// Device memory taken and given back in stream order (cudaMallocAsync from the device's
// pool, which keeps freed blocks: no cudaMalloc per step once the pool has grown).
class device_array {
public:
  device_array() = default;
  device_array(std::size_t bytes, cudaStream_t stream);
  // From `pool` (null: the device's default pool), e.g. cuda::binding_pool.
  device_array(std::size_t bytes, cudaStream_t stream, cudaMemPool_t pool);
  ~device_array();
  device_array(device_array&& other) noexcept;
  device_array& operator=(device_array&& other) noexcept;
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  void* get() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  // The stream its free is ordered on from now on (the one it was allocated on until then);
  // the caller has ordered `stream` after the allocation and every use so far on others
  // (an event), as cudaFreeAsync requires.
  void free_on(cudaStream_t stream) { stream_ = stream; }

private:
  void* ptr_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// The layer's parameters as the products read them: matrices (out, in) of the storage type,
// vectors f32. HF names: query/key/value/attention_out are attention.self.* and
// attention.output.dense, intermediate and output the feed-forward's two projections.
struct layer_weights {
  const void *query = nullptr, *key = nullptr, *value = nullptr, *attention_out = nullptr;
  const void *intermediate = nullptr, *output = nullptr;
  const float *query_bias = nullptr, *key_bias = nullptr, *value_bias = nullptr;
  const float *attention_out_bias = nullptr, *intermediate_bias = nullptr, *output_bias = nullptr;
  const float *attention_norm_gamma = nullptr, *attention_norm_beta = nullptr;
  const float *output_norm_gamma = nullptr, *output_norm_beta = nullptr;
};

// Their gradients, f32, accumulated (+=) by each backward; the same layout.
struct layer_grads {
  float *query = nullptr, *key = nullptr, *value = nullptr, *attention_out = nullptr;
  float *intermediate = nullptr, *output = nullptr;
  float *query_bias = nullptr, *key_bias = nullptr, *value_bias = nullptr;
  float *attention_out_bias = nullptr, *intermediate_bias = nullptr, *output_bias = nullptr;
  float *attention_norm_gamma = nullptr, *attention_norm_beta = nullptr;
  float *output_norm_gamma = nullptr, *output_norm_beta = nullptr;
};

struct layer_shape {
  std::int64_t batch = 0, seq = 0, hidden = 0, heads = 0, intermediate = 0;
  float eps = 1e-12f;
  float hidden_dropout = 0.0f, attention_dropout = 0.0f; // the rates applied (0 in eval)
  cuda::elem type = cuda::elem::bf16;
  bool pre_norm = false; // LayerNorm placement: pre-LN when set, else post-LN
  // gelu_checkpoint: the GELU output is not stashed; the backward recomputes it from the
  // stashed first projection (the same kernel on the same input: the same bits).
  bool gelu_checkpoint = false;
  // attn_dropout_checkpoint: the dropped-out probabilities are not stashed; the backward
  // applies the same dropout mask to the stashed probabilities again. f32 storage: the same
  // bits; half storage: the forward rounded probs * mask / (1 - p) from f32 probabilities,
  // the recompute rounds it from the stored ones (at most an ulp of the storage type apart).
  bool attn_dropout_checkpoint = false;
  // normalize_invertible: the LayerNorms' inputs are not stashed where their outputs are
  // kept anyway (post-LN: both exits', from h and the layer's output y, which the caller
  // keeps until the backward; pre-LN: LN_o's, from h); the backward rebuilds each input
  // from the output (layernorm_invert) before its LayerNorm backward.
  bool normalize_invertible = false;
  // devices.deterministic: the LayerNorm and bias gradients by ordered sums (ordered_sums.hpp)
  // instead of the fused kernels' float atomics.
  bool deterministic = false;
  std::int64_t rows() const { return batch * seq; }
  std::int64_t head_size() const { return hidden / heads; }
};

// The three dropout streams of the layer (forward_context::stream(layer, site::...)).
struct layer_streams {
  philox_stream attention_probs, attention_output, ffn_output;
};

// What the forward keeps for the backward (the input x is the caller's and must outlive it).
// q, k, v are head-major (batch, heads, seq, d); probs and dropped (batch, heads, seq, seq);
// the rest (rows, hidden) or (rows, intermediate), statistics (rows) f32. dropped and gelu
// stay empty under their memory flags.
// Post-LN: sum_a / mean_a / rstd_a are LN_a's input and statistics, h its output (the
// feed-forward's input), sum_o / mean_o / rstd_o LN_o's. Pre-LN: a_in = LN_a(x) (the
// attention's input) with mean_a / rstd_a, sum_o the residual stream after attention (LN_o's
// input) with mean_o / rstd_o, h = LN_o(sum_o) (the feed-forward's input); sum_a unused.
struct layer_stash {
  const void* x = nullptr;
  const void* y = nullptr; // the output (the caller's), read back under normalize_invertible
  device_array a_in;
  device_array q, k, v, probs, dropped, context;
  device_array sum_a, mean_a, rstd_a, h;
  device_array ff1, gelu, sum_o, mean_o, rstd_o;
};

// LayerNorm backward from its input x: dx overwritten (it may alias dy), dgamma += and
// dbeta += through the kernel's atomics, or with `deterministic` by ordered sums (taken
// before dx overwrites dy). Throws std::runtime_error naming `what`.
void norm_backward(bool deterministic, void* dx, float* dgamma, float* dbeta, const void* dy, const void* x,
                   const float* mean, const float* rstd, const float* gamma, cuda::elem type, std::int64_t rows,
                   std::int64_t c, cudaStream_t stream, const char* what);

// x, y: (batch * seq, hidden) of the storage type; key_mask: (batch, seq) f32 on the
// device, 1 = attend, or null. With normalize_invertible (post-LN) y must outlive the
// backward. Throws std::runtime_error naming the step that failed.
void layer_forward(cuda::gemm_engine& engine, const layer_weights& w, const layer_shape& shape,
                   const layer_streams& streams, const void* x, const float* key_mask, void* y,
                   layer_stash& stash, cudaStream_t stream);

// dy, dx: (batch * seq, hidden) of the storage type; dx is overwritten, gradients +=.
void layer_backward(cuda::gemm_engine& engine, const layer_weights& w, const layer_grads& g,
                    const layer_shape& shape, const layer_streams& streams,
                    const layer_stash& stash, const void* dy, void* dx, cudaStream_t stream);

} // namespace dsa::bert::gpu
