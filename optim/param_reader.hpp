// Reads the keys of one config table ("scheduler.params", "optimizer.params") into plain
// structs, remembering which keys were read so unknown ones can be reported by name.
// Every problem goes to a config_problems sink and reading goes on (a bad value keeps
// the default), so one pass finds every problem in the table.
#pragma once

#include "core/config.hpp"
#include "core/config_problems.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsa::optim {

class param_reader {
public:
  // prefix: the table's key path; the table may be absent (every read keeps its default).
  param_reader(const config& cfg, std::string prefix, config_problems& problems)
      : cfg_(cfg), prefix_(std::move(prefix)), problems_(problems) {}

  // The full key path of a child ("scheduler.params.warmup_num_steps").
  std::string key(std::string_view name) const { return prefix_ + "." + std::string(name); }

  // Overwrites out when the key is present; a value of the wrong type is recorded.
  template <class T> void read(std::string_view name, T& out) {
    known_.emplace_back(name);
    cfg_.read(key(name), out, problems_);
  }
  template <class T> void read(std::string_view name, std::optional<T>& out) {
    known_.emplace_back(name);
    if (!cfg_.has(key(name)))
      return;
    T value{};
    config_problems local;
    cfg_.read(key(name), value, local);
    if (local.empty())
      out = value;
    problems_.append(local);
  }
  // As read; an absent key is recorded as missing.
  template <class T> void require(std::string_view name, T& out) {
    known_.emplace_back(name);
    cfg_.require(key(name), out, problems_);
  }
  bool has(std::string_view name) const { return cfg_.has(key(name)); }
  // Counts a child as known without reading it (a sub-table read by another reader).
  void accept(std::string_view name) { known_.emplace_back(name); }

  // Records every child of the table that no read asked for, with a suggestion.
  void check_unknown() const {
    for (const auto& child : cfg_.children(prefix_)) {
      bool found = false;
      for (const auto& k : known_) found = found || k == child;
      if (found) continue;
      std::string hint = nearest_match(child, known_);
      problems_.add(cfg_.problem(problem_kind::unknown_key, key(child),
                                 hint.empty() ? std::string("unknown key")
                                              : "unknown key (did you mean '" + hint + "'?)"));
    }
  }

  // Records a present value that is out of range or inconsistent.
  void invalid(std::string_view name, std::string message) const {
    problems_.add(cfg_.problem(problem_kind::invalid_value, key(name), std::move(message)));
  }

  config_problems& problems() const { return problems_; }

private:
  const config& cfg_;
  std::string prefix_;
  config_problems& problems_;
  std::vector<std::string> known_;
};

} // namespace dsa::optim
