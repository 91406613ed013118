// TOML config access: key paths, typed reads, overrides and unknown-key checks.
#include "core/config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <sstream>

namespace dsa {
namespace {

std::vector<std::string> split_key(std::string_view key) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= key.size()) {
    std::size_t dot = key.find('.', start);
    if (dot == std::string_view::npos) dot = key.size();
    parts.emplace_back(key.substr(start, dot - start));
    start = dot + 1;
  }
  return parts;
}

const char* node_kind(const toml::node& n) {
  switch (n.type()) {
  case toml::node_type::table: return "a table";
  case toml::node_type::array: return "an array";
  case toml::node_type::string: return "a string";
  case toml::node_type::integer: return "an integer";
  case toml::node_type::floating_point: return "a number";
  case toml::node_type::boolean: return "a boolean";
  default: return "a date/time";
  }
}

template <class T> struct type_traits;
template <> struct type_traits<bool> { static constexpr const char* name = "a boolean"; };
template <> struct type_traits<std::int64_t> { static constexpr const char* name = "an integer"; };
template <> struct type_traits<int> { static constexpr const char* name = "an integer"; };
template <> struct type_traits<double> { static constexpr const char* name = "a number"; };
template <> struct type_traits<std::string> { static constexpr const char* name = "a string"; };

template <class T> std::optional<T> convert(const toml::node& n) {
  if constexpr (std::is_same_v<T, bool>) {
    if (auto v = n.value_exact<bool>()) return *v;
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    if (auto v = n.value_exact<std::int64_t>()) return *v;
    // 1e9-style integers written as floats are accepted when exact.
    if (auto d = n.value_exact<double>(); d && *d == static_cast<double>(static_cast<std::int64_t>(*d)))
      return static_cast<std::int64_t>(*d);
  } else if constexpr (std::is_same_v<T, int>) {
    if (auto v = convert<std::int64_t>(n); v && *v >= INT32_MIN && *v <= INT32_MAX) return static_cast<int>(*v);
  } else if constexpr (std::is_same_v<T, double>) {
    if (auto v = n.value_exact<double>()) return *v;
    if (auto v = n.value_exact<std::int64_t>()) return static_cast<double>(*v);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (auto v = n.value_exact<std::string>()) return *v;
  }
  return std::nullopt;
}

} // namespace

expected<config> config::load(const std::string& path) {
  try {
    return from_table(toml::parse_file(path), path);
  } catch (const toml::parse_error& e) {
    return make_error(errc::config, "{}:{}:{}: {}", path, e.source().begin.line, e.source().begin.column,
                      e.description());
  }
}

expected<config> config::parse(std::string_view text, std::string source_name) {
  try {
    toml::table table = toml::parse(text, std::string_view(source_name));
    return from_table(std::move(table), std::move(source_name));
  } catch (const toml::parse_error& e) {
    return make_error(errc::config, "{}:{}:{}: {}", source_name, e.source().begin.line, e.source().begin.column,
                      e.description());
  }
}

config config::from_table(toml::table table, std::string source_name) {
  config c;
  // toml++ drops source positions when a table is copied, so keep the lines by key.
  std::function<void(const toml::table&, const std::string&)> record = [&](const toml::table& t,
                                                                           const std::string& prefix) {
    for (const auto& [k, v] : t) {
      std::string path = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      if (v.source().begin.line > 0) c.lines_[path] = static_cast<int>(v.source().begin.line);
      if (const toml::table* sub = v.as_table()) record(*sub, path);
    }
  };
  record(table, "");
  c.table_ = std::move(table);
  c.source_ = std::move(source_name);
  return c;
}

const toml::node* config::find(std::string_view key) const {
  const toml::node* node = &table_;
  if (key.empty()) return node;
  for (const auto& part : split_key(key)) {
    const toml::table* t = node->as_table();
    if (!t) return nullptr;
    node = t->get(part);
    if (!node) return nullptr;
  }
  return node;
}

void config::mark(std::string_view key) const { known_.insert(std::string(key)); }
void config::accept(std::string_view key) const { accepted_.insert(std::string(key)); }

void config::know(std::string_view key) const { known_.insert(std::string(key)); }

config_problem config::problem(problem_kind kind, std::string_view key, std::string message) const {
  config_problem p{kind, std::string(key), source_, 0, 0, std::move(message)};
  // Where the longest prefix of the key that was set from elsewhere came from.
  for (std::string prefix(key);;) {
    auto o = origins_.find(prefix);
    if (o != origins_.end()) {
      p.origin = o->second.name;
      p.set_order = o->second.order;
      return p;
    }
    auto dot = prefix.rfind('.');
    if (dot == std::string::npos) break;
    prefix.resize(dot);
  }
  // The key's own line, or for an absent key the line of its nearest table.
  const bool present = find(key) != nullptr;
  for (std::string prefix(key);;) {
    auto it = lines_.find(prefix);
    if (it != lines_.end()) {
      p.line = it->second;
      break;
    }
    auto dot = prefix.rfind('.');
    if (present || dot == std::string::npos)
      break;
    prefix.resize(dot);
  }
  return p;
}

error config::key_error(std::string_view key, std::string_view message) const {
  return error{errc::config,
               problem(problem_kind::invalid_value, key, std::string(message)).to_string()};
}

bool config::has(std::string_view key) const {
  mark(key);
  return find(key) != nullptr;
}

template <class T> expected<T> config::convert_node(const toml::node& n) {
  if constexpr (std::is_same_v<T, std::vector<std::string>> || std::is_same_v<T, std::vector<double>> ||
                std::is_same_v<T, std::vector<std::int64_t>>) {
    using E = typename T::value_type;
    const toml::array* arr = n.as_array();
    if (!arr)
      return make_error(errc::config, "expected an array of {}, found {}", type_traits<E>::name,
                        node_kind(n));
    T out;
    for (std::size_t i = 0; i < arr->size(); ++i) {
      auto v = convert<E>(*arr->get(i));
      if (!v)
        return make_error(errc::config, "element {} should be {}, found {}", i,
                          type_traits<E>::name, node_kind(*arr->get(i)));
      out.push_back(*v);
    }
    return out;
  } else {
    auto v = convert<T>(n);
    if (!v)
      return make_error(errc::config, "expected {}, found {}", type_traits<T>::name, node_kind(n));
    return *v;
  }
}

template <class T> expected<T> config::get(std::string_view key) const {
  mark(key);
  const toml::node* n = find(key);
  if (!n)
    return make_error(errc::config, "{}: missing required key '{}'", source_, key);
  expected<T> v = convert_node<T>(*n);
  if (!v)
    return key_error(key, v.err().message);
  return v;
}

template <class T>
void config::read(std::string_view key, T& out, config_problems& problems) const {
  mark(key);
  const toml::node* n = find(key);
  if (!n)
    return;
  auto v = convert_node<T>(*n);
  if (v)
    out = std::move(*v);
  else
    problems.add(problem(problem_kind::invalid_value, key, v.err().message));
}

template <class T>
void config::require(std::string_view key, T& out, config_problems& problems) const {
  mark(key);
  if (!find(key)) {
    const char* what = "a value";
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::int64_t> ||
                  std::is_same_v<T, int> || std::is_same_v<T, double> ||
                  std::is_same_v<T, std::string>)
      what = type_traits<T>::name;
    problems.add(problem(problem_kind::missing_key, key,
                         fmt::format("required key is missing (expected {})", what)));
    return;
  }
  read(key, out, problems);
}

template <class T> expected<T> config::get_or(std::string_view key, T fallback) const {
  mark(key);
  if (!find(key)) return fallback;
  return get<T>(key);
}

#define DSA_CONFIG_INSTANTIATE(T)                                                                  \
  template expected<T> config::get<T>(std::string_view) const;                                     \
  template expected<T> config::get_or<T>(std::string_view, T) const;                               \
  template void config::read<T>(std::string_view, T&, config_problems&) const;                     \
  template void config::require<T>(std::string_view, T&, config_problems&) const;
DSA_CONFIG_INSTANTIATE(bool)
DSA_CONFIG_INSTANTIATE(std::int64_t)
DSA_CONFIG_INSTANTIATE(int)
DSA_CONFIG_INSTANTIATE(double)
DSA_CONFIG_INSTANTIATE(std::string)
DSA_CONFIG_INSTANTIATE(std::vector<std::string>)
DSA_CONFIG_INSTANTIATE(std::vector<double>)
DSA_CONFIG_INSTANTIATE(std::vector<std::int64_t>)
#undef DSA_CONFIG_INSTANTIATE

std::vector<std::string> config::children(std::string_view key) const {
  mark(key);
  std::vector<std::string> out;
  const toml::node* n = find(key);
  if (!n || !n->is_table()) return out;
  for (const auto& [k, v] : *n->as_table()) out.emplace_back(k.str());
  return out;
}

void config::check_unknown(config_problems& problems) const {
  std::vector<std::string> known(known_.begin(), known_.end());
  // Depth-first in file order.
  std::function<void(const toml::table&, const std::string&)> walk =
      [&](const toml::table& t, const std::string& prefix) {
        for (const auto& [k, v] : t) {
          std::string path =
              prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
          if (accepted_.count(path))
            continue;
          if (const toml::table* sub = v.as_table()) {
            walk(*sub, path);
            continue;
          }
          if (known_.count(path))
            continue;
          std::string hint = nearest_match(path, known);
          problems.add(problem(problem_kind::unknown_key, path,
                               hint.empty()
                                   ? std::string("unknown key")
                                   : fmt::format("unknown key (did you mean '{}'?)", hint)));
        }
      };
  walk(table_, "");
}

status config::reject_unknown() const {
  config_problems problems;
  check_unknown(problems);
  return problems.to_status();
}

status config::set_override(std::string_view assignment) {
  std::size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0)
    return make_error(errc::config, "override '{}': expected key=value", assignment);
  std::string key(assignment.substr(0, eq));
  std::string value(assignment.substr(eq + 1));
  try {
    toml::table parsed = toml::parse("v = " + value);
    return set_node(key, *parsed.get("v"), fmt::format("--set {}", assignment));
  } catch (const toml::parse_error&) {
    return set_node(key, toml::value<std::string>(value), fmt::format("--set {}", assignment));
  }
}

status config::set_node(std::string_view key, const toml::node& value, std::string origin) {
  auto parts = split_key(key);
  toml::table* t = &table_;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* child = t->get(parts[i]);
    if (!child) {
      t->insert(parts[i], toml::table{});
      child = t->get(parts[i]);
    }
    if (!child->is_table())
      return make_error(errc::config, "override '{}': '{}' is not a table", key, parts[i]);
    t = child->as_table();
  }
  value.visit([&](auto&& v) { t->insert_or_assign(parts.back(), v); });
  if (!origin.empty())
    origins_[std::string(key)] = {std::move(origin), ++origins_set_};
  return {};
}

std::string config::to_toml() const {
  std::ostringstream os;
  os << table_;
  return os.str();
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(3, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

} // namespace dsa
