// Span start/end head forward/backward.
#include "models/bert/squad_head.hpp"

#include "kernels/cpu/loss.hpp"
#include "models/bert/linear.hpp"
#include "models/bert/stored_precision.hpp"

#include <algorithm>
#include <vector>

namespace dsa::bert {
namespace {

// HF: clamp(0, T); T is the ignore index.
std::vector<std::int32_t> clamped_labels(const tensor& positions, std::int64_t T) {
  const std::int32_t* v = positions.data<std::int32_t>();
  std::vector<std::int32_t> out(static_cast<std::size_t>(positions.numel()));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<std::int32_t>(std::clamp<std::int64_t>(v[i], 0, T));
  return out;
}

} // namespace

bert_losses squad_head_forward(const tensor& hidden, const bert_batch& batch,
                               const squad_head_params& stored, squad_head_stash& stash,
                               squad_logits& out) {
  const squad_head_params p = widen(stored);
  const std::int64_t B = hidden.dim(0), T = hidden.dim(1), N = B * T;
  stash = squad_head_stash{};
  stash.hidden = hidden;
  std::vector<float> logits(static_cast<std::size_t>(N * 2));
  linear_forward(logits.data(), hidden.data<float>(), p.qa_outputs, N);
  out.start = tensor::empty({B, T}, dtype::f32);
  out.end = tensor::empty({B, T}, dtype::f32);
  float* start = out.start.data<float>();
  float* end = out.end.data<float>();
  for (std::int64_t i = 0; i < N; ++i) {
    start[i] = logits[static_cast<std::size_t>(2 * i)];
    end[i] = logits[static_cast<std::size_t>(2 * i + 1)];
  }
  bert_losses losses;
  if (!batch.start_positions.defined())
    return losses;

  const auto ignore = static_cast<std::int32_t>(T);
  const auto start_labels = clamped_labels(batch.start_positions, T);
  const auto end_labels = clamped_labels(batch.end_positions, T);
  cpu::xent_sum s = cpu::cross_entropy_forward(start, start_labels.data(), ignore, B, T);
  cpu::xent_sum e = cpu::cross_entropy_forward(end, end_labels.data(), ignore, B, T);
  losses.start_loss = s.count > 0 ? s.loss_sum / static_cast<double>(s.count) : 0.0;
  losses.end_loss = e.count > 0 ? e.loss_sum / static_cast<double>(e.count) : 0.0;
  losses.start_count = s.count;
  losses.start_correct = s.correct;
  losses.end_count = e.count;
  losses.end_correct = e.correct;
  losses.total = 0.5 * (losses.start_loss + losses.end_loss);

  std::vector<float> dstart(static_cast<std::size_t>(N)), dend(dstart.size());
  cpu::cross_entropy_backward(dstart.data(), start, start_labels.data(), ignore,
                              s.count > 0 ? 0.5f / static_cast<float>(s.count) : 0.0f, B, T);
  cpu::cross_entropy_backward(dend.data(), end, end_labels.data(), ignore,
                              e.count > 0 ? 0.5f / static_cast<float>(e.count) : 0.0f, B, T);
  stash.dlogits = tensor::empty({N, 2}, dtype::f32);
  float* d = stash.dlogits.data<float>();
  for (std::int64_t i = 0; i < N; ++i) {
    d[2 * i] = dstart[static_cast<std::size_t>(i)];
    d[2 * i + 1] = dend[static_cast<std::size_t>(i)];
  }
  return losses;
}

tensor squad_head_backward(const squad_head_stash& stash, const squad_head_params& stored,
                           float loss_scale) {
  const squad_head_params p = widen(stored);
  const std::int64_t N = stash.hidden.dim(0) * stash.hidden.dim(1);
  tensor dhidden = tensor::zeros(stash.hidden.shape(), dtype::f32);
  if (!stash.dlogits.defined())
    return dhidden;
  std::vector<float> d(stash.dlogits.data<float>(), stash.dlogits.data<float>() + 2 * N);
  for (auto& v : d)
    v *= loss_scale;
  linear_backward(dhidden.data<float>(), d.data(), stash.hidden.data<float>(), p.qa_outputs, N,
                  write_mode::overwrite);
  return dhidden;
}

} // namespace dsa::bert
