// Fully connected layer y = x W^T + b with HF's [out, in] weight layout, on
// top of the CPU GEMM and bias kernels.
#pragma once

#include "models/bert/bert_parameters.hpp"

#include <cstdint>

namespace dsa::bert {

// Whether a kernel overwrites its output or adds to it.
enum class write_mode { overwrite, accumulate };

// y: (rows, out) = x: (rows, in) W^T + b.
void linear_forward(float* y, const float* x, const linear_params& p, std::int64_t rows);

// dW += dy^T x, db += sum_rows dy; dx: (rows, in) = or += dy W per `dx_mode`
// (skipped when dx is null). dy: (rows, out), x: (rows, in).
void linear_backward(float* dx, const float* dy, const float* x, const linear_params& p,
                     std::int64_t rows, write_mode dx_mode);

} // namespace dsa::bert
