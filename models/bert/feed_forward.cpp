// Feed-forward forward/backward with optional GELU recompute.
#include "models/bert/feed_forward.hpp"

#include "kernels/cpu/activation.hpp"
#include "models/bert/stored_precision.hpp"

#include <memory>
#include <vector>

namespace dsa::bert {

void feed_forward_forward(float* out, feed_forward_stash& stash, const tensor& x,
                          const layer_params& p, const memory_flags& flags, dtype stash_type) {
  const std::int64_t rows = x.dim(0), I = p.intermediate.out_features();
  tensor ff1 = tensor::empty({rows, I}, dtype::f32);
  // The first projection's bias and the GELU in one pass (ff1 keeps the biased value).
  linear_product(ff1.data<float>(), gemm_source(x, stash.x), p.intermediate, rows);
  if (stash_type != dtype::f32 && gemm_reads_stored(stash_type) && !flags.gelu_checkpoint) {
    // The stash and the output projection read only the bf16 values: the pass writes them
    // and no f32 GELU output (the same bits as rounding the f32 results).
    stash.ff1 = tensor::empty({rows, I}, stash_type);
    stash.gelu = tensor::empty({rows, I}, stash_type);
    cpu::gelu_bias_forward_half(cpu::active_isa(), stash.gelu.data<std::uint16_t>(), stash.ff1.data<std::uint16_t>(),
                                stash_type, ff1.data<float>(), p.intermediate.bias.data<float>(), rows, I);
    ff1 = tensor{};
    linear_product(out, operand(stash.gelu), p.output, rows); // bias: the caller's
    return;
  }
  tensor gelu = tensor::empty({rows, I}, dtype::f32);
  cpu::gelu_bias_forward(gelu.data<float>(), ff1.data<float>(), p.intermediate.bias.data<float>(), rows, I);
  if (!flags.gelu_checkpoint)
    stash.gelu = keep(gelu, stash_type);
  linear_product(out, gemm_source(gelu, stash.gelu), p.output, rows);
  stash.ff1 = keep(ff1, stash_type);
}

void feed_forward_backward(float* dx, const float* dout, const feed_forward_stash& stash,
                           const layer_params& p, write_mode dx_mode) {
  const std::int64_t rows = stash.x.dim(0), I = p.intermediate.out_features();
  // ff1 as stashed: the GELU gradient widens each slice it reads; the recompute needs it whole.
  tensor ff1 = stash.ff1;
  tensor gelu = gemm_input(stash.gelu); // only the output projection's dW reads it
  if (!gelu.defined()) {
    ff1 = widen(stash.ff1);
    gelu = tensor::empty({rows, I}, dtype::f32);
    cpu::gelu_forward(gelu.data<float>(), ff1.data<float>(), rows * I);
  }
  const auto dgelu = scratch_floats(rows * I); // overwritten whole
  linear_backward(dgelu.get(), dout, operand(gelu), p.output, rows, write_mode::overwrite);
  gelu = tensor{};
  const tensor x_in = gemm_input(stash.x); // held: a widened copy lives as long as the tensor
  const cpu::gemm_operand x = operand(x_in);
  if (gemm_reads_stored(dtype::bf16)) {
    // The products read the GELU gradient in bf16 only: the kernel writes it rounded (the
    // bits shared_gemm_input would make of the f32 values) and no f32 copy.
    std::unique_ptr<std::uint16_t[]> rounded(new std::uint16_t[static_cast<std::size_t>(rows * I)]);
    cpu::gelu_bias_backward(cpu::active_isa(), nullptr, rounded.get(), p.intermediate.dbias.data<float>(),
                            dgelu.get(), ff1.raw_data(), ff1.type(), rows, I);
    linear_backward_products(dx, cpu::gemm_operand{rounded.get(), dtype::bf16}, x, p.intermediate, rows, dx_mode);
    return;
  }
  cpu::gelu_bias_backward(cpu::active_isa(), dgelu.get(), p.intermediate.dbias.data<float>(), dgelu.get(),
                          ff1.raw_data(), ff1.type(), rows, I);
  linear_backward_products(dx, dgelu.get(), x, p.intermediate, rows, dx_mode);
}

} // namespace dsa::bert
