// The synthetic linear stage; see linear_stack.hpp.
#include "actors/synthetic/linear_stack.hpp"

#include "core/error.hpp"

#include <cmath>

namespace dsa::actors {

namespace {

// y = x W^T: x (B, n), W (n, n), y (B, n).
void matmul_wt(tensor& y, const tensor& x, const tensor& w, std::int64_t n) {
  const std::int64_t rows = x.dim(0);
  if (!y.defined() || y.shape() != x.shape()) y = tensor::empty(x.shape(), dtype::f32);
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  float* yp = y.data<float>();
  for (std::int64_t b = 0; b < rows; ++b)
    for (std::int64_t o = 0; o < n; ++o) {
      double sum = 0;
      for (std::int64_t i = 0; i < n; ++i) sum += double(xp[b * n + i]) * wp[o * n + i];
      yp[b * n + o] = static_cast<float>(sum);
    }
}

} // namespace

float linear_stack::initial_weight(std::uint32_t layer, std::int64_t row, std::int64_t col, std::int64_t width) {
  // Near the identity, so a deep stack neither explodes nor vanishes.
  const double phase = 0.7 * layer + 0.31 * row + 0.17 * col;
  return static_cast<float>((row == col ? 0.9 : 0.0) + 0.2 * std::sin(phase) / std::sqrt(double(width)));
}

linear_stack::linear_stack(std::uint32_t first_layer, std::uint32_t layers, std::int64_t width,
                           std::int64_t tied_layer)
    : width_(width) {
  for (std::uint32_t l = 0; l < layers; ++l) {
    tensor w = tensor::empty({width, width}, dtype::f32);
    float* p = w.data<float>();
    const std::uint32_t source = first_layer + l == tied_layer ? 0 : first_layer + l;
    for (std::int64_t r = 0; r < width; ++r)
      for (std::int64_t c = 0; c < width; ++c) p[r * width + c] = initial_weight(source, r, c, width);
    weights_.push_back(w);
    grads_.push_back(tensor::zeros({width, width}, dtype::f32));
  }
}

void linear_stack::reserve_stash(std::uint32_t slots) { stash_.assign(slots, stash_entry{}); }

double linear_stack::forward(const work_key& key, const std::vector<tensor>& inputs, const tensor& labels,
                             std::vector<tensor>& outputs) {
  DSA_CHECK(key.stash < stash_.size() && !stash_[key.stash].used, "stash slot {} not free", key.stash);
  DSA_CHECK(inputs.size() == 1, "linear_stack input slot with {} tensors", inputs.size());
  const tensor& in = inputs[0];
  DSA_CHECK(in.ndim() == 2 && in.dim(1) == width_, "linear_stack input {} for width {}", in.describe(), width_);
  auto& entry = stash_[key.stash];
  entry.used = true;
  entry.inputs.resize(weights_.size());
  tensor h = in;
  for (std::size_t l = 0; l < weights_.size(); ++l) {
    entry.inputs[l] = h.clone();
    tensor next;
    matmul_wt(next, h, weights_[l], width_);
    h = next;
  }
  if (!labels.defined()) {
    outputs.resize(1);
    tensor& out = outputs[0];
    if (!out.defined() || out.shape() != h.shape()) out = tensor::empty(h.shape(), dtype::f32);
    out.copy_from(h);
    return 0.0;
  }
  entry.residual = h; // becomes y - t
  float* r = entry.residual.data<float>();
  const float* t = labels.data<float>();
  double loss = 0;
  const std::int64_t rows = h.dim(0);
  for (std::int64_t i = 0; i < h.numel(); ++i) {
    r[i] -= t[i];
    loss += 0.5 * double(r[i]) * r[i];
  }
  return loss / double(rows);
}

void linear_stack::backward(const work_key& key, const tensor& grad_out, tensor& grad_in) {
  DSA_CHECK(key.stash < stash_.size() && stash_[key.stash].used, "stash slot {} holds nothing", key.stash);
  auto& entry = stash_[key.stash];
  const std::int64_t n = width_;
  tensor dy;
  if (grad_out.defined()) {
    dy = grad_out.clone();
  } else { // last stage: dL/dy = (y - t) / B
    dy = entry.residual;
    float* p = dy.data<float>();
    const double rows = double(dy.dim(0));
    for (std::int64_t i = 0; i < dy.numel(); ++i) p[i] = static_cast<float>(p[i] / rows);
  }
  const std::int64_t rows = dy.dim(0);
  for (std::size_t l = weights_.size(); l-- > 0;) {
    const float* x = entry.inputs[l].data<float>();
    const float* g = dy.data<float>();
    const float* w = weights_[l].data<float>();
    float* dw = grads_[l].data<float>();
    for (std::int64_t o = 0; o < n; ++o) // dW += dy^T x
      for (std::int64_t i = 0; i < n; ++i) {
        double sum = 0;
        for (std::int64_t b = 0; b < rows; ++b) sum += double(g[b * n + o]) * x[b * n + i];
        dw[o * n + i] += static_cast<float>(sum);
      }
    if (final_) final_(l, l + 1); // layer l's weight gradient is complete (overlap_comm)
    tensor dx = tensor::empty({rows, n}, dtype::f32); // dx = dy W
    float* dxp = dx.data<float>();
    for (std::int64_t b = 0; b < rows; ++b)
      for (std::int64_t i = 0; i < n; ++i) {
        double sum = 0;
        for (std::int64_t o = 0; o < n; ++o) sum += double(g[b * n + o]) * w[o * n + i];
        dxp[b * n + i] = static_cast<float>(sum);
      }
    dy = dx;
  }
  if (!grad_in.defined() || grad_in.shape() != dy.shape()) grad_in = tensor::empty(dy.shape(), dtype::f32);
  grad_in.copy_from(dy);
  entry = stash_entry{};
}

void linear_stack::load_parameters(const std::vector<tensor>& updated) {
  DSA_CHECK(updated.size() == weights_.size(), "{} parameters for {} layers", updated.size(), weights_.size());
  for (std::size_t l = 0; l < weights_.size(); ++l) {
    weights_[l].copy_from(updated[l]);
    grads_[l].zero();
  }
}

} // namespace dsa::actors
