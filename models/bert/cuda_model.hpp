// A whole BERT for pre-training on one GPU: embeddings, the encoder layers
// (cuda_layer.hpp) and the MLM + NSP heads, forward and backward, plus a fused AdamW step
// over every parameter. The arithmetic of bert_part's forward and backward on the CPU, with
// the same dropout streams, so a GPU step compares with a CPU step with dropout on.
//
// A whole-model cuda_part (cuda_part.hpp, which holds the parameters and the arithmetic)
// with one stash: step() is its forward then its backward, and waits for the stream once,
// to read the losses back. `dsactor bench gpu-train` runs it as the bare GPU step.
#pragma once

#include "kernels/cuda/gemm.hpp"
#include "models/bert/bert_batch.hpp"
#include "models/bert/bert_dropout.hpp"
#include "models/bert/bert_parameters.hpp"
#include "models/bert/cuda_part.hpp"

#include "kernels/cpu/adam.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace dsa::bert::gpu {

class pretraining_model {
public:
  // The values of `params` (a whole-model range with the pre-training head, f32 values)
  // copied to the device, working copies in `type`. Throws std::runtime_error with the
  // reason for a configuration it does not run (the SQuAD head, f16 storage). Raises the
  // device pool's release threshold, so freed activations stay cached between steps.
  pretraining_model(const bert_parameters& params, cuda::elem type, cudaStream_t stream);
  ~pretraining_model();
  pretraining_model(const pretraining_model&) = delete;
  pretraining_model& operator=(const pretraining_model&) = delete;

  // One micro-batch forward and backward: parameter gradients += the gradient of
  // loss_scale x (mlm_loss + nsp_loss). The batch is checked on the host (validate_batch);
  // a bad one throws naming the tensor. Returns the losses (waits for the stream).
  bert_losses step(const bert_batch& batch, const forward_context& ctx, float loss_scale);

  // AdamW over every parameter (masters, moments, then the working copies), from the
  // accumulated gradients; weight decay on the matrices and tables only (not biases or
  // LayerNorm parameters, as optim's bert_no_decay); then the gradients are zeroed. After
  // a step() or optimizer_step() that threw, call zero_gradients() before going on.
  void optimizer_step(const cpu::adam_params& params);

  // The accumulated gradients into the f32 gradient tensors of the bert_parameters given
  // to the constructor (which must outlive the model), and the masters into its values.
  void download_gradients() const;
  void download_values() const;
  void zero_gradients();

  std::int64_t parameter_count() const;
  cudaStream_t stream() const { return stream_; }

private:
  const bert_parameters& host_;
  std::unique_ptr<part> part_;
  part_stash stash_;
  cudaStream_t stream_;
};

} // namespace dsa::bert::gpu
