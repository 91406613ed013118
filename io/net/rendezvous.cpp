// Comparing the config summaries of two ranks; see rendezvous.hpp.
#include "io/net/rendezvous.hpp"

#include <set>
#include <sstream>

namespace dsa::net {
namespace {

// A value as TOML-like text; floats in their shortest exact form, so a mismatch message
// shows 0.9, not 0.90000000000000002.
std::string value_text(const toml::node& node) {
  if (auto v = node.as_string())
    return fmt::format("\"{}\"", v->get());
  if (auto v = node.as_integer())
    return fmt::format("{}", v->get());
  if (auto v = node.as_floating_point())
    return fmt::format("{}", v->get());
  if (auto v = node.as_boolean())
    return v->get() ? "true" : "false";
  if (auto arr = node.as_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < arr->size(); ++i)
      out += (i ? ", " : "") + value_text(*arr->get(i));
    return out + "]";
  }
  if (auto table = node.as_table()) {
    std::string out = "{";
    for (const auto& [key, value] : *table)
      out += fmt::format("{}{} = {}", out.size() > 1 ? ", " : "", key.str(), value_text(value));
    return out + "}";
  }
  std::ostringstream text; // dates and times
  node.visit([&](const auto& leaf) { text << leaf; });
  return text.str();
}

void summarize_into(const toml::table& table, const std::string& prefix, config_summary& out) {
  for (const auto& [key, node] : table) {
    std::string path =
        prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
    if (const toml::table* sub = node.as_table())
      summarize_into(*sub, path, out);
    else
      out[path] = value_text(node);
  }
}

} // namespace

config_summary summarize_config(const toml::table& table) {
  config_summary out;
  summarize_into(table, "", out);
  return out;
}

std::string config_difference(const config_summary& rank0, const config_summary& other,
                              int other_rank) {
  std::set<std::string> keys;
  for (const auto& [k, v] : rank0)
    keys.insert(k);
  for (const auto& [k, v] : other)
    keys.insert(k);
  auto value_of = [](const config_summary& c, const std::string& key) -> std::string {
    auto it = c.find(key);
    return it == c.end() ? "(unset)" : it->second;
  };
  constexpr int shown = 8;
  std::string listed;
  int differing = 0;
  for (const auto& key : keys) {
    std::string a = value_of(rank0, key), b = value_of(other, key);
    if (a == b)
      continue;
    if (differing++ < shown)
      listed += fmt::format("{}{} = {} vs {}", listed.empty() ? "" : ", ", key, a, b);
  }
  if (differing == 0)
    return "";
  if (differing > shown)
    listed += fmt::format(" and {} more", differing - shown);
  return fmt::format("rank {}'s config differs from rank 0's: {}", other_rank, listed);
}

std::optional<int> lost_rank_in(const std::string& message) {
  for (std::size_t at = message.find("rank "); at != std::string::npos; at = message.find("rank ", at + 1)) {
    std::size_t i = at + 5, digits = 0;
    int rank = 0;
    while (i < message.size() && message[i] >= '0' && message[i] <= '9' && digits < 9) {
      rank = rank * 10 + (message[i] - '0');
      ++i;
      ++digits;
    }
    if (digits > 0 && message.compare(i, 5, " lost") == 0) return rank;
  }
  return std::nullopt;
}

} // namespace dsa::net
