// Loading HF BERT state dicts into a range's parameters, and exporting them.
#include "models/bert/bert_state.hpp"

#include "core/file_backed.hpp"

#include "kernels/cpu/convert.hpp"
#include "models/bert/parameter_specs.hpp"

#include <cstring>
#include <set>

namespace dsa::bert {
namespace {

const char* const decoder_weight = "cls.predictions.decoder.weight";
const char* const decoder_bias = "cls.predictions.decoder.bias";
const char* const prediction_bias = "cls.predictions.bias";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

bool is_head(const std::string& name) {
  return starts_with(name, "cls.") || starts_with(name, "bert.pooler.") ||
         starts_with(name, "qa_outputs.");
}

// Every parameter name of the whole model under either head, plus HF's extras.
std::set<std::string> known_names(const bert_config& cfg) {
  std::set<std::string> names = {decoder_weight, decoder_bias, "bert.embeddings.position_ids",
                                 "bert.embeddings.token_type_ids"};
  for (head_kind head : {head_kind::pretraining, head_kind::squad}) {
    bert_config c = cfg;
    c.head = head;
    for (const auto& s : parameter_specs(c, bert_range::whole(c)))
      names.insert(s.name);
  }
  return names;
}

// Our name for a dict key: old gamma/beta LayerNorm names, BertModel keys without "bert.".
std::string canonical(const std::string& key, const std::set<std::string>& known) {
  std::string name = key;
  if (name.find("LayerNorm") != std::string::npos) {
    if (ends_with(name, ".gamma"))
      name = name.substr(0, name.size() - 6) + ".weight";
    else if (ends_with(name, ".beta"))
      name = name.substr(0, name.size() - 5) + ".bias";
  }
  if (!known.count(name) && known.count("bert." + name) && !is_head(name))
    name = "bert." + name;
  return name;
}

status check_source(const std::string& name, const std::string& key, const tensor& src,
                    const shape_t& shape) {
  if (!dtype_is_float(src.type()))
    return make_error(errc::format,
                      "state dict: tensor '{}' has dtype {}, expected f32, f16 or bf16", key,
                      dtype_name(src.type()));
  if (src.shape() != shape)
    return make_error(errc::format, "state dict: tensor '{}' has shape {}, expected {} for {}", key,
                      shape_string(src.shape()), shape_string(shape), name);
  if (!src.dev().is_cpu())
    return make_error(errc::unsupported, "state dict: tensor '{}' is on {}, expected cpu", key,
                      src.dev().to_string());
  return {};
}

std::vector<float> as_f32(const tensor& src) {
  const tensor c = src.is_contiguous() ? src : src.clone();
  std::vector<float> out(static_cast<std::size_t>(c.numel()));
  cpu::cast(out.data(), dtype::f32, c.raw_data(), c.type(), c.numel());
  return out;
}

struct source {
  std::string key; // the dict's own name
  tensor value;
};

} // namespace

expected<load_report> load_state(bert_parameters& params, const std::map<std::string, tensor>& dict,
                                 const load_options& options) {
  const bert_config& cfg = params.config();
  const std::set<std::string> known = known_names(cfg);
  std::map<std::string, source> by_name;
  for (const auto& [key, value] : dict) {
    std::string name = canonical(key, known);
    auto [it, inserted] = by_name.emplace(name, source{key, value});
    if (!inserted)
      return make_error(errc::format, "state dict: tensor '{}' given twice (as '{}' and '{}')",
                        name, it->second.key, key);
  }
  auto lookup = [&](const std::string& name) -> const source* {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : &it->second;
  };

  // Resolve and check everything before writing anything.
  load_report report;
  std::set<std::string> used;
  std::vector<std::pair<const bert_parameters::entry*, const source*>> plan;
  for (const auto& e : params.entries()) {
    const std::string& name = e.spec.name;
    const source* src = lookup(name);
    const source* tied = nullptr;
    if (name == word_embeddings_name())
      tied = lookup(decoder_weight);
    if (name == prediction_bias)
      tied = lookup(decoder_bias);
    if (!src)
      src = tied;
    if (!src) {
      if (is_head(name) && options.head == missing_head::keep_current) {
        report.kept.push_back(name);
        continue;
      }
      return make_error(errc::not_found, "state dict: missing tensor '{}' (range {})", name,
                        params.range().to_string());
    }
    DSA_TRY(check_source(name, src->key, src->value, e.spec.shape));
    if (tied && tied != src) {
      DSA_TRY(check_source(name, tied->key, tied->value, e.spec.shape));
      if (as_f32(tied->value) != as_f32(src->value))
        return make_error(errc::format,
                          "state dict: '{}' differs from '{}': an untied decoder is not supported",
                          tied->key, src->key);
    }
    used.insert(src->key);
    plan.emplace_back(&e, src);
  }
  for (const auto& [name, src] : by_name) {
    if (used.count(src.key))
      continue;
    if (!known.count(name) && options.unexpected == unexpected_tensors::error)
      return make_error(errc::format,
                        "state dict: unexpected tensor '{}' (not a {}-LN BERT parameter)", src.key,
                        cfg.norm == layer_norm_placement::post ? "post" : "pre");
    report.ignored.push_back(src.key);
  }
  for (const auto& [e, src] : plan) {
    const tensor c = src->value.is_contiguous() ? src->value : src->value.clone();
    cpu::cast(e->value.raw_data(), e->value.type(), c.raw_data(), c.type(), c.numel());
    page_out(e->value); // values in a file (a ZeRO-3 stage built on NVMe) leave memory one by one
    page_out(c);        // and so does a mapped checkpoint's tensor once read
    report.loaded.push_back(e->spec.name);
  }
  return report;
}

std::map<std::string, tensor> state(const bert_parameters& params) {
  std::map<std::string, tensor> out;
  for (const auto& e : params.entries())
    if (e.spec.role == replica::owner)
      out.emplace(e.spec.name, e.value);
  return out;
}

} // namespace dsa::bert
