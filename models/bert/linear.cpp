// Linear forward/backward through cpu::gemm.
#include "models/bert/linear.hpp"

#include "kernels/cpu/bias.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/gemm_bf16.hpp"
#include "models/bert/stored_precision.hpp"
#include "models/bert/weight_grads.hpp"

namespace dsa::bert {

void linear_product(float* y, cpu::gemm_operand x, const linear_params& p, std::int64_t rows) {
  if (rows == 0)
    return;
  cpu::gemm_shape s;
  s.m = rows;
  s.n = p.out_features();
  s.k = p.in_features();
  s.trans_b = cpu::transpose::yes; // W is stored (out, in)
  cpu::gemm(y, x, operand(p.weight), s);
}

void linear_forward(float* y, cpu::gemm_operand x, const linear_params& p, std::int64_t rows) {
  if (rows == 0)
    return;
  linear_product(y, x, p, rows);
  cpu::bias_add(y, p.bias.data<float>(), rows, p.out_features());
}

void linear_backward_products(float* dx, const float* dy, cpu::gemm_operand x, const linear_params& p,
                              std::int64_t rows, write_mode dx_mode) {
  if (rows == 0)
    return;
  const shared_gemm_input dy_in(dy, rows * p.out_features()); // both products read dy
  linear_backward_products(dx, dy_in.operand(), x, p, rows, dx_mode);
}

void linear_backward_products(float* dx, cpu::gemm_operand dy, cpu::gemm_operand x, const linear_params& p,
                              std::int64_t rows, write_mode dx_mode, float* dbias) {
  const std::int64_t out = p.out_features(), in = p.in_features();
  if (rows == 0)
    return;
  cpu::gemm_shape dw; // dW (out, in) += dy^T (out, rows) x (rows, in)
  dw.m = out;
  dw.n = in;
  dw.k = rows;
  dw.trans_a = cpu::transpose::yes;
  dw.beta = 1.0f;
  weight_gradient_product(p.dweight, dy, rows * out, x, rows * in, dw, dbias); // W: now, or deferred (weight_grads.hpp)
  if (dx == nullptr)
    return;
  cpu::gemm_shape dxs; // dx (rows, in) = dy (rows, out) W (out, in)
  dxs.m = rows;
  dxs.n = in;
  dxs.k = out;
  dxs.beta = dx_mode == write_mode::accumulate ? 1.0f : 0.0f;
  cpu::gemm(dx, dy, operand(p.weight), dxs);
}

void linear_backward(float* dx, const float* dy, cpu::gemm_operand x, const linear_params& p, std::int64_t rows,
                     write_mode dx_mode) {
  if (rows == 0)
    return;
  if (weight_grad_deferral() != nullptr && !cpu::bf16_operands()) {
    // B/W split in f32: the bias gradient goes with the deferred dW, which copies dy anyway.
    linear_backward_products(dx, cpu::gemm_operand(dy), x, p, rows, dx_mode, p.dbias.data<float>());
    return;
  }
  // Both products read dy: rounded to bf16 in the bias gradient's pass when they take bf16.
  const shared_gemm_input dy_in(dy, rows, p.out_features(), p.dbias.data<float>());
  linear_backward_products(dx, dy_in.operand(), x, p, rows, dx_mode);
}

} // namespace dsa::bert
