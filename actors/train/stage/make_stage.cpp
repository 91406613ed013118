// The one place a stage's device is chosen (see model_stage.hpp), and what every stage
// class does alike with a parameter version.
#include "actors/train/data/batch_packing.hpp"
#include "actors/train/stage/bert_stage.hpp"
#include "actors/train/stage/model_stage.hpp"
#if DSA_HAVE_CUDA
#include "actors/train/stage/cuda_stage.hpp"
#endif

#include "core/error.hpp"
#include "kernels/cpu/convert.hpp"

#include <fmt/format.h>

#include <limits>
#include <stdexcept>

namespace dsa::train {

std::unique_ptr<model_stage> make_stage(stage_device device, const stage_options& options, stage_shared& shared) {
  switch (device) {
  case stage_device::cpu: return std::make_unique<bert_stage>(options, shared);
  case stage_device::cuda:
#if DSA_HAVE_CUDA
    return std::make_unique<cuda_stage>(options, shared);
#else
    DSA_CHECK(false, "make_stage: a CUDA stage in a build without CUDA code (choose_device refuses that)");
    return nullptr;
#endif
  }
  DSA_CHECK(false, "make_stage: unknown device {}", static_cast<int>(device));
  return nullptr;
}

tensor read_slot(const bert::bert_range& range, bert::head_kind head, const std::vector<tensor>& in,
                 const tensor& labels, bert::bert_batch& batch) {
  tensor hidden;
  if (range.has_embeddings()) {
    if (in.size() != 1) throw std::runtime_error(fmt::format("input slot with {} tensors, expected 1", in.size()));
    unpack_inputs(in[0], batch);
  } else {
    if (in.size() != 2 || !in[0].defined() || !in[1].defined() || in[1].type() != dtype::f32)
      throw std::runtime_error(fmt::format("activation slot with {} tensors, expected the hidden states and the "
                                           "f32 attention mask",
                                           in.size()));
    hidden = in[0];
    batch.attention_mask = in[1];
  }
  if (range.has_head()) unpack_labels(labels, head, batch);
  return hidden;
}

void inject_overflow(const stage_options& options, std::uint32_t step, std::size_t index, tensor& gradient) {
  if (options.overflow_step < 0 || step != static_cast<std::uint64_t>(options.overflow_step) || index != 0 ||
      !gradient.defined() || gradient.numel() == 0)
    return;
  const float inf = std::numeric_limits<float>::infinity();
  cpu::cast(gradient.raw_data(), gradient.type(), &inf, dtype::f32, 1);
}

double load_version(bert::bert_parameters& params, const std::vector<tensor>& updated) {
  const auto& entries = params.entries();
  // The weights, then the loss scale of the next step.
  if (updated.size() != entries.size() + 1)
    throw std::runtime_error(fmt::format("parameter version with {} tensors for a stage of {} parameters and "
                                         "the loss scale",
                                         updated.size(), entries.size()));
  auto scale = loss_scale_of(updated.back());
  if (!scale) throw std::runtime_error("parameter version: " + scale.err().message);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const tensor& src = updated[i];
    const tensor& dst = entries[i].value;
    const bool floating = src.type() == dtype::f32 || src.type() == dtype::f16 || src.type() == dtype::bf16;
    if (!src.defined() || !floating || !src.is_contiguous() || src.shape() != dst.shape())
      throw std::runtime_error(fmt::format("parameter version: tensor {} ({}) is {}, expected {}", i,
                                           entries[i].spec.name, src.defined() ? src.describe() : "(none)",
                                           dst.describe()));
    cpu::cast(dst.raw_data(), dst.type(), src.raw_data(), src.type(), src.numel());
  }
  return *scale;
}

double zero3_version_scale(const std::vector<tensor>& updated) {
  if (updated.size() != 2)
    throw std::runtime_error(fmt::format("ZeRO-3 parameter version with {} tensors; expected the partition and "
                                         "the loss scale",
                                         updated.size()));
  auto scale = loss_scale_of(updated.back());
  if (!scale) throw std::runtime_error("parameter version: " + scale.err().message);
  return *scale;
}

} // namespace dsa::train
