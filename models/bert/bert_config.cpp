// BERT sizes, validation and parsing from the "model" config table.
#include "models/bert/bert_config.hpp"

#include <fmt/format.h>

#include <array>
#include <vector>

namespace dsa::bert {
namespace {

struct size_row {
  model_size size;
  const char* name;
  std::int64_t layers, hidden, heads;
};

constexpr std::array<size_row, 6> size_table{{
    {model_size::tiny, "tiny", 2, 128, 2},
    {model_size::mini, "mini", 4, 256, 4},
    {model_size::small, "small", 4, 512, 8},
    {model_size::medium, "medium", 8, 512, 8},
    {model_size::base, "base", 12, 768, 12},
    {model_size::large, "large", 24, 1024, 16},
}};

const std::vector<std::string>& known_keys() {
  static const std::vector<std::string> keys = {"size",
                                                "num_layers",
                                                "hidden_size",
                                                "num_heads",
                                                "intermediate_size",
                                                "vocab_size",
                                                "max_position_embeddings",
                                                "type_vocab_size",
                                                "pad_token_id",
                                                "hidden_dropout",
                                                "attention_dropout",
                                                "layer_norm_eps",
                                                "initializer_range",
                                                "layer_norm",
                                                "head",
                                                "normalize_invertible",
                                                "attn_dropout_checkpoint",
                                                "gelu_checkpoint",
                                                "checkpoint_activations"};
  return keys;
}

std::string join_key(std::string_view prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : fmt::format("{}.{}", prefix, key);
}

// Reads an optional key into `field`, keeping the current value when absent or bad.
template <class T, class Field>
void read_optional(const config& cfg, const std::string& key, Field& field,
                   config_problems& problems) {
  T value = static_cast<T>(field);
  cfg.read(key, value, problems);
  field = static_cast<Field>(value);
}

} // namespace

status bert_config::validate() const {
  auto bad = [](std::string_view what) {
    return make_error(errc::config, "bert config: {}", what);
  };
  if (num_layers < 1)
    return bad(fmt::format("num_layers must be >= 1, got {}", num_layers));
  if (hidden_size < 1 || num_heads < 1 || hidden_size % num_heads != 0)
    return bad(fmt::format("hidden_size {} must be a positive multiple of num_heads {}",
                           hidden_size, num_heads));
  if (intermediate_size < 1)
    return bad(fmt::format("intermediate_size must be >= 1, got {}", intermediate_size));
  if (vocab_size < 1 || max_position_embeddings < 1 || type_vocab_size < 1)
    return bad("vocab_size, max_position_embeddings and type_vocab_size must be >= 1");
  if (pad_token_id < -1 || pad_token_id >= vocab_size)
    return bad(
        fmt::format("pad_token_id {} outside [-1, vocab_size {})", pad_token_id, vocab_size));
  if (!(hidden_dropout >= 0.0f && hidden_dropout < 1.0f))
    return bad(fmt::format("hidden_dropout {} outside [0, 1)", hidden_dropout));
  if (!(attention_dropout >= 0.0f && attention_dropout < 1.0f))
    return bad(fmt::format("attention_dropout {} outside [0, 1)", attention_dropout));
  if (!(layer_norm_eps > 0.0f))
    return bad("layer_norm_eps must be > 0");
  if (!(initializer_range >= 0.0f))
    return bad("initializer_range must be >= 0");
  return {};
}

bert_config bert_config_for(model_size size) {
  bert_config cfg;
  cfg.size = size;
  for (const auto& row : size_table) {
    if (row.size != size)
      continue;
    cfg.num_layers = row.layers;
    cfg.hidden_size = row.hidden;
    cfg.num_heads = row.heads;
  }
  cfg.intermediate_size = 4 * cfg.hidden_size;
  return cfg;
}

const char* model_size_name(model_size size) {
  for (const auto& row : size_table)
    if (row.size == size)
      return row.name;
  return "custom";
}

expected<model_size> parse_model_size(std::string_view name) {
  for (const auto& row : size_table)
    if (name == row.name)
      return row.size;
  if (name == "custom")
    return model_size::custom;
  return make_error(
      errc::config,
      "unknown model size '{}' (expected tiny, mini, small, medium, base, large or custom)", name);
}

bert_config read_bert_config(const config& cfg, config_problems& problems,
                             std::string_view prefix) {
  for (const auto& child : cfg.children(prefix)) {
    bool known = false;
    for (const auto& k : known_keys())
      known = known || (k == child);
    if (known)
      continue;
    std::string hint = nearest_match(child, known_keys());
    problems.add(cfg.problem(problem_kind::unknown_key, join_key(prefix, child),
                             hint.empty()
                                 ? std::string("unknown model key")
                                 : fmt::format("unknown model key (did you mean '{}'?)", hint)));
  }
  auto key = [&](std::string_view k) { return join_key(prefix, k); };
  auto invalid = [&](std::string_view k, std::string message) {
    problems.add(cfg.problem(problem_kind::invalid_value, k, std::move(message)));
  };

  std::string size_name = "base";
  cfg.read(key("size"), size_name, problems);
  auto size = parse_model_size(size_name);
  if (!size)
    invalid(key("size"), size.err().message);
  bert_config out = bert_config_for(size ? *size : model_size::base);
  if (size && *size == model_size::custom)
    for (const char* k : {"num_layers", "hidden_size", "num_heads"})
      if (!cfg.has(key(k)))
        problems.add(
            cfg.problem(problem_kind::missing_key, key(k), "required when size = \"custom\""));

  read_optional<std::int64_t>(cfg, key("num_layers"), out.num_layers, problems);
  read_optional<std::int64_t>(cfg, key("hidden_size"), out.hidden_size, problems);
  read_optional<std::int64_t>(cfg, key("num_heads"), out.num_heads, problems);
  out.intermediate_size = 4 * out.hidden_size;
  read_optional<std::int64_t>(cfg, key("intermediate_size"), out.intermediate_size, problems);
  read_optional<std::int64_t>(cfg, key("vocab_size"), out.vocab_size, problems);
  read_optional<std::int64_t>(cfg, key("max_position_embeddings"), out.max_position_embeddings,
                              problems);
  read_optional<std::int64_t>(cfg, key("type_vocab_size"), out.type_vocab_size, problems);
  read_optional<std::int64_t>(cfg, key("pad_token_id"), out.pad_token_id, problems);
  read_optional<double>(cfg, key("hidden_dropout"), out.hidden_dropout, problems);
  read_optional<double>(cfg, key("attention_dropout"), out.attention_dropout, problems);
  read_optional<double>(cfg, key("layer_norm_eps"), out.layer_norm_eps, problems);
  read_optional<double>(cfg, key("initializer_range"), out.initializer_range, problems);
  read_optional<bool>(cfg, key("normalize_invertible"), out.memory.normalize_invertible, problems);
  read_optional<bool>(cfg, key("attn_dropout_checkpoint"), out.memory.attn_dropout_checkpoint,
                      problems);
  read_optional<bool>(cfg, key("gelu_checkpoint"), out.memory.gelu_checkpoint, problems);
  read_optional<bool>(cfg, key("checkpoint_activations"), out.checkpoint_activations, problems);

  std::string norm = "post";
  cfg.read(key("layer_norm"), norm, problems);
  if (norm == "post")
    out.norm = layer_norm_placement::post;
  else if (norm == "pre")
    out.norm = layer_norm_placement::pre;
  else
    invalid(key("layer_norm"), fmt::format("expected \"post\" or \"pre\", got \"{}\"", norm));

  std::string head = "pretraining";
  cfg.read(key("head"), head, problems);
  if (head == "pretraining")
    out.head = head_kind::pretraining;
  else if (head == "squad")
    out.head = head_kind::squad;
  else
    invalid(key("head"), fmt::format("expected \"pretraining\" or \"squad\", got \"{}\"", head));

  if (auto ok = out.validate(); !ok)
    invalid(prefix, ok.err().message);
  return out;
}

expected<bert_config> parse_bert_config(const config& cfg, std::string_view prefix) {
  config_problems problems;
  bert_config out = read_bert_config(cfg, problems, prefix);
  DSA_TRY(problems.to_status());
  return out;
}

std::string describe(const bert_config& cfg) {
  return fmt::format(
      "bert-{}: layers {} hidden {} heads {} intermediate {} vocab {} positions {} types {} "
      "dropout hidden {} attention {} eps {:g} init {} norm {} head {} flags{}{}{}{}",
      model_size_name(cfg.size), cfg.num_layers, cfg.hidden_size, cfg.num_heads,
      cfg.intermediate_size, cfg.vocab_size, cfg.max_position_embeddings, cfg.type_vocab_size,
      cfg.hidden_dropout, cfg.attention_dropout, cfg.layer_norm_eps, cfg.initializer_range,
      cfg.norm == layer_norm_placement::post ? "post" : "pre",
      cfg.head == head_kind::pretraining ? "pretraining" : "squad",
      cfg.memory.normalize_invertible ? " normalize_invertible" : "",
      cfg.memory.attn_dropout_checkpoint ? " attn_dropout_checkpoint" : "",
      cfg.memory.gelu_checkpoint ? " gelu_checkpoint" : "",
      cfg.checkpoint_activations ? " checkpoint_activations" : "");
}

} // namespace dsa::bert
