// DeepSpeed JSON -> TOML table, and the merged run config.
#include "actors/train/config/deepspeed_json.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace dsa::train {
namespace {

// Converts one JSON value; returns false for null (skipped).
bool to_toml(const nlohmann::json& j, toml::table& parent, const std::string& key) {
  switch (j.type()) {
  case nlohmann::json::value_t::null: return false;
  case nlohmann::json::value_t::object: {
    toml::table t;
    for (const auto& [k, v] : j.items()) to_toml(v, t, k);
    parent.insert_or_assign(key, std::move(t));
    return true;
  }
  case nlohmann::json::value_t::array: {
    toml::array arr;
    for (const auto& v : j) {
      toml::table holder;
      if (to_toml(v, holder, "v")) holder.get("v")->visit([&](auto&& node) { arr.push_back(node); });
    }
    parent.insert_or_assign(key, std::move(arr));
    return true;
  }
  case nlohmann::json::value_t::boolean: parent.insert_or_assign(key, j.get<bool>()); return true;
  case nlohmann::json::value_t::number_integer:
  case nlohmann::json::value_t::number_unsigned: parent.insert_or_assign(key, j.get<std::int64_t>()); return true;
  case nlohmann::json::value_t::number_float: parent.insert_or_assign(key, j.get<double>()); return true;
  case nlohmann::json::value_t::string: parent.insert_or_assign(key, j.get<std::string>()); return true;
  default: return false;
  }
}

// A section whose `type` decides what its params mean (optimizer, scheduler): when
// the TOML and the JSON name different types, the JSON's params do not belong to the
// TOML's type, so the TOML's section is taken whole.
bool other_type(const config& cfg, const toml::node& json_section, const std::string& key) {
  const toml::table* section = json_section.as_table();
  const auto* json_type = section ? section->get("type") : nullptr;
  const auto* toml_type = cfg.table().at_path(key + ".type").node();
  return json_type && toml_type && json_type->value<std::string>() != toml_type->value<std::string>();
}

// Sets every key of `json` that the TOML config does not set itself (TOML wins).
status fill_missing(config& cfg, const toml::table& json, const std::string& prefix, const std::string& origin) {
  for (const auto& [k, v] : json) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    bool present = cfg.table().at_path(key).node() != nullptr;
    if (present && v.is_table()) {
      if ((key == "optimizer" || key == "scheduler") && other_type(cfg, v, key)) continue;
      DSA_TRY(fill_missing(cfg, *v.as_table(), key, origin));
    } else if (!present) {
      DSA_TRY(cfg.set_node(key, v, origin));
    }
  }
  return {};
}

} // namespace

expected<toml::table> load_deepspeed_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(errc::io, "{}: cannot open DeepSpeed config", path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) { // parse_error, and out_of_range for a number too large
    return make_error(errc::config, "{}: invalid JSON: {}", path, e.what());
  }
  if (!j.is_object()) return make_error(errc::config, "{}: a DeepSpeed config must be a JSON object", path);
  toml::table root;
  for (const auto& [k, v] : j.items()) to_toml(v, root, k);
  return root;
}

expected<config> load_run_config(const std::string& toml_path, const std::string& json_override) {
  DSA_ASSIGN_OR_RETURN(config cfg, config::load(toml_path));
  std::string json_path = json_override;
  if (json_path.empty() && cfg.table().contains("deepspeed_config")) {
    DSA_ASSIGN_OR_RETURN(json_path, cfg.get<std::string>("deepspeed_config"));
    // Relative to the TOML file's folder.
    std::filesystem::path p(json_path);
    if (p.is_relative()) json_path = (std::filesystem::path(toml_path).parent_path() / p).string();
  } else {
    (void)cfg.has("deepspeed_config");
  }
  if (json_path.empty()) return cfg;
  DSA_ASSIGN_OR_RETURN(toml::table json, load_deepspeed_json(json_path));
  DSA_TRY(fill_missing(cfg, json, "", json_path));
  return cfg;
}

} // namespace dsa::train
