// Fully connected layer y = x W^T + b with HF's [out, in] weight layout, on
// top of the CPU GEMM and bias kernels.
#pragma once

#include "kernels/cpu/gemm.hpp"
#include "models/bert/bert_parameters.hpp"

#include <cstdint>

namespace dsa::bert {

// Whether a kernel overwrites its output or adds to it.
enum class write_mode { overwrite, accumulate };

// The weight may be stored in bf16 (stored_precision.hpp's gemm_input); the bias is f32.
// y: (rows, out) = x: (rows, in), f32 or per gemm_input, W^T + b.
void linear_forward(float* y, cpu::gemm_operand x, const linear_params& p, std::int64_t rows);

// dW += dy^T x, db += sum_rows dy; dx: (rows, in) = or += dy W per `dx_mode`
// (skipped when dx is null). dy: (rows, out), x: (rows, in), as stored (f32 or per gemm_input).
void linear_backward(float* dx, const float* dy, cpu::gemm_operand x, const linear_params& p,
                     std::int64_t rows, write_mode dx_mode);

// The same without the bias: y = x W^T, and dW += dy^T x, dx = or += dy W (dbias left to
// the caller, which fuses bias and activation: cpu::gelu_bias_forward / _backward).
void linear_product(float* y, cpu::gemm_operand x, const linear_params& p, std::int64_t rows);
void linear_backward_products(float* dx, const float* dy, cpu::gemm_operand x, const linear_params& p,
                              std::int64_t rows, write_mode dx_mode);
// The same with dy as the products take it (bf16 already rounded by the caller's kernel);
// with `dbias`, dy (f32) also adds its column sums there, beside dW (now or deferred).
void linear_backward_products(float* dx, cpu::gemm_operand dy, cpu::gemm_operand x, const linear_params& p,
                              std::int64_t rows, write_mode dx_mode, float* dbias = nullptr);

} // namespace dsa::bert
