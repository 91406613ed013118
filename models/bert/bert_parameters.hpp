// The parameters of one BERT range: a value (f32, or f16/bf16 working weights)
// and an f32 gradient per HF-named tensor, plus typed views for the
// forward/backward code, which widen half values to f32 one layer at a time
// (stored_precision.hpp). Gradients accumulate (+=) across micro-batches until
// zero_grad().
#pragma once

#include "core/tensor.hpp"
#include "models/bert/bert_config.hpp"
#include "models/bert/bert_range.hpp"
#include "models/bert/parameter_specs.hpp"

#include <cstdint>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dsa::bert {

// Views (shared storage) of one Linear: weight (out, in), bias (out) and their gradients.
struct linear_params {
  tensor weight, bias, dweight, dbias;
  std::int64_t out_features() const { return weight.dim(0); }
  std::int64_t in_features() const { return weight.dim(1); }
};

// LayerNorm gamma ("weight") and beta ("bias"), each (C).
struct layernorm_params {
  tensor weight, bias, dweight, dbias;
};

struct embeddings_params {
  tensor word, dword;             // (V, H)
  tensor position, dposition;     // (max_positions, H)
  tensor token_type, dtoken_type; // (type_vocab, H)
  layernorm_params norm;
};

struct layer_params {
  linear_params query, key, value, attention_out; // (H, H)
  layernorm_params attention_norm;                // attention.output.LayerNorm
  linear_params intermediate;                     // (I, H)
  linear_params output;                           // (H, I)
  layernorm_params output_norm;                   // output.LayerNorm
};

struct pretraining_head_params {
  tensor word, dword; // tied word embedding (V, H): the MLM decoder weight
  linear_params pooler, transform;
  layernorm_params transform_norm;
  tensor decoder_bias, ddecoder_bias; // cls.predictions.bias (V)
  linear_params seq_relationship;     // (2, H)
};

struct squad_head_params {
  linear_params qa_outputs; // (2, H)
};

class bert_parameters {
public:
  struct entry {
    param_spec spec;
    tensor value; // value_type(), spec.shape
    tensor grad;  // f32, spec.shape
  };

  // Allocates every tensor of the range (values and gradients zero); values in
  // value_type: f32, f16 or bf16. gradients false: no gradient buffers (a ZeRO stage that
  // binds a part's gradients only during its backward, set_grads).
  // make_value, when set, gives each value instead (zeros of its spec's shape and
  // value_type): a ZeRO-3 stage's whole weights in a file (core/file_backed.hpp), which
  // init and load_state page out a tensor at a time.
  using value_maker = std::function<tensor(const param_spec& spec, dtype type)>;
  bert_parameters(const bert_config& cfg, const bert_range& range, dtype value_type = dtype::f32,
                  bool gradients = true, const value_maker& make_value = {});
  // Views share storage with entries: copying would alias, so only moves.
  bert_parameters(const bert_parameters&) = delete;
  bert_parameters& operator=(const bert_parameters&) = delete;
  bert_parameters(bert_parameters&&) = default;
  bert_parameters& operator=(bert_parameters&&) = default;

  // Deterministic init from a seed (param_init.hpp), rounded to value_type();
  // gradients untouched.
  void init(std::uint64_t seed);
  void zero_grad();
  // ZeRO-3: replaces entry i's value (value_type(), spec.shape) or, with an undefined
  // tensor, drops it (its memory is freed once no other reference holds it). The typed
  // views follow; a part may run only while its values are defined.
  void set_value(std::size_t i, tensor value);
  // Several at once (one rebuild of the views).
  void set_values(std::vector<std::pair<std::size_t, tensor>> values);
  // ZeRO-3: the same for gradients (f32, spec.shape, or undefined); zero_grad skips
  // undefined ones.
  void set_grads(std::vector<std::pair<std::size_t, tensor>> grads);

  const bert_config& config() const { return cfg_; }
  const bert_range& range() const { return range_; }
  const std::vector<entry>& entries() const { return entries_; }
  // nullptr when this range holds no tensor of that name.
  const entry* find(std::string_view name) const;
  std::int64_t count() const; // elements over all entries (held or not)
  dtype value_type() const { return value_type_; }
  std::size_t value_bytes() const; // bytes of the values held (the working weights)

  // Typed views (values in value_type()); each checks that the range holds the part.
  const embeddings_params& embeddings() const;
  const layer_params& layer(std::int64_t global_index) const;
  const layernorm_params& final_norm() const; // pre-LN with head only
  const pretraining_head_params& pretraining_head() const;
  const squad_head_params& squad_head() const;

private:
  void build_views();
  const tensor& value_of(const std::string& name) const;
  const tensor& grad_of(const std::string& name) const;
  linear_params linear(const std::string& prefix) const;
  layernorm_params layernorm(const std::string& prefix) const;

  bert_config cfg_;
  bert_range range_;
  dtype value_type_;
  std::vector<entry> entries_;
  // Name -> position in entries_: the typed views are rebuilt by name whenever ZeRO-3
  // rebinds a part (several times per layer and micro-batch), so lookups stay O(1).
  std::unordered_map<std::string, std::size_t> index_;
  embeddings_params embeddings_;
  std::vector<layer_params> layers_;
  layernorm_params final_norm_;
  pretraining_head_params pretraining_;
  squad_head_params squad_;
};

} // namespace dsa::bert
