// Sparse softmax cross-entropy with ignore_index (MLM, NSP, SQuAD spans).
#pragma once

#include "kernels/cpu/isa.hpp"

#include <cstdint>

namespace dsa::cpu {

struct xent_sum {
  double loss_sum = 0.0;   // sum over counted rows of -log softmax(logits)[label]
  std::int64_t count = 0;  // rows whose label != ignore_index
  std::int64_t correct = 0; // counted rows whose argmax equals the label
};

// logits: (rows, classes); labels: (rows). A label outside [0, classes) that is not
// ignore_index is a broken invariant (data is validated before it gets here).
xent_sum cross_entropy_forward(const float* logits, const std::int32_t* labels, std::int32_t ignore_index,
                               std::int64_t rows, std::int64_t classes);
// dlogits = scale * (softmax(logits) - onehot(label)) for counted rows, 0 for ignored rows.
// For the gradient of the mean loss, scale = 1 / count. dlogits may alias logits.
void cross_entropy_backward(float* dlogits, const float* logits, const std::int32_t* labels,
                            std::int32_t ignore_index, float scale, std::int64_t rows, std::int64_t classes);

// The two on a given path (at most the CPU's best): avx512 runs row loops compiled for
// 16-lane vectors; scalar and avx2 run the build's.
xent_sum cross_entropy_forward(isa path, const float* logits, const std::int32_t* labels, std::int32_t ignore_index,
                               std::int64_t rows, std::int64_t classes);
void cross_entropy_backward(isa path, float* dlogits, const float* logits, const std::int32_t* labels,
                            std::int32_t ignore_index, float scale, std::int64_t rows, std::int64_t classes);

// The forward and the backward of the mean loss in one parallel region, three passes over
// each row (bias + max, exponentials, scale), for heads that need both at once: logits (rows, classes), with bias (classes) added first when given,
// are overwritten by the gradient of the mean loss over counted rows, (softmax - onehot) /
// count (0 for ignored rows; all 0 when none is counted). The sums and the gradient are
// those of bias_add, cross_entropy_forward and cross_entropy_backward with scale 1 / count
// (within the rounding of the exponentials' summation order), with two fewer
// exponential passes, one fewer max pass and no separate bias pass per row.
xent_sum cross_entropy_mean_grad(isa path, float* logits, const float* bias, const std::int32_t* labels,
                                 std::int32_t ignore_index, std::int64_t rows, std::int64_t classes);
xent_sum cross_entropy_mean_grad(float* logits, const float* bias, const std::int32_t* labels,
                                 std::int32_t ignore_index, std::int64_t rows, std::int64_t classes);

xent_sum cross_entropy_forward_ref(const float* logits, const std::int32_t* labels,
                                   std::int32_t ignore_index, std::int64_t rows, std::int64_t classes);

} // namespace dsa::cpu
