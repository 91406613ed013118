// Deferred weight gradients; see weight_grads.hpp.
#include "models/bert/weight_grads.hpp"

#include "core/error.hpp"

#include <cstring>

namespace dsa::bert {
namespace {

thread_local deferred_weight_grads* active = nullptr;

std::vector<unsigned char> copy_of(cpu::gemm_operand x, std::int64_t elements) {
  const std::size_t bytes = static_cast<std::size_t>(elements) * dtype_size(x.type);
  std::vector<unsigned char> out(bytes);
  if (bytes > 0) std::memcpy(out.data(), x.data, bytes);
  return out;
}

} // namespace

void deferred_weight_grads::record(const tensor& dweight, cpu::gemm_operand a, std::int64_t a_elements,
                                   cpu::gemm_operand b, std::int64_t b_elements, const cpu::gemm_shape& shape) {
  DSA_CHECK(dweight.defined() && dweight.type() == dtype::f32 && shape.beta == 1.0f,
            "deferred weight gradient: an f32 gradient accumulated with beta 1 expected");
  products_.push_back({dweight, copy_of(a, a_elements), copy_of(b, b_elements), a.type, b.type, shape, {}, 0});
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
    cpu::gemm(p.dweight.data<float>(), cpu::gemm_operand{p.a.data(), p.a_type}, cpu::gemm_operand{p.b.data(), p.b_type},
              p.shape);
  }
  products_.clear();
}

std::size_t deferred_weight_grads::bytes() const {
  std::size_t n = 0;
  for (const product& p : products_) n += p.a.size() + p.b.size() + p.work_bytes;
  return n;
}

defer_weight_grads::defer_weight_grads(deferred_weight_grads& into) {
  DSA_CHECK(active == nullptr, "weight-gradient deferrals do not nest");
  active = &into;
}

defer_weight_grads::~defer_weight_grads() { active = nullptr; }

deferred_weight_grads* weight_grad_deferral() { return active; }

void weight_gradient_product(const tensor& dweight, cpu::gemm_operand a, std::int64_t a_elements,
                             cpu::gemm_operand b, std::int64_t b_elements, const cpu::gemm_shape& shape) {
  if (active) {
    active->record(dweight, a, a_elements, b, b_elements, shape);
    return;
  }
  cpu::gemm(dweight.data<float>(), a, b, shape);
}

} // namespace dsa::bert
