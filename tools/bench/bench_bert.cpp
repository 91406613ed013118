// One BERT-mini training step (forward + backward, pretraining head) timed
// against the machine's GEMM peak, for `dsactor bench kernels`.
#include "tools/bench/bench_kernels.hpp"
#include "tools/bench/bench_util.hpp"

#include "core/philox.hpp"
#include "models/bert/bert_part.hpp"

#include <fmt/format.h>

namespace dsa::tools {
namespace {

tensor random_ids(std::int64_t rows, std::int64_t cols, std::int32_t lo, std::int32_t hi, std::uint32_t site) {
  tensor t = tensor::empty({rows, cols}, dtype::i32);
  philox_stream s{7, 0, 0, 0, site};
  for (std::int64_t i = 0; i < rows * cols; ++i)
    t.data<std::int32_t>()[i] = lo + static_cast<std::int32_t>(s.uniform(static_cast<std::uint64_t>(i)) * static_cast<float>(hi - lo));
  return t;
}

// Model FLOPs of one training step (forward x 3): encoder GEMMs and attention
// products per token, the pooler/NSP on [CLS], and the MLM head at masked slots.
double training_flops(const bert::bert_config& c, std::int64_t b, std::int64_t t, std::int64_t p) {
  double h = static_cast<double>(c.hidden_size), i = static_cast<double>(c.intermediate_size);
  double v = static_cast<double>(c.vocab_size), L = static_cast<double>(c.num_layers);
  double tokens = static_cast<double>(b * t);
  double encoder = tokens * L * (2 * (4 * h * h + 2 * h * i) + 4 * static_cast<double>(t) * h);
  double heads = static_cast<double>(b) * 2 * h * h + static_cast<double>(b * p) * (2 * h * h + 2 * h * v);
  return 3 * (encoder + heads);
}

} // namespace

bert_step_report bench_bert_mini_step(const bench_sizes& sizes, dtype working) {
  bert_step_report r;
  bool quick = sizes.tokens < 4096;
  r.batch = quick ? 4 : 32;
  r.seq = quick ? 32 : 128;
  const std::int64_t p = 20;
  bert::bert_config cfg = bert::bert_config_for(bert::model_size::mini);
  bert::bert_part part(cfg, bert::bert_range::whole(cfg), working);
  part.parameters().init(1234);
  bert::bert_batch batch;
  batch.input_ids = random_ids(r.batch, r.seq, 0, static_cast<std::int32_t>(cfg.vocab_size), 1);
  batch.token_type_ids = tensor::zeros({r.batch, r.seq}, dtype::i32);
  batch.attention_mask = tensor::empty({r.batch, r.seq}, dtype::f32);
  for (std::int64_t i = 0; i < r.batch * r.seq; ++i) batch.attention_mask.data<float>()[i] = 1.0f;
  batch.masked_lm_positions = random_ids(r.batch, p, 1, r.seq, 2);
  batch.masked_lm_ids = random_ids(r.batch, p, 0, static_cast<std::int32_t>(cfg.vocab_size), 3);
  batch.next_sentence_labels = random_ids(r.batch, 1, 0, 2, 4).reshape({r.batch});
  bert::forward_context ctx;
  ctx.seed = 1;
  ctx.stash_type = working;
  bert::part_stash stash;
  r.seconds = best_seconds(sizes.reps, [&] {
    auto out = part.forward(tensor(), batch, ctx, stash);
    DSA_CHECK(out.has_value(), "benchmark forward failed: {}", out.has_value() ? "" : out.err().to_string());
    part.backward(tensor(), stash, {});
  });
  r.gflops = training_flops(cfg, r.batch, r.seq, p) / r.seconds / 1e9;
  return r;
}

} // namespace dsa::tools
