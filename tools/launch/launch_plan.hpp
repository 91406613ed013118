// What `dsactor launch` starts: one process_spec per rank (its command and the variables a
// launcher sets, named as DeepSpeed and torchrun name them), and the job token.
#pragma once

#include "core/error.hpp"
#include "tools/launch/hostfile.hpp"

#include <string>
#include <utility>
#include <vector>

namespace dsa::tools {

struct launch_request {
  int num_procs = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;              // the rendezvous server's; 0 in a dry run before binding
  std::string job_token;            // "" in a dry run
  int heartbeat_timeout_ms = 10000; // the rendezvous server's, passed on to the ranks
  std::vector<std::string> command; // every rank's argv: program first
};

// One process of the job. A host-list launcher would add the host and run the same spec
// through ssh; spawn_rank (process_group.hpp) is the one place a spec becomes a process.
struct process_spec {
  std::string host; // from a hostfile; "" for this host
  int rank = 0;
  int local_rank = 0;
  std::vector<std::string> argv;
  // Set on top of the launcher's environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE,
  // CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT, DSA_JOB_TOKEN, DSA_HEARTBEAT_TIMEOUT_MS.
  std::vector<std::pair<std::string, std::string>> env;
  // Written to the process's standard input, then closed (empty: stdin is /dev/null). A
  // rank started over ssh reads its job token from there, so that no command line shows it.
  std::string stdin_text;
  // What the launcher calls the process in its messages and output prefix, when it is not
  // one rank (mpirun or srun starting them all; then rank is -1); empty: "rank N".
  std::string label;
};

// The processes of a one-host job: ranks 0..num_procs-1, local rank = rank.
std::vector<process_spec> make_local_plan(const launch_request& request);

// This host's processes of a job started host by host, by hand or by a scheduler, without
// ssh (torchrun's --nnodes/--node_rank): node `node_rank` of `nnodes` runs ranks
// node_rank * per_node .. + per_node - 1 (LOCAL_RANK 0.., CROSS_RANK node_rank).
std::vector<process_spec> make_node_plan(const launch_request& request, int nnodes, int node_rank, int per_node);

// The processes of a job over hosts (host_slots from hostfile.hpp): ranks host by host in
// the list's order, then slot by slot; LOCAL_RANK counts a host's processes, CROSS_RANK is
// the host's index; DSA_SLOT names the slot; CUDA_VISIBLE_DEVICES lists the host's selected
// slots (DeepSpeed's mapping: a CUDA rank's device is its local rank among them, so slot
// DSA_SLOT). request.num_procs is ignored.
std::vector<process_spec> make_host_plan(const launch_request& request, const std::vector<host_slots>& hosts);

// The line --dry-run prints: "RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 'prog' 'arg'", arguments
// quoted for a POSIX shell where they need it; "host HOST " first for a spec with a host,
// and " CUDA_VISIBLE_DEVICES=0,2 (device 1: GPU slot 2)" after WORLD_SIZE for one that maps
// GPUs (a host list's).
std::string describe(const process_spec& spec, int world_size);

// `word` quoted for a POSIX shell where it needs quoting (as it would be for ssh).
std::string shell_quote(const std::string& word);

// `spec` run on its host over OpenSSH: `ssh -o BatchMode=yes -o ConnectTimeout=30 HOST 'IFS= read -r
// DSA_JOB_TOKEN && export DSA_JOB_TOKEN && cd CWD && exec env K=V...
// PROGRAM ARGS'`, with the spec's variables and `forwarded` ones (NCCL_*, UCX_*, the
// .dsactor_env files': forwarded_environment) set on the remote side. `ssh` is the client
// program (resolved in PATH by the caller). A spec for localhost is returned unchanged.
process_spec over_ssh(const process_spec& spec, const std::string& ssh, const std::string& cwd,
                      const std::vector<std::pair<std::string, std::string>>& forwarded);

// The cluster launchers `dsactor launch --launcher` drives instead of ssh.
enum class cluster_launcher { mpirun, slurm };

// One process that starts every process of `plan` (make_host_plan over `hosts`) through
// OpenMPI's mpirun (`mpirun -np N --host h0:2,h1:2 --tag-output -x NAME... ARGS... PROGRAM ARGS`: ranks
// host by host, slot by slot, as the plan; each rank reads OMPI_COMM_WORLD_RANK and
// _LOCAL_RANK) or Slurm's srun (`srun --nodes H --ntasks N --ntasks-per-node S --nodelist
// h0,h1 --export=ALL ARGS... PROGRAM ARGS`, which needs as many slots on every host; ranks
// read SLURM_PROCID and SLURM_LOCALID). The job's common variables (WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, DSA_JOB_TOKEN, ...; not a host's CUDA_VISIBLE_DEVICES, which
// differs between hosts) and `forwarded` are set in the process's
// environment and passed on by name (mpirun's -x NAME, srun's --export=ALL), so no command
// line shows the token. `program` is mpirun's or srun's path, `extra` --launcher_args. An
// srun over hosts of unequal slots is an error.
expected<process_spec> through_cluster_launcher(cluster_launcher which, const std::string& program,
                                                const std::vector<process_spec>& plan,
                                                const std::vector<host_slots>& hosts,
                                                const std::vector<std::string>& extra,
                                                const std::vector<std::pair<std::string, std::string>>& forwarded);

// Whether a variable of the launcher's environment goes to remote ranks: NCCL_*, UCX_*,
// and what chooses kernels, so that every rank of a job computes the same bits: OPENBLAS_*
// (OPENBLAS_CORETYPE picks OpenBLAS's kernels) and DSA_CPU_ISA. Not OMP_*: thread counts
// do not change dsactor's bits, and each host keeps its own.
bool forwarded_name(const std::string& name);

// The variables a remote rank gets beyond its own: every forwarded_name() variable of the
// launcher's environment, then the KEY=VALUE lines of ~/.dsactor_env and ./.dsactor_env
// (in that order, later ones winning; '#' comments and blank lines skipped). A malformed
// line is an error naming the file and line.
expected<std::vector<std::pair<std::string, std::string>>> forwarded_environment(const std::string& home,
                                                                                  const std::string& cwd);

// 32 hexadecimal characters from /dev/urandom.
expected<std::string> random_job_token();

// argv[0] resolved as execvp would (a name without '/' searched in PATH), so that a
// missing program is an error before anything starts, and the child only calls execve.
expected<std::string> resolve_program(const std::string& program);

} // namespace dsa::tools
