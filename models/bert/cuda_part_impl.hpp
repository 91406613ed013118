// The GPU part's state, shared by cuda_part.cpp (forward and backward) and
// cuda_part_params.cpp (parameters, gradients, optimizer). Internal to models/bert.
#pragma once

#include "models/bert/cuda_part.hpp"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace dsa::bert::gpu {

// One parameter tensor on the device.
struct device_param {
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  bool working_copy = false; // a matrix or table read in the storage type (half storage)
  // Weight decay applies: the matrices and tables, not biases or LayerNorm parameters (the
  // rule of optim's bert_no_decay, which names the same tensors).
  bool decay = false;
  device_array master;   // f32 values; also what the kernels read without a working copy (none
                         // for a working copy when the part is made without masters)
  device_array working;  // the storage-type copy
  device_array gradient; // f32, accumulated
  device_array m, v;     // AdamW moments, from the first optimizer step
};

// Positions in impl::params of one encoder layer's tensors.
struct layer_index {
  std::size_t query, key, value, attention_out, intermediate, output;
  std::size_t query_bias, key_bias, value_bias, attention_out_bias, intermediate_bias, output_bias;
  std::size_t attention_gamma, attention_beta, output_gamma, output_beta;
};

struct part::impl {
  bert_config cfg;
  bert_range range;
  cuda::elem type = cuda::elem::bf16;
  cudaStream_t stream = nullptr;
  bool deterministic = false;
  bool masters = true; // every parameter has its f32 master (false: part(..., masters = false))
  std::unique_ptr<cuda::gemm_engine> engine;
  std::vector<device_param> params; // bert_parameters' order
  // With the embeddings: word, position, token_type, embedding_gamma, embedding_beta.
  std::size_t word = 0, position = 0, token_type = 0, embedding_gamma = 0, embedding_beta = 0;
  std::vector<layer_index> layers; // layers [range.first_layer, range.last_layer)
  // With the head (decoder_word: the tied word embedding the decoder reads).
  std::size_t decoder_word = 0, pooler = 0, pooler_bias = 0, transform = 0, transform_bias = 0, transform_gamma = 0,
              transform_beta = 0, decoder_bias = 0, relationship = 0, relationship_bias = 0;
  // Pre-LN with the head: the final LayerNorm (bert.encoder.final_layernorm) before it.
  std::size_t final_gamma = 0, final_beta = 0;
  bool final_norm() const { return range.has_head() && cfg.norm == layer_norm_placement::pre; }
  // With the SQuAD head: qa_outputs (2, H) and its bias (2).
  std::size_t qa = 0, qa_bias = 0;
  bool squad() const { return range.has_head() && cfg.head == head_kind::squad; }

  // What the kernels read: the working copy, or the f32 master.
  const void* value(std::size_t i) const {
    const device_param& p = params[i];
    return p.working_copy ? p.working.get() : p.master.get();
  }
  const float* f32(std::size_t i) const { return params[i].master.as<float>(); }
  float* grad(std::size_t i) const { return params[i].gradient.as<float>(); }
  layer_weights weights(const layer_index& l) const;
  layer_grads grads(const layer_index& l) const;
};

inline void check_cuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw std::runtime_error("GPU BERT: " + what + " failed: " + cudaGetErrorString(e));
}

} // namespace dsa::bert::gpu
