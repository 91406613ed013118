// End-of-run evaluation with the whole model in eval mode (no dropout), in forward-only
// batches on the CPU (bert_part) or on the run's GPU (gpu_eval.hpp):
// pre-training: MLM and NSP loss and accuracy on held-out shards;
// SQuAD: predictions.json for the dev set, exact match and F1 as the official
// script computes them, beside the trivial baselines.
#pragma once

#include "core/error.hpp"
#include "io/data/squad_eval.hpp"
#include "models/bert/bert_part.hpp"
#include "models/tokenizer/bert_tokenizer.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dsa::train {

// One eval-mode forward of the whole model: a pre-training batch's losses, or a SQuAD
// batch's start and end logits (f32 on the host).
using eval_forward = std::function<expected<bert::part_output>(const bert::bert_batch&)>;

// bert_part's forward in eval mode; `model` must outlive the function.
eval_forward cpu_eval_forward(const bert::bert_part& model);

struct pretrain_eval {
  std::int64_t sequences = 0;
  double mlm_loss = 0.0, nsp_loss = 0.0;
  double mlm_accuracy = 0.0, nsp_accuracy = 0.0;
};

// shards: held-out shard files; batches: 0 = all.
expected<pretrain_eval> evaluate_pretraining(const eval_forward& model, const std::vector<std::string>& shards,
                                             std::int64_t batch_size, std::int64_t batches);

struct squad_eval_settings {
  std::string dev_file;
  std::string predictions_path; // written atomically
  std::int64_t batch_size = 8;
  int max_seq_length = 384, doc_stride = 128, max_query_length = 64;
  int n_best_size = 20, max_answer_length = 30;
  std::uint64_t seed = 0; // random-span baseline
};

struct squad_eval_result {
  data::squad_scores model;
  data::squad_scores first_sentence, random_span;
};

expected<squad_eval_result> evaluate_squad(const eval_forward& model, const tok::bert_tokenizer& tokenizer,
                                           const squad_eval_settings& settings);

} // namespace dsa::train
