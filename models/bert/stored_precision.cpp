// Conversions between a range's stored precision and the f32 it computes in.
#include "models/bert/stored_precision.hpp"

#include "kernels/cpu/bias.hpp"
#include "kernels/cpu/convert.hpp"
#include "kernels/cpu/gemm_bf16.hpp"

namespace dsa::bert {

tensor widen(const tensor& t) {
  if (!t.defined() || t.type() == dtype::f32)
    return t;
  DSA_CHECK(t.is_contiguous(), "widen of a non-contiguous tensor {}", t.describe());
  tensor out = tensor::empty(t.shape(), dtype::f32);
  cpu::cast(out.raw_data(), dtype::f32, t.raw_data(), t.type(), t.numel());
  return out;
}

tensor keep(const tensor& x, dtype type) {
  if (!x.defined() || type == x.type())
    return x;
  DSA_CHECK(x.type() == dtype::f32 && x.is_contiguous(), "keep({}) of {}: needs contiguous f32",
            dtype_name(type), x.describe());
  tensor out = tensor::empty(x.shape(), type);
  cpu::cast(out.raw_data(), type, x.raw_data(), dtype::f32, x.numel());
  return out;
}

bool gemm_reads_stored(dtype type) { return type == dtype::f32 || (type == dtype::bf16 && cpu::bf16_operands()); }

tensor gemm_input(const tensor& t) {
  if (t.defined() && gemm_reads_stored(t.type()))
    return t;
  return widen(t);
}

cpu::gemm_operand operand(const tensor& t) {
  DSA_CHECK(t.is_contiguous(), "GEMM operand of a non-contiguous tensor {}", t.describe());
  return {t.raw_data(), t.type()};
}

cpu::gemm_operand gemm_source(const tensor& x, const tensor& kept) {
  if (kept.defined() && kept.type() != dtype::f32 && gemm_reads_stored(kept.type())) {
    DSA_CHECK(!x.defined() || kept.numel() == x.numel(), "gemm_source: stash copy {} of {}", kept.describe(),
              x.describe());
    return operand(kept);
  }
  return operand(x);
}

shared_gemm_input::shared_gemm_input(const float* x, std::int64_t n) : operand_(x) {
  if (!cpu::bf16_operands())
    return;
  rounded_.reset(new std::uint16_t[static_cast<std::size_t>(n)]);
  cpu::cast(rounded_.get(), dtype::bf16, x, dtype::f32, n);
  operand_ = cpu::gemm_operand{rounded_.get(), dtype::bf16};
}

shared_gemm_input::shared_gemm_input(const float* x, std::int64_t rows, std::int64_t cols, float* dbias)
    : operand_(x) {
  if (!cpu::bf16_operands()) {
    cpu::bias_backward(dbias, x, rows, cols);
    return;
  }
  rounded_.reset(new std::uint16_t[static_cast<std::size_t>(rows * cols)]);
  cpu::bias_backward_rounded(cpu::active_isa(), dbias, rounded_.get(), x, rows, cols);
  operand_ = cpu::gemm_operand{rounded_.get(), dtype::bf16};
}

linear_params widen(const linear_params& p) {
  return linear_params{gemm_input(p.weight), widen(p.bias), p.dweight, p.dbias};
}

layernorm_params widen(const layernorm_params& p) {
  return layernorm_params{widen(p.weight), widen(p.bias), p.dweight, p.dbias};
}

layer_params widen(const layer_params& p) {
  layer_params w;
  w.query = widen(p.query);
  w.key = widen(p.key);
  w.value = widen(p.value);
  w.attention_out = widen(p.attention_out);
  w.attention_norm = widen(p.attention_norm);
  w.intermediate = widen(p.intermediate);
  w.output = widen(p.output);
  w.output_norm = widen(p.output_norm);
  return w;
}

squad_head_params widen(const squad_head_params& p) {
  return squad_head_params{widen(p.qa_outputs)};
}

pretraining_head_params widen(const pretraining_head_params& p) {
  pretraining_head_params w = p;
  w.word = gemm_input(p.word);
  w.pooler = widen(p.pooler);
  w.transform = widen(p.transform);
  w.transform_norm = widen(p.transform_norm);
  w.decoder_bias = widen(p.decoder_bias);
  w.seq_relationship = widen(p.seq_relationship);
  return w;
}

} // namespace dsa::bert
