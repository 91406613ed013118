// The whole GPU BERT (models/bert/cuda_model.hpp) against the CPU model (bert_part) on the
// same batch, dropout on everywhere with the same streams: the losses, the accuracy counts
// and every parameter's gradient, in f32 storage (close to the CPU's f32) and in bf16
// (within bf16's error); then an AdamW step on the GPU against cpu::adam_update, weight
// decay on the matrices and tables only.
#include "gpu_test_util.hpp"

#include "models/bert/bert_part.hpp"
#include "models/bert/cuda_model.hpp"
#include "gpu_bert_fixture.hpp"

#include <cmath>
#include <cstring>
#include <string>

namespace dsa::test {
TEST_CASE("cuda BERT pre-training step equals the CPU model: losses and every gradient") {
  const bert::bert_config cfg = gpu_bert_config();
  const bert::bert_batch batch = small_batch(cfg);
  bert::forward_context ctx;
  ctx.seed = 5;
  ctx.step = 3;
  bert::bert_part cpu_part(cfg, bert::bert_range::whole(cfg));
  prepare_gpu_bert(cpu_part.parameters());
  bert::part_stash stash;
  auto out = cpu_part.forward(tensor{}, batch, ctx, stash);
  REQUIRE(out);
  const bert::bert_losses ref = out.value().losses;
  bert::backward_options options;
  options.loss_scale = 2.0f;
  cpu_part.backward(tensor{}, stash, options);
  REQUIRE(ref.mlm_count > 0);
  REQUIRE(ref.nsp_count > 0);

  for (const cuda::elem type : {cuda::elem::f32, cuda::elem::bf16}) {
    INFO("storage " << std::string(elem_name(type)));
    bert::bert_parameters gpu_params(cfg, bert::bert_range::whole(cfg));
    prepare_gpu_bert(gpu_params);
    test_stream stream;
    bert::gpu::pretraining_model model(gpu_params, type, stream.get());
    CHECK(model.parameter_count() == gpu_params.count());
    const bert::bert_losses got = model.step(batch, ctx, 2.0f);
    const test::tolerance& limit = type == cuda::elem::f32 ? test::gpu_f32_vs_cpu : test::gpu_half_vs_cpu;
    const double tol = limit.rel;
    CHECK(got.mlm_count == ref.mlm_count);
    CHECK(got.nsp_count == ref.nsp_count);
    CHECK(std::fabs(got.mlm_loss - ref.mlm_loss) <= tol * std::fabs(ref.mlm_loss));
    CHECK(std::fabs(got.nsp_loss - ref.nsp_loss) <= tol * std::fabs(ref.nsp_loss) + limit.abs);
    if (type == cuda::elem::f32) {
      CHECK(got.mlm_correct == ref.mlm_correct);
      CHECK(got.nsp_correct == ref.nsp_correct);
    }
    model.download_gradients();
    // Each gradient against the CPU's, relative to its norm; the key biases' gradients are
    // zero up to rounding (softmax ignores a shift shared by a row), so against the query
    // bias's norm.
    for (const auto& e : gpu_params.entries()) {
      const double err = gradient_error(gpu_params, cpu_part.parameters(), e.spec.name);
      INFO(e.spec.name << ": relative error " << err);
      CHECK(err <= tol);
    }

    // AdamW on the GPU against the CPU kernel on the same gradients (f32 storage: the
    // masters follow the CPU's arithmetic; the element rule is shared).
    if (type == cuda::elem::f32) {
      cpu::adam_params adam;
      adam.lr = 1e-3f;
      adam.weight_decay = 0.01f;
      model.optimizer_step(adam);
      model.download_values();
      int bad = 0;
      for (const auto& e : cpu_part.parameters().entries()) {
        const auto* gpu_entry = gpu_params.find(e.spec.name);
        std::vector<float> p(static_cast<std::size_t>(e.value.numel())), m(p.size(), 0.0f), v(p.size(), 0.0f);
        std::memcpy(p.data(), e.value.raw_data(), p.size() * 4);
        std::vector<float> grad(p.size());
        std::memcpy(grad.data(), gpu_entry->grad.raw_data(), grad.size() * 4); // the GPU's gradient
        // No decay for biases and LayerNorm parameters (optim's bert_no_decay rule).
        const std::string& n = e.spec.name;
        const bool no_decay = n.find("LayerNorm") != std::string::npos ||
                              (n.size() >= 4 && n.compare(n.size() - 4, 4, "bias") == 0);
        cpu::adam_params rule = adam;
        if (no_decay)
          rule.weight_decay = 0.0f;
        cpu::adam_update(p.data(), m.data(), v.data(), grad.data(), nullptr, dtype::f32, rule,
                         static_cast<std::int64_t>(p.size()));
        if (std::memcmp(p.data(), gpu_entry->value.raw_data(), p.size() * 4) != 0 && ++bad <= 3)
          CHECK_MESSAGE(false, e.spec.name << ": the GPU's AdamW differs from the CPU kernel's");
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("cuda BERT refuses what the GPU path does not run yet") {
  bert::bert_config cfg = gpu_bert_config();
  cfg.norm = bert::layer_norm_placement::pre;
  bert::bert_parameters pre_ln(cfg, bert::bert_range::whole(cfg));
  test_stream stream;
  CHECK_THROWS_WITH(bert::gpu::pretraining_model(pre_ln, cuda::elem::bf16, stream.get()),
                    doctest::Contains("post-LN"));
  bert::bert_parameters plain(gpu_bert_config(), bert::bert_range::whole(gpu_bert_config()));
  CHECK_THROWS_WITH(bert::gpu::pretraining_model(plain, cuda::elem::f16, stream.get()),
                    doctest::Contains("f16 storage"));
  cfg = gpu_bert_config();
  cfg.memory.gelu_checkpoint = true;
  bert::bert_parameters flagged(cfg, bert::bert_range::whole(cfg));
  CHECK_THROWS_WITH(bert::gpu::pretraining_model(flagged, cuda::elem::bf16, stream.get()),
                    doctest::Contains("memory flags"));
}

} // namespace dsa::test
