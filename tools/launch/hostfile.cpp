// Host lists of a multi-host launch; see hostfile.hpp.
#include "tools/launch/hostfile.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace dsa::tools {
namespace {

std::string trimmed(const std::string& s) {
  const auto a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return {};
  const auto b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

// A whole non-negative decimal number; nullopt otherwise.
std::optional<int> number(const std::string& s) {
  if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoi(s);
}

// NAME[:SLOT[,SLOT...]]@...: host -> slots (empty: every slot), in the spec's order.
expected<std::vector<std::pair<std::string, std::vector<int>>>> parse_spec(const std::string& spec, const char* flag) {
  std::vector<std::pair<std::string, std::vector<int>>> out;
  std::stringstream nodes(spec);
  std::string node;
  while (std::getline(nodes, node, '@')) {
    const auto colon = node.find(':');
    const std::string host = node.substr(0, colon);
    if (host.empty())
      return make_error(errc::invalid_argument, "{} '{}': a node without a host name", flag, spec);
    std::vector<int> slots;
    if (colon != std::string::npos) {
      std::stringstream list(node.substr(colon + 1));
      std::string slot;
      while (std::getline(list, slot, ',')) {
        auto n = number(slot);
        if (!n) return make_error(errc::invalid_argument, "{} '{}': slot '{}' of {} is not a number", flag, spec, slot, host);
        slots.push_back(*n);
      }
      if (slots.empty()) return make_error(errc::invalid_argument, "{} '{}': {}: no slots after ':'", flag, spec, host);
    }
    out.emplace_back(host, std::move(slots));
  }
  if (out.empty()) return make_error(errc::invalid_argument, "{}: an empty host spec", flag);
  return out;
}

} // namespace

expected<std::vector<host_entry>> parse_hostfile(const std::string& text, const std::string& path) {
  std::vector<host_entry> hosts;
  std::set<std::string> seen;
  std::stringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string content = trimmed(line.substr(0, line.find('#')));
    if (content.empty()) continue;
    std::stringstream words(content);
    std::string host, slots, extra;
    words >> host >> slots;
    const bool shaped = !slots.empty() && !(words >> extra) && slots.rfind("slots=", 0) == 0;
    const auto count = shaped ? number(slots.substr(6)) : std::nullopt;
    if (!count)
      return make_error(errc::invalid_argument, "hostfile {} line {}: '{}' is not 'HOST slots=N'", path, n, content);
    if (*count < 1) return make_error(errc::invalid_argument, "hostfile {} line {}: {} has slots=0", path, n, host);
    if (!seen.insert(host).second)
      return make_error(errc::invalid_argument, "hostfile {} line {}: host {} is listed twice", path, n, host);
    hosts.push_back({host, *count});
  }
  if (hosts.empty()) return make_error(errc::invalid_argument, "hostfile {} lists no hosts", path);
  return hosts;
}

expected<std::vector<host_entry>> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(errc::io, "hostfile {}: cannot be read", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_hostfile(text.str(), path);
}

expected<std::vector<host_slots>> select_hosts(const std::vector<host_entry>& hosts, const host_filter& filter) {
  const bool include = !filter.include.empty(), exclude = !filter.exclude.empty();
  if (include && exclude) return make_error(errc::invalid_argument, "--include and --exclude are mutually exclusive");
  if ((include || exclude) && (filter.num_nodes || filter.num_gpus))
    return make_error(errc::invalid_argument, "--include/--exclude cannot be combined with --num_nodes or --num_gpus");
  if (filter.num_nodes && *filter.num_nodes < 1)
    return make_error(errc::invalid_argument, "--num_nodes {}: at least 1", *filter.num_nodes);
  if (filter.num_gpus && *filter.num_gpus < 1)
    return make_error(errc::invalid_argument, "--num_gpus {}: at least 1", *filter.num_gpus);
  std::map<std::string, std::set<int>> chosen; // host -> slots
  for (const auto& h : hosts)
    for (int s = 0; s < h.slots; ++s) chosen[h.host].insert(s);
  if (include || exclude) {
    const char* flag = include ? "--include" : "--exclude";
    DSA_ASSIGN_OR_RETURN(auto spec, parse_spec(include ? filter.include : filter.exclude, flag));
    std::map<std::string, std::set<int>> named;
    for (const auto& [host, slots] : spec) {
      const std::string& name = host; // C++17 lambdas cannot capture a structured binding (clang refuses)
      auto it = std::find_if(hosts.begin(), hosts.end(), [&](const host_entry& h) { return h.host == name; });
      if (it == hosts.end()) return make_error(errc::invalid_argument, "{}: unknown host {} (not in the hostfile)", flag, host);
      auto& set = named[host];
      if (slots.empty())
        for (int s = 0; s < it->slots; ++s) set.insert(s);
      for (int s : slots) {
        if (s >= it->slots)
          return make_error(errc::invalid_argument, "{}: host {} has no slot {} (slots=0..{})", flag, host, s, it->slots - 1);
        set.insert(s);
      }
    }
    for (auto& [host, slots] : chosen) {
      const auto& n = named[host];
      std::set<int> kept;
      for (int s : slots)
        if ((n.count(s) > 0) == include) kept.insert(s);
      slots = std::move(kept);
    }
  }
  std::vector<host_slots> out;
  for (const auto& h : hosts) {
    if (filter.num_nodes && static_cast<int>(out.size()) == *filter.num_nodes) break;
    host_slots hs{h.host, {}};
    for (int s : chosen[h.host])
      if (!filter.num_gpus || s < *filter.num_gpus) hs.slots.push_back(s);
    if (!hs.slots.empty()) out.push_back(std::move(hs));
  }
  if (out.empty()) return make_error(errc::invalid_argument, "the host filters leave no slot to run on");
  return out;
}

restart_choice choose_restart_hosts(const std::vector<host_slots>& original, const std::vector<bool>& answered,
                                    const std::vector<host_slots>& previous, int max_procs) {
  restart_choice c;
  auto add = [](std::string& list, const std::string& host) { list += (list.empty() ? "" : ", ") + host; };
  for (std::size_t i = 0; i < original.size(); ++i) {
    const auto& h = original[i];
    if (i >= answered.size() || !answered[i]) {
      add(c.dropped, h.host);
      continue;
    }
    const int room = max_procs - c.procs;
    if (room <= 0) continue;
    host_slots taken{h.host, {}};
    for (int slot : h.slots)
      if (static_cast<int>(taken.slots.size()) < room) taken.slots.push_back(slot);
    c.procs += static_cast<int>(taken.slots.size());
    const bool before = std::any_of(previous.begin(), previous.end(), [&](const host_slots& p) { return p.host == h.host; });
    if (!before) add(c.rejoined, h.host);
    c.hosts.push_back(std::move(taken));
  }
  return c;
}

} // namespace dsa::tools
