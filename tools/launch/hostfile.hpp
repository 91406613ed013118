// The host list of a multi-host `dsactor launch`, with DeepSpeed's semantics
// (../shared/reference/deepspeed-notes.md §11): a hostfile of `host slots=N` lines, '#'
// comments and blank lines; the --include / --exclude filters (`NAME[:SLOT[,SLOT...]]`
// joined by '@', e.g. `worker-0@worker-1:0,2`); --num_nodes (the first N hosts) and
// --num_gpus (slots 0..G-1 of each). Errors name the file and line, the host or the slot.
#pragma once

#include "core/error.hpp"

#include <optional>
#include <string>
#include <vector>

namespace dsa::tools {

struct host_entry {
  std::string host;
  int slots = 0;
};

// The hosts of `text` in file order; `path` names it in errors.
expected<std::vector<host_entry>> parse_hostfile(const std::string& text, const std::string& path);
// parse_hostfile of the file at `path` (an error names it when it cannot be read).
expected<std::vector<host_entry>> read_hostfile(const std::string& path);

struct host_filter {
  std::string include, exclude; // "" when not given
  std::optional<int> num_nodes, num_gpus;
};

// The slots a job uses on a host, in slot order.
struct host_slots {
  std::string host;
  std::vector<int> slots;
};

// The selected hosts in hostfile order, hosts left without slots dropped. Errors: include
// with exclude; either with num_nodes or num_gpus; an unknown host or slot; a malformed
// spec; a count below 1; nothing left.
expected<std::vector<host_slots>> select_hosts(const std::vector<host_entry>& hosts, const host_filter& filter);

// A restart's hosts: of the original list, those that answer, in list order, their slots
// up to `max_procs` processes in all (the last host taken may give only its first slots).
// `dropped` names the hosts that did not answer, `rejoined` those that answer now and were
// not in the previous attempt.
struct restart_choice {
  std::vector<host_slots> hosts;
  int procs = 0;
  std::string dropped, rejoined;
};
restart_choice choose_restart_hosts(const std::vector<host_slots>& original, const std::vector<bool>& answered,
                                    const std::vector<host_slots>& previous, int max_procs);

} // namespace dsa::tools
