// The small BERT the GPU layer, range and model tests share (tests/models/bert_fixture's,
// wider so the GEMMs and kernels take their tiled paths), its prepared values, and the
// relative gradient distance they compare with.
#pragma once

#include "kernels/cpu/convert.hpp"
#include "models/bert/bert_parameters.hpp"
#include "models/bert/parameter_specs.hpp"
#include "tests/models/bert_fixture.hpp"

#include <cmath>
#include <cstdint>
#include <string>

namespace dsa::test {

// Post-LN, pre-training head, H 48 in 3 heads, I 112, dropout 0.1 everywhere.
inline bert::bert_config gpu_bert_config(std::int64_t layers = 2) {
  bert::bert_config cfg = small_bert(bert::layer_norm_placement::post, bert::head_kind::pretraining);
  cfg.num_layers = layers;
  cfg.hidden_size = 48;
  cfg.num_heads = 3;
  cfg.intermediate_size = 112;
  cfg.hidden_dropout = 0.1f;
  cfg.attention_dropout = 0.1f;
  return cfg;
}

// The fixture's values (keyed by name, so every range of a model gets the same) with the
// products' matrices scaled down, so attention and the heads are not saturated and bf16
// keeps room.
inline void prepare_gpu_bert(bert::bert_parameters& params) {
  randomize_parameters(params, 11);
  for (const auto& e : params.entries()) {
    if (e.value.shape().size() != 2 || e.spec.name.find("embeddings") != std::string::npos)
      continue;
    // Scaled in f32, then rounded to the values' type (half working weights too).
    tensor f = tensor::empty(e.value.shape(), dtype::f32);
    cpu::cast(f.raw_data(), dtype::f32, e.value.raw_data(), e.value.type(), f.numel());
    auto* p = f.data<float>();
    for (std::int64_t i = 0; i < f.numel(); ++i)
      p[i] *= 0.25f;
    cpu::cast(e.value.raw_data(), e.value.type(), f.raw_data(), dtype::f32, f.numel());
  }
}

// ||a - b|| (b null: ||a||), in double.
inline double distance(const float* a, const float* b, std::int64_t n) {
  double s = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - (b ? b[i] : 0.0f);
    s += d * d;
  }
  return std::sqrt(s);
}

// Gradient `name` of `got` against `ref`'s, relative to the reference's norm. Some are zero
// up to rounding, because a softmax ignores a shift shared by all its inputs: the key
// biases' (every score of a query row alike), and with the SQuAD head the span bias's and
// the bias of the LayerNorm right before it (every start/end logit alike); theirs is taken
// relative to the norm of the query bias's, the span weight's and that LayerNorm's gain's.
inline double gradient_error(const bert::bert_parameters& got, const bert::bert_parameters& ref,
                             const std::string& name) {
  std::string scale_name = name;
  if (const auto key = scale_name.find("key.bias"); key != std::string::npos)
    scale_name.replace(key, 8, "query.bias");
  const bert::bert_config& cfg = ref.config();
  if (cfg.head == bert::head_kind::squad) {
    const std::string last_norm = cfg.norm == bert::layer_norm_placement::pre
                                      ? "bert.encoder.final_layernorm."
                                      : bert::layer_prefix(cfg.num_layers - 1) + "output.LayerNorm.";
    if (name == "qa_outputs.bias")
      scale_name = "qa_outputs.weight";
    if (name == last_norm + "bias")
      scale_name = last_norm + "weight";
  }
  const auto* g = got.find(name);
  const auto* r = ref.find(name);
  const auto* s = ref.find(scale_name);
  if (!g || !r || !s)
    return INFINITY;
  const std::int64_t n = g->grad.numel();
  const double scale = distance(static_cast<const float*>(s->grad.raw_data()), nullptr, s->grad.numel());
  return distance(static_cast<const float*>(g->grad.raw_data()), static_cast<const float*>(r->grad.raw_data()), n) /
         std::max(scale, 1e-30);
}

} // namespace dsa::test
