// Reads the keys of one config table ("scheduler.params", "optimizer.params") into plain
// structs, remembering which keys were read so unknown ones can be reported by name.
#pragma once

#include "core/config.hpp"
#include "core/error.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::optim {

class param_reader {
public:
  // prefix: the table's key path; the table may be absent (every read keeps its default).
  param_reader(const config& cfg, std::string prefix) : cfg_(cfg), prefix_(std::move(prefix)) {}

  // The full key path of a child ("scheduler.params.warmup_num_steps").
  std::string key(std::string_view name) const { return prefix_ + "." + std::string(name); }

  // Overwrites out when the key is present; an error names the key when its type is wrong.
  template <class T> status read(std::string_view name, T& out) {
    known_.emplace_back(name);
    if (!cfg_.has(key(name))) return {};
    DSA_ASSIGN_OR_RETURN(out, cfg_.get<T>(key(name)));
    return {};
  }
  template <class T> status read(std::string_view name, std::optional<T>& out) {
    known_.emplace_back(name);
    if (!cfg_.has(key(name))) return {};
    DSA_ASSIGN_OR_RETURN(out, cfg_.get<T>(key(name)));
    return {};
  }
  template <class T> status require(std::string_view name, T& out) {
    known_.emplace_back(name);
    if (!cfg_.has(key(name))) return cfg_.key_error(key(name), "required key is missing");
    DSA_ASSIGN_OR_RETURN(out, cfg_.get<T>(key(name)));
    return {};
  }
  bool has(std::string_view name) const { return cfg_.has(key(name)); }
  // Counts a child as known without reading it (a sub-table read by another reader).
  void accept(std::string_view name) { known_.emplace_back(name); }

  // An error for the first child of the table that no read asked for, with a suggestion.
  status reject_unknown() const {
    for (const auto& child : cfg_.children(prefix_)) {
      bool found = false;
      for (const auto& k : known_) found = found || k == child;
      if (found) continue;
      std::string hint = nearest_match(child, known_);
      return cfg_.key_error(key(child), hint.empty() ? std::string("unknown key")
                                                     : "unknown key (did you mean '" + hint + "'?)");
    }
    return {};
  }

  error value_error(std::string_view name, std::string_view message) const {
    return cfg_.key_error(key(name), message);
  }

private:
  const config& cfg_;
  std::string prefix_;
  std::vector<std::string> known_;
};

} // namespace dsa::optim
