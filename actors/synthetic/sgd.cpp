// Synthetic SGD; see sgd.hpp.
#include "actors/synthetic/sgd.hpp"

#include "core/error.hpp"

namespace dsa::actors {

void sgd_apply(tensor& param, const tensor& grad, double lr, std::uint32_t accumulation) {
  DSA_CHECK(param.shape() == grad.shape(), "sgd: {} vs {}", param.describe(), grad.describe());
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  for (std::int64_t i = 0; i < param.numel(); ++i)
    p[i] = static_cast<float>(p[i] - lr * (double(g[i]) / accumulation));
}

void sgd::init(const std::vector<tensor>& initial) {
  master_.clear();
  for (const auto& t : initial) master_.push_back(t.clone());
}

void sgd::update(std::uint32_t, const std::vector<tensor>& grads, std::vector<tensor>& out) {
  DSA_CHECK(grads.size() == master_.size(), "sgd: {} gradients for {} parameters", grads.size(), master_.size());
  out.resize(master_.size());
  for (std::size_t i = 0; i < master_.size(); ++i) {
    sgd_apply(master_[i], grads[i], lr_, accumulation_);
    if (!out[i].defined()) out[i] = tensor::empty(master_[i].shape(), master_[i].type());
    out[i].copy_from(master_[i]);
  }
}

} // namespace dsa::actors
