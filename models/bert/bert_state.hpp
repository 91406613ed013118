// HuggingFace-compatible state dicts: load_state() takes a BertForPreTraining or
// BertForQuestionAnswering state dict as HF writes it; state() exports ours.
//
// Accepted on load:
//   - f32, f16 and bf16 tensors (converted to the parameters' value type, rounding to
//     nearest even when that is f16/bf16); anything else is an error;
//   - old LayerNorm names "...LayerNorm.gamma" / "...LayerNorm.beta";
//   - BertModel dicts without the "bert." prefix;
//   - HF extras: bert.embeddings.position_ids / token_type_ids buffers;
//     cls.predictions.decoder.weight (tied: must equal the word embedding when both
//     are present, and stands in for it when only it is); cls.predictions.decoder.bias
//     (a duplicate of cls.predictions.bias, same rules);
//   - tensors of the model that this range does not hold (other pipeline stages),
//     and of the other head (a pretraining checkpoint loaded for SQuAD fine-tuning).
// Errors name the tensor: missing, wrong shape, wrong dtype, untied decoder,
// unexpected name. Nothing is written unless the whole dict checks out.
//
// Exported by state(): every parameter this range owns under its HF name, as
// views of the live parameters in their value type (clone to snapshot). Not exported:
// cls.predictions.decoder.weight and cls.predictions.decoder.bias, which HF ties
// to the word embedding and cls.predictions.bias (HF's own safetensors files omit
// them and load without them), and the tied word-embedding copy of a head-only
// range (its owner, the embedding range, exports it).
#pragma once

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "models/bert/bert_parameters.hpp"

#include <map>
#include <string>
#include <vector>

namespace dsa::bert {

// What to do when the dict lacks this range's head (fine-tuning from a
// pretraining checkpoint): fail, or keep the head's current (initialised) values.
enum class missing_head { error, keep_current };
// What to do with names that are neither ours, the other head's nor known HF extras.
enum class unexpected_tensors { error, ignore };

struct load_options {
  missing_head head = missing_head::error;
  unexpected_tensors unexpected = unexpected_tensors::error;
};

struct load_report {
  std::vector<std::string> loaded; // our names, written
  std::vector<std::string>
      kept; // our head tensors absent from the dict (missing_head::keep_current)
  std::vector<std::string> ignored; // dict names not loaded (extras, other ranges, other head)
};

expected<load_report> load_state(bert_parameters& params, const std::map<std::string, tensor>& dict,
                                 const load_options& options = {});

std::map<std::string, tensor> state(const bert_parameters& params);

} // namespace dsa::bert
