// A collecting sink for configuration problems: parsing records each problem it finds
// and goes on with a default, so one run reports every problem, unknown keys first.
#pragma once

#include "core/error.hpp"

#include <string>
#include <vector>

namespace dsa {

// In the order problems are reported.
enum class problem_kind {
  unknown_key,   // a key no reader asked for (a typo, usually)
  missing_key,   // a required key or table is absent
  invalid_value, // present, but of the wrong type, out of range or inconsistent
};

struct config_problem {
  problem_kind kind = problem_kind::invalid_value;
  std::string key;     // full key path ("optimizer.params.lr"); "" when about no one key
  std::string origin;  // the TOML file, the DeepSpeed JSON file or the --set flag
  int line = 0;        // line in origin; 0 where there is none (JSON, --set, absent keys)
  int set_order = 0;   // > 0 for a key set from elsewhere: the order it was set in
  std::string message; // what is wrong and what was expected

  // "<origin>[:<line>]: key '<key>': <message>" (parts that are empty are left out).
  std::string to_string() const;
};

class config_problems {
public:
  // Records a problem; a second problem of the same kind about the same key is dropped
  // (a section reader and the whole-config check may both find an unknown key).
  void add(config_problem problem);
  // Records an error that is not about a key (a malformed --set flag).
  void add(const error& e);
  void append(const config_problems& other);

  bool empty() const { return list_.empty(); }
  std::size_t size() const { return list_.size(); }

  // Unknown keys, then missing keys, then invalid values. Within a kind: keys of the
  // file by line, then keys set from elsewhere in the order they were set (JSON keys,
  // then --set flags in command-line order), then the rest in the order found.
  std::vector<config_problem> sorted() const;

  // Success when there are none; else an errc::config error listing every problem in
  // sorted order, one per line (a single problem is its own message).
  status to_status() const;

private:
  std::vector<config_problem> list_;
};

} // namespace dsa
