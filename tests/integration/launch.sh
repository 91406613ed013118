#!/usr/bin/env bash
# Integration: `dsactor launch` starting real processes (tests/net/rendezvous_probe.cpp, and
# shell scripts): rank prefixes and the environment, stdout and stderr kept apart, a failing
# rank, kill -9 of a rank, SIGKILL after the grace period, a wrong token, differing configs,
# Ctrl-C passed on, --dry-run, usage errors. No fixed ports: the launcher binds port 0.
# Usage: launch.sh PATH/TO/dsactor PATH/TO/rendezvous_probe
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
probe=$(realpath "$2")
launcher_pid=
cleanup() { [[ -n $launcher_pid ]] && kill -9 "$launcher_pid" 2>/dev/null || true; }
# The whole of out and err, not their tails: the probe's lines are few.
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/out "$work"/err; do [[ -f $f ]] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}
# Waits (at most 30 s) until FILE holds at least COUNT lines matching PATTERN.
wait_for_lines() {
  local file=$1 pattern=$2 count=$3
  for _ in $(seq 600); do
    [[ $(grep -c -- "$pattern" "$file" 2>/dev/null || true) -ge $count ]] && return 0
    sleep 0.05
  done
  fail "waited 30 s for $count line(s) matching '$pattern' in $file"
}
launch() { "$dsactor" launch "$@" >"$work/out" 2>"$work/err"; }

# 1. Two ranks join and leave: prefixes, environment, streams kept apart.
launch --num_procs 2 -- "$probe" --config train_steps=4 || fail "a clean 2-rank job should exit 0"
for r in 0 1; do
  grep -qx "\[rank $r\] env RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=[0-9]* TOKEN_CHARS=32 PID=[0-9]*" "$work/out" ||
    fail "rank $r's environment line"
  grep -qx "\[rank $r\] joined: blob0,blob1" "$work/out" || fail "rank $r did not get both blobs"
  grep -qx "\[rank $r\] left" "$work/out" || fail "rank $r did not leave"
  grep -qx "\[rank $r\] probe rank $r writes this to stderr" "$work/err" || fail "rank $r's stderr line"
done
grep -q "writes this to stderr" "$work/out" && fail "stderr lines reached stdout"
grep -v '^\[rank [01]\] ' "$work/out" && fail "an unprefixed stdout line"
[[ $(grep -o 'MASTER_PORT=[0-9]*' "$work/out" | sort -u | wc -l) -eq 1 ]] || fail "ranks saw different ports"
grep -q 'MASTER_PORT=0 ' "$work/out" && fail "MASTER_PORT should be the port the server bound"
echo "ok: 2 ranks, prefixes, environment, stdout and stderr apart"

# 1b. OpenMP settings: dsactor alone on the host spins briefly; a launcher gives each of its
# 2 ranks here no spinning, also programs that are not dsactor; a choice inherited from
# another dsactor process is made again; a user's setting is passed on as it is.
clean=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u DSA_OMP_ENV -u LOCAL_SIZE -u LOCAL_WORLD_SIZE
  -u OMPI_COMM_WORLD_LOCAL_SIZE -u MPI_LOCALNRANKS -u SLURM_NTASKS_PER_NODE -u SLURM_STEP_TASKS_PER_NODE)
"${clean[@]}" "$dsactor" report >"$work/out" 2>"$work/err" || fail "dsactor report"
grep -q "^openmp *: OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000 (dsactor set .*, pid [0-9]*: one rank on this host)" \
  "$work/out" || fail "one process's OpenMP line"
"${clean[@]}" LOCAL_SIZE=2 OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000 \
  DSA_OMP_ENV="OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000 (pid 1: one rank on this host)" \
  "$dsactor" report >"$work/out" 2>"$work/err" || fail "dsactor report with an inherited choice"
grep -q "^openmp *: OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=0 (dsactor set .*: 2 ranks on this host, so no spinning)" \
  "$work/out" || fail "an inherited choice should be made again"
"${clean[@]}" "$dsactor" launch --num_procs 2 -- "$dsactor" report >"$work/out" 2>"$work/err" || fail "launch of dsactor report"
for r in 0 1; do
  grep -q "^\[rank $r\] openmp *: OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=0 (dsactor set .*: 2 ranks on this host, so no spinning)" \
    "$work/out" || fail "rank $r's OpenMP line (no spinning with 2 ranks on the host)"
done
"${clean[@]}" "$dsactor" launch --num_procs 2 -- /usr/bin/env >"$work/out" 2>"$work/err" || fail "launch of env"
for r in 0 1; do
  grep -qx "\[rank $r\] GOMP_SPINCOUNT=0" "$work/out" || fail "rank $r (not dsactor) should get GOMP_SPINCOUNT=0"
done
"${clean[@]}" GOMP_SPINCOUNT=77 "$dsactor" launch --num_procs 2 -- "$dsactor" report >"$work/out" 2>"$work/err" ||
  fail "launch with the user's spin count"
for r in 0 1; do
  grep -q "^\[rank $r\] openmp *: OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=77 (dsactor set OMP_WAIT_POLICY=passive, .*GOMP_SPINCOUNT is the user's)" \
    "$work/out" || fail "rank $r's OpenMP line (the user's spin count)"
done
"${clean[@]}" OMP_WAIT_POLICY=active GOMP_SPINCOUNT=77 \
  "$dsactor" launch --num_procs 2 -- "$dsactor" report >"$work/out" 2>"$work/err" || fail "launch with the user's settings"
for r in 0 1; do
  grep -q "^\[rank $r\] openmp *: OMP_WAIT_POLICY=active GOMP_SPINCOUNT=77 (as set by the user)" "$work/out" ||
    fail "rank $r's OpenMP line (the user's settings)"
done
echo "ok: OpenMP settings chosen per process, the user's passed on"

# 2. A rank exiting 3: the launcher exits non-zero naming rank 1; the other rank stops.
rc=0
launch --num_procs 2 -- "$probe" --exit-rank 1 --exit-code 3 --wait-lost || rc=$?
[[ $rc -eq 3 ]] || fail "a rank exiting 3 should make the launcher exit 3 (got $rc)"
grep -q "dsactor launch: rank 1 exited with code 3" "$work/err" || fail "the launcher should name rank 1 and its code"
grep -q "dsactor launch: the job failed: " "$work/err" || fail "no failure summary"
echo "ok: a rank exiting 3"

# Launches 2 probes (extra launcher options: $2...), rank 1 hanging and rank 0 waiting for
# a loss, sends rank 1 signal $1 and waits for the launcher; sets rc. Fails after 30 s.
signal_hanging_rank() {
  local sig=$1
  shift
  "$dsactor" launch --num_procs 2 "$@" -- "$probe" --hang-rank 1 --wait-lost >"$work/out" 2>"$work/err" &
  launcher_pid=$!
  wait_for_lines "$work/out" '^\[rank 1\] hanging' 1
  local victim start=$SECONDS
  victim=$(sed -n 's/^\[rank 1\] env .* PID=\([0-9]*\)$/\1/p' "$work/out")
  kill "-$sig" "$victim"
  rc=0
  wait "$launcher_pid" || rc=$?
  launcher_pid=
  ((SECONDS - start < 30)) || fail "the job took $((SECONDS - start)) s to end after SIG$sig"
  [[ $rc -ne 0 ]] || fail "SIG$sig to a rank should make the launcher exit non-zero"
}

# 3. kill -9 of rank 1 while rank 0 waits: everything ends non-zero within 30 s, rank 1 named.
signal_hanging_rank KILL
grep -q "dsactor launch: rank 1 was killed by signal 9 (SIGKILL)" "$work/err" || fail "rank 1's SIGKILL not named"
grep -Eq "dsactor launch: rank 0 (exited with code 1|was killed by signal 15)" "$work/err" || fail "rank 0 should have stopped"
echo "ok: kill -9 of a rank stops the job"

# 3b. A rank that stops answering (SIGSTOP): lost after --heartbeat_timeout, the job ends.
signal_hanging_rank STOP --heartbeat_timeout 2
grep -q "dsactor launch: rendezvous: rank 1 lost (no heartbeat for [0-9]* ms)" "$work/err" || fail "the stopped rank 1 not named"
grep -q "dsactor launch: rank 1 was killed by signal 15 (SIGTERM)" "$work/err" || fail "rank 1 should end by SIGTERM (sent with SIGCONT)"
echo "ok: a stopped rank is lost by missed heartbeats"

# 4. A rank that ignores SIGTERM is killed after the grace period.
cat >"$work/stubborn.sh" <<SH
if [ "\$RANK" = 1 ]; then
  while [ ! -e "$work/ready" ]; do sleep 0.05; done
  exit 3
fi
trap '' TERM
touch "$work/ready"
while :; do sleep 0.05; done
SH
rc=0
launch --num_procs 2 --grace 0.5 -- sh "$work/stubborn.sh" || rc=$?
[[ $rc -eq 3 ]] || fail "the stubborn job should exit 3 (got $rc)"
grep -q "rank 0 still runs 500 ms after SIGTERM; sending SIGKILL" "$work/err" || fail "no SIGKILL after the grace period"
grep -q "rank 0 was killed by signal 9 (SIGKILL)" "$work/err" || fail "rank 0 should end by SIGKILL"
echo "ok: SIGKILL after the grace period"

# 5. A process presenting a wrong token is refused and logged with its address.
rc=0
launch --num_procs 2 -- sh -c 'if [ "$RANK" = 1 ]; then DSA_JOB_TOKEN=guess; fi; exec "$0" --wait-lost' "$probe" || rc=$?
[[ $rc -ne 0 ]] || fail "a refused rank should fail the job"
grep -q "rendezvous: refused the connection from 127.0.0.1:[0-9]*: wrong job token" "$work/err" || fail "the refusal was not logged"
grep -q "\[rank 1\] join failed: .*wrong job token" "$work/err" || fail "rank 1 should read why it was refused"
grep -q "guess" "$work/err" && fail "the presented token was logged"
echo "ok: a wrong token is refused and logged"

# 6. Differing configs are refused at the rendezvous, naming the key and the ranks.
rc=0
launch --num_procs 2 -- sh -c 'exec "$0" --config "optimizer.params.lr=0.00$RANK" --config train_steps=4' "$probe" || rc=$?
[[ $rc -ne 0 ]] || fail "differing configs should fail the job"
grep -q "rank 1's config differs from rank 0's: optimizer.params.lr = 0.000 vs 0.001" "$work/err" || fail "the differing key was not named"
echo "ok: differing configs are refused"

# 7. Ctrl-C (SIGINT to the launcher) reaches every rank once.
"$dsactor" launch --num_procs 2 -- sh -c 'trap "echo got INT; exit 130" INT; echo ready; while :; do sleep 0.05; done' \
  >"$work/out" 2>"$work/err" &
launcher_pid=$!
wait_for_lines "$work/out" 'ready$' 2
kill -INT "$launcher_pid"
rc=0
wait "$launcher_pid" || rc=$?
launcher_pid=
[[ $rc -eq 130 ]] || fail "an interrupted job should exit 130 (got $rc)"
for r in 0 1; do
  [[ $(grep -c "^\[rank $r\] got INT" "$work/out") -eq 1 ]] || fail "rank $r should get SIGINT once"
done
echo "ok: SIGINT passed on"

# 8. --dry-run prints each rank's command and starts nothing.
launch --num_procs 2 --dry-run no-such.toml --set 'optimizer.params.lr=1e-4' --resume || fail "--dry-run"
[[ $(wc -l <"$work/out") -eq 2 ]] || fail "--dry-run should print one line per rank"
for r in 0 1; do
  grep -qx "RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 $dsactor run no-such.toml --set optimizer.params.lr=1e-4 --resume" "$work/out" ||
    fail "--dry-run line of rank $r"
done
launch --num_procs 3 --dry-run -- sh -c 'echo $RANK' || fail "--dry-run of a program"
grep -qx "RANK=2 LOCAL_RANK=2 WORLD_SIZE=3 $(command -v sh) -c 'echo \$RANK'" "$work/out" || fail "--dry-run quoting"
echo "ok: --dry-run"

# 9. Usage errors exit 2 and say why.
rc=0; launch -- true || rc=$?
[[ $rc -eq 2 ]] && grep -q "num_procs" "$work/err" || fail "a missing --num_procs should exit 2"
rc=0; launch --num_procs 2 -- no-such-program-xyz || rc=$?
[[ $rc -eq 2 ]] && grep -q "'no-such-program-xyz' was not found in PATH" "$work/err" || fail "a missing program should exit 2"
rc=0; launch --num_procs 2 || rc=$?
[[ $rc -eq 2 ]] && grep -q "a CONFIG file, or -- PROGRAM, is required" "$work/err" || fail "no command should exit 2"
echo "ok: usage errors"

# 10. A host list (DeepSpeed's hostfile, --include/--exclude/--num_nodes/--num_gpus): the
#     dry run names each process's host, ranks host by host; a list naming only localhost
#     runs here with the hosts' variables; hostfile and filter errors exit 2 naming them.
printf '# two hosts\nworker-0 slots=2\n\nworker-1 slots=3  # three\n' >"$work/hosts"
launch --hostfile "$work/hosts" --include 'worker-1:0,2@worker-0:1' --dry-run -- true || fail "hostfile --dry-run"
[[ "$(cut -d' ' -f1-5 "$work/out")" == "host worker-0 RANK=0 LOCAL_RANK=0 WORLD_SIZE=3
host worker-1 RANK=1 LOCAL_RANK=0 WORLD_SIZE=3
host worker-1 RANK=2 LOCAL_RANK=1 WORLD_SIZE=3" ]] || fail "--include should pick worker-0 slot 1 and worker-1 slots 0 and 2"
# The GPU mapping, DeepSpeed's: a host's selected slots are its visible devices, and a rank's
# device is its local rank among them.
[[ "$(cut -d' ' -f6-11 "$work/out")" == "CUDA_VISIBLE_DEVICES=1 (device 0: GPU slot 1)
CUDA_VISIBLE_DEVICES=0,2 (device 0: GPU slot 0)
CUDA_VISIBLE_DEVICES=0,2 (device 1: GPU slot 2)" ]] || fail "each rank's device under --include"
# mpirun and srun do not set each host's CUDA_VISIBLE_DEVICES: it is not passed on (-x) nor
# shown, and slots other than 0..n-1 get a warning naming the host and slot.
launch --hostfile "$work/hosts" --include 'worker-1:0,2' --launcher mpirun --dry-run -- true ||
  fail "mpirun over a slot selection should still run"
grep -q "warning: --launcher mpirun: host worker-1 runs a rank for slot 2 as its local rank 1" "$work/err" ||
  fail "mpirun with GPU slots other than 0..n-1 should be warned about, naming the host and slot"
grep -q -- "-x CUDA_VISIBLE_DEVICES\|CUDA_VISIBLE_DEVICES=" "$work/out" && fail "mpirun must not pass one host's CUDA_VISIBLE_DEVICES to all"
launch --hostfile "$work/hosts" --exclude 'worker-0' --num_gpus 1 --dry-run -- true && fail "--exclude with --num_gpus was accepted"
grep -q "cannot be combined with --num_nodes or --num_gpus" "$work/err" || fail "exclusive filters not named"
launch --hostfile "$work/hosts" --num_nodes 1 --num_gpus 1 --dry-run -- true || fail "--num_nodes/--num_gpus"
[[ "$(cut -d" " -f1-5 "$work/out")" == "host worker-0 RANK=0 LOCAL_RANK=0 WORLD_SIZE=1" ]] || fail "--num_nodes 1 --num_gpus 1"
for bad in "--include worker-9" "--include worker-1:5" "--num_procs 2"; do
  rc=0; launch --hostfile "$work/hosts" $bad --dry-run -- true || rc=$?
  [[ $rc -eq 2 ]] || fail "$bad should exit 2"
done
grep -q "mutually exclusive" "$work/err" || fail "--num_procs with --hostfile not named"
printf 'a slots=1\na slots=2\n' >"$work/dup"
rc=0; launch --hostfile "$work/dup" --dry-run -- true || rc=$?
[[ $rc -eq 2 ]] && grep -q "hostfile $work/dup line 2: host a is listed twice" "$work/err" || fail "a duplicate host"
: >"$work/empty"
rc=0; launch --hostfile "$work/empty" --dry-run -- true || rc=$?
[[ $rc -eq 2 ]] && grep -q "lists no hosts" "$work/err" || fail "an empty hostfile"
# --launcher mpirun and slurm: one line per process, with the command that starts them all;
# srun needs as many slots on every host; either needs a host list.
launch --hostfile "$work/hosts" --launcher mpirun --launcher_args "--allow-run-as-root" --dry-run -- true ||
  fail "--launcher mpirun --dry-run"
[[ $(wc -l <"$work/out") -eq 5 ]] || fail "mpirun --dry-run: one line per process"
grep -q "^host worker-1 RANK=4 LOCAL_RANK=2 WORLD_SIZE=5 .*(started by: .*mpirun -np 5 --host worker-0:2,worker-1:3 --tag-output -x WORLD_SIZE .*-x DSA_JOB_TOKEN .*--allow-run-as-root)$" "$work/out" ||
  fail "mpirun --dry-run line: $(tail -1 "$work/out")"
launch --hostfile "$work/hosts" --launcher slurm --num_gpus 2 --dry-run -- true || fail "--launcher slurm --dry-run"
grep -q "(started by: .*srun --nodes 2 --ntasks 4 --ntasks-per-node 2 --nodelist worker-0,worker-1 --export=ALL)$" "$work/out" ||
  fail "srun --dry-run line: $(tail -1 "$work/out")"
rc=0; launch --hostfile "$work/hosts" --launcher slurm --dry-run -- true || rc=$?
[[ $rc -eq 2 ]] && grep -q "as many ranks on every host; worker-0 has 2 slots and worker-1 has 3" "$work/err" ||
  fail "srun over unequal slots"
rc=0; launch --num_procs 2 --launcher mpirun --dry-run -- true || rc=$?
[[ $rc -eq 2 ]] && grep -q "starts the ranks of a --hostfile" "$work/err" || fail "--launcher mpirun without a host list"
# --nnodes: this host's ranks only; the rendezvous address, port and token are required.
launch --nnodes 2 --node_rank 1 --nproc_per_node 2 --master_addr 10.9.9.9 --master_port 29500 --dry-run -- true ||
  fail "--nnodes --dry-run"
[[ "$(cut -d' ' -f3-5 "$work/out")" == "RANK=2 LOCAL_RANK=0 WORLD_SIZE=4
RANK=3 LOCAL_RANK=1 WORLD_SIZE=4" ]] || fail "--nnodes 2 --node_rank 1 should plan ranks 2 and 3: $(cat "$work/out")"
grep -q "^host $(hostname) " "$work/out" || fail "--nnodes --dry-run should name this host"
rc=0; env -u DSA_JOB_TOKEN "$dsactor" launch --nnodes 2 --node_rank 1 --nproc_per_node 2 --master_addr 10.9.9.9 \
  --master_port 29500 -- true >"$work/out" 2>"$work/err" || rc=$?
[[ $rc -eq 2 ]] && grep -q "needs the job token in DSA_JOB_TOKEN" "$work/err" || fail "--nnodes without a token"
rc=0; launch --nnodes 2 --node_rank 1 --nproc_per_node 2 --master_addr 10.9.9.9 --dry-run -- true || rc=$?
[[ $rc -eq 2 ]] && grep -q "a fixed --master_port" "$work/err" || fail "--nnodes without a port"
rc=0; launch --nnodes 2 --node_rank 2 --nproc_per_node 2 --master_addr 10.9.9.9 --master_port 1 --dry-run -- true || rc=$?
[[ $rc -eq 2 ]] && grep -q "0 <= node_rank < nnodes" "$work/err" || fail "--node_rank out of range"
rc=0; launch --hostfile "$work/hosts" --launcher pdsh --dry-run -- true || rc=$?
[[ $rc -eq 2 ]] && grep -q "must be ssh, mpirun (or openmpi) or slurm" "$work/err" || fail "an unknown launcher"
# Remote hosts start over ssh. A stand-in ssh (first in PATH) checks BatchMode and runs the
# remote command here, saying which host it was for; host "down" fails as ssh does (255).
# It records its command lines: the job token must not be on them (it goes through stdin).
# (Real hosts, network namespaces with an sshd each: tests/integration/multihost.sh.)
mkdir -p "$work/bin"
cat >"$work/bin/ssh" <<'SSH'
#!/bin/sh
printf '%s\n' "$*" >>"${0%/*}/ssh-command-lines"
opts=
while [ "$1" = "-o" ]; do opts="$opts $2"; shift 2; done
case "$opts" in *" BatchMode=yes"*) ;; *) echo "stand-in ssh: expected -o BatchMode=yes, got $opts" >&2; exit 2 ;; esac
host=$1
[ "$host" = down ] && { echo "ssh: connect to host down port 22: Connection refused" >&2; exit 255; }
SSH_HOST=$host exec sh -c "$2"
SSH
chmod +x "$work/bin/ssh"
printf 'nodeA slots=1
nodeB slots=2
' >"$work/two"
printf '# forwarded
FROM_ENV_FILE=yes it is
' >"$work/.dsactor_env"
(cd "$work" && PATH="$work/bin:$PATH" UCX_TEST_VAR=u1 OPENBLAS_CORETYPE=Haswell DSA_CPU_ISA=avx2 \
  "$dsactor" launch --hostfile two --master_addr 127.0.0.1 -- \
  sh -c 'echo "on $SSH_HOST in $(pwd) rank $RANK/$WORLD_SIZE local $LOCAL_RANK node $CROSS_RANK ucx $UCX_TEST_VAR env $FROM_ENV_FILE token ${#DSA_JOB_TOKEN}"' \
  >"$work/out" 2>"$work/err") || fail "a host list over ssh"
grep -qx "\[nodeA rank 0\] on nodeA in $work rank 0/3 local 0 node 0 ucx u1 env yes it is token 32" "$work/out" || fail "rank 0 over ssh"
grep -qx "\[nodeB rank 2\] on nodeB in $work rank 2/3 local 1 node 1 ucx u1 env yes it is token 32" "$work/out" || fail "rank 2 over ssh"
[[ $(wc -l <"$work/bin/ssh-command-lines") -eq 3 ]] || fail "3 ssh command lines expected"
grep -q "DSA_JOB_TOKEN=" "$work/bin/ssh-command-lines" && fail "the job token is on an ssh command line"
# What chooses kernels goes to every remote rank (their GEMM bits must match).
[[ $(grep -c "OPENBLAS_CORETYPE=Haswell.*DSA_CPU_ISA=avx2\|DSA_CPU_ISA=avx2.*OPENBLAS_CORETYPE=Haswell" \
  "$work/bin/ssh-command-lines") -eq 3 ]] || fail "OPENBLAS_CORETYPE and DSA_CPU_ISA not on every ssh command line"
printf 'nodeA slots=1
down slots=1
' >"$work/down"
rc=0; (cd "$work" && PATH="$work/bin:$PATH" "$dsactor" launch --hostfile down --master_addr 127.0.0.1 -- sleep 30 \
  >"$work/out" 2>"$work/err") || rc=$?
[[ $rc -eq 255 ]] && grep -q "rank 1 on host down exited with code 255 (ssh could not connect" "$work/err" ||
  fail "a host ssh cannot reach should fail the job naming it (rc $rc)"
printf 'BROKEN LINE
' >"$work/.dsactor_env"
rc=0; (cd "$work" && PATH="$work/bin:$PATH" "$dsactor" launch --hostfile two --master_addr 127.0.0.1 -- true \
  >"$work/out" 2>"$work/err") || rc=$?
[[ $rc -eq 2 ]] && grep -q "$work/.dsactor_env line 1: 'BROKEN LINE' is not KEY=VALUE" "$work/err" || fail "a malformed .dsactor_env"
rm "$work/.dsactor_env"
printf 'localhost slots=2\n' >"$work/local"
launch --hostfile "$work/local" -- sh -c 'echo "$RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_SIZE node $CROSS_RANK/$CROSS_SIZE slot $DSA_SLOT"' ||
  fail "a localhost host list"
grep -qx '\[rank 1\] 1/2 local 1/2 node 0/1 slot 1' "$work/out" || fail "rank 1's variables under a host list"
echo "ok: host lists"
