// Shared fixtures of the model tests.
#include "tests/models/bert_fixture.hpp"

#include "kernels/cpu/convert.hpp"
#include "models/bert/param_init.hpp"

#include <doctest/doctest.h>

#include <cstring>

namespace dsa::test {

bert::bert_config small_bert(bert::layer_norm_placement norm, bert::head_kind head) {
  bert::bert_config cfg = bert::bert_config_for(bert::model_size::custom);
  cfg.num_layers = 2;
  cfg.hidden_size = 16;
  cfg.num_heads = 2;
  cfg.intermediate_size = 32;
  cfg.vocab_size = 50;
  cfg.max_position_embeddings = 16;
  cfg.hidden_dropout = 0.0f;
  cfg.attention_dropout = 0.0f;
  cfg.norm = norm;
  cfg.head = head;
  return cfg;
}

tensor i32_tensor(const shape_t& shape, const std::vector<std::int32_t>& values) {
  tensor t = tensor::empty(shape, dtype::i32);
  REQUIRE(static_cast<std::int64_t>(values.size()) == t.numel());
  std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(std::int32_t));
  return t;
}

tensor f32_tensor(const shape_t& shape, const std::vector<float>& values) {
  tensor t = tensor::empty(shape, dtype::f32);
  REQUIRE(static_cast<std::int64_t>(values.size()) == t.numel());
  std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

bert::bert_batch small_batch(const bert::bert_config& cfg) {
  (void)cfg;
  bert::bert_batch b;
  b.input_ids = i32_tensor({2, 7}, {2, 17, 5, 3, 41, 9, 3, 2, 33, 12, 3, 7, 1, 1});
  b.token_type_ids = i32_tensor({2, 7}, {0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1});
  b.attention_mask = f32_tensor({2, 7}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0});
  b.masked_lm_positions = i32_tensor({2, 3}, {2, 4, 6, 1, 3, 0});
  b.masked_lm_ids = i32_tensor({2, 3}, {11, 41, 23, 48, 12, -1});
  b.next_sentence_labels = i32_tensor({2}, {0, 1});
  b.start_positions = i32_tensor({2}, {2, 1});
  b.end_positions = i32_tensor({2}, {4, 3});
  return b;
}

double chain_loss(const std::vector<const bert::bert_part*>& parts, const bert::bert_batch& batch,
                  const bert::forward_context& ctx) {
  tensor hidden;
  double loss = 0.0;
  for (const auto* part : parts) {
    bert::part_stash stash;
    auto out = part->forward(hidden, batch, ctx, stash);
    REQUIRE_MESSAGE(out.has_value(), (out ? "" : out.err().to_string()));
    hidden = out->hidden;
    loss = out->losses.total;
  }
  return loss;
}

bert::bert_losses chain_step(const std::vector<bert::bert_part*>& parts,
                             const bert::bert_batch& batch, const bert::forward_context& ctx) {
  std::vector<bert::part_stash> stashes(parts.size());
  tensor hidden;
  bert::bert_losses losses;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    auto out = parts[i]->forward(hidden, batch, ctx, stashes[i]);
    REQUIRE_MESSAGE(out.has_value(), (out ? "" : out.err().to_string()));
    hidden = out->hidden;
    losses = out->losses;
  }
  tensor grad;
  for (std::size_t i = parts.size(); i-- > 0;)
    grad = parts[i]->backward(grad, stashes[i], bert::backward_options{});
  return losses;
}

void randomize_parameters(bert::bert_parameters& params, std::uint64_t seed) {
  for (const auto& e : params.entries()) {
    tensor full = tensor::empty(e.spec.shape, dtype::f32);
    float* v = full.data<float>();
    const bool gain = e.spec.init == bert::init_kind::ones;
    bert::normal_fill(v, full.numel(), gain ? 0.2f : 0.3f, seed, e.spec.name);
    if (gain)
      for (std::int64_t i = 0; i < full.numel(); ++i)
        v[i] += 1.0f;
    cpu::cast(e.value.raw_data(), e.value.type(), v, dtype::f32, full.numel()); // rounds f16/bf16
  }
}

} // namespace dsa::test
