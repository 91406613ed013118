// A contiguous slice of BERT as a pipeline stage runs it: optional embeddings,
// encoder layers [first, last), optional head (with the pre-LN final LayerNorm).
// One bert_part holds the parameters; each micro-batch in flight has its own
// part_stash, filled by forward and consumed by backward, so several
// micro-batches (1F1B) can be in flight at once.
//
// The tied word embedding: a range with the embeddings accumulates the lookup's
// gradient into it, a range with a pretraining head accumulates the decoder's.
// One range holding both gets the sum; split ranges each hold their own
// contribution, and the caller sums them across stages (DeepSpeed's tied-weight
// allreduce) before the optimizer step.
//
// Threads: forward is const and may run for several micro-batches at once;
// backward accumulates into the shared gradients, so one backward at a time.
#pragma once

#include "core/tensor.hpp"
#include "models/bert/bert_batch.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_dropout.hpp"
#include "models/bert/bert_parameters.hpp"
#include "models/bert/bert_range.hpp"
#include "models/bert/embeddings.hpp"
#include "models/bert/encoder_layer.hpp"
#include "models/bert/pretraining_head.hpp"
#include "models/bert/squad_head.hpp"

#include <cstddef>
#include <functional>
#include <vector>

namespace dsa::bert {

struct part_stash {
  embeddings_stash embeddings;
  std::vector<layer_stash> layers;
  tensor final_norm_in, final_norm_mean, final_norm_rstd; // pre-LN with head; in: stash_type
  pretraining_head_stash pretraining;
  squad_head_stash squad;
  // Activation checkpointing (bert_config::checkpoint_activations): each layer's f32 input
  // instead of its stash, and what its recomputed forward needs (`layers` stays empty).
  std::vector<tensor> checkpoints;
  tensor key_mask;
  forward_context ctx;
  bool filled = false; // set by a train-mode forward, cleared by backward

  std::size_t bytes() const; // layers' stashes plus embeddings and final norm
};

struct part_output {
  tensor hidden;      // (B, T, H) output of the last layer (ranges without head)
  bert_losses losses; // ranges with head
  squad_logits squad; // squad head: start/end logits (B, T)
};

struct backward_options {
  // Scales the loss gradient (fp16 loss scaling, 1/M for gradient accumulation).
  // Applies in the range with the head only: other ranges receive gradients
  // that are already scaled.
  float loss_scale = 1.0f;
  // When set, called as parts of the range finish adding to their parameter
  // gradients: head_done after the head (and a pre-LN final LayerNorm), the
  // layer's index after each encoder layer, embeddings_done after the
  // embeddings (which also receive the tied decoder's share, so the word
  // embedding is complete only then). Used to overlap gradient sums with backward.
  static constexpr std::int64_t head_done = -1, embeddings_done = -2;
  std::function<void(std::int64_t part)> on_done;
};

// The parameters of `params` (indices into its entries) whose gradients are complete once
// `part` of its range has run its backward (backward_options::on_done's ids): by name,
// "bert.embeddings." where the range has the embeddings (the last stage's tied decoder
// copy is completed by the head), each layer's prefix, and the rest is the head's. Every
// index belongs to exactly one part. The CPU and the GPU stage both tell the runtime so.
std::vector<std::size_t> parameters_finished_by(const bert_parameters& params, std::int64_t part);
// The parameters `part` reads as it runs: parameters_finished_by's and, for a pre-training
// head, the tied word embedding its decoder reads (the embeddings' where the range has
// them). What ZeRO-3 binds around the part, on the CPU and on the GPU.
std::vector<std::size_t> parameters_read_by(const bert_parameters& params, std::int64_t part);

// ZeRO-3 (a parameter fetcher): told just before and just after the model runs each part
// of the range, so that part's weights can be gathered for it and freed after it. Part
// ids as backward_options::on_done's: embeddings_done for the embeddings, the layer's
// index, head_done for the head (with a pre-LN final LayerNorm). The forward runs the
// parts in that order, the backward in reverse; each enter is followed by its leave.
class part_gate {
public:
  virtual ~part_gate() = default;
  virtual void enter(std::int64_t part) = 0;
  virtual void leave(std::int64_t part) = 0;
};

class bert_part {
public:
  // weights: the dtype the parameter values are held in (f32, f16 or bf16); each
  // layer widens its own to f32 while it runs, so at most one layer's f32 copy
  // lives at a time per call.
  // gradients: as bert_parameters' (false: none allocated).
  bert_part(const bert_config& cfg, const bert_range& range, dtype weights = dtype::f32, bool gradients = true,
            const bert_parameters::value_maker& make_value = {});

  bert_parameters& parameters() { return params_; }
  const bert_parameters& parameters() const { return params_; }
  const bert_config& config() const { return params_.config(); }
  const bert_range& range() const { return params_.range(); }

  // hidden_in: (B, T, H) from the previous stage; ignored (may be undefined) when the
  // range has the embeddings, which read batch.input_ids. Every range reads
  // batch.attention_mask; the head reads the labels. Errors name a malformed batch
  // tensor. In eval mode nothing is stashed and dropout is off. Activations are
  // stashed in ctx.stash_type (the heads' stashes and per-row statistics in f32).
  expected<part_output> forward(const tensor& hidden_in, const bert_batch& batch,
                                const forward_context& ctx, part_stash& stash) const;

  // dhidden_out: (B, T, H) gradient of this range's output (ignored with a head: the
  // loss is the start). Accumulates parameter gradients; returns d hidden_in
  // (B, T, H), undefined when the range has the embeddings. Releases the stash.
  tensor backward(const tensor& dhidden_out, part_stash& stash,
                  const backward_options& options) const;

  // ZeRO-3: the gate told about every part forward and backward run (null: none).
  void set_gate(part_gate* gate) { gate_ = gate; }

private:
  void enter(std::int64_t part) const {
    if (gate_) gate_->enter(part);
  }
  void leave(std::int64_t part) const {
    if (gate_) gate_->leave(part);
  }
  bert_parameters params_;
  part_gate* gate_ = nullptr;
};

// The key mask the softmax takes: (B, T) f32, converted from i32 when needed;
// undefined when the batch has none.
tensor key_mask_f32(const bert_batch& batch);

} // namespace dsa::bert
