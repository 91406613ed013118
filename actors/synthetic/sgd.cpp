// Synthetic SGD; see sgd.hpp.
#include "actors/synthetic/sgd.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

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

void sgd::gradients_final(std::uint32_t step, std::uint32_t first) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    parts_.emplace_back(step, first);
  }
  cv_.notify_all();
}

void sgd::cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

std::vector<std::pair<std::uint32_t, std::uint32_t>> sgd::parts_seen() const {
  std::lock_guard<std::mutex> lock(mu_);
  return parts_;
}

bool sgd::stream_update(std::uint32_t step) {
  DSA_CHECK(stream_elements() > 0 && !streamed_step_, "sgd: a streamed update of step {} it cannot stream", step);
  for (std::size_t i = master_.size(); i-- > 0;) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      return cancelled_ || std::any_of(parts_.begin(), parts_.end(), [&](const auto& p) {
               return p.first == step && p.second <= i;
             });
    });
    if (cancelled_) throw std::runtime_error("sgd: the run stopped during a streamed update");
    lock.unlock();
    sgd_apply(master_[i], grads_[i], lr_, accumulation_, 1.0);
  }
  streamed_step_ = step;
  ++streamed_;
  return true;
}

bool sgd::update(std::uint32_t step, const grad_totals& totals, std::vector<tensor>& out) {
  DSA_CHECK(grads_.size() == master_.size(), "sgd: {} gradients for {} parameters", grads_.size(), master_.size());
  DSA_CHECK(clip_ <= 0 || totals.global, "sgd: clipping needs the global gradient norm");
  DSA_CHECK(!streamed_step_ || *streamed_step_ == step, "sgd: update of step {} after streaming step {}", step,
            *streamed_step_);
  const bool streamed = streamed_step_.has_value();
  streamed_step_.reset();
  const double c = sgd_clip_factor(clip_, totals.sum_of_squares);
  out.resize(master_.size());
  for (std::size_t i = 0; i < master_.size(); ++i) {
    if (!streamed) sgd_apply(master_[i], grads_[i], lr_, accumulation_, c);
    if (!out[i].defined()) out[i] = tensor::empty(master_[i].shape(), master_[i].type());
    out[i].copy_from(master_[i]);
  }
  return true;
}

} // namespace dsa::actors
