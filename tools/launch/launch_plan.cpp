// The processes `dsactor launch` starts; see launch_plan.hpp.
#include "tools/launch/launch_plan.hpp"
#include "tools/omp_env.hpp"

#include "io/ckpt/posix_file.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

extern char** environ;

namespace dsa::tools {

std::vector<process_spec> make_local_plan(const launch_request& request) {
  std::vector<process_spec> plan;
  const std::string world = std::to_string(request.num_procs);
  for (int rank = 0; rank < request.num_procs; ++rank) {
    process_spec p;
    p.rank = rank;
    p.local_rank = rank;
    p.argv = request.command;
    p.env = {{"RANK", std::to_string(rank)},
             {"LOCAL_RANK", std::to_string(rank)},
             {"WORLD_SIZE", world},
             {"LOCAL_SIZE", world},
             {"CROSS_RANK", "0"}, // the host's index (DeepSpeed's node rank)
             {"CROSS_SIZE", "1"}, // the number of hosts
             {"MASTER_ADDR", request.master_addr},
             {"MASTER_PORT", std::to_string(request.master_port)},
             {"DSA_JOB_TOKEN", request.job_token},
             {"DSA_HEARTBEAT_TIMEOUT_MS", std::to_string(request.heartbeat_timeout_ms)}};
    for (auto& kv : launched_rank_omp_env(request.num_procs)) p.env.push_back(std::move(kv));
    plan.push_back(std::move(p));
  }
  return plan;
}

std::vector<process_spec> make_node_plan(const launch_request& request, int nnodes, int node_rank, int per_node) {
  std::vector<process_spec> plan = make_local_plan(launch_request{per_node, request.master_addr, request.master_port,
                                                                  request.job_token, request.heartbeat_timeout_ms,
                                                                  request.command});
  for (auto& p : plan) {
    p.rank = node_rank * per_node + p.local_rank;
    for (auto& [k, v] : p.env) {
      if (k == "RANK") v = std::to_string(p.rank);
      else if (k == "WORLD_SIZE") v = std::to_string(nnodes * per_node);
      else if (k == "CROSS_RANK") v = std::to_string(node_rank);
      else if (k == "CROSS_SIZE") v = std::to_string(nnodes);
    }
  }
  return plan;
}

namespace {
std::string visible_slots(const std::vector<int>& slots) {
  std::string out;
  for (int s : slots) out += (out.empty() ? "" : ",") + std::to_string(s);
  return out;
}
} // namespace

std::vector<process_spec> make_host_plan(const launch_request& request, const std::vector<host_slots>& hosts) {
  std::size_t world = 0;
  for (const auto& h : hosts) world += h.slots.size();
  std::vector<process_spec> plan;
  for (std::size_t node = 0; node < hosts.size(); ++node) {
    const auto& h = hosts[node];
    for (std::size_t local = 0; local < h.slots.size(); ++local) {
      process_spec p;
      p.host = h.host;
      p.rank = static_cast<int>(plan.size());
      p.local_rank = static_cast<int>(local);
      p.argv = request.command;
      p.env = {{"RANK", std::to_string(p.rank)},
               {"LOCAL_RANK", std::to_string(local)},
               {"WORLD_SIZE", std::to_string(world)},
               {"LOCAL_SIZE", std::to_string(h.slots.size())},
               {"CROSS_RANK", std::to_string(node)},
               {"CROSS_SIZE", std::to_string(hosts.size())},
               {"MASTER_ADDR", request.master_addr},
               {"MASTER_PORT", std::to_string(request.master_port)},
               {"DSA_JOB_TOKEN", request.job_token},
               {"DSA_HEARTBEAT_TIMEOUT_MS", std::to_string(request.heartbeat_timeout_ms)},
               {"DSA_SLOT", std::to_string(h.slots[local])},
               // DeepSpeed's mapping: the host's selected slots are its visible GPUs, and a
               // rank's device is its local rank among them (so slot slots[local]).
               {"CUDA_VISIBLE_DEVICES", visible_slots(h.slots)}};
      for (auto& kv : launched_rank_omp_env(static_cast<int>(h.slots.size()))) p.env.push_back(std::move(kv));
      plan.push_back(std::move(p));
    }
  }
  return plan;
}

expected<process_spec> through_cluster_launcher(cluster_launcher which, const std::string& program,
                                                const std::vector<process_spec>& plan,
                                                const std::vector<host_slots>& hosts,
                                                const std::vector<std::string>& extra,
                                                const std::vector<std::pair<std::string, std::string>>& forwarded) {
  if (plan.empty()) return make_error(errc::invalid_argument, "no processes to start");
  process_spec out;
  out.rank = -1;
  out.label = which == cluster_launcher::mpirun ? "mpirun" : "srun";
  // The variables every rank shares (its own come from the launcher's rank variables; a
  // dsactor rank chooses its OpenMP settings from them, omp_env.hpp).
  for (const auto& [k, v] : plan.front().env)
    if (k != "RANK" && k != "LOCAL_RANK" && k != "LOCAL_SIZE" && k != "CROSS_RANK" && k != "DSA_SLOT" &&
        k != "CUDA_VISIBLE_DEVICES" && k != "OMP_WAIT_POLICY" && k != "GOMP_SPINCOUNT" && k != "DSA_OMP_ENV")
      out.env.emplace_back(k, v);
  out.env.insert(out.env.end(), forwarded.begin(), forwarded.end());
  out.argv = {program};
  const std::string n = std::to_string(plan.size());
  if (which == cluster_launcher::mpirun) {
    std::string list;
    for (const auto& h : hosts) list += (list.empty() ? "" : ",") + h.host + ":" + std::to_string(h.slots.size());
    // --tag-output: each line names its rank ("[1,3]<stdout>:"), behind the launcher's [mpirun].
    for (const char* w : {"-np", n.c_str(), "--host", list.c_str(), "--tag-output"}) out.argv.emplace_back(w);
    for (const auto& kv : out.env) {
      out.argv.emplace_back("-x");
      out.argv.push_back(kv.first);
    }
  } else {
    const std::size_t per_host = hosts.front().slots.size();
    std::string list;
    for (const auto& h : hosts) {
      if (h.slots.size() != per_host)
        return make_error(errc::invalid_argument,
                          "--launcher slurm starts as many ranks on every host; {} has {} slots and {} has {}",
                          hosts.front().host, per_host, h.host, h.slots.size());
      list += (list.empty() ? "" : ",") + h.host;
    }
    out.argv.insert(out.argv.end(), {"--nodes", std::to_string(hosts.size()), "--ntasks", n, "--ntasks-per-node",
                                     std::to_string(per_host), "--nodelist", list, "--export=ALL"});
  }
  out.argv.insert(out.argv.end(), extra.begin(), extra.end());
  out.argv.insert(out.argv.end(), plan.front().argv.begin(), plan.front().argv.end());
  return out;
}

std::string shell_quote(const std::string& word) {
  const bool plain =
      !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                                              "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-+=.,/:@%") == std::string::npos;
  if (plain)
    return word;
  std::string out = "'";
  for (char c : word)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string describe(const process_spec& spec, int world_size) {
  std::string line = spec.host.empty() ? std::string() : fmt::format("host {} ", spec.host);
  line += fmt::format("RANK={} LOCAL_RANK={} WORLD_SIZE={}", spec.rank, spec.local_rank, world_size);
  // A host list's GPU mapping: the visible devices and the rank's device among them.
  std::string visible, slot;
  for (const auto& [k, v] : spec.env) {
    if (k == "CUDA_VISIBLE_DEVICES") visible = v;
    if (k == "DSA_SLOT") slot = v;
  }
  if (!visible.empty())
    line += fmt::format(" CUDA_VISIBLE_DEVICES={} (device {}: GPU slot {})", visible, spec.local_rank, slot);
  for (const auto& word : spec.argv)
    line += " " + shell_quote(word);
  return line;
}

process_spec over_ssh(const process_spec& spec, const std::string& ssh, const std::string& cwd,
                      const std::vector<std::pair<std::string, std::string>>& forwarded) {
  if (spec.host.empty() || spec.host == "localhost") return spec;
  // The job token goes through ssh's standard input, read by the remote shell into the
  // rank's environment: never on a command line (ps on either host would show it).
  std::string remote, token;
  for (const auto& [k, v] : spec.env)
    if (k == "DSA_JOB_TOKEN") token = v;
  if (!token.empty()) remote = "IFS= read -r DSA_JOB_TOKEN && export DSA_JOB_TOKEN && ";
  remote += "cd " + shell_quote(cwd) + " && exec env";
  for (const auto& [k, v] : forwarded) remote += " " + shell_quote(k + "=" + v);
  // The rank's OpenMP settings, chosen again from the user's as forwarded (.dsactor_env's
  // included): those stand over the launcher's choice for the rank.
  const char* policy = nullptr;
  const char* spin = nullptr;
  std::string local_size = "1";
  for (const auto& [k, v] : forwarded) {
    if (k == "OMP_WAIT_POLICY") policy = v.c_str();
    if (k == "GOMP_SPINCOUNT") spin = v.c_str();
  }
  for (const auto& [k, v] : spec.env)
    if (k == "LOCAL_SIZE") local_size = v;
  std::vector<std::pair<std::string, std::string>> env;
  for (const auto& kv : spec.env)
    if (kv.first != "DSA_JOB_TOKEN" && kv.first != "OMP_WAIT_POLICY" && kv.first != "GOMP_SPINCOUNT" &&
        kv.first != "DSA_OMP_ENV")
      env.push_back(kv);
  for (auto& kv : rank_omp_env(policy, spin, std::max(1, std::atoi(local_size.c_str())))) env.push_back(std::move(kv));
  for (const auto& [k, v] : env) remote += " " + shell_quote(k + "=" + v);
  for (const auto& word : spec.argv) remote += " " + shell_quote(word);
  process_spec out = spec;
  // ConnectTimeout: a host that drops packets is named after 30 s, not the kernel's ~2 min.
  out.argv = {ssh, "-o", "BatchMode=yes", "-o", "ConnectTimeout=30", spec.host, remote};
  if (!token.empty()) out.stdin_text = token + "\n";
  return out;
}

bool forwarded_name(const std::string& name) {
  if (chosen_for_this_process(name)) return false; // each rank chooses its own (omp_env.hpp)
  for (const char* prefix : {"NCCL_", "UCX_", "OPENBLAS_", "OMP_", "GOMP_"})
    if (name.rfind(prefix, 0) == 0) return true;
  // The CPU path, the run directory a restarted job keeps, and the restart tests' fault.
  return name == "DSA_CPU_ISA" || name == "DSA_LAUNCH_RUN_DIR" || name == "DSA_TEST_KILL_ONCE" ||
         name == "DSA_TEST_WAIT_ONCE" || name == "DSA_TEST_COLLECTIVE_FAULT" || name == "DSA_TEST_KILL_IN";
}

expected<std::vector<std::pair<std::string, std::string>>> forwarded_environment(const std::string& home,
                                                                                  const std::string& cwd) {
  std::vector<std::pair<std::string, std::string>> out;
  auto set = [&](const std::string& k, const std::string& v) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& kv) { return kv.first == k; });
    if (it != out.end()) it->second = v;
    else out.emplace_back(k, v);
  };
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = kv.substr(0, eq);
    if (forwarded_name(name)) set(name, kv.substr(eq + 1));
  }
  for (const std::string& dir : {home, cwd}) {
    if (dir.empty()) continue;
    const std::string path = dir + "/.dsactor_env";
    std::ifstream in(path);
    std::string line;
    for (int n = 1; in && std::getline(in, line); ++n) {
      const auto first = line.find_first_not_of(" \t");
      if (first == std::string::npos || line[first] == '#') continue;
      const auto eq = line.find('=');
      if (eq == std::string::npos || eq == first)
        return make_error(errc::invalid_argument, "{} line {}: '{}' is not KEY=VALUE", path, n, line);
      set(line.substr(first, eq - first), line.substr(eq + 1));
    }
  }
  return out;
}

expected<std::string> random_job_token() {
  const std::string path = "/dev/urandom";
  DSA_ASSIGN_OR_RETURN(ckpt::unique_fd fd, ckpt::open_for_read(path));
  unsigned char raw[16];
  DSA_TRY(ckpt::pread_exact(fd, path, raw, sizeof raw, 0));
  std::string token;
  for (unsigned char b : raw)
    token += fmt::format("{:02x}", b);
  return token;
}

expected<std::string> resolve_program(const std::string& program) {
  if (program.empty())
    return make_error(errc::invalid_argument, "the program to launch is empty");
  if (program.find('/') != std::string::npos) {
    if (::access(program.c_str(), X_OK) != 0)
      return make_error(errc::not_found, "'{}' is not an executable file", program);
    return program;
  }
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0)
      return candidate;
  }
  return make_error(errc::not_found, "'{}' was not found in PATH", program);
}

} // namespace dsa::tools
