// What the GPU model (cuda_layer.hpp, cuda_part.hpp) allocates on its device for one
// micro-batch, as arithmetic on the config: the device-memory plan's activations
// (actors/train/memory/device_plan.hpp). Plain C++ (no CUDA): it builds and is tested on
// every machine; the gpu suite compares it with the device pool's bytes after a real
// forward and backward (tests/gpu/test_gpu_memory_plan.cpp).
//
// Each function follows the allocations of the code it names, array by array: a change
// there that adds or drops an array changes the figure here (the gpu suite's comparison
// fails when the two part).
#pragma once

#include "models/bert/bert_config.hpp"
#include "models/bert/bert_range.hpp"

#include <cstdint>

namespace dsa::bert {

// A training micro-batch as the GPU part sees it: batch x seq tokens, at most
// `predictions` masked-LM rows per sequence (pre-training), activations of `elem_size`
// bytes (4: f32, 2: f16 or bf16); `deterministic`: devices.deterministic (the embedding
// tables' row groups).
struct gpu_micro_batch {
  std::int64_t batch = 1, seq = 128, predictions = 20, elem_size = 4;
  bool deterministic = false;
};

// What gpu::layer_forward leaves in its layer_stash for the backward (not its output,
// which the part keeps), under cfg.memory, in training (dropout on where its rate is
// above 0).
std::int64_t gpu_layer_stash_bytes(const bert_config& cfg, const gpu_micro_batch& mb);

// The most gpu::layer_forward and gpu::layer_backward hold at once beyond the stash, the
// layer's input and output and the gradients flowing in and out (their scratch arrays).
std::int64_t gpu_layer_forward_scratch(const bert_config& cfg, const gpu_micro_batch& mb);
std::int64_t gpu_layer_backward_scratch(const bert_config& cfg, const gpu_micro_batch& mb);

// What gpu::part::forward leaves in a part_stash for `range`: the ids and masks, each
// layer's input and output, the layers' stashes (none under checkpoint_activations), the
// embeddings' statistics, the final LayerNorm's and the head's arrays (the MLM logits, f32,
// M x vocab with M = batch x predictions at most).
std::int64_t gpu_part_stash_bytes(const bert_config& cfg, const bert_range& range, const gpu_micro_batch& mb);

// The most a forward or a backward of `range` holds at once beyond its stashes (the head's
// loss gradient copy and scratch, the gradient flowing down and the next one, under
// checkpointing a layer's recomputed stash and output, each layer's scratch).
std::int64_t gpu_part_scratch_bytes(const bert_config& cfg, const bert_range& range, const gpu_micro_batch& mb);

} // namespace dsa::bert
