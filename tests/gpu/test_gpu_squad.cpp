// Fine-tuning on the GPU: the SQuAD span head of the GPU part (models/bert/cuda_part.hpp)
// against the CPU model (bert_part) on the same batch with dropout on, the losses, the
// logits and every gradient in f32, bf16 and f16 storage; and the end-of-run evaluation
// on the GPU (actors/train/eval/gpu_eval.hpp) against its CPU twin: a pre-training batch's
// losses and a SQuAD batch's logits, eval mode.
#include "gpu_test_util.hpp"

#include "actors/train/eval/evaluation.hpp"
#include "actors/train/eval/gpu_eval.hpp"
#include "models/bert/bert_part.hpp"
#include "models/bert/cuda_part.hpp"
#include "gpu_bert_fixture.hpp"

#include <cmath>
#include <string>

namespace dsa::test {
namespace {

bert::bert_config squad_config(std::int64_t layers) {
  bert::bert_config cfg = gpu_bert_config(layers);
  cfg.head = bert::head_kind::squad;
  return cfg;
}

// small_batch's spans, with the second sequence's end outside the window: clamped to T
// and ignored, so the end loss counts one sequence and the start loss two.
bert::bert_batch squad_batch(const bert::bert_config& cfg) {
  bert::bert_batch b = small_batch(cfg);
  b.masked_lm_positions = b.masked_lm_ids = b.next_sentence_labels = tensor();
  b.end_positions.data<std::int32_t>()[1] = 99;
  return b;
}

double max_abs_diff(const tensor& a, const tensor& b) {
  double m = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  return m;
}

double max_abs(const tensor& a) {
  double m = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a.data<float>()[i])));
  return m;
}

} // namespace

TEST_CASE("cuda part: the SQuAD head equals the CPU model, losses, logits and every gradient") {
  const bert::bert_config cfg = squad_config(2);
  const bert::bert_batch batch = squad_batch(cfg);
  bert::forward_context ctx;
  ctx.seed = 5;
  ctx.step = 2;
  for (const cuda::elem type : {cuda::elem::f32, cuda::elem::bf16, cuda::elem::f16}) {
    INFO("storage " << std::string(elem_name(type)));
    const float scale = type == cuda::elem::f16 ? 1024.0f : 1.0f;
    const bert::bert_range whole = bert::bert_range::whole(cfg);
    bert::bert_part cpu(cfg, whole);
    prepare_gpu_bert(cpu.parameters());
    bert::part_stash cpu_stash;
    auto ref = cpu.forward(tensor(), batch, ctx, cpu_stash);
    REQUIRE(ref);
    bert::backward_options options;
    options.loss_scale = scale;
    (void)cpu.backward(tensor(), cpu_stash, options);
    REQUIRE(ref->losses.start_count == 2);
    REQUIRE(ref->losses.end_count == 1);

    test_stream stream;
    bert::bert_parameters host(cfg, whole);
    prepare_gpu_bert(host);
    bert::gpu::part gpu(host, type, stream.get());
    bert::gpu::part_stash stash;
    CHECK(gpu.forward(bert::gpu::device_array(), batch, ctx, scale, stash) == nullptr);
    const bert::bert_losses got = gpu.losses(stash);
    const bert::squad_logits logits = gpu.span_logits(stash);
    (void)gpu.backward(nullptr, stash);

    const test::tolerance& limit = type == cuda::elem::f32 ? test::gpu_f32_vs_cpu : test::gpu_half_vs_cpu;
    CHECK(got.start_count == 2);
    CHECK(got.end_count == 1);
    CHECK(got.start_correct == ref->losses.start_correct);
    CHECK(got.end_correct == ref->losses.end_correct);
    CHECK(std::fabs(got.start_loss - ref->losses.start_loss) <= limit.rel * std::fabs(ref->losses.start_loss) + limit.abs);
    CHECK(std::fabs(got.end_loss - ref->losses.end_loss) <= limit.rel * std::fabs(ref->losses.end_loss) + limit.abs);
    REQUIRE(logits.start.numel() == ref->squad.start.numel());
    CHECK(max_abs_diff(logits.start, ref->squad.start) <= limit.rel * max_abs(ref->squad.start) + limit.abs);
    CHECK(max_abs_diff(logits.end, ref->squad.end) <= limit.rel * max_abs(ref->squad.end) + limit.abs);

    std::vector<tensor> grads;
    for (const auto& e : host.entries())
      grads.push_back(e.grad);
    gpu.download_gradients(grads);
    for (const auto& e : host.entries()) {
      const double err = gradient_error(host, cpu.parameters(), e.spec.name);
      INFO(e.spec.name << ": relative error " << err);
      CHECK(std::isfinite(err));
      CHECK(err <= limit.rel);
    }

    // A batch without positions, trained on: logits, no loss, and no gradient anywhere.
    bert::bert_batch unlabelled = batch;
    unlabelled.start_positions = unlabelled.end_positions = tensor();
    gpu.zero_gradients();
    (void)gpu.forward(bert::gpu::device_array(), unlabelled, ctx, scale, stash);
    CHECK(gpu.losses(stash).start_count == 0);
    CHECK(gpu.span_logits(stash).start.numel() == logits.start.numel());
    (void)gpu.backward(nullptr, stash);
    gpu.download_gradients(grads);
    for (const auto& e : host.entries())
      CHECK_MESSAGE(max_abs(e.grad) == 0.0, e.spec.name);
  }
}

TEST_CASE("GPU evaluation equals the CPU evaluation: pre-training losses and SQuAD logits") {
  for (const bert::head_kind head : {bert::head_kind::pretraining, bert::head_kind::squad}) {
    bert::bert_config cfg = gpu_bert_config(2);
    cfg.head = head;
    INFO((head == bert::head_kind::squad ? "squad" : "pretraining"));
    bert::bert_part whole(cfg, bert::bert_range::whole(cfg));
    prepare_gpu_bert(whole.parameters());
    bert::bert_batch batch = small_batch(cfg);
    if (head == bert::head_kind::squad) { // dev-set batches carry no positions
      batch.start_positions = batch.end_positions = tensor();
      batch.masked_lm_positions = batch.masked_lm_ids = batch.next_sentence_labels = tensor();
    }
    const train::eval_forward cpu = train::cpu_eval_forward(whole);
    const train::eval_forward gpu = train::gpu_eval_forward(whole.parameters(), 0, dtype::f32);
    auto ref = cpu(batch);
    auto got = gpu(batch);
    REQUIRE(ref);
    REQUIRE(got);
    // Twice: the stash and its readout are reused batch after batch.
    auto again = gpu(batch);
    REQUIRE(again);
    const test::tolerance& limit = test::gpu_f32_vs_cpu;
    if (head == bert::head_kind::pretraining) {
      CHECK(got->losses.mlm_count == ref->losses.mlm_count);
      CHECK(got->losses.mlm_correct == ref->losses.mlm_correct);
      CHECK(std::fabs(got->losses.mlm_loss - ref->losses.mlm_loss) <= limit.rel * std::fabs(ref->losses.mlm_loss));
      CHECK(std::fabs(got->losses.nsp_loss - ref->losses.nsp_loss) <=
            limit.rel * std::fabs(ref->losses.nsp_loss) + limit.abs);
      CHECK(again->losses.mlm_loss == got->losses.mlm_loss); // eval mode: no dropout stream moves
    } else {
      CHECK(got->losses.start_count == 0); // no positions, no loss
      CHECK(max_abs_diff(got->squad.start, ref->squad.start) <= limit.rel * max_abs(ref->squad.start) + limit.abs);
      CHECK(max_abs_diff(got->squad.end, ref->squad.end) <= limit.rel * max_abs(ref->squad.end) + limit.abs);
      CHECK(max_abs_diff(again->squad.start, got->squad.start) == 0.0);
    }
  }
}

} // namespace dsa::test
