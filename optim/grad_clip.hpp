// Global gradient L2 norm over any number of buffers, and DeepSpeed's combined
// unscale + clip factor (fused_optimizer.py / stage_1_and_2.py unscale_and_clip_grads).
// Stages and optimizer shards contribute partial sums of squares; the owner of the
// step adds them (after any allreduce) and takes one square root.
#pragma once

#include "core/dtype.hpp"
#include "core/tensor.hpp"

#include <cstdint>
#include <vector>

namespace dsa::optim {

// Sum of squares of one buffer, accumulated in double. x: (n) of type f32, f16 or bf16.
// Inf or NaN anywhere makes the result non-finite (the overflow signal DeepSpeed reads
// from a norm).
double sum_of_squares(const void* x, dtype type, std::int64_t n);
double sum_of_squares(const tensor& x);

// Accumulates partial sums of squares from any number of buffers, in the order added.
class grad_norm {
public:
  void add_buffer(const tensor& x) { sum_ += optim::sum_of_squares(x); }
  void add_buffer(const void* x, dtype type, std::int64_t n) { sum_ += optim::sum_of_squares(x, type, n); }
  void add_partial(double partial_sum) { sum_ += partial_sum; }
  double total() const { return sum_; }
  double norm() const; // sqrt of the total; inf/nan propagate
  bool finite() const;

private:
  double sum_ = 0.0;
};

// DeepSpeed's factor: with scaled global norm G (norm of loss-scaled grads) and loss scale s,
//   clip = (G / s + 1e-6) / clip_grad;  combined = s * clip if clip_grad > 0 and clip > 1, else s.
// Gradients are then multiplied by 1 / combined. clip_grad <= 0 disables clipping.
double combined_unscale_clip(double scaled_norm, double loss_scale, double clip_grad);

// The unscaled norm DeepSpeed stashes as _global_grad_norm: G / s.
inline double unscaled_norm(double scaled_norm, double loss_scale) { return scaled_norm / loss_scale; }

// x *= factor over an f32 buffer (factor = 1 / combined).
void scale_in_place(float* x, double factor, std::int64_t n);
void scale_in_place(tensor& x, double factor);

} // namespace dsa::optim
