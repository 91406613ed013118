// A synthetic stage compute for runtime tests and benchmarks: a stack of
// square linear layers y = x W^T (no bias), with a least-squares loss
// L = 0.5 / B * sum((y - t)^2) on the last stage, and its exact gradient.
// Weights are a fixed function of the global layer index, so any split of the
// same layers over stages starts from the same model. f32 storage, double sums.
#pragma once

#include "actors/compute.hpp"

#include <cstdint>
#include <vector>

namespace dsa::actors {

class linear_stack : public stage_compute {
public:
  // layers [first_layer, first_layer + layers) of a model of width `width`.
  // tied_layer: a global layer that starts with layer 0's weights (the two are
  // meant to be tied: their gradients summed, see run_parts::tied); -1: none.
  linear_stack(std::uint32_t first_layer, std::uint32_t layers, std::int64_t width, std::int64_t tied_layer = -1);

  void reserve_stash(std::uint32_t slots) override;
  // in: (B, width); labels: (B, width) on the last stage; out: (B, width).
  double forward(const work_key& key, const std::vector<tensor>& in, const tensor& labels,
                 std::vector<tensor>& out) override;
  void backward(const work_key& key, const tensor& grad_out, tensor& grad_in) override;
  std::vector<tensor> parameters() override { return weights_; }
  std::vector<tensor> gradients() override { return grads_; }
  void load_parameters(const std::vector<tensor>& updated) override;
  // Reports each layer's gradient as final right after backward accumulated it.
  void set_gradients_final(gradients_final_fn listener) override { final_ = std::move(listener); }

  // The initial value of weight (row, col) of global layer `layer`.
  static float initial_weight(std::uint32_t layer, std::int64_t row, std::int64_t col, std::int64_t width);

private:
  struct stash_entry {
    std::vector<tensor> inputs; // input of each layer, (B, width)
    tensor residual;            // last stage: y - t, (B, width)
    bool used = false;
  };

  std::int64_t width_;
  std::vector<tensor> weights_; // each (width, width): W[out, in]
  std::vector<tensor> grads_;   // same shapes, accumulated over micro-batches
  std::vector<stash_entry> stash_;
  gradients_final_fn final_;
};

} // namespace dsa::actors
