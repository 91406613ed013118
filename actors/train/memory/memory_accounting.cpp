// Model-state bytes per rank; see memory_accounting.hpp.
#include "actors/train/memory/memory_accounting.hpp"

#include "core/file_backed.hpp"

#include "actors/train/stage/param_store.hpp"
#include "actors/train/stage/zero3_binding.hpp"
#include "io/aio/swap_store.hpp"
#include "optim/flat_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dsa::train {

bool model_state_bytes::operator==(const model_state_bytes& o) const {
  return weights == o.weights && grads == o.grads && reduced == o.reduced && masters == o.masters &&
         half_masters == o.half_masters && moments == o.moments && version == o.version &&
         swap_buffers == o.swap_buffers;
}

std::string model_state_bytes::describe() const {
  auto mib = [](std::int64_t b) { return static_cast<double>(b) / (1 << 20); };
  return fmt::format("{:.2f} MiB = working weights {:.2f} + gradient accumulators {:.2f} + reduced gradients {:.2f} + "
                     "fp32 masters {:.2f} + half masters {:.2f} + optimizer moments {:.2f} + next version {:.2f}",
                     mib(total()), mib(weights), mib(grads), mib(reduced), mib(masters), mib(half_masters),
                     mib(moments), mib(version)) +
         (swap_buffers > 0 ? fmt::format(" + NVMe swap buffers {:.2f}", mib(swap_buffers)) : std::string());
}

double deepspeed_model_states(std::int64_t parameters, int stage, int ranks) {
  const double p = static_cast<double>(parameters), n = std::max(ranks, 1);
  switch (stage) {
    case 0: return 16 * p;
    case 1: return 4 * p + 12 * p / n;
    case 2: return 2 * p + 14 * p / n;
    default: return 16 * p / n;
  }
}

model_state_bytes expected_model_states(std::int64_t n, precision working, std::optional<zero_sizes> zero) {
  const std::int64_t w = working == precision::f32 ? 4 : 2;
  model_state_bytes b;
  if (zero) {
    b.weights = w * n;
    b.grads = 4 * n;
    b.reduced = 4 * (zero->stage >= 2 ? zero->partition + zero->whole_gradient : zero->padded);
    b.masters = zero->swap_buffers > 0 ? 0 : 4 * zero->partition;
    b.moments = zero->swap_buffers > 0 ? 0 : 8 * zero->partition + 4 * zero->onebit_extra;
    b.swap_buffers = zero->swap_buffers;
    b.version = w * zero->padded;
    if (zero->grads_partitioned || zero->stage >= 3) {
      b.grads = zero->grads_in_file ? std::min<std::int64_t>(4 * zero->partition, 2 * file_backed_window_bytes())
                                    : 4 * zero->partition;
      b.reduced = 4 * zero->whole_gradient; // the shard uses the stage's partition itself
    }
    if (zero->stage >= 3) {
      const std::int64_t in_memory = zero->param_in_memory < 0 ? zero->partition : zero->param_in_memory;
      b.weights = w * (in_memory + zero->persistent) + zero->param_buffers;
      // The shard writes each version into the weight store as it updates it: in place in
      // memory, or through a window's scratch to NVMe (partition_shard::advance_into_fetcher).
      b.version = zero->param_in_memory < 0
                      ? 0
                      : w * std::min(zero->partition, shard_version_window_elements);
    }
    return b;
  }
  b.weights = w * n;
  b.grads = 4 * n;
  b.reduced = 4 * n;
  b.masters = 4 * n;
  b.half_masters = working == precision::f32 ? 0 : 2 * n;
  b.moments = 8 * n;
  b.version = w * n;
  return b;
}

zero_sizes zero_sizes_of(const std::vector<bert::param_spec>& specs, std::uint32_t ranks) {
  auto layout = stage_flat_layout(specs, ranks);
  DSA_CHECK(layout.has_value(), "flat layout of a stage: {}", layout.has_value() ? "" : layout.err().message);
  return {layout->padded_numel(), layout->partition_numel()};
}

namespace {
const bert::param_spec* find_word_embeddings(const std::vector<bert::param_spec>& specs) {
  for (const auto& s : specs)
    if (s.name == bert::word_embeddings_name()) return &s;
  return nullptr;
}
} // namespace

bool tied_exchanged(const run_config& rc, const std::vector<bert::bert_range>& ranges) {
  return ranges.size() > 1 && find_word_embeddings(bert::parameter_specs(rc.model, ranges.front())) &&
         find_word_embeddings(bert::parameter_specs(rc.model, ranges.back()));
}

std::optional<zero_sizes> run_zero_sizes(const run_config& rc, const std::vector<bert::bert_range>& ranges,
                                         std::size_t s) {
  const auto ranks = static_cast<std::uint32_t>(rc.batch.data_parallel_size);
  const auto& off = rc.offload;
  if (rc.zero_stage < 1 || (ranks < 2 && !off.swaps() && !rc.zero_partitions())) return std::nullopt;
  const auto specs = bert::parameter_specs(rc.model, ranges.at(s));
  zero_sizes z = zero_sizes_of(specs, ranks);
  z.stage = ranks > 1 || rc.zero_partitions() ? std::max(rc.zero_stage, 1) : 1;
  z.grads_partitioned = z.stage == 2 && ranges.size() == 1; // stage 3 always is
  z.grads_in_file = rc.grads_on_nvme && (z.grads_partitioned || z.stage >= 3);
  if (z.stage >= 3) {
    for (const auto& spec : specs)
      if (shape_numel(spec.shape) <= rc.stage3_persistence) z.persistent += shape_numel(spec.shape);
    if (off.param.swaps()) {
      const dtype w = working_dtype(rc.working);
      z.param_in_memory = std::min(off.param.max_in_cpu, z.partition);
      const param_buffers b = nvme_param_buffers(z.partition, w, off.param.max_in_cpu, off.param.buffer_size,
                                                 off.param.buffer_count, 4096);
      z.param_buffers = b.count * b.bytes;
    }
  }
  if (off.swaps())
    z.swap_buffers = static_cast<std::int64_t>(aio::swap_buffers_allocated(static_cast<std::size_t>(off.buffer_count))) * 4 *
                     aio::swap_chunk_numel(off.sub_group_size, optim::flat_layout::default_alignment, z.partition);
  if (rc.optimizer.compressed()) {
    std::int64_t numel = 0;
    for (const auto& spec : specs) numel += shape_numel(spec.shape);
    // The whole momentum; 1-bit LAMB's fresh variance partition; 0/1 Adam's whole variance,
    // accumulated move and parameters (its local steps).
    z.onebit_extra = numel;
    if (rc.optimizer.type == optim::optimizer_type::onebit_lamb) z.onebit_extra += z.partition;
    if (rc.optimizer.type == optim::optimizer_type::zeroone_adam) z.onebit_extra += 3 * numel;
  }
  if (const auto* tied = find_word_embeddings(specs); z.stage >= 2 && tied && tied_exchanged(rc, ranges))
    z.whole_gradient = shape_numel(tied->shape);
  return z;
}

model_state_bytes measured_model_states(const model_stage& stage, const model_shard& shard) {
  model_state_bytes b;
  for (const auto& e : const_cast<model_stage&>(stage).named_parameters().entries()) {
    if (e.value.defined()) b.weights += static_cast<std::int64_t>(e.value.nbytes());
    if (e.grad.defined()) b.grads += static_cast<std::int64_t>(e.grad.nbytes());
  }
  // ZeRO-3: what the stage holds between the parts' gathers (the values bound at this
  // moment are whatever part the stage's worker is running).
  // Likewise its gradients: the partition they are summed into (a part's whole gradients
  // live only during its backward).
  if (const param_fetcher* f = stage.fetcher()) b.weights = f->held_bytes();
  if (stage.gradients_reduced()) b.grads = stage.partition_grad_bytes();
  const shard_bytes s = shard.held_bytes();
  b.reduced = s.gradients;
  b.masters = s.masters;
  b.half_masters = s.half_masters;
  b.moments = s.moments;
  b.version = s.version;
  b.swap_buffers = s.swap_buffers;
  return b;
}

namespace {

// The part of the range a parameter belongs to, by its name: "embeddings", its layer's
// prefix, or "head" (the rest: the pooler, the heads, a pre-LN final LayerNorm).
std::string part_of(const std::string& name) {
  if (name.rfind("bert.embeddings.", 0) == 0) return "embeddings";
  const std::string layer = "bert.encoder.layer.";
  if (name.rfind(layer, 0) == 0) return name.substr(0, name.find('.', layer.size()));
  return "head";
}

// ZeRO-3 on a CUDA rank, per part of the range (its name's prefix): the bytes of the
// values it binds (not the persistent ones; the head's include the tied word embedding its
// decoder reads) and of its f32 gradients (without the tied word embedding's, counted once
// beside them), with the value elements the device window is sized by.
struct zero3_part_bytes {
  std::int64_t persistent = 0, word_grad = 0;
  std::int64_t persistent_upload = 0; // the persistent tensors in an upload buffer (working precision, 64-byte padded)
  std::vector<std::int64_t> values, grads, value_elements, uploads;
  std::int64_t layer_elements = 0; // the largest encoder layer's gathered elements
};

zero3_part_bytes zero3_parts_of(const run_config& rc, const std::vector<bert::param_spec>& specs) {
  const bool half = rc.working != precision::f32;
  const auto elem = static_cast<std::int64_t>(dtype_size(working_dtype(rc.working)));
  auto padded = [&](std::int64_t n) { return static_cast<std::int64_t>(zero3_padded(static_cast<std::size_t>(n * elem))); };
  zero3_part_bytes out;
  std::int64_t word_value = 0, word_elements = 0, word_upload = 0;
  struct sums {
    std::int64_t values = 0, grads = 0, elements = 0, upload = 0;
  };
  std::map<std::string, sums> parts;
  for (const auto& spec : specs) {
    const std::int64_t n = shape_numel(spec.shape);
    const std::int64_t value = n * (half && spec.shape.size() == 2 ? 2 : 4);
    const bool kept = n <= rc.stage3_persistence;
    sums& part = parts[part_of(spec.name)];
    if (kept) {
      out.persistent += value;
      out.persistent_upload += padded(n);
    } else {
      part.values += value;
      part.elements += n;
      part.upload += padded(n);
    }
    if (spec.name == bert::word_embeddings_name()) {
      word_value = kept ? 0 : value;
      word_elements = kept ? 0 : n;
      word_upload = kept ? 0 : padded(n);
      out.word_grad = 4 * n;
    } else {
      part.grads += 4 * n;
    }
  }
  const bool tied = rc.model.head == bert::head_kind::pretraining && parts.count("head") && parts.count("embeddings") &&
                    out.word_grad > 0;
  // The decoder reads the tied word embedding: bert::parameters_read_by's rule, restated as
  // arithmetic over the specs (the accounting makes no bert_parameters, whose values would
  // be allocated); test_device_choice.cpp's ZeRO-3 case holds the two together.
  if (tied) {
    parts["head"].values += word_value;
    parts["head"].elements += word_elements;
    parts["head"].upload += word_upload;
  } else if (parts.count("embeddings")) {
    parts["embeddings"].grads += out.word_grad; // an ordinary gradient of the embeddings
    out.word_grad = 0;
  } else {
    out.word_grad = 0;
  }
  for (const auto& [name, part] : parts) {
    out.values.push_back(part.values);
    out.grads.push_back(part.grads);
    out.value_elements.push_back(part.elements);
    out.uploads.push_back(part.upload);
    if (name != "embeddings" && name != "head") out.layer_elements = std::max(out.layer_elements, part.elements);
  }
  return out;
}

// The sum of the n largest.
std::int64_t largest_sum(std::vector<std::int64_t> v, std::size_t n) {
  std::sort(v.begin(), v.end(), std::greater<>());
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < std::min(n, v.size()); ++i) sum += v[i];
  return sum;
}

// ZeRO-3 on a CUDA rank: the persistent values; the values of `window` parts (the one
// computing and the ones bound ahead of it: the W largest); the gradients of two parts (the
// one computing, the one before it copying down); the tied word embedding's gradient, bound
// from the head's backward to the embeddings'.
std::int64_t cuda_zero3_state_bytes(const run_config& rc, const std::vector<bert::param_spec>& specs) {
  const zero3_part_bytes parts = zero3_parts_of(rc, specs);
  return parts.persistent + largest_sum(parts.values, static_cast<std::size_t>(cuda_zero3_window(rc, specs))) +
         largest_sum(parts.grads, 2) + parts.word_grad;
}

} // namespace

std::int64_t cuda_zero3_window_limit(const run_config& rc, const std::vector<bert::param_spec>& specs) {
  const zero3_part_bytes parts = zero3_parts_of(rc, specs);
  const auto count = static_cast<std::int64_t>(parts.values.size());
  // In parts of a layer's gathered elements (the embeddings and the head come once each).
  std::int64_t unit = parts.layer_elements;
  if (unit == 0 && !parts.value_elements.empty())
    unit = *std::max_element(parts.value_elements.begin(), parts.value_elements.end());
  if (count <= 1 || unit == 0) return std::max<std::int64_t>(count, 1);
  return std::clamp<std::int64_t>(1 + std::max<std::int64_t>(rc.stage3_prefetch, 0) / unit, 1, count);
}

std::int64_t cuda_zero3_window(const run_config& rc, const std::vector<bert::param_spec>& specs) {
  const std::int64_t limit = cuda_zero3_window_limit(rc, specs);
  return rc.zero3_device_window > 0 ? std::min(rc.zero3_device_window, limit) : limit;
}

std::int64_t cuda_zero3_staging_bytes(const run_config& rc, const std::vector<bert::param_spec>& specs) {
  std::map<std::string, std::int64_t> parts;
  for (const auto& spec : specs) parts[part_of(spec.name)] += 4 * shape_numel(spec.shape);
  std::int64_t largest = 0;
  for (const auto& [name, bytes] : parts) largest = std::max(largest, bytes);
  // The upload buffers: a part's gathered weights each (the step's first also the
  // persistent ones), in the working precision the fetcher gathers in, each tensor padded to
  // 64 bytes (cuda_zero3_binder).
  const zero3_part_bytes z = zero3_parts_of(rc, specs);
  const std::int64_t upload = z.uploads.empty() ? 0 : *std::max_element(z.uploads.begin(), z.uploads.end());
  return largest + cuda_zero3_window(rc, specs) * (z.persistent_upload + upload);
}

std::int64_t cuda_model_state_bytes(const run_config& rc, const std::vector<bert::param_spec>& specs) {
  // Stage 3 on one rank without offload_param on NVMe runs as stage 0 (zero_partitions()).
  if (rc.zero_stage >= 3 && rc.zero_partitions()) return cuda_zero3_state_bytes(rc, specs);
  const bool half = rc.working != precision::f32;
  const bool gpu_optimizer = rc.offload.device == offload_device::none;
  std::int64_t bytes = 0, largest = 0;
  for (const auto& spec : specs) {
    const std::int64_t n = shape_numel(spec.shape);
    const bool working_copy = half && spec.shape.size() == 2; // gpu::part's rule
    bytes += n * (4 + (working_copy ? 2 : 4));                // the gradient and the value read
    if (gpu_optimizer) bytes += n * (4 + 8 + (half ? 2 : 0)); // its master, moments, working copy
    largest = std::max(largest, n);
  }
  if (gpu_optimizer) bytes += 4 * largest;
  return bytes;
}

} // namespace dsa::train
