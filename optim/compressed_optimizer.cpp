// What the compressed optimizers share; see compressed_optimizer.hpp.
#include "optim/compressed_optimizer.hpp"

#include "optim/optimizer.hpp"

namespace dsa::optim {

void set_compressed_params(compressed_params& p, const optimizer_config& cfg, double lr, double weight_decay) {
  p.lr = static_cast<float>(lr);
  p.beta1 = static_cast<float>(cfg.beta1);
  p.beta2 = static_cast<float>(cfg.beta2);
  p.eps = static_cast<float>(cfg.eps);
  p.weight_decay = static_cast<float>(weight_decay);
}

} // namespace dsa::optim
