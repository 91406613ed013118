// Dense GEMM and strided batched GEMM on the CPU through OpenBLAS (fp32),
// with fp16/bf16 operands converted to fp32 first (or, with bf16 GEMM operands on, through
// gemm_bf16). Row-major throughout.
#pragma once

#include "core/dtype.hpp"

#include <cstdint>

namespace dsa::cpu {

enum class transpose : std::uint8_t { no, yes };

// C(m, n) = alpha * op(A)(m, k) * op(B)(k, n) + beta * C.
// op(A) is A (m, k) when trans_a is no, else A is stored (k, m). Likewise B.
// Leading dimensions are row strides in elements; 0 means packed.
struct gemm_shape {
  std::int64_t m = 0, n = 0, k = 0;
  transpose trans_a = transpose::no;
  transpose trans_b = transpose::no;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f; // 0: C is overwritten (its old contents may be NaN); 1: accumulate
};

// Batch i uses A + i*stride_a, B + i*stride_b, C + i*stride_c (elements).
struct gemm_batch {
  std::int64_t count = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};
// A second level of batching: `count` groups of a batch's entries, group g's operands and
// result g * stride further on (attention's sequences, each a batch of heads).
struct gemm_groups {
  std::int64_t count = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// c: (m, n) = / += per beta; a, b per shape. No aliasing between c and a/b.
void gemm(float* c, const float* a, const float* b, const gemm_shape& shape);
void gemm_batched(float* c, const float* a, const float* b, const gemm_shape& shape, const gemm_batch& batch);
// An operand as stored: f32, f16 or bf16 elements (a GEMM computes with their exact f32
// values). Implicit from const float*, so f32 call sites read as before.
struct gemm_operand {
  const void* data = nullptr;
  dtype type = dtype::f32;
  gemm_operand() = default;
  gemm_operand(const float* p) : data(p) {}
  gemm_operand(const void* p, dtype t) : data(p), type(t) {}
  // The operand `elements` further on.
  gemm_operand advanced(std::int64_t elements) const;
};
// The contract of gemm / gemm_batched on stored operands, with the same result as widening
// each to f32 first. With bf16 GEMM operands on (gemm_bf16.hpp) a bf16 operand is used as it
// is and the others are rounded to bf16; otherwise the half ones are widened. So a model that
// keeps weights and activations in bf16 passes them straight to a bf16 product, with no
// round trip through f32.
void gemm(float* c, gemm_operand a, gemm_operand b, const gemm_shape& shape);
void gemm_batched(float* c, gemm_operand a, gemm_operand b, const gemm_shape& shape, const gemm_batch& batch);
// With bf16 GEMM operands on, every group of `batch` in one bf16 call (gemm_bf16_groups: its
// threads split the whole grid, where one call per group from inside a parallel region runs
// each on one thread); f32/f16 operands are rounded first. False, with nothing written, when
// the mode is off or the layout is not one call: the caller then runs the groups itself.
bool gemm_batched_groups(float* c, gemm_operand a, gemm_operand b, const gemm_shape& shape, const gemm_batch& batch,
                         const gemm_groups& groups);
// The shape with leading dimensions resolved (0 -> packed) and checked (a broken invariant
// when one is too small or a size negative).
gemm_shape resolve_gemm_shape(const gemm_shape& shape);
// Elements a stored operand spans: A (which_a) or B of a resolved shape, over `count` batch
// entries `stride` apart.
std::int64_t gemm_operand_extent(const gemm_shape& resolved, bool which_a, std::int64_t count = 1,
                                 std::int64_t stride = 0);

// Whether the C blocks of a batch (resolved shape) are pairwise disjoint: separate matrices,
// or side by side within the same rows (attention's heads as column blocks of (T, H) rows).
bool gemm_c_disjoint(const gemm_shape& resolved, const gemm_batch& batch);
// C = beta C (beta 0 overwrites, NaN included) for one entry of a resolved shape: all a
// product with k = 0 leaves.
void gemm_scale_c(float* c, const gemm_shape& resolved);

// Reference: plain loops, double accumulation. Same contract as gemm_batched.
void gemm_ref(float* c, const float* a, const float* b, const gemm_shape& shape,
              const gemm_batch& batch = {});

} // namespace dsa::cpu
