// The end-of-run evaluation of a run's model; see run_evaluate.hpp.
#include "actors/train/eval/run_evaluate.hpp"

#include "actors/train/data/data_prepare.hpp"
#include "actors/train/eval/evaluation.hpp"
#if DSA_HAVE_CUDA
#include "actors/train/eval/gpu_eval.hpp"
#endif
#include "core/log.hpp"
#include "io/ckpt/atomic_file.hpp"
#include "models/bert/bert_state.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dsa::train {
namespace {

// The whole model in f32 from the stages' working weights (for evaluation).
bert::bert_part assemble_whole(const run_config& rc, const std::vector<std::unique_ptr<model_stage>>& stages,
                               const std::map<std::string, tensor>& elsewhere) {
  bert::bert_part whole(rc.model, bert::bert_range::whole(rc.model));
  std::map<std::string, tensor> dict = elsewhere;
  for (auto& st : stages)
    if (st) dict.merge(evaluation_weights(*st));
  auto loaded = bert::load_state(whole.parameters(), dict, {});
  DSA_CHECK(loaded.has_value(), "assembling the stages into one model: {}", loaded.has_value() ? "" : loaded.err().message);
  return whole;
}

// The whole model's eval forward on the rank's device (the GPU's copy is made here); on
// the CPU when the GPU cannot hold it beside the training stages.
eval_forward eval_model(const run_config& rc, const device_choice& device, const bert::bert_part& whole) {
  if (device.device == stage_device::cpu) return cpu_eval_forward(whole);
#if DSA_HAVE_CUDA
  try {
    eval_forward gpu = gpu_eval_forward(whole.parameters(), device.index, working_dtype(rc.working));
    log_info("eval: on {}", device.description);
    return gpu;
  } catch (const std::exception& e) {
    log_warn("eval: on the CPU, since the model could not be set up on {}: {}", device.description, e.what());
  }
#else
  (void)rc;
#endif
  return cpu_eval_forward(whole);
}

} // namespace

bool evaluates_anything(const run_config& rc) {
  const auto& d = rc.data;
  return rc.model.head == bert::head_kind::pretraining ? !d.eval_shards.empty() : !d.dev_file.empty();
}

std::map<std::string, tensor> evaluation_weights(model_stage& stage) {
  std::map<std::string, tensor> out;
  for (const auto& e : stage.named_parameters().entries())
    if (e.spec.role == bert::replica::owner) out.emplace(e.spec.name, e.value);
  return out;
}

int evaluate(const run_config& rc, const device_choice& device, const tok::bert_tokenizer* tokenizer,
             const std::vector<std::unique_ptr<model_stage>>& stages, const std::map<std::string, tensor>& elsewhere) {
  const auto& d = rc.data;
  if (!evaluates_anything(rc)) return 0;
  // The held-out shards first: without them nothing is assembled (the whole model's weights
  // and gradients, 8 bytes per parameter).
  expected<std::vector<std::string>> shards = std::vector<std::string>{};
  if (rc.model.head == bert::head_kind::pretraining) {
    shards = list_shards(d.eval_shards);
    if (!shards) {
      log_warn("evaluation skipped: {}", shards.err().message);
      return 0;
    }
  }
  bert::bert_part whole = assemble_whole(rc, stages, elsewhere);
  const eval_forward model = eval_model(rc, device, whole);
  if (rc.model.head == bert::head_kind::pretraining) {
    auto r = evaluate_pretraining(model, *shards, rc.batch.micro_batch_size, d.eval_batches);
    if (!r) {
      log_error("evaluation failed: {}", r.err().message);
      return 1;
    }
    log_info("eval: {} held-out sequences: MLM accuracy {:.4f} (loss {:.4f}), NSP accuracy {:.4f} (loss {:.4f})",
             r->sequences, r->mlm_accuracy, r->mlm_loss, r->nsp_accuracy, r->nsp_loss);
    std::string summary = fmt::format("{{\"eval_sequences\":{},\"mlm_accuracy\":{:.6f},\"mlm_loss\":{:.6f},"
                                      "\"nsp_accuracy\":{:.6f},\"nsp_loss\":{:.6f}}}\n",
                                      r->sequences, r->mlm_accuracy, r->mlm_loss, r->nsp_accuracy, r->nsp_loss);
    (void)ckpt::write_file_atomic(rc.run_dir + "/eval.json", summary);
    fmt::print("{}", summary);
    return 0;
  }
  squad_eval_settings s;
  s.dev_file = d.dev_file;
  s.predictions_path = rc.run_dir + "/predictions.json";
  s.batch_size = rc.batch.micro_batch_size;
  s.max_seq_length = static_cast<int>(d.max_seq_length);
  s.doc_stride = static_cast<int>(d.doc_stride);
  s.max_query_length = static_cast<int>(d.max_query_length);
  s.n_best_size = static_cast<int>(d.n_best_size);
  s.max_answer_length = static_cast<int>(d.max_answer_length);
  s.seed = rc.seed;
  auto r = evaluate_squad(model, *tokenizer, s);
  if (!r) {
    log_error("evaluation failed: {}", r.err().message);
    return 1;
  }
  log_info("eval: wrote {}", s.predictions_path);
  log_info("eval: baseline first sentence: EM {:.2f} F1 {:.2f}; baseline random span: EM {:.2f} F1 {:.2f}",
           r->first_sentence.exact_match, r->first_sentence.f1, r->random_span.exact_match, r->random_span.f1);
  log_info("eval: model: EM {:.2f} F1 {:.2f} over {} questions", r->model.exact_match, r->model.f1, r->model.total);
  std::string line = data::squad_scores_json(r->model);
  (void)ckpt::write_file_atomic(rc.run_dir + "/eval.json", line + "\n");
  fmt::print("{}\n", line);
  return 0;
}

} // namespace dsa::train
