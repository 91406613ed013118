// Gradients into the optimizer shard's buffers; see gradient_gather.hpp.
#include "actors/gradient_gather.hpp"

#include "kernels/cpu/convert.hpp"
#include "optim/grad_clip.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::actors {

void cast_gradient(std::size_t i, const tensor& g, tensor& b, const std::vector<gradient_part>& kept, bool presummed) {
  const bool floating = g.type() == dtype::f32 || g.type() == dtype::f16 || g.type() == dtype::bf16;
  const gradient_part part = kept.empty() ? gradient_part{0, g.numel()} : kept[i];
  const bool fits = kept.empty() ? g.shape() == b.shape()
                    : presummed  ? g.numel() == part.hi - part.lo && b.numel() == g.numel() && b.is_contiguous()
                                 : 0 <= part.lo && part.lo <= part.hi && part.hi <= g.numel() &&
                                       b.numel() == part.hi - part.lo && b.is_contiguous();
  if (!g.defined() || !fits || !floating || !g.is_contiguous())
    throw std::runtime_error(fmt::format("gradient {} {} does not fit the optimizer's buffer {} (elements [{}, {}))", i,
                                         g.defined() ? g.describe() : "(none)", b.describe(), part.lo, part.hi));
  const std::int64_t skipped = presummed ? 0 : part.lo * static_cast<std::int64_t>(dtype_size(g.type())); // bytes
  const auto* first = static_cast<const std::byte*>(g.raw_data()) + skipped;
  // The shard may use the stage's gradient partition itself (train::shard_options::shared_gradients).
  if (first == b.raw_data() && g.type() == dtype::f32) return;
  cpu::cast(b.raw_data(), dtype::f32, first, g.type(), part.hi - part.lo);
}

double gather(const slot_contents& grads, slot_contents& buffers, const std::vector<gradient_part>& kept, int skip,
              bool presummed) {
  if (grads.size() != buffers.size() || (!kept.empty() && kept.size() != buffers.size()))
    throw std::runtime_error(fmt::format("{} gradients for {} optimizer buffers ({} parts kept)", grads.size(),
                                         buffers.size(), kept.size()));
  double share = 0;
  for (std::size_t i = 0; i < grads.size(); ++i) cast_gradient(i, grads[i], buffers[i], kept, presummed);
  for (std::size_t i = 0; i < grads.size(); ++i)
    if (static_cast<int>(i) != skip) share += optim::sum_of_squares(grads[i]);
  return share;
}

} // namespace dsa::actors
