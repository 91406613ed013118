// Memory flags (normalize_invertible, attn_dropout_checkpoint, gelu_checkpoint):
// same losses and gradients with dropout on, fewer stashed bytes; stash-size
// formula vs the real stash; dropout determinism.
#include "tests/models/bert_fixture.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/tolerances.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <map>

namespace {

using namespace dsa;
using bert::head_kind;
using bert::layer_norm_placement;

struct run_result {
  bert::bert_losses losses;
  std::map<std::string, std::vector<float>> grads;
  std::size_t layer_bytes = 0; // stash of layer 0 after forward
};

bert::bert_config dropout_bert(layer_norm_placement norm, head_kind head,
                               const bert::memory_flags& flags) {
  bert::bert_config cfg = test::small_bert(norm, head);
  cfg.hidden_dropout = 0.1f;
  cfg.attention_dropout = 0.1f;
  cfg.memory = flags;
  return cfg;
}

bert::forward_context train_ctx(std::uint32_t micro_batch) {
  bert::forward_context ctx;
  ctx.seed = 1234;
  ctx.step = 5;
  ctx.micro_batch = micro_batch;
  return ctx;
}

run_result run(const bert::bert_config& cfg, const bert::forward_context& ctx) {
  bert::bert_part part(cfg, bert::bert_range::whole(cfg));
  test::randomize_parameters(part.parameters(), 11);
  const bert::bert_batch batch = test::small_batch(cfg);
  bert::part_stash stash;
  auto out = part.forward(tensor{}, batch, ctx, stash);
  REQUIRE(out.has_value());
  run_result r;
  r.losses = out->losses;
  r.layer_bytes = stash.layers.at(0).bytes();
  CHECK(r.layer_bytes == bert::layer_stash_bytes(cfg, 2, 7, ctx.mode));
  part.backward(tensor{}, stash, bert::backward_options{});
  for (const auto& e : part.parameters().entries())
    r.grads[e.spec.name].assign(e.grad.data<float>(), e.grad.data<float>() + e.grad.numel());
  return r;
}

void check_same(const run_result& a, const run_result& b, test::tolerance tol) {
  CHECK(a.losses.total == doctest::Approx(b.losses.total).epsilon(1e-6));
  for (const auto& [name, g] : a.grads) {
    INFO(name);
    const auto& ref = b.grads.at(name);
    DSA_CHECK_CLOSE(g.data(), ref.data(), static_cast<std::int64_t>(g.size()), tol);
  }
}

} // namespace

TEST_CASE("bert memory flags: identical losses and gradients, strictly fewer stashed bytes") {
  for (auto norm : {layer_norm_placement::post, layer_norm_placement::pre}) {
    for (auto head : {head_kind::pretraining, head_kind::squad}) {
      const run_result base = run(dropout_bert(norm, head, {}), train_ctx(0));
      CHECK(base.losses.total > 0.0);
      for (int flag = 0; flag < 4; ++flag) {
        bert::memory_flags f;
        f.normalize_invertible = flag == 0 || flag == 3;
        f.attn_dropout_checkpoint = flag == 1 || flag == 3;
        f.gelu_checkpoint = flag == 2 || flag == 3;
        CAPTURE(flag);
        CAPTURE(static_cast<int>(norm));
        CAPTURE(static_cast<int>(head));
        const run_result r = run(dropout_bert(norm, head, f), train_ctx(0));
        // LayerNorm backward from the output rebuilds xhat from the rounded output:
        // not bit-exact, so that flag gets the f32-kernel bound; the others replay the
        // same arithmetic.
        check_same(r, base, f.normalize_invertible ? test::f32_kernel : test::recompute);
        CHECK(r.layer_bytes < base.layer_bytes);
      }
    }
  }
}

TEST_CASE("bert stash bytes: formula matches the real stash; each flag removes what it names") {
  const std::int64_t B = 2, T = 7;
  bert::bert_config cfg = dropout_bert(layer_norm_placement::post, head_kind::pretraining, {});
  const std::size_t N = B * T, H = 16, I = 32, scores = B * 2 * T * T;
  const std::size_t base = bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train);
  cfg.memory.attn_dropout_checkpoint = true;
  CHECK(base - bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train) == scores * 4);
  cfg.memory = {};
  cfg.memory.gelu_checkpoint = true;
  CHECK(base - bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train) == N * I * 4);
  cfg.memory = {};
  cfg.memory.normalize_invertible = true; // post-LN: two LN inputs and means out, the output in
  CHECK(base - bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train) == (N * H + 2 * N) * 4);
  cfg.norm = layer_norm_placement::pre; // pre-LN: nothing comes in
  cfg.memory = {};
  const std::size_t pre_base = bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train);
  cfg.memory.normalize_invertible = true;
  CHECK(pre_base - bert::layer_stash_bytes(cfg, B, T, bert::run_mode::train) ==
        (2 * N * H + 2 * N) * 4);
  // bert-large at B 8, T 512 (sanity of magnitudes: probabilities dominate).
  bert::bert_config large = bert::bert_config_for(bert::model_size::large);
  const std::size_t big = bert::layer_stash_bytes(large, 8, 512, bert::run_mode::train);
  CHECK(big > 2 * std::size_t(8) * 16 * 512 * 512 * 4);
}

TEST_CASE("bert dropout: same (seed, step, micro-batch) gives the same loss; another micro-batch "
          "differs") {
  const bert::bert_config cfg =
      dropout_bert(layer_norm_placement::post, head_kind::pretraining, {});
  bert::bert_part part(cfg, bert::bert_range::whole(cfg));
  test::randomize_parameters(part.parameters(), 5);
  const bert::bert_batch batch = test::small_batch(cfg);
  const double a = test::chain_loss({&part}, batch, train_ctx(0));
  const double b = test::chain_loss({&part}, batch, train_ctx(0));
  const double c = test::chain_loss({&part}, batch, train_ctx(1));
  CHECK(a == b);
  CHECK(a != c);
  bert::forward_context eval = train_ctx(0);
  eval.mode = bert::run_mode::eval;
  bert::forward_context eval_other = train_ctx(1);
  eval_other.mode = bert::run_mode::eval;
  CHECK(test::chain_loss({&part}, batch, eval) == test::chain_loss({&part}, batch, eval_other));
}

TEST_CASE("bert eval mode keeps no stash and backward refuses to run from it") {
  const bert::bert_config cfg = dropout_bert(layer_norm_placement::pre, head_kind::squad, {});
  bert::bert_part part(cfg, bert::bert_range::whole(cfg));
  bert::forward_context ctx;
  ctx.mode = bert::run_mode::eval;
  bert::part_stash stash;
  auto out = part.forward(tensor{}, test::small_batch(cfg), ctx, stash);
  REQUIRE(out.has_value());
  CHECK(stash.bytes() == 0);
  CHECK_FALSE(stash.filled);
  CHECK(out->squad.start.shape() == shape_t{2, 7});
}

// Activation checkpointing (bert_config::checkpoint_activations): each layer keeps its f32
// input only and its backward recomputes its forward with the same dropout streams, so
// losses and every gradient are bit for bit those of the plain run, for both layer-norm
// placements, both heads, f32 and bf16 stashes, the memory flags on top, and a range split
// in two as pipeline stages split it; the stash holds one (B, T, H) f32 tensor per layer.
TEST_CASE("activation checkpointing: bit-identical losses and gradients, one f32 input per layer stashed") {
  for (auto norm : {layer_norm_placement::post, layer_norm_placement::pre})
    for (auto head : {head_kind::pretraining, head_kind::squad})
      for (const dtype stash_type : {dtype::f32, dtype::bf16})
        for (const bool flags : {false, true}) {
          CAPTURE(static_cast<int>(norm));
          CAPTURE(static_cast<int>(head));
          CAPTURE(dtype_name(stash_type));
          CAPTURE(flags);
          bert::memory_flags f;
          f.normalize_invertible = f.attn_dropout_checkpoint = f.gelu_checkpoint = flags;
          bert::bert_config cfg = dropout_bert(norm, head, f);
          bert::forward_context ctx = train_ctx(3);
          ctx.stash_type = stash_type;
          auto run_split = [&](bool checkpoint, std::size_t& stashed) {
            cfg.checkpoint_activations = checkpoint;
            // Two ranges, as two pipeline stages: embeddings + layer 0, then layer 1 + head.
            bert::bert_part first(cfg, bert::bert_range::layers(0, 1).with_embeddings());
            bert::bert_part second(cfg, bert::bert_range::layers(1, cfg.num_layers).with_head());
            test::randomize_parameters(first.parameters(), 11);
            test::randomize_parameters(second.parameters(), 11);
            const bert::bert_batch batch = test::small_batch(cfg);
            bert::part_stash s1, s2;
            auto o1 = first.forward(tensor{}, batch, ctx, s1);
            REQUIRE(o1.has_value());
            auto o2 = second.forward(o1->hidden, batch, ctx, s2);
            REQUIRE(o2.has_value());
            stashed = s2.bytes() - (s2.final_norm_in.defined() ? s2.final_norm_in.nbytes() + s2.final_norm_mean.nbytes() +
                                                        s2.final_norm_rstd.nbytes()
                                                  : 0);
            bert::backward_options opt;
            opt.loss_scale = 4.0f;
            const tensor d = second.backward(tensor{}, s2, opt);
            first.backward(d, s1, opt);
            run_result r;
            r.losses = o2->losses;
            for (const auto* part : {&first, &second})
              for (const auto& e : part->parameters().entries())
                r.grads[part == &first ? "first." + e.spec.name : e.spec.name].assign(
                    e.grad.data<float>(), e.grad.data<float>() + e.grad.numel());
            return r;
          };
          std::size_t plain_bytes = 0, checkpoint_bytes = 0;
          const run_result plain = run_split(false, plain_bytes);
          const run_result checkpointed = run_split(true, checkpoint_bytes);
          CHECK(checkpointed.losses.total == plain.losses.total);
          for (const auto& [name, g] : plain.grads) {
            INFO(name);
            const auto& c = checkpointed.grads.at(name);
            REQUIRE(c.size() == g.size());
            CHECK(std::memcmp(c.data(), g.data(), g.size() * sizeof(float)) == 0);
          }
          // The second range's layers: one f32 (B, T, H) input each instead of their stashes,
          // and the (B, T) f32 key mask their recomputed forwards read.
          const std::size_t layers = static_cast<std::size_t>(cfg.num_layers - 1);
          CHECK(checkpoint_bytes == layers * 2 * 7 * static_cast<std::size_t>(cfg.hidden_size) * 4 + 2 * 7 * 4);
          CHECK(checkpoint_bytes < plain_bytes);
        }
}
