// Collecting and ordering configuration problems.
#include "core/config_problems.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace dsa {

std::string config_problem::to_string() const {
  std::string where = line > 0 ? fmt::format("{}:{}", origin, line) : origin;
  if (!key.empty())
    return fmt::format("{}{}key '{}': {}", where, where.empty() ? "" : ": ", key, message);
  if (!where.empty())
    return fmt::format("{}: {}", where, message);
  return message;
}

void config_problems::add(config_problem problem) {
  for (const auto& p : list_)
    if (p.kind == problem.kind && !p.key.empty() && p.key == problem.key)
      return;
  list_.push_back(std::move(problem));
}

void config_problems::add(const error& e) {
  config_problem p;
  p.message = e.message;
  list_.push_back(std::move(p));
}

void config_problems::append(const config_problems& other) {
  for (const auto& p : other.list_)
    add(p);
}

std::vector<config_problem> config_problems::sorted() const {
  std::vector<config_problem> out = list_;
  auto rank = [](const config_problem& p) {
    if (p.line > 0)
      return std::make_tuple(static_cast<int>(p.kind), 0, p.line);
    if (p.set_order > 0)
      return std::make_tuple(static_cast<int>(p.kind), 1, p.set_order);
    return std::make_tuple(static_cast<int>(p.kind), 2, 0);
  };
  std::stable_sort(out.begin(), out.end(), [&](const config_problem& a, const config_problem& b) {
    return rank(a) < rank(b);
  });
  return out;
}

status config_problems::to_status() const {
  if (list_.empty())
    return {};
  auto all = sorted();
  if (all.size() == 1)
    return error{errc::config, all.front().to_string()};
  std::string text = fmt::format("{} problems in the configuration:", all.size());
  for (const auto& p : all)
    text += "\n  " + p.to_string();
  return error{errc::config, text};
}

} // namespace dsa
