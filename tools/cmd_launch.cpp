// dsactor launch: start the N local processes of one job, host their rendezvous, forward
// their output and signals, and stop them all when one fails (DeepSpeed's launcher and
// torchrun do the same for Python). Forms:
//   dsactor launch [options] CONFIG [dsactor run options]   N x `dsactor run CONFIG ...`
//   dsactor launch [options] -- PROGRAM [ARGS...]           N x any program
#include "io/net/rendezvous_server.hpp"
#include "io/net/route_address.hpp"
#include "tools/command.hpp"
#include "tools/launch/launch_plan.hpp"
#include "tools/launch/restarts.hpp"
#include "tools/launch/swap_janitor.hpp"
#include "tools/options.hpp"
#include "tools/launch/process_group.hpp"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace dsa::tools {
namespace {

// The launcher's own options come first; from the first word that is not one of them
// (CONFIG) or after `--`, everything belongs to the ranks' command, untouched.
struct split_args {
  std::vector<std::string> own{"launch"};
  std::vector<std::string> rest;
  bool general = false; // `-- PROGRAM ...` rather than CONFIG
};

split_args split(int argc, char** argv, const po::options_description& opts) {
  split_args s;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      s.general = true;
      s.rest.assign(argv + i + 1, argv + argc);
      return s;
    }
    if (a.size() > 1 && a[0] == '-') {
      s.own.push_back(a);
      std::string name = a.substr(a.find_first_not_of('-'));
      const auto* o = opts.find_nothrow(name, false);
      if (name.find('=') == std::string::npos && o && o->semantic()->max_tokens() > 0 &&
          i + 1 < argc)
        s.own.push_back(argv[++i]);
      continue;
    }
    s.rest.assign(argv + i, argv + argc);
    return s;
  }
  return s;
}

expected<std::string> self_executable() {
  char path[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0)
    return make_error(errc::io, "cannot read /proc/self/exe");
  return std::string(path, static_cast<std::size_t>(n));
}

const char* const epilog = R"(
Forms:
  dsactor launch --num_procs N [options] CONFIG [dsactor run options...]
      starts N processes of `dsactor run CONFIG ...` (this binary), e.g. --set k=v, --resume
  dsactor launch --num_procs N [options] -- PROGRAM [ARGS...]
      starts N processes of any program

Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE,
MASTER_ADDR, MASTER_PORT (the rendezvous server this launcher hosts) and DSA_JOB_TOKEN
(a random token every rendezvous connection must present). Output lines are prefixed
with "[rank r] ". Ctrl-C is passed on to every rank; a second one kills them. When a rank
fails or the rendezvous loses one, every rank is stopped (SIGTERM, then SIGKILL after
--grace seconds). The exit code is 0 only when every rank exited 0.
)";

po::options_description launch_options() {
  po::options_description opts(
      "dsactor launch --num_procs N [options] (CONFIG [run options] | -- PROGRAM [ARGS])");
  opts.add_options()("help,h", "this help")("num_procs", po::value<int>(),
                                            "how many processes (ranks) to start on this host")(
      "master_addr", po::value<std::string>()->default_value("127.0.0.1"),
      "address the rendezvous server binds and the ranks connect to (with a --hostfile: by default this "
      "machine's address towards the first host; 0.0.0.0 listens on every interface)")(
      "master_port", po::value<int>()->default_value(0), "its port; 0 lets the OS pick a free one")(
      "grace", po::value<double>()->default_value(10.0),
      "seconds between SIGTERM and SIGKILL when stopping the ranks after a failure")(
      "heartbeat_timeout", po::value<double>()->default_value(10.0),
      "seconds of silence after which the rendezvous declares a rank lost")(
      "dry-run", "print each rank's variables and command; start nothing")(
      "hostfile", po::value<std::string>(), "a host list, lines 'HOST slots=N' (instead of --num_procs)")(
      "include", po::value<std::string>(), "with --hostfile: only these hosts/slots, e.g. worker-0@worker-1:0,2")(
      "exclude", po::value<std::string>(), "with --hostfile: all but these hosts/slots")(
      "num_nodes", po::value<int>(), "with --hostfile: the first N hosts")(
      "num_gpus", po::value<int>(), "with --hostfile: slots 0..G-1 of each host")(
      "nnodes", po::value<int>(), "no ssh: the job spans N hosts, each started by hand or by a scheduler "
                                  "(with --node_rank, --nproc_per_node, --master_addr and --master_port)")(
      "node_rank", po::value<int>(), "with --nnodes: this host's index, 0..N-1 (node 0 hosts the rendezvous)")(
      "nproc_per_node", po::value<int>(), "with --nnodes: ranks on each host")(
      "new_token", "print a fresh job token (for DSA_JOB_TOKEN, which --nnodes needs on every host) and exit")(
      "launcher", po::value<std::string>()->default_value("ssh"),
      "with --hostfile: how ranks on other hosts start: ssh (one ssh per rank), mpirun (OpenMPI's) or slurm (srun)")(
      "max_restarts", po::value<int>()->default_value(0),
      "when a rank or host is lost, restart the job from its latest committed checkpoint up to N times, on the "
      "hosts that still answer (not with --nnodes, mpirun or slurm)")(
      "min_procs", po::value<int>()->default_value(1), "with --max_restarts: restart only on at least this many "
      "processes")(
      "min_nodes", po::value<int>()->default_value(1), "with --max_restarts and --hostfile: restart only on at least "
      "this many hosts of the list")(
      "max_procs", po::value<int>()->default_value(0), "with --max_restarts: start at most this many processes at a "
      "restart (default: the job's own count); a host of the list lost earlier that answers again rejoins")(
      "launcher_args", po::value<std::string>()->default_value(""),
      "extra arguments for mpirun or srun, split at spaces (e.g. \"--mca oob_tcp_if_include eth1\")");
  return opts;
}

// The job as the command line lays it out: N local processes (--num_procs), the slots of a
// host list (--hostfile, started over ssh or by a cluster launcher), or this host's share
// of a job whose hosts each run a launcher (--nnodes).
struct launch_layout {
  bool by_node = false, listed = false;
  int nnodes = 1, node_rank = 0, per_node = 1;
  std::string node_token;          // --nnodes: DSA_JOB_TOKEN, the same on every host
  std::vector<host_slots> hosts;   // --hostfile, selected
  std::optional<cluster_launcher> cluster;
  std::vector<std::string> launcher_args;
  double grace = 10, heartbeat = 10;
};

// A usage error: the message and the options, exit code 2.
struct usage {
  const po::options_description& opts;
  int operator()(const std::string& what) const {
    fmt::print(stderr, "dsactor launch: {}\n{}", what, fmt::to_string(fmt::streamed(opts)));
    return 2;
  }
};

// Without ssh (--nnodes): every host's launcher starts its own ranks; node 0's also hosts
// the rendezvous at --master_addr:--master_port, which every host must be given, with the
// same job token in DSA_JOB_TOKEN.
std::optional<int> read_node_layout(const po::variables_map& vm, const usage& fail, launch_layout& l) {
  l.by_node = vm.count("nnodes") > 0;
  if (!l.by_node) {
    if (vm.count("node_rank") || vm.count("nproc_per_node"))
      return fail("--node_rank and --nproc_per_node go with --nnodes");
    return std::nullopt;
  }
  if (vm.count("hostfile") || vm.count("num_procs"))
    return fail("--nnodes and --hostfile or --num_procs are mutually exclusive");
  if (!vm.count("node_rank") || !vm.count("nproc_per_node")) return fail("--nnodes needs --node_rank and --nproc_per_node");
  l.nnodes = vm["nnodes"].as<int>();
  l.node_rank = vm["node_rank"].as<int>();
  l.per_node = vm["nproc_per_node"].as<int>();
  if (l.nnodes < 1 || l.node_rank < 0 || l.node_rank >= l.nnodes || l.per_node < 1)
    return fail(fmt::format("--nnodes {} --node_rank {} --nproc_per_node {}: need nnodes >= 1, 0 <= "
                            "node_rank < nnodes and nproc_per_node >= 1", l.nnodes, l.node_rank, l.per_node));
  if (l.nnodes > 1 && (vm["master_addr"].defaulted() || vm["master_port"].as<int>() == 0))
    return fail("--nnodes > 1 needs --master_addr (node 0's address) and a fixed --master_port on every host");
  const char* t = std::getenv("DSA_JOB_TOKEN");
  if (!vm.count("dry-run") && (!t || !*t))
    return fail("--nnodes needs the job token in DSA_JOB_TOKEN, the same on every host (make one with "
                "'dsactor launch --new_token' and pass it as the scheduler passes variables)");
  l.node_token = t ? t : "";
  return std::nullopt;
}

// A host list: the hosts and slots to run on (tools/launch/hostfile.hpp), and how the ranks on
// other hosts start (ssh, mpirun or srun).
std::optional<int> read_host_layout(const po::variables_map& vm, const usage& fail, launch_layout& l) {
  l.listed = vm.count("hostfile") > 0;
  if (l.listed) {
    if (vm.count("num_procs")) return fail("--num_procs and --hostfile are mutually exclusive");
    auto entries = read_hostfile(vm["hostfile"].as<std::string>());
    if (!entries) return fail(entries.err().message);
    host_filter filter;
    if (vm.count("include")) filter.include = vm["include"].as<std::string>();
    if (vm.count("exclude")) filter.exclude = vm["exclude"].as<std::string>();
    if (vm.count("num_nodes")) filter.num_nodes = vm["num_nodes"].as<int>();
    if (vm.count("num_gpus")) filter.num_gpus = vm["num_gpus"].as<int>();
    auto selected = select_hosts(*entries, filter);
    if (!selected) return fail(selected.err().message);
    l.hosts = std::move(*selected);
  } else if (vm.count("include") || vm.count("exclude") || vm.count("num_nodes") || vm.count("num_gpus")) {
    return fail("--include, --exclude, --num_nodes and --num_gpus select from a --hostfile");
  } else if (!l.by_node && (!vm.count("num_procs") || vm["num_procs"].as<int>() < 1)) {
    return fail("--num_procs N (N >= 1) or --hostfile FILE is required");
  }
  const std::string launcher_name = vm["launcher"].as<std::string>();
  if (launcher_name == "mpirun" || launcher_name == "openmpi") l.cluster = cluster_launcher::mpirun;
  else if (launcher_name == "slurm") l.cluster = cluster_launcher::slurm;
  else if (launcher_name != "ssh")
    return fail("--launcher must be ssh, mpirun (or openmpi) or slurm, got '" + launcher_name + "'");
  if (l.cluster && !l.listed) return fail("--launcher " + launcher_name + " starts the ranks of a --hostfile");
  // mpirun and srun start every rank themselves, without each host's CUDA_VISIBLE_DEVICES: a
  // CUDA rank's device is then its local rank, which is its slot only when a host's slots are
  // 0..n-1. A CPU job does not care, so this is said, not refused.
  if (l.cluster)
    for (const auto& h : l.hosts)
      for (std::size_t i = 0; i < h.slots.size(); ++i)
        if (h.slots[i] != static_cast<int>(i)) {
          fmt::print(stderr,
                     "dsactor launch: warning: --launcher {}: host {} runs a rank for slot {} as its local rank {}; "
                     "mpirun and srun start the ranks without each host's CUDA_VISIBLE_DEVICES, so a CUDA rank "
                     "there would use GPU {}: select slots 0..n-1 (--num_gpus) or start over ssh for GPU jobs\n",
                     launcher_name, h.host, h.slots[i], i, i);
          i = h.slots.size(); // once per host
        }
  std::istringstream words(vm["launcher_args"].as<std::string>());
  for (std::string w; words >> w;) l.launcher_args.push_back(w);
  if (!l.launcher_args.empty() && !l.cluster) return fail("--launcher_args go to --launcher mpirun or slurm");
  return std::nullopt;
}

// The rendezvous address with a host list: this machine's address towards the first host
// (the interface the routing table picks for it), never every interface unless
// --master_addr 0.0.0.0 asks. A host that is this machine (its name may resolve to
// 127.0.1.1) routes through loopback, which the others cannot reach: the first host that
// does not decides.
std::optional<int> choose_master_addr(const po::variables_map& vm, const usage& fail, const launch_layout& l,
                                      launch_request& request) {
  if (!vm["master_addr"].defaulted()) return std::nullopt;
  for (const auto& h : l.hosts) {
    if (h.host == "localhost") continue;
    auto mine = net::local_address_towards(h.host);
    if (!mine && vm.count("dry-run")) { // nothing listens in a dry run
      request.master_addr = h.host;
      break;
    }
    if (!mine) return fail(mine.err().message + "; give --master_addr, an address of this machine the hosts reach");
    if (net::is_loopback(*mine)) continue; // this machine
    request.master_addr = *mine;
    break;
  }
  return std::nullopt;
}

// The request every rank's process is made from: how many, where the rendezvous is, the command.
std::optional<int> make_request(const po::variables_map& vm, const usage& fail, const launch_layout& l,
                                const split_args& args, launch_request& request) {
  request.master_addr = vm["master_addr"].as<std::string>();
  if (l.listed) {
    request.num_procs = 0;
    for (const auto& h : l.hosts) request.num_procs += static_cast<int>(h.slots.size());
    if (auto code = choose_master_addr(vm, fail, l, request)) return code;
  } else {
    request.num_procs = l.by_node ? l.nnodes * l.per_node : vm["num_procs"].as<int>();
  }
  request.master_port = vm["master_port"].as<int>();
  request.heartbeat_timeout_ms = static_cast<int>(l.heartbeat * 1000);
  auto program = args.general ? resolve_program(args.rest[0]) : self_executable();
  if (!program) {
    fmt::print(stderr, "dsactor launch: {}\n", program.err().message);
    return 2;
  }
  request.command.push_back(*program);
  if (!args.general) request.command.push_back("run");
  request.command.insert(request.command.end(), args.rest.begin() + (args.general ? 1 : 0), args.rest.end());
  return std::nullopt;
}

// This host's processes.
std::vector<process_spec> plan_here(const launch_layout& l, const launch_request& request) {
  return l.by_node ? make_node_plan(request, l.nnodes, l.node_rank, l.per_node)
         : l.listed ? make_host_plan(request, l.hosts)
                    : make_local_plan(request);
}

// --dry-run: each rank's variables and command, and the cluster launcher's own words.
int print_dry_run(const usage& fail, const launch_layout& l, const launch_request& request) {
  const auto plan = plan_here(l, request);
  std::string via; // mpirun's or srun's own words, before the program
  if (l.cluster) {
    const char* name = *l.cluster == cluster_launcher::mpirun ? "mpirun" : "srun";
    auto path = resolve_program(name);
    auto one = through_cluster_launcher(*l.cluster, path ? *path : name, plan, l.hosts, l.launcher_args, {});
    if (!one) return fail(one.err().message);
    for (std::size_t i = 0; i + plan.front().argv.size() < one->argv.size(); ++i)
      via += (via.empty() ? "" : " ") + shell_quote(one->argv[i]);
  }
  // A --nnodes host names itself: its processes are this machine's.
  std::string here;
  if (l.by_node) {
    char name[256] = {};
    here = ::gethostname(name, sizeof name - 1) == 0 ? fmt::format("host {} ", name) : "";
  }
  for (auto spec : plan) {
    if (l.cluster) // mpirun and srun start the ranks without each host's CUDA_VISIBLE_DEVICES
      spec.env.erase(std::remove_if(spec.env.begin(), spec.env.end(),
                                    [](const auto& kv) { return kv.first == "CUDA_VISIBLE_DEVICES"; }),
                     spec.env.end());
    fmt::print("{}{}{}\n", here, describe(spec, request.num_procs), via.empty() ? "" : "  (started by: " + via + ")");
  }
  return 0;
}

// How ranks on other hosts start: over OpenSSH (localhost ones here) or one mpirun/srun,
// in this directory, with their variables and the forwarded ones (NCCL_*, UCX_*, .dsactor_env).
struct remote_start {
  bool remote = false;
  std::string ssh, cwd, cluster_program;
  std::vector<std::pair<std::string, std::string>> forwarded;
};

std::optional<int> prepare_remote_start(const po::variables_map& vm, const usage& fail, const launch_layout& l,
                                        remote_start& r) {
  r.remote = l.listed && std::any_of(l.hosts.begin(), l.hosts.end(),
                                     [](const host_slots& h) { return h.host != "localhost"; });
  if (l.cluster) {
    auto found = resolve_program(*l.cluster == cluster_launcher::mpirun ? "mpirun" : "srun");
    if (!found) return fail("--launcher " + vm["launcher"].as<std::string>() + ": " + found.err().message);
    r.cluster_program = *found;
  }
  if (!r.remote && !l.cluster) return std::nullopt;
  if (!l.cluster) {
    auto client = resolve_program("ssh");
    if (!client) return fail("ranks on other hosts start over ssh: " + client.err().message);
    r.ssh = *client;
  }
  char here[PATH_MAX];
  if (!::getcwd(here, sizeof here)) return fail("cannot read the working directory");
  r.cwd = here;
  const char* home = std::getenv("HOME");
  auto env = forwarded_environment(home ? home : "", r.cwd);
  if (!env) return fail(env.err().message);
  r.forwarded = std::move(*env);
  return std::nullopt;
}

// Hosts the rendezvous (except on the hosts other than node 0 of a --nnodes job), starts
// this host's ranks and supervises them until every one has ended.
int start_and_supervise(const usage& fail, const launch_layout& l, const remote_start& r, launch_request& request,
                        swap_janitor& janitor, bool dsactor_run, attempt_end& end) {
  std::unique_ptr<net::rendezvous_server> server;
  supervise_options supervise;
  supervise.grace = std::chrono::milliseconds(static_cast<long long>(l.grace * 1000));
  // Ctrl-C reaches ranks on other hosts through the rendezvous, not as a signal.
  supervise.on_interrupt = [&server, &end] {
    end.interrupted = true;
    if (server) server->interrupt();
  };
  // SIGUSR1 too: every rank, on every host, writes a flight record.
  supervise.on_flight_request = [&server, dsactor_run] {
    if (!server || !dsactor_run) return false; // a -- PROGRAM does not hear the rendezvous: signals
    server->request_flight_dumps();
    return true;
  };
  supervise.remote_ranks_hear_rendezvous = dsactor_run;
  process_group group(supervise); // its signal handlers are in place before any rank starts
  net::rendezvous_options rendezvous;
  rendezvous.heartbeat_timeout = std::chrono::milliseconds(request.heartbeat_timeout_ms);
  rendezvous.heartbeat_interval =
      std::min(rendezvous.heartbeat_interval, std::max(std::chrono::milliseconds(1), rendezvous.heartbeat_timeout / 4));
  if (!l.by_node || l.node_rank == 0) {
    auto started = net::rendezvous_server::start(request.master_addr, request.master_port, request.job_token,
                                                 request.num_procs, rendezvous, [&group, &end](const net::server_event& e) {
                                                   if (e.what == net::server_event::kind::failed) {
                                                     if (end.rendezvous_cause.empty()) end.rendezvous_cause = e.text;
                                                     group.fail("rendezvous: " + e.text, e.rank);
                                                   }
                                                 });
    if (!started) {
      fmt::print(stderr, "dsactor launch: {}\n", started.err().message);
      return 1;
    }
    server = std::move(*started);
    request.master_port = server->port();
  }
  if (l.cluster) { // one mpirun or srun starts every rank
    auto one = through_cluster_launcher(*l.cluster, r.cluster_program, make_host_plan(request, l.hosts), l.hosts,
                                        l.launcher_args, r.forwarded);
    if (!one) return fail(one.err().message);
    if (auto started = group.spawn_rank(*one); !started) {
      fmt::print(stderr, "dsactor launch: {}\n", started.err().message);
      return 1;
    }
  }
  for (const auto& spec : l.cluster ? std::vector<process_spec>{} : plan_here(l, request)) {
    if (auto started = group.spawn_rank(r.remote ? over_ssh(spec, r.ssh, r.cwd, r.forwarded) : spec); !started) {
      fmt::print(stderr, "dsactor launch: {}\n", started.err().message);
      return 1; // the group's destructor kills the ranks already started
    }
  }
  int code = group.supervise([&](int rank, const std::string& how) {
    if (rank >= 0 && end.cause.empty() && how != "exited with code 0") end.cause = fmt::format("rank {} {}", rank, how);
    if (rank >= 0 && server) server->process_exited(rank, how); // not mpirun's or srun's own end
  });
  if (server) server->stop();
  // Every rank has ended: the swap folders of those that died are this launcher's to remove.
  for (const auto& removed : janitor.sweep())
    fmt::print(stderr, "dsactor launch: removed {} (its rank ended without removing them)\n", removed);
  end.code = code;
  return code;
}

} // namespace

int cmd_launch(int argc, char** argv) {
  const po::options_description opts = launch_options();
  split_args args = split(argc, argv, opts);
  std::vector<char*> own;
  for (auto& a : args.own) own.push_back(a.data());
  po::variables_map vm;
  if (auto done = parse_options(static_cast<int>(own.size()), own.data(), opts, vm, "launch", epilog)) return *done;
  const usage fail{opts};
  if (vm.count("new_token")) {
    auto fresh = random_job_token();
    if (!fresh) {
      fmt::print(stderr, "dsactor launch: no job token: {}\n", fresh.err().message);
      return 1;
    }
    fmt::print("{}\n", *fresh);
    return 0;
  }
  launch_layout layout;
  if (auto code = read_node_layout(vm, fail, layout)) return *code;
  if (auto code = read_host_layout(vm, fail, layout)) return *code;
  if (args.rest.empty())
    return fail(args.general ? "a PROGRAM is required after --" : "a CONFIG file, or -- PROGRAM, is required");
  layout.grace = vm["grace"].as<double>();
  layout.heartbeat = vm["heartbeat_timeout"].as<double>();
  if (!(layout.grace >= 0) || !(layout.heartbeat >= 0.001 && layout.heartbeat <= 86400))
    return fail("--grace must be >= 0 and --heartbeat_timeout within 0.001..86400 seconds");
  restart_limits limits;
  limits.max_restarts = vm["max_restarts"].as<int>();
  limits.min_procs = vm["min_procs"].as<int>();
  limits.max_procs = vm["max_procs"].as<int>();
  limits.min_nodes = vm["min_nodes"].as<int>();
  std::vector<std::string> bounds_given;
  for (const char* flag : {"min_procs", "min_nodes", "max_procs"})
    if (!vm[flag].defaulted()) bounds_given.emplace_back(flag);
  if (auto why = check_restart_limits(limits, bounds_given, layout.listed ? &layout.hosts : nullptr))
    return fail(*why);
  const int max_restarts = limits.max_restarts;
  if (max_restarts > 0 && layout.cluster)
    return fail("--max_restarts with --launcher " + vm["launcher"].as<std::string>() +
                ": restarts are the cluster launcher's business (mpirun's or Slurm's own options)");
  if (max_restarts > 0 && layout.by_node)
    return fail("--max_restarts needs one launcher that starts every rank (--num_procs or --hostfile); with "
                "--nnodes each host's launcher starts its own, so restart the job through the scheduler");
  launch_request request;
  if (auto code = make_request(vm, fail, layout, args, request)) return *code;
  if (max_restarts > 0 && !args.general) pin_run_dir(args.rest[0]);
  if (vm.count("dry-run")) return print_dry_run(fail, layout, request);
  remote_start remote;
  if (auto code = prepare_remote_start(vm, fail, layout, remote)) return *code;
  auto token = layout.by_node ? expected<std::string>(layout.node_token) : random_job_token();
  if (!token) {
    fmt::print(stderr, "dsactor launch: no job token: {}\n", token.err().message);
    return 1;
  }
  request.job_token = *token;
  // This host's ranks register their NVMe swap folders with it (not under mpirun or srun,
  // which may pass the launcher's environment to other hosts).
  swap_janitor janitor(!layout.cluster);
  auto start = [&](attempt_end& end) {
    return start_and_supervise(fail, layout, remote, request, janitor, !args.general, end);
  };
  if (max_restarts == 0) {
    attempt_end end;
    return start(end);
  }
  const restart_hosts hosts{layout.listed ? &layout.hosts : nullptr, remote.ssh, &remote.remote};
  return run_attempts(request, limits, !args.general, hosts, start);
}

} // namespace dsa::tools
