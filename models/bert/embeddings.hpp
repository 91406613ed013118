// BERT embeddings: word + position + token-type lookup, LayerNorm, dropout
// (site::embeddings, layer 0). Forward fills a stash; backward consumes it.
#pragma once

#include "core/tensor.hpp"
#include "models/bert/bert_batch.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_dropout.hpp"
#include "models/bert/bert_parameters.hpp"

namespace dsa::bert {

struct embeddings_stash {
  forward_context ctx;
  tensor input_ids, token_type_ids; // (B, T) i32, references to the batch
  tensor sum;                       // (B*T, H) LayerNorm input, in ctx.stash_type
  tensor mean, rstd;                // (B*T)
  std::size_t bytes() const;
};

// p: in the parameters' stored dtype (word rows are widened as they are gathered,
// the small tables whole). Returns (B, T, H) f32.
tensor embeddings_forward(const embeddings_params& p, const bert_config& cfg,
                          const bert_batch& batch, const forward_context& ctx,
                          embeddings_stash& stash);

// dout: (B, T, H), used as scratch. Accumulates into p's gradients; the word
// embedding row pad_token_id receives nothing (HF padding_idx).
void embeddings_backward(const embeddings_params& p, const bert_config& cfg, const tensor& dout,
                         const embeddings_stash& stash);

} // namespace dsa::bert
