// Parameters and stashed activations held in f16/bf16 while the CPU computes in
// f32 (CPU ranks compute in f32 and keep working copies in half).
// widen() makes the f32 copy a layer computes with; the copy lives as long as the
// caller holds it (one layer at a time), so the half values are the only lasting
// copy. keep() makes the copy of an f32 activation that the stash holds for
// backward. Both return their argument itself, sharing storage, when it is
// already in the wanted dtype: f32 runs copy nothing.
#pragma once

#include "core/tensor.hpp"
#include "kernels/cpu/gemm.hpp"

#include <cstdint>
#include <memory>
#include <vector>
#include "models/bert/bert_parameters.hpp"

namespace dsa::bert {

// t: f32, f16 or bf16, contiguous. Returns t when f32, else a new f32 tensor of its values.
tensor widen(const tensor& t);
// x: f32, contiguous. Returns x when type is f32, else a new `type` tensor of x rounded
// to nearest even. type: f32, f16 or bf16.
tensor keep(const tensor& x, dtype type);

// Whether a GEMM takes `type` values as they are stored: f32, or bf16 while bf16 GEMM
// operands are on (cpu::bf16_operands). Then a layer whose stash is of that type may hand
// the products its stash copies and need no f32 result of its own.
bool gemm_reads_stored(dtype type);

// What a GEMM takes t as: t itself when the GEMM uses it as stored (f32, or bf16 while bf16
// GEMM operands are on, cpu::bf16_operands), else widen(t). So a bf16 run with bf16.cpu_gemm
// hands its bf16 weights and stashed activations to the product with no round trip.
tensor gemm_input(const tensor& t);
// t (f32, f16 or bf16) as a GEMM operand; t must outlive the call.
cpu::gemm_operand operand(const tensor& t);
// The operand a forward GEMM reads for the f32 activation x whose stash copy is `kept`
// (keep(x, stash type), or undefined): kept when the GEMM takes it as it is (bf16 with bf16
// GEMM operands on; x rounded once for both), else x. The same bits either way. x may be
// undefined when kept is such a copy (its f32 values were never made).
cpu::gemm_operand gemm_source(const tensor& x, const tensor& kept);

// f32 values that several products read (a gradient both dW and dx need): rounded to bf16
// once when bf16 GEMM operands are on, else the f32 values themselves. The same bits as each
// product rounding them. x must outlive it.
class shared_gemm_input {
public:
  shared_gemm_input(const float* x, std::int64_t n);
  // The same for an output gradient x (rows, cols) whose column sums also go into dbias
  // (cols; bias_backward's bits): when rounding, one pass does both (bias_backward_rounded).
  shared_gemm_input(const float* x, std::int64_t rows, std::int64_t cols, float* dbias);
  cpu::gemm_operand operand() const { return operand_; }

private:
  std::unique_ptr<std::uint16_t[]> rounded_; // not zero-filled: the cast writes it whole
  cpu::gemm_operand operand_;
};

// n f32 elements left uninitialized, for a buffer a product overwrites whole (zero-filling
// such buffers took ~3% of a bf16 step in perf).
inline std::unique_ptr<float[]> scratch_floats(std::int64_t n) {
  return std::unique_ptr<float[]>(new float[static_cast<std::size_t>(n)]);
}

// The same views with weight and bias widened to f32 (a linear weight per gemm_input); the gradients (always f32)
// stay the parameters' own, so backward still accumulates into them.
linear_params widen(const linear_params& p);
layernorm_params widen(const layernorm_params& p);
layer_params widen(const layer_params& p);
squad_head_params widen(const squad_head_params& p);
// Widens every tensor of the head; the tied word embedding (V, H) per gemm_input.
pretraining_head_params widen(const pretraining_head_params& p);

} // namespace dsa::bert
