// Deferred weight gradients, the zero-bubble schedules' B/W split on CPU ranks: while a
// deferral is active on a thread, each weight-gradient product a backward makes there
// (dW += dy^T x: every linear layer's, linear.cpp, and the MLM decoder's,
// pretraining_head.cpp) is recorded with copies of its two operands instead of being
// computed. The backward then yields its input gradient (B) sooner; run() computes the
// recorded products later (W), in recorded order, with the same operands and shapes, so a
// micro-batch's gradients are those of the undeferred backward bit for bit, and W in
// micro-batch order accumulates as 1F1B does. Biases, LayerNorm parameters and the
// embedding tables are cheap and stay in B, except a linear layer's bias in f32, whose
// column sums over dy move with its dW (B then reads dy once less). The copies are the W work's memory (its layers'
// inputs and output gradients).
#pragma once

#include "core/tensor.hpp"
#include "kernels/cpu/gemm.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace dsa::bert {

class deferred_weight_grads {
public:
  // dweight (f32) += op(a) op(b) per `shape` (beta 1), a and b copied now (`a_elements` and
  // `b_elements` of their types, contiguous).
  // With `dbias`, a's column sums go there first (weight_gradient_product).
  void record(const tensor& dweight, cpu::gemm_operand a, std::int64_t a_elements, cpu::gemm_operand b,
              std::int64_t b_elements, const cpu::gemm_shape& shape, float* dbias = nullptr);
  // Other weight-gradient work deferred in the same order (the word embedding's lookup
  // gradient, which the MLM decoder's product also adds to: the tied embedding keeps the
  // plain backward's order). `work` owns what it reads; `bytes` is its size.
  void record_work(std::function<void()> work, std::size_t bytes);
  // Runs the recorded work in order and forgets it.
  void run();
  bool empty() const { return products_.empty(); }
  std::size_t size() const { return products_.size(); }
  std::size_t bytes() const; // the operand copies held

private:
  struct product {
    tensor dweight; // undefined for other work
    tensor a, b; // flat copies of the operands
    dtype a_type = dtype::f32, b_type = dtype::f32;
    cpu::gemm_shape shape;
    float* dbias = nullptr; // a's column sums go here first
    std::function<void()> work;
    std::size_t work_bytes = 0;
  };
  std::vector<product> products_;
};

// While alive, the weight-gradient products of backwards on this thread go to `into`
// (nesting is not allowed).
class defer_weight_grads {
public:
  explicit defer_weight_grads(deferred_weight_grads& into);
  ~defer_weight_grads();
  defer_weight_grads(const defer_weight_grads&) = delete;
  defer_weight_grads& operator=(const defer_weight_grads&) = delete;
};

// The deferral active on this thread, or null.
deferred_weight_grads* weight_grad_deferral();

// dweight += op(a) op(b) per shape (beta 1): now, or recorded when a deferral is active.
// With `dbias`, a is an f32 output gradient (k rows of m, transposed) whose column sums
// also go into dbias (m) just before, in the same place.
void weight_gradient_product(const tensor& dweight, cpu::gemm_operand a, std::int64_t a_elements,
                             cpu::gemm_operand b, std::int64_t b_elements, const cpu::gemm_shape& shape,
                             float* dbias = nullptr);

} // namespace dsa::bert
