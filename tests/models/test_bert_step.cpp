// Training-step behaviour: gradients accumulate across micro-batches and
// zero_grad clears them; the pad row gets no lookup gradient; i32 and f32
// attention masks agree; malformed batches are errors naming the tensor.
#include "tests/models/bert_fixture.hpp"
#include "tests/support/compare.hpp"
#include "tests/support/tolerances.hpp"

#include <doctest/doctest.h>

#include <map>

namespace {

using namespace dsa;
using bert::head_kind;
using bert::layer_norm_placement;

std::map<std::string, std::vector<float>> grads_of(const bert::bert_parameters& p) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& e : p.entries())
    out[e.spec.name].assign(e.grad.data<float>(), e.grad.data<float>() + e.grad.numel());
  return out;
}

} // namespace

TEST_CASE("bert step: gradients accumulate (+=) across micro-batches; zero_grad clears them") {
  const bert::bert_config cfg =
      test::small_bert(layer_norm_placement::post, head_kind::pretraining);
  bert::bert_part part(cfg, bert::bert_range::whole(cfg));
  part.parameters().init(4);
  const bert::bert_batch batch = test::small_batch(cfg);
  test::chain_step({&part}, batch, bert::forward_context{});
  const auto once = grads_of(part.parameters());
  test::chain_step({&part}, batch, bert::forward_context{});
  for (const auto& [name, twice] : grads_of(part.parameters())) {
    INFO(name);
    std::vector<float> expected = once.at(name);
    for (auto& v : expected)
      v *= 2.0f;
    DSA_CHECK_CLOSE(twice.data(), expected.data(), static_cast<std::int64_t>(twice.size()),
                    test::recompute);
  }
  part.parameters().zero_grad();
  for (const auto& [name, g] : grads_of(part.parameters()))
    for (float v : g)
      REQUIRE(v == 0.0f);
}

TEST_CASE("bert step: loss_scale scales every gradient") {
  const bert::bert_config cfg = test::small_bert(layer_norm_placement::pre, head_kind::squad);
  bert::bert_part part(cfg, bert::bert_range::whole(cfg));
  part.parameters().init(4);
  const bert::bert_batch batch = test::small_batch(cfg);
  test::chain_step({&part}, batch, bert::forward_context{});
  const auto plain = grads_of(part.parameters());
  part.parameters().zero_grad();
  bert::part_stash stash;
  REQUIRE(part.forward(tensor{}, batch, bert::forward_context{}, stash).has_value());
  bert::backward_options scaled;
  scaled.loss_scale = 256.0f;
  part.backward(tensor{}, stash, scaled);
  for (const auto& [name, g] : grads_of(part.parameters())) {
    INFO(name);
    std::vector<float> expected = plain.at(name);
    for (auto& v : expected)
      v *= 256.0f;
    DSA_CHECK_CLOSE(g.data(), expected.data(), static_cast<std::int64_t>(g.size()),
                    test::recompute);
  }
}

TEST_CASE("bert step: the pad token's word-embedding row gets no lookup gradient") {
  bert::bert_config cfg = test::small_bert(layer_norm_placement::post, head_kind::squad);
  cfg.pad_token_id = 1; // small_batch pads the second sequence with id 1
  bert::bert_part part(cfg, bert::bert_range::whole(cfg));
  part.parameters().init(4);
  test::chain_step({&part}, test::small_batch(cfg), bert::forward_context{});
  const float* dword = part.parameters().embeddings().dword.data<float>();
  for (int c = 0; c < 16; ++c)
    CHECK(dword[16 + c] == 0.0f);
  bool any = false;
  for (int c = 0; c < 16; ++c)
    any = any || dword[2 * 16 + c] != 0.0f; // id 2 is a real token
  CHECK(any);
}

TEST_CASE("bert step: an i32 attention mask gives the f32 mask's result") {
  const bert::bert_config cfg =
      test::small_bert(layer_norm_placement::post, head_kind::pretraining);
  bert::bert_part part(cfg, bert::bert_range::whole(cfg));
  part.parameters().init(4);
  bert::bert_batch batch = test::small_batch(cfg);
  const double with_f32 = test::chain_loss({&part}, batch, bert::forward_context{});
  batch.attention_mask = test::i32_tensor({2, 7}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0});
  CHECK(test::chain_loss({&part}, batch, bert::forward_context{}) == with_f32);
  batch.attention_mask = tensor{}; // no mask: the padding now takes part
  CHECK(test::chain_loss({&part}, batch, bert::forward_context{}) != with_f32);
}

TEST_CASE("bert step: malformed batches are errors naming the tensor") {
  const bert::bert_config cfg =
      test::small_bert(layer_norm_placement::post, head_kind::pretraining);
  bert::bert_part part(cfg, bert::bert_range::whole(cfg));
  auto expect = [&](const bert::bert_batch& b, const std::string& needle) {
    bert::part_stash stash;
    auto r = part.forward(tensor{}, b, bert::forward_context{}, stash);
    REQUIRE_FALSE(r.has_value());
    INFO(r.err().message);
    CHECK(r.err().message.find(needle) != std::string::npos);
  };
  bert::bert_batch b = test::small_batch(cfg);
  b.input_ids = test::i32_tensor({2, 7}, {2, 17, 5, 3, 41, 9, 3, 2, 33, 12, 3, 50, 1, 1});
  expect(b, "input_ids[11] = 50");
  b = test::small_batch(cfg);
  b.masked_lm_positions = test::i32_tensor({2, 3}, {2, 4, 7, 1, 3, 0});
  expect(b, "masked_lm_positions[2] = 7");
  b = test::small_batch(cfg);
  b.next_sentence_labels = test::i32_tensor({1}, {0});
  expect(b, "next_sentence_labels should be");
  b = test::small_batch(cfg);
  b.attention_mask = tensor::zeros({2, 6}, dtype::f32);
  expect(b, "attention_mask");
}
