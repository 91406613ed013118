// BERT's embedding layer on the GPU: word + position + token-type lookup, LayerNorm and
// dropout in one pass over each row, and its backward down to the three tables' gradients.
// The same arithmetic as models/bert/embeddings.cpp; masks equal the CPU's bit for bit.
#pragma once

#include "core/philox.hpp"
#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// For every row r of rows = batch * seq (the position of row r is t = r % seq, its token
// type tt = token_types[r], or 0 when token_types is null):
//   e = word[ids[r]] + (position[t] + token_type[tt])   (f32, in that order),
//   out = dropout(LayerNorm(e)), the mask drawn from element r hidden + j of `rng`,
//   kept values scaled by 1 / (1 - p);
//   sum = e rounded to `type` (the stash backward needs), written when non-null.
// ids, token_types: (rows) int32; word: (vocab, hidden), position: (>= seq, hidden),
// token_type: (types, hidden), tables of `type`; out, sum: (rows, hidden) of `type`;
// gamma, beta: (hidden) f32; mean, rstd: (rows) f32. out, sum, mean and rstd are
// overwritten and alias no input. The caller guarantees 0 <= ids[r] < vocab and
// 0 <= token_types[r] < types (the kernel cannot check them: it has no table sizes and the
// ids live on the device; check them on the host). p in [0, 1); rows a multiple of seq,
// rows < 2^31, rows hidden < 2^34 (the stream's Philox blocks). Bad sizes and null required
// pointers give cudaErrorInvalidValue without a launch; rows == 0 launches nothing.
cudaError_t embedding_forward(void* out, void* sum, float* mean, float* rstd,
                              const std::int32_t* ids, const std::int32_t* token_types,
                              const void* word, const void* position, const void* token_type,
                              const float* gamma, const float* beta, float eps, float p,
                              const philox_stream& rng, elem type, std::int64_t rows,
                              std::int64_t seq, std::int64_t hidden, cudaStream_t stream);

// The backward of the forward above, from its saved sum, mean and rstd. Per row, in f32:
//   d = dropout backward of dout (the mask drawn again from element r hidden + j of `rng`),
//   de = LayerNorm input gradient of d (from sum, mean, rstd and gamma), then
//   dposition[t] += de, dtoken_type[tt] += de, dword[ids[r]] += de unless ids[r] == pad_id
//   (those word rows receive nothing: HF padding_idx), and
//   dgamma += sum_r d xhat, dbeta += sum_r d (each skipped when null).
// dout, sum: (rows, hidden) of `type`; mean, rstd: (rows) f32; gamma, dgamma, dbeta:
// (hidden) f32; dword: (vocab, hidden), dposition: (>= seq, hidden), dtoken_type:
// (types, hidden), all f32. ids, token_types, the ranges, p, rng and the sizes as in the
// forward. Every gradient accumulates through f32 atomics, so its rounding depends on the
// order rows arrive in (not bit-reproducible from run to run; the sum's terms are fixed).
cudaError_t embedding_backward(float* dword, float* dposition, float* dtoken_type, float* dgamma,
                               float* dbeta, const void* dout, const void* sum, const float* mean,
                               const float* rstd, const float* gamma, const std::int32_t* ids,
                               const std::int32_t* token_types, std::int32_t pad_id, float p,
                               const philox_stream& rng, elem type, std::int64_t rows,
                               std::int64_t seq, std::int64_t hidden, cudaStream_t stream);

} // namespace dsa::cuda
