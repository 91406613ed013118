// Typed access to a TOML configuration by key path ("optimizer.params.lr").
// Every error names the file, the key and its line (for an absent key, the line of
// its table). Reads may record problems in a config_problems sink and go on, so a
// whole config is checked in one pass; keys that the program never asked for are
// unknown, with the nearest known key suggested.
#pragma once

#include "core/config_problems.hpp"
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
  // Overwrites out when the key is present; a value of the wrong type is recorded as an
  // invalid value and out keeps its value, so parsing goes on.
  template <class T> void read(std::string_view key, T& out, config_problems& problems) const;
  // As read, but an absent key is recorded as missing.
  template <class T> void require(std::string_view key, T& out, config_problems& problems) const;
  bool has(std::string_view key) const;
  // Names of the direct children of a table key ("" for the root); marks the key as known.
  std::vector<std::string> children(std::string_view key) const;

  // Marks a key (and everything under it) as known without reading it.
  void accept(std::string_view key) const;
  // Marks a key as known without reading it: a key of that name is not reported
  // by check_unknown, and a misspelling of it gets it as the suggestion.
  void know(std::string_view key) const;
  // Records every key that was never read or accepted (in file order), each with the
  // nearest known key.
  void check_unknown(config_problems& problems) const;
  // An error listing every key that was never read or accepted.
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

  // A problem about a key, located in the file (and line), JSON file or --set flag it came from.
  config_problem problem(problem_kind kind, std::string_view key, std::string message) const;
  // Error helpers for callers that validate values: "<file>:<line>: key 'k': message".
  error key_error(std::string_view key, std::string_view message) const;

private:
  const toml::node* find(std::string_view key) const;
  void mark(std::string_view key) const;
  // The converted value, or why the node cannot be a T ("expected an integer, found a string").
  template <class T> static expected<T> convert_node(const toml::node& n);

  toml::table table_;
  std::string source_;
  std::map<std::string, int> lines_;      // source line of each key as loaded
  struct origin {
    std::string name; // set_node's origin
    int order;        // 1 for the first key set from elsewhere, then 2, ...
  };
  std::map<std::string, origin> origins_;  // keys set from elsewhere
  int origins_set_ = 0;                    // how many set_node calls named an origin
  mutable std::set<std::string> known_;    // keys read or tested
  mutable std::set<std::string> accepted_; // subtrees accepted whole
};

// Edit distance, used for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);
// Nearest candidate within a distance that makes sense for the length, or "".
std::string nearest_match(std::string_view word, const std::vector<std::string>& candidates);

} // namespace dsa
