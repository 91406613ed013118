// Pipeline ranges: [0, 1) + [1, 2) equals [0, 2); the tied word-embedding
// gradient is the sum of the embedding and decoder contributions; per-range
// init equals whole-model init.
#include "tests/models/bert_fixture.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/tolerances.hpp"

#include <doctest/doctest.h>

namespace {

using namespace dsa;
using bert::head_kind;
using bert::layer_norm_placement;

void check_split(layer_norm_placement norm, head_kind head) {
  bert::bert_config cfg = test::small_bert(norm, head);
  cfg.hidden_dropout = 0.1f; // dropout on: streams are keyed by global layer index
  cfg.attention_dropout = 0.1f;
  bert::bert_part whole(cfg, bert::bert_range::whole(cfg));
  bert::bert_part first(cfg, bert::bert_range::layers(0, 1).with_embeddings());
  bert::bert_part last(cfg, bert::bert_range::layers(1, 2).with_head());
  for (auto* p : {&whole, &first, &last})
    test::randomize_parameters(p->parameters(), 21);
  const bert::bert_batch batch = test::small_batch(cfg);
  bert::forward_context ctx;
  ctx.seed = 99;
  ctx.step = 2;
  ctx.micro_batch = 3;

  // Two micro-batches: gradients accumulate across them in both layouts.
  bert::bert_losses whole_losses, split_losses;
  for (std::uint32_t mb = 0; mb < 2; ++mb) {
    ctx.micro_batch = mb;
    whole_losses = test::chain_step({&whole}, batch, ctx);
    split_losses = test::chain_step({&first, &last}, batch, ctx);
  }
  CHECK(whole_losses.total == split_losses.total);

  const auto* last_word = last.parameters().find(bert::word_embeddings_name());
  CHECK((last_word != nullptr) == (head == head_kind::pretraining));
  if (last_word)
    CHECK(last_word->spec.role == bert::replica::tied_copy);
  for (const auto& e : whole.parameters().entries()) {
    INFO(e.spec.name);
    const auto* a = first.parameters().find(e.spec.name);
    const auto* b = last.parameters().find(e.spec.name);
    REQUIRE((a != nullptr || b != nullptr));
    std::vector<float> grad(static_cast<std::size_t>(e.grad.numel()), 0.0f);
    for (const auto* part_entry : {a, b}) {
      if (!part_entry)
        continue;
      for (std::size_t i = 0; i < grad.size(); ++i)
        grad[i] += part_entry->grad.data<float>()[i];
    }
    DSA_CHECK_CLOSE(grad.data(), e.grad.data<float>(), e.grad.numel(), test::layout_equivalence);
  }
}

} // namespace

TEST_CASE("bert ranges: [0,1)+embeddings then [1,2)+head equals the whole model") {
  check_split(layer_norm_placement::post, head_kind::pretraining);
  check_split(layer_norm_placement::pre, head_kind::pretraining);
  check_split(layer_norm_placement::post, head_kind::squad);
}

TEST_CASE("bert ranges: a middle range takes hidden states and returns their gradient") {
  bert::bert_config cfg = test::small_bert(layer_norm_placement::post, head_kind::pretraining);
  cfg.num_layers = 3;
  bert::bert_part middle(cfg, bert::bert_range::layers(1, 2));
  const bert::bert_batch batch = test::small_batch(cfg);
  bert::part_stash stash;
  auto bad = middle.forward(tensor{}, batch, bert::forward_context{}, stash);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.err().message.find("hidden input") != std::string::npos);
  tensor hidden = tensor::zeros({2, 7, 16}, dtype::f32);
  auto out = middle.forward(hidden, batch, bert::forward_context{}, stash);
  REQUIRE(out.has_value());
  CHECK(out->hidden.shape() == shape_t{2, 7, 16});
  tensor d =
      middle.backward(tensor::zeros({2, 7, 16}, dtype::f32), stash, bert::backward_options{});
  CHECK(d.shape() == shape_t{2, 7, 16});
}

TEST_CASE("bert ranges: a range's init equals the whole model's for the tensors it holds") {
  const bert::bert_config cfg = test::small_bert(layer_norm_placement::pre, head_kind::pretraining);
  bert::bert_parameters whole(cfg, bert::bert_range::whole(cfg));
  bert::bert_parameters last(cfg, bert::bert_range::layers(1, 2).with_head());
  whole.init(42);
  last.init(42);
  for (const auto& e : last.entries()) {
    INFO(e.spec.name);
    const auto* w = whole.find(e.spec.name);
    REQUIRE(w != nullptr);
    CHECK(std::equal(e.value.data<float>(), e.value.data<float>() + e.value.numel(),
                     w->value.data<float>()));
  }
  CHECK_FALSE(bert::bert_range::layers(1, 2).with_embeddings().validate(cfg).has_value());
  CHECK_FALSE(bert::bert_range::layers(0, 1).with_head().validate(cfg).has_value());
}
