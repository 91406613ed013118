// Deferred weight gradients; see weight_grads.hpp.
#include "models/bert/weight_grads.hpp"

#include "core/error.hpp"
#include "kernels/cpu/bias.hpp"

#include <cstring>

namespace dsa::bert {
namespace {

thread_local deferred_weight_grads* active = nullptr;

// An uninitialised tensor (large ones come from the host page cache, core/host_allocator.hpp)
// rather than a zero-filled vector: the copy is on B's critical path, and a fresh vector
// costs a memset and, above malloc's mmap threshold, a page fault per 4 KiB.
tensor copy_of(cpu::gemm_operand x, std::int64_t elements) {
  tensor out = tensor::empty({elements}, x.type);
  const std::size_t bytes = static_cast<std::size_t>(elements) * dtype_size(x.type);
  if (bytes > 0) std::memcpy(out.raw_data(), x.data, bytes);
  return out;
}

} // namespace

void deferred_weight_grads::record(const tensor& dweight, cpu::gemm_operand a, std::int64_t a_elements,
                                   cpu::gemm_operand b, std::int64_t b_elements, const cpu::gemm_shape& shape,
                                   float* dbias) {
  DSA_CHECK(dweight.defined() && dweight.type() == dtype::f32 && shape.beta == 1.0f,
            "deferred weight gradient: an f32 gradient accumulated with beta 1 expected");
  DSA_CHECK(dbias == nullptr || a.type == dtype::f32, "deferred bias gradient: an f32 output gradient expected");
  products_.push_back({dweight, copy_of(a, a_elements), copy_of(b, b_elements), a.type, b.type, shape, dbias, {}, 0});
}

void deferred_weight_grads::record_work(std::function<void()> work, std::size_t bytes) {
  product p;
  p.work = std::move(work);
  p.work_bytes = bytes;
  products_.push_back(std::move(p));
}

void deferred_weight_grads::run() {
  for (const product& p : products_) {
    if (p.work) {
      p.work();
      continue;
    }
    if (p.dbias) cpu::bias_backward(p.dbias, p.a.data<float>(), p.shape.k, p.shape.m);
    cpu::gemm(p.dweight.data<float>(), cpu::gemm_operand{p.a.raw_data(), p.a_type},
              cpu::gemm_operand{p.b.raw_data(), p.b_type},
              p.shape);
  }
  products_.clear();
}

std::size_t deferred_weight_grads::bytes() const {
  std::size_t n = 0;
  for (const product& p : products_) n += p.a.nbytes() + p.b.nbytes() + p.work_bytes;
  return n;
}

defer_weight_grads::defer_weight_grads(deferred_weight_grads& into) {
  DSA_CHECK(active == nullptr, "weight-gradient deferrals do not nest");
  active = &into;
}

defer_weight_grads::~defer_weight_grads() { active = nullptr; }

deferred_weight_grads* weight_grad_deferral() { return active; }

void weight_gradient_product(const tensor& dweight, cpu::gemm_operand a, std::int64_t a_elements,
                             cpu::gemm_operand b, std::int64_t b_elements, const cpu::gemm_shape& shape,
                             float* dbias) {
  if (active) {
    active->record(dweight, a, a_elements, b, b_elements, shape, dbias);
    return;
  }
  if (dbias) {
    DSA_CHECK(a.type == dtype::f32, "bias gradient: an f32 output gradient expected");
    cpu::bias_backward(dbias, static_cast<const float*>(a.data), shape.k, shape.m);
  }
  cpu::gemm(dweight.data<float>(), a, b, shape);
}

} // namespace dsa::bert
