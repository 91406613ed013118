// Comparing the config summaries of two ranks; see rendezvous.hpp.
#include "io/net/rendezvous.hpp"

#include <set>

namespace dsa::net {

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

} // namespace dsa::net
