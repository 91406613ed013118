// BERT attention's scaled masked softmax fused with the dropout of its probabilities, on
// the GPU: a warp per row held in registers (a block per row past 1024 keys), f32
// arithmetic, masks drawn from the same Philox elements as the CPU
// (kernels/common/dropout_math.hpp), so a CUDA run compares with
// cpu::softmax_dropout_forward / cpu::softmax_dropout_backward (kernels/cpu/softmax.hpp).
// Launchers check sizes, run on the given stream, and return the launch status.
#pragma once

#include "core/philox.hpp"
#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// probs, dropped, scores: (batch, heads, tq, tk) of `type`; key_mask: (batch, tk) f32,
// 1 = attend, 0 = masked, or null (every key attended). Overwrites:
//   probs = softmax(scale * scores) over tk, masked keys given probability exactly 0 and a
//           row whose keys are all masked all zeros;
//   dropped = probs * mask / (1 - p), element i of the tensor kept iff element i of `rng` is
//           (computed from the f32 probabilities, then rounded to `type`).
// Either output may be null, not both. dropped needs p in (0, 1) and at most 2^34
// elements (the stream's Philox blocks); p is unused without it. probs may alias scores.
cudaError_t softmax_dropout_forward(void* probs, void* dropped, const void* scores,
                                    const float* key_mask, float scale, float p,
                                    const philox_stream& rng, elem type, std::int64_t batch,
                                    std::int64_t heads, std::int64_t tq, std::int64_t tk,
                                    cudaStream_t stream);

// dscores, ddropped, probs: (rows, tk) of `type`, rows = batch * heads * tq. Overwrites
//   dprobs = ddropped * mask / (1 - p) (the forward's mask regenerated from `rng`; p == 0:
//            dprobs = ddropped, rng unused),
//   dscores = scale * probs * (dprobs - sum_k(dprobs * probs)).
// p in [0, 1); with p > 0 at most 2^34 elements. dscores may alias ddropped.
cudaError_t softmax_dropout_backward(void* dscores, const void* ddropped, const void* probs,
                                     float scale, float p, const philox_stream& rng, elem type,
                                     std::int64_t rows, std::int64_t tk, cudaStream_t stream);

} // namespace dsa::cuda
