// Activation checkpointing on the GPU (model.checkpoint_activations): the GPU part that
// keeps only each layer's input and runs the layer's forward again before its backward,
// against the same part without it, both heads, f32 and bf16 storage, dropout on. The
// forward is the same kernels on the same inputs (the losses equal exactly); the gradients
// differ only by the order of the float atomics that sum the embedding and LayerNorm
// parameter gradients. The three memory flags likewise, against the plain part, both
// LayerNorm placements.
#include "gpu_test_util.hpp"

#include "models/bert/cuda_part.hpp"
#include "gpu_bert_fixture.hpp"

#include <string>

namespace dsa::test {

TEST_CASE("cuda part: activation checkpointing gives the plain run's losses and gradients") {
  for (const bert::head_kind head : {bert::head_kind::pretraining, bert::head_kind::squad}) {
    for (const cuda::elem type : {cuda::elem::f32, cuda::elem::bf16}) {
      INFO((head == bert::head_kind::squad ? "squad" : "pretraining") << ", storage " << std::string(elem_name(type)));
      bert::bert_config cfg = gpu_bert_config(3);
      cfg.head = head;
      const bert::bert_batch batch = small_batch(cfg);
      bert::forward_context ctx;
      ctx.seed = 21;
      ctx.step = 3;
      test_stream stream;
      bert::bert_losses losses[2];
      std::unique_ptr<bert::bert_parameters> host[2];
      for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
        bert::bert_config c = cfg;
        c.checkpoint_activations = checkpointed == 1;
        host[checkpointed] = std::make_unique<bert::bert_parameters>(c, bert::bert_range::whole(c));
        prepare_gpu_bert(*host[checkpointed]);
        bert::gpu::part gpu(*host[checkpointed], type, stream.get());
        bert::gpu::part_stash stash;
        // Two micro-batches, so the recomputation also meets gradients already accumulated.
        for (std::uint32_t micro = 0; micro < 2; ++micro) {
          ctx.micro_batch = micro;
          (void)gpu.forward(bert::gpu::device_array(), batch, ctx, 0.5f, stash);
          // Between forward and backward a checkpointed layer holds no activations.
          REQUIRE(stash.layers.size() == 3);
          CHECK((stash.layers[1].q.get() == nullptr) == (checkpointed == 1));
          losses[checkpointed] = gpu.losses(stash);
          (void)gpu.backward(nullptr, stash);
        }
        std::vector<tensor> grads;
        for (const auto& e : host[checkpointed]->entries())
          grads.push_back(e.grad);
        gpu.download_gradients(grads);
      }
      CHECK(losses[1].total == losses[0].total);
      for (const auto& e : host[0]->entries()) {
        const double err = gradient_error(*host[1], *host[0], e.spec.name);
        INFO(e.spec.name << ": relative error " << err);
        CHECK(err <= test::gpu_f32_reduction.rel);
      }
    }
  }
}

TEST_CASE("cuda part: the three memory flags give the plain run's results") {
  for (const auto placement : {bert::layer_norm_placement::post, bert::layer_norm_placement::pre})
  for (const cuda::elem type : {cuda::elem::f32, cuda::elem::bf16}) {
    const bool pre = placement == bert::layer_norm_placement::pre;
    INFO((pre ? "pre-LN" : "post-LN") << ", storage " << std::string(elem_name(type)));
    bert::bert_config cfg = gpu_bert_config(2);
    cfg.norm = placement;
    const bert::bert_batch batch = small_batch(cfg);
    bert::forward_context ctx;
    ctx.seed = 8;
    test_stream stream;
    bert::bert_losses losses[2];
    std::unique_ptr<bert::bert_parameters> host[2];
    for (int flagged = 0; flagged < 2; ++flagged) {
      bert::bert_config c = cfg;
      c.memory.gelu_checkpoint = c.memory.attn_dropout_checkpoint = c.memory.normalize_invertible = flagged == 1;
      host[flagged] = std::make_unique<bert::bert_parameters>(c, bert::bert_range::whole(c));
      prepare_gpu_bert(*host[flagged]);
      bert::gpu::part gpu(*host[flagged], type, stream.get());
      bert::gpu::part_stash stash;
      (void)gpu.forward(bert::gpu::device_array(), batch, ctx, 1.0f, stash);
      // The flags' activations are not stashed.
      REQUIRE(stash.layers.size() == 2);
      CHECK((stash.layers[0].gelu.get() == nullptr) == (flagged == 1));
      CHECK((stash.layers[0].dropped.get() == nullptr) == (flagged == 1));
      // normalize_invertible: no LayerNorm input where its output is kept (post-LN: both
      // exits'; pre-LN: LN_o's; pre-LN never stashes sum_a).
      CHECK((stash.layers[0].sum_o.get() == nullptr) == (flagged == 1));
      CHECK((stash.layers[0].sum_a.get() == nullptr) == (flagged == 1 || pre));
      losses[flagged] = gpu.losses(stash);
      (void)gpu.backward(nullptr, stash);
      std::vector<tensor> grads;
      for (const auto& e : host[flagged]->entries())
        grads.push_back(e.grad);
      gpu.download_gradients(grads);
    }
    CHECK(losses[1].total == losses[0].total); // the forward is unchanged
    // f32: the recomputed GELU and dropped probabilities are the same bits, the rebuilt
    // LayerNorm inputs within f32 rounding; half: the dropped probabilities are rounded from
    // the stored probabilities (an ulp apart at most), the LayerNorm inputs rebuilt from
    // half outputs.
    const double limit = type == cuda::elem::f32 ? test::gpu_f32_reduction.rel : test::gpu_half_vs_cpu.rel;
    for (const auto& e : host[0]->entries()) {
      const double err = gradient_error(*host[1], *host[0], e.spec.name);
      INFO(e.spec.name << ": relative error " << err);
      CHECK(err <= limit);
    }
  }
}

} // namespace dsa::test
