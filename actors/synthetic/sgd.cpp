// Synthetic SGD; see sgd.hpp.
#include "actors/synthetic/sgd.hpp"

#include "core/error.hpp"

#include <cmath>

namespace dsa::actors {

void sgd_apply(tensor& param, const tensor& grad, double lr, std::uint32_t accumulation, double grad_scale) {
  DSA_CHECK(param.shape() == grad.shape(), "sgd: {} vs {}", param.describe(), grad.describe());
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  for (std::int64_t i = 0; i < param.numel(); ++i)
    p[i] = static_cast<float>(p[i] - lr * grad_scale * (double(g[i]) / accumulation));
}

double sgd_clip_factor(double clip, double sum_of_squares) {
  const double norm = std::sqrt(sum_of_squares);
  return clip > 0 && norm > clip ? clip / norm : 1.0;
}

void sgd::init(const std::vector<tensor>& initial) {
  master_.clear();
  grads_.clear();
  for (const auto& t : initial) {
    master_.push_back(t.clone());
    grads_.push_back(tensor::zeros(t.shape(), dtype::f32));
  }
}

bool sgd::update(std::uint32_t, const grad_totals& totals, std::vector<tensor>& out) {
  DSA_CHECK(grads_.size() == master_.size(), "sgd: {} gradients for {} parameters", grads_.size(), master_.size());
  DSA_CHECK(clip_ <= 0 || totals.global, "sgd: clipping needs the global gradient norm");
  const double c = sgd_clip_factor(clip_, totals.sum_of_squares);
  out.resize(master_.size());
  for (std::size_t i = 0; i < master_.size(); ++i) {
    sgd_apply(master_[i], grads_[i], lr_, accumulation_, c);
    if (!out[i].defined()) out[i] = tensor::empty(master_[i].shape(), master_[i].type());
    out[i].copy_from(master_[i]);
  }
  return true;
}

} // namespace dsa::actors
