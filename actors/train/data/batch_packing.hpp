// A BERT micro-batch as the runtime carries it: the first stage's input is one
// i32 tensor (3, B, T) = [input_ids; token_type_ids; attention_mask], the last
// stage's labels one i32 tensor (pretraining (B, 2P + 1) = [positions | ids |
// next_sentence]; squad (B, 2) = [start | end]). Middle stages need only the
// attention mask, which the source posts on the mask board, keyed by
// (step, micro-batch), and the first stage's backward (the micro-batch's last
// use) removes.
#pragma once

#include "core/tensor.hpp"
#include "models/bert/bert_batch.hpp"
#include "models/bert/bert_config.hpp"

#include <cstdint>
#include <utility>

namespace dsa::train {

tensor pack_inputs(const bert::bert_batch& b);
// Fills input_ids, token_type_ids and attention_mask (f32) of `out` from a packed tensor.
void unpack_inputs(const tensor& packed, bert::bert_batch& out);

tensor pack_labels(const bert::bert_batch& b, bert::head_kind head);
void unpack_labels(const tensor& packed, bert::head_kind head, bert::bert_batch& out);

} // namespace dsa::train
