// BERT's pre-training heads on the GPU, the parts that are not GEMMs, LayerNorm or GELU:
// sparse softmax cross-entropy (MLM over the vocabulary, NSP over 2 classes), the pooler's
// tanh, and the copies of the masked rows out of the encoder output and of their
// gradients back (models/bert/pretraining_head.cpp is the CPU head). Launchers check sizes
// and required pointers (cudaErrorInvalidValue, nothing launched), run on the given stream
// and return the launch status; no synchronization.
#pragma once

#include "kernels/cuda/elem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsa::cuda {

// Per row r of logits: (rows, classes) of `type`, with labels: (rows) int32 on the device,
// in f32 arithmetic (the row maximum subtracted before the exponentials):
//   row_loss[r]    = -log softmax(logits[r])[labels[r]]                  (rows) f32
//   row_correct[r] = 1 if the argmax of logits[r] is labels[r], else 0   (rows) int32
//   dlogits[r]     = scale * (softmax(logits[r]) - onehot(labels[r]))    (rows, classes) of `type`
// all overwritten. The argmax is cpu::cross_entropy_forward's: the first index holding the
// row's maximum, NaNs skipped (the last index when every element is NaN). A row whose
// label is ignore_index gets loss 0, correct 0 and a zero gradient row. The caller sums
// row_loss on the host (in double) and counts the rows that are not ignored; for the
// gradient of the mean loss, scale = 1 / count.
// Labels must lie in [0, classes) unless ignored: the caller checks them on the host (as
// the CPU head's data is checked). Such a row is not read past its end: it gets a NaN loss
// and NaN gradients, correct 0.
// Any of dlogits, row_loss, row_correct may be null (not written), not all three. dlogits
// may be logits itself (in place); no other overlap. rows and classes at most 2^31 - 1;
// one block per row.
cudaError_t cross_entropy(void* dlogits, float* row_loss, std::int32_t* row_correct,
                          const void* logits, const std::int32_t* labels, std::int32_t ignore_index,
                          float scale, elem type, std::int64_t rows, std::int64_t classes,
                          cudaStream_t stream);

// y = tanh(x) (overwrite), in f32. y, x: (n) of `type`; y may alias x.
cudaError_t tanh_forward(void* y, const void* x, elem type, std::int64_t n, cudaStream_t stream);

// dx = dy * (1 - y * y) (overwrite) from the forward's output y, in f32, 1 - y * y as one
// fused multiply-add (as the CPU build contracts cpu::tanh_backward's). dx, dy, y: (n) of
// `type`; dx may alias dy or y.
cudaError_t tanh_backward(void* dx, const void* dy, const void* y, elem type, std::int64_t n,
                          cudaStream_t stream);

// dst[i] = src[rows_index[i]] (overwrite, exact). dst: (count, c) of `type`; src: (rows, c)
// of `type`; rows_index: (count) int64 on the device, each in [0, rows) (the caller's
// invariant: not checked). dst and src must not overlap. count at most 2^31 - 1.
cudaError_t gather_rows(void* dst, const void* src, const std::int64_t* rows_index, elem type,
                        std::int64_t count, std::int64_t c, cudaStream_t stream);

// dst[rows_index[i]] += src[i] (accumulate), each element added in f32 and rounded once to
// `type`. dst: (rows, c) of `type`; src: (count, c) of `type`; rows_index: (count) int64 on
// the device, each in [0, rows) and all distinct (the caller's invariant, not checked: no
// atomics, so a repeated index races). dst and src must not overlap. count at most 2^31 - 1.
cudaError_t scatter_add_rows(void* dst, const void* src, const std::int64_t* rows_index, elem type,
                             std::int64_t count, std::int64_t c, cudaStream_t stream);

} // namespace dsa::cuda
