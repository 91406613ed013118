// Allocation, typed views, init and zero_grad of a BERT range's parameters.
#include "models/bert/bert_parameters.hpp"

#include "core/file_backed.hpp"
#include "kernels/cpu/convert.hpp"
#include "models/bert/param_init.hpp"

namespace dsa::bert {

bert_parameters::bert_parameters(const bert_config& cfg, const bert_range& range, dtype value_type, bool gradients,
                                 const value_maker& make_value)
    : cfg_(cfg), range_(range), value_type_(value_type) {
  DSA_CHECK(value_type == dtype::f32 || value_type == dtype::f16 || value_type == dtype::bf16,
            "bert parameters: values in {}; expected f32, f16 or bf16", dtype_name(value_type));
  auto ok = cfg.validate();
  DSA_CHECK(ok.has_value(), "{}", ok ? "" : ok.err().message);
  auto range_ok = range.validate(cfg);
  DSA_CHECK(range_ok.has_value(), "{}", range_ok ? "" : range_ok.err().message);

  for (auto& spec : parameter_specs(cfg, range)) {
    tensor value = make_value ? make_value(spec, value_type) : tensor::zeros(spec.shape, value_type);
    DSA_CHECK(value.shape() == spec.shape && value.type() == value_type && value.is_contiguous(),
              "bert parameters: the value made for {} is {}", spec.name, value.describe());
    tensor grad = gradients ? tensor::zeros(spec.shape, dtype::f32) : tensor();
    index_.emplace(spec.name, entries_.size());
    entries_.push_back(entry{std::move(spec), std::move(value), std::move(grad)});
  }
  build_views();
}

void bert_parameters::set_value(std::size_t i, tensor value) {
  std::vector<std::pair<std::size_t, tensor>> one;
  one.emplace_back(i, std::move(value));
  set_values(std::move(one));
}

void bert_parameters::set_values(std::vector<std::pair<std::size_t, tensor>> values) {
  for (auto& [i, value] : values) {
    DSA_CHECK(i < entries_.size(), "bert parameters: entry {} of {}", i, entries_.size());
    entry& e = entries_[i];
    DSA_CHECK(!value.defined() || (value.type() == value_type_ && value.shape() == e.spec.shape && value.is_contiguous()),
              "bert parameters: {} takes a contiguous {} tensor of {} elements in its shape, got {}", e.spec.name,
              dtype_name(value_type_), shape_numel(e.spec.shape), value.describe());
    e.value = std::move(value);
  }
  build_views();
}

void bert_parameters::set_grads(std::vector<std::pair<std::size_t, tensor>> grads) {
  for (auto& [i, grad] : grads) {
    DSA_CHECK(i < entries_.size(), "bert parameters: entry {} of {}", i, entries_.size());
    entry& e = entries_[i];
    DSA_CHECK(!grad.defined() || (grad.type() == dtype::f32 && grad.shape() == e.spec.shape && grad.is_contiguous()),
              "bert parameters: {}'s gradient must be contiguous f32 in its shape, got {}", e.spec.name,
              grad.describe());
    e.grad = std::move(grad);
  }
  build_views();
}

void bert_parameters::build_views() {
  const bert_range& range = range_;
  const bert_config& cfg = cfg_;
  layers_.clear();
  if (range.has_embeddings()) {
    embeddings_.word = value_of(word_embeddings_name());
    embeddings_.dword = grad_of(word_embeddings_name());
    embeddings_.position = value_of("bert.embeddings.position_embeddings.weight");
    embeddings_.dposition = grad_of("bert.embeddings.position_embeddings.weight");
    embeddings_.token_type = value_of("bert.embeddings.token_type_embeddings.weight");
    embeddings_.dtoken_type = grad_of("bert.embeddings.token_type_embeddings.weight");
    embeddings_.norm = layernorm("bert.embeddings.LayerNorm");
  }
  for (std::int64_t l = range.first_layer; l < range.last_layer; ++l) {
    const std::string p = layer_prefix(l);
    layer_params lp;
    lp.query = linear(p + "attention.self.query");
    lp.key = linear(p + "attention.self.key");
    lp.value = linear(p + "attention.self.value");
    lp.attention_out = linear(p + "attention.output.dense");
    lp.attention_norm = layernorm(p + "attention.output.LayerNorm");
    lp.intermediate = linear(p + "intermediate.dense");
    lp.output = linear(p + "output.dense");
    lp.output_norm = layernorm(p + "output.LayerNorm");
    layers_.push_back(lp);
  }
  if (!range.has_head())
    return;
  if (cfg.norm == layer_norm_placement::pre)
    final_norm_ = layernorm("bert.encoder.final_layernorm");
  if (cfg.head == head_kind::squad) {
    squad_.qa_outputs = linear("qa_outputs");
    return;
  }
  pretraining_.word = value_of(word_embeddings_name());
  pretraining_.dword = grad_of(word_embeddings_name());
  pretraining_.pooler = linear("bert.pooler.dense");
  pretraining_.transform = linear("cls.predictions.transform.dense");
  pretraining_.transform_norm = layernorm("cls.predictions.transform.LayerNorm");
  pretraining_.decoder_bias = value_of("cls.predictions.bias");
  pretraining_.ddecoder_bias = grad_of("cls.predictions.bias");
  pretraining_.seq_relationship = linear("cls.seq_relationship");
}

void bert_parameters::init(std::uint64_t seed) {
  for (auto& e : entries_) {
    if (value_type_ == dtype::f32) {
      init_parameter(e.value, e.spec, cfg_, seed);
    } else {
      tensor full = tensor::empty(e.spec.shape, dtype::f32);
      init_parameter(full, e.spec, cfg_, seed);
      cpu::cast(e.value.raw_data(), value_type_, full.raw_data(), dtype::f32, full.numel());
    }
    page_out(e.value); // nothing unless the value is in a file
  }
}

void bert_parameters::zero_grad() {
  for (auto& e : entries_)
    if (e.grad.defined()) e.grad.zero();
}

const bert_parameters::entry* bert_parameters::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::int64_t bert_parameters::count() const {
  std::int64_t n = 0;
  for (const auto& e : entries_)
    n += shape_numel(e.spec.shape);
  return n;
}

std::size_t bert_parameters::value_bytes() const {
  std::size_t n = 0;
  for (const auto& e : entries_)
    if (e.value.defined()) n += e.value.nbytes();
  return n;
}

const tensor& bert_parameters::value_of(const std::string& name) const {
  const entry* e = find(name);
  DSA_CHECK(e != nullptr, "bert parameters: no tensor '{}' in range {}", name, range_.to_string());
  return e->value;
}

const tensor& bert_parameters::grad_of(const std::string& name) const {
  const entry* e = find(name);
  DSA_CHECK(e != nullptr, "bert parameters: no tensor '{}' in range {}", name, range_.to_string());
  return e->grad;
}

linear_params bert_parameters::linear(const std::string& prefix) const {
  return linear_params{value_of(prefix + ".weight"), value_of(prefix + ".bias"),
                       grad_of(prefix + ".weight"), grad_of(prefix + ".bias")};
}

layernorm_params bert_parameters::layernorm(const std::string& prefix) const {
  return layernorm_params{value_of(prefix + ".weight"), value_of(prefix + ".bias"),
                          grad_of(prefix + ".weight"), grad_of(prefix + ".bias")};
}

const embeddings_params& bert_parameters::embeddings() const {
  DSA_CHECK(range_.has_embeddings(), "range {} holds no embeddings", range_.to_string());
  return embeddings_;
}

const layer_params& bert_parameters::layer(std::int64_t global_index) const {
  DSA_CHECK(global_index >= range_.first_layer && global_index < range_.last_layer,
            "layer {} is not in range {}", global_index, range_.to_string());
  return layers_[static_cast<std::size_t>(global_index - range_.first_layer)];
}

const layernorm_params& bert_parameters::final_norm() const {
  DSA_CHECK(range_.has_head() && cfg_.norm == layer_norm_placement::pre,
            "range {} holds no final LayerNorm (pre-LN with head only)", range_.to_string());
  return final_norm_;
}

const pretraining_head_params& bert_parameters::pretraining_head() const {
  DSA_CHECK(range_.has_head() && cfg_.head == head_kind::pretraining,
            "range {} holds no pretraining head", range_.to_string());
  return pretraining_;
}

const squad_head_params& bert_parameters::squad_head() const {
  DSA_CHECK(range_.has_head() && cfg_.head == head_kind::squad, "range {} holds no squad head",
            range_.to_string());
  return squad_;
}

} // namespace dsa::bert
