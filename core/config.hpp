// Typed access to a TOML configuration by key path ("optimizer.params.lr").
// Every error names the file, the key and (where the key exists) its line.
// Keys that the program never asked for are rejected by reject_unknown(),
// with the nearest known key suggested.
#pragma once

#include "core/error.hpp"

#include <toml++/toml.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace dsa {

class config {
public:
  config() = default;
  static expected<config> load(const std::string& path);
  static expected<config> parse(std::string_view text, std::string source_name);
  static config from_table(toml::table table, std::string source_name);

  // T is bool, std::int64_t, int, double, std::string, or std::vector of those.
  template <class T> expected<T> get(std::string_view key) const;
  template <class T> expected<T> get_or(std::string_view key, T fallback) const;
  bool has(std::string_view key) const;
  // Names of the direct children of a table key ("" for the root); marks the key as known.
  std::vector<std::string> children(std::string_view key) const;

  // Marks a key (and everything under it) as known without reading it.
  void accept(std::string_view key) const;
  // Error listing the first key in the file that was never read or accepted.
  status reject_unknown() const;

  // Applies "a.b.c=value"; the value is parsed as a TOML value, or taken as a string.
  status set_override(std::string_view assignment);
  // Sets a key from a TOML value, creating intermediate tables. `origin` names where
  // the value came from (another file, a command-line flag); errors about the key
  // or anything under it name it instead of this file.
  status set_node(std::string_view key, const toml::node& value, std::string origin = "");

  const std::string& source() const { return source_; }
  const toml::table& table() const { return table_; }
  std::string to_toml() const;

  // Error helpers for callers that validate values: "<file>:<line>: key 'k': message".
  error key_error(std::string_view key, std::string_view message) const;

private:
  const toml::node* find(std::string_view key) const;
  void mark(std::string_view key) const;
  std::string where(std::string_view key) const;

  toml::table table_;
  std::string source_;
  std::map<std::string, int> lines_;      // source line of each key as loaded
  std::map<std::string, std::string> origins_; // keys set from elsewhere (set_node's origin)
  mutable std::set<std::string> known_;    // keys read or tested
  mutable std::set<std::string> accepted_; // subtrees accepted whole
};

// Edit distance, used for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);
// Nearest candidate within a distance that makes sense for the length, or "".
std::string nearest_match(std::string_view word, const std::vector<std::string>& candidates);

} // namespace dsa
