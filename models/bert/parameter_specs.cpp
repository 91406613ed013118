// The HF-named parameter list of a BERT range.
#include "models/bert/parameter_specs.hpp"

#include <fmt/format.h>

namespace dsa::bert {
namespace {

void add(std::vector<param_spec>& out, std::string name, shape_t shape, init_kind init) {
  out.push_back(param_spec{std::move(name), std::move(shape), init, replica::owner});
}
void add_linear(std::vector<param_spec>& out, const std::string& prefix, std::int64_t out_features,
                std::int64_t in_features) {
  add(out, prefix + ".weight", {out_features, in_features}, init_kind::normal);
  add(out, prefix + ".bias", {out_features}, init_kind::zeros);
}
void add_layernorm(std::vector<param_spec>& out, const std::string& prefix, std::int64_t c) {
  add(out, prefix + ".weight", {c}, init_kind::ones);
  add(out, prefix + ".bias", {c}, init_kind::zeros);
}

void add_layer(std::vector<param_spec>& out, const bert_config& cfg, std::int64_t layer) {
  const std::string p = layer_prefix(layer);
  const std::int64_t H = cfg.hidden_size, I = cfg.intermediate_size;
  add_linear(out, p + "attention.self.query", H, H);
  add_linear(out, p + "attention.self.key", H, H);
  add_linear(out, p + "attention.self.value", H, H);
  add_linear(out, p + "attention.output.dense", H, H);
  add_layernorm(out, p + "attention.output.LayerNorm", H);
  add_linear(out, p + "intermediate.dense", I, H);
  add_linear(out, p + "output.dense", H, I);
  add_layernorm(out, p + "output.LayerNorm", H);
}

} // namespace

std::string layer_prefix(std::int64_t layer) {
  return fmt::format("bert.encoder.layer.{}.", layer);
}

std::vector<param_spec> parameter_specs(const bert_config& cfg, const bert_range& range) {
  std::vector<param_spec> out;
  const std::int64_t H = cfg.hidden_size;
  if (range.has_embeddings()) {
    add(out, word_embeddings_name(), {cfg.vocab_size, H}, init_kind::normal_pad_zero);
    add(out, "bert.embeddings.position_embeddings.weight", {cfg.max_position_embeddings, H},
        init_kind::normal);
    add(out, "bert.embeddings.token_type_embeddings.weight", {cfg.type_vocab_size, H},
        init_kind::normal);
    add_layernorm(out, "bert.embeddings.LayerNorm", H);
  }
  for (std::int64_t l = range.first_layer; l < range.last_layer; ++l)
    add_layer(out, cfg, l);
  if (!range.has_head())
    return out;
  if (cfg.norm == layer_norm_placement::pre)
    add_layernorm(out, "bert.encoder.final_layernorm", H);
  if (cfg.head == head_kind::squad) {
    add_linear(out, "qa_outputs", 2, H);
    return out;
  }
  if (!range.has_embeddings()) {
    add(out, word_embeddings_name(), {cfg.vocab_size, H}, init_kind::normal_pad_zero);
    out.back().role = replica::tied_copy;
  }
  add_linear(out, "bert.pooler.dense", H, H);
  add_linear(out, "cls.predictions.transform.dense", H, H);
  add_layernorm(out, "cls.predictions.transform.LayerNorm", H);
  add(out, "cls.predictions.bias", {cfg.vocab_size}, init_kind::zeros);
  add_linear(out, "cls.seq_relationship", 2, H);
  return out;
}

std::int64_t parameter_count(const std::vector<param_spec>& specs) {
  std::int64_t n = 0;
  for (const auto& s : specs)
    n += shape_numel(s.shape);
  return n;
}

} // namespace dsa::bert
