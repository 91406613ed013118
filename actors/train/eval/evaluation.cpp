// Evaluation loops over the whole model.
#include "actors/train/eval/evaluation.hpp"

#include "actors/train/data/feed_source.hpp"
#include "core/log.hpp"
#include "io/data/squad_baselines.hpp"
#include "io/data/squad_dataset.hpp"
#include "io/data/squad_postprocess.hpp"

namespace dsa::train {

eval_forward cpu_eval_forward(const bert::bert_part& model) {
  return [&model](const bert::bert_batch& batch) -> expected<bert::part_output> {
    bert::forward_context ctx;
    ctx.mode = bert::run_mode::eval;
    bert::part_stash stash;
    return model.forward(tensor(), batch, ctx, stash);
  };
}

expected<pretrain_eval> evaluate_pretraining(const eval_forward& model, const std::vector<std::string>& shards,
                                             std::int64_t batch_size, std::int64_t batches) {
  data::shard_reader_options o;
  o.shuffle_buffer = 1;
  o.order = data::shard_order::in_order;
  o.epochs = 1;
  DSA_ASSIGN_OR_RETURN(auto reader, data::shard_reader::open(shards, o));
  pretrain_eval r;
  double mlm_loss = 0, nsp_loss = 0;
  std::int64_t mlm_n = 0, mlm_ok = 0, nsp_n = 0, nsp_ok = 0;
  for (std::int64_t b = 0; batches == 0 || b < batches; ++b) {
    DSA_ASSIGN_OR_RETURN(auto t, reader.next_batch(batch_size));
    if (t.empty() || t.at("input_ids").dim(0) == 0) break;
    bert::bert_batch batch = pretrain_batch(t);
    DSA_ASSIGN_OR_RETURN(auto out, model(batch));
    const auto& l = out.losses;
    mlm_loss += l.mlm_loss * static_cast<double>(l.mlm_count);
    nsp_loss += l.nsp_loss * static_cast<double>(l.nsp_count);
    mlm_n += l.mlm_count;
    mlm_ok += l.mlm_correct;
    nsp_n += l.nsp_count;
    nsp_ok += l.nsp_correct;
    r.sequences += batch.batch_size();
  }
  if (mlm_n > 0) {
    r.mlm_loss = mlm_loss / static_cast<double>(mlm_n);
    r.mlm_accuracy = static_cast<double>(mlm_ok) / static_cast<double>(mlm_n);
  }
  if (nsp_n > 0) {
    r.nsp_loss = nsp_loss / static_cast<double>(nsp_n);
    r.nsp_accuracy = static_cast<double>(nsp_ok) / static_cast<double>(nsp_n);
  }
  return r;
}

expected<squad_eval_result> evaluate_squad(const eval_forward& model, const tok::bert_tokenizer& tokenizer,
                                           const squad_eval_settings& s) {
  DSA_ASSIGN_OR_RETURN(auto dataset, data::load_squad(s.dev_file));
  auto examples = data::squad_read_examples(dataset, data::squad_mode::evaluation);
  data::squad_feature_options fo;
  fo.max_seq_length = s.max_seq_length;
  fo.doc_stride = s.doc_stride;
  fo.max_query_length = s.max_query_length;
  fo.mode = data::squad_mode::evaluation;
  DSA_ASSIGN_OR_RETURN(auto features, data::squad_convert_examples(examples.examples, tokenizer, fo));
  std::vector<data::squad_raw_result> results;
  const auto batch = static_cast<std::size_t>(s.batch_size);
  for (std::size_t begin = 0; begin < features.size(); begin += batch) {
    std::size_t end = std::min(features.size(), begin + batch);
    bert::bert_batch b = squad_batch(features, begin, end);
    b.start_positions = tensor();
    b.end_positions = tensor();
    DSA_ASSIGN_OR_RETURN(auto out, model(b));
    const std::int64_t T = b.seq_length();
    for (std::size_t i = begin; i < end; ++i) {
      data::squad_raw_result r;
      r.unique_id = features[i].unique_id;
      const float* st = out.squad.start.data<float>() + static_cast<std::int64_t>(i - begin) * T;
      const float* en = out.squad.end.data<float>() + static_cast<std::int64_t>(i - begin) * T;
      r.start_logits.assign(st, st + T);
      r.end_logits.assign(en, en + T);
      results.push_back(std::move(r));
    }
  }
  data::squad_postprocess_options po;
  po.n_best_size = s.n_best_size;
  po.max_answer_length = s.max_answer_length;
  po.basic = tokenizer.options();
  DSA_ASSIGN_OR_RETURN(auto predictions, data::squad_postprocess(examples.examples, features, results, po));
  DSA_TRY(data::write_squad_predictions(s.predictions_path, predictions));
  data::squad_predictions by_id;
  for (const auto& p : predictions) by_id[p.qas_id] = p.text;
  squad_eval_result r;
  DSA_ASSIGN_OR_RETURN(r.model, data::squad_evaluate(dataset, by_id));
  DSA_ASSIGN_OR_RETURN(auto baselines, data::squad_evaluate_baselines(dataset, s.seed));
  r.first_sentence = baselines.first_sentence;
  r.random_span = baselines.random_span;
  return r;
}

} // namespace dsa::train
