// Feed-forward forward/backward with optional GELU recompute.
#include "models/bert/feed_forward.hpp"

#include "kernels/cpu/activation.hpp"

#include <vector>

namespace dsa::bert {

void feed_forward_forward(float* out, feed_forward_stash& stash, const tensor& x,
                          const layer_params& p, const memory_flags& flags) {
  const std::int64_t rows = x.dim(0), I = p.intermediate.out_features();
  stash.x = x;
  stash.ff1 = tensor::empty({rows, I}, dtype::f32);
  linear_forward(stash.ff1.data<float>(), x.data<float>(), p.intermediate, rows);
  tensor gelu = tensor::empty({rows, I}, dtype::f32);
  cpu::gelu_forward(gelu.data<float>(), stash.ff1.data<float>(), rows * I);
  linear_forward(out, gelu.data<float>(), p.output, rows);
  if (!flags.gelu_checkpoint)
    stash.gelu = gelu;
}

void feed_forward_backward(float* dx, const float* dout, const feed_forward_stash& stash,
                           const layer_params& p, write_mode dx_mode) {
  const std::int64_t rows = stash.x.dim(0), I = p.intermediate.out_features();
  std::vector<float> recomputed;
  const float* gelu = nullptr;
  if (stash.gelu.defined()) {
    gelu = stash.gelu.data<float>();
  } else {
    recomputed.resize(static_cast<std::size_t>(rows * I));
    cpu::gelu_forward(recomputed.data(), stash.ff1.data<float>(), rows * I);
    gelu = recomputed.data();
  }
  std::vector<float> dgelu(static_cast<std::size_t>(rows * I));
  linear_backward(dgelu.data(), dout, gelu, p.output, rows, write_mode::overwrite);
  cpu::gelu_backward(dgelu.data(), dgelu.data(), stash.ff1.data<float>(), rows * I);
  linear_backward(dx, dgelu.data(), stash.x.data<float>(), p.intermediate, rows, dx_mode);
}

} // namespace dsa::bert
