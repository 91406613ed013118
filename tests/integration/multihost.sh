#!/usr/bin/env bash
# Integration: `dsactor launch --hostfile` on real hosts made of network namespaces
# (hosts_fixture.sh: a namespace, a hostname, an address and an sshd each, UCX on TCP),
# the launcher started on host 0 as a user would:
#   1. 2 hosts x 2 ranks train BERT-tiny with ZeRO-2 and end with the parameters of one
#      process with 4 in-process ranks, bit for bit; every rank's output comes back
#      prefixed with its host and rank;
#   1b. the same job under --launcher mpirun (OpenMPI) gives the same parameters;
#   1c. the same job started host by host without ssh (--nnodes/--node_rank);
#   1d. a list naming host 0 by 127.0.0.1 still gives host 1 a reachable rendezvous;
#   2. --include/--exclude start exactly the selected ranks on the selected hosts;
#   3. kill -9 of a rank on host 1 mid-run stops the job within 30 s naming that host,
#      and the last checkpoint resumes on a different host list (host 0 alone, 4 slots);
#   3a. (before 3) SIGUSR1 to the launcher: the ranks of both hosts write a flight record;
#   3b. Ctrl-C of the launcher stops every rank on both hosts after its step (exit 130);
#   4. a rank on host 1 presenting a wrong job token is refused, logged with its address;
#   5. host 1's link cut mid-run stops the job within 30 s naming the lost rank's host, and
#      --min_nodes 2 keeps --max_restarts from restarting it on host 0 alone;
#   6. (before 5) with --max_restarts, host 1's link cut mid-run: the job restarts on host 0
#      alone and ends with the parameters of its checkpoint resumed there by hand; 6b. the
#      same with host 1 killed (its ranks and its sshd: it no longer answers).
#   7. (before 5) with --max_restarts 2, host 1 cut at the first restart and back for the
#      second: it rejoins (--max_procs).
# Skips (exit 77) where namespaces cannot be made. Usage: multihost.sh PATH/TO/dsactor
here=$(dirname "${BASH_SOURCE[0]}")
# shellcheck source=common.sh
source "$here/common.sh" || exit 1
# shellcheck source=hosts_fixture.sh
source "$here/hosts_fixture.sh"
reason=$(hosts_skip_reason)
if [[ -n $reason ]]; then
  echo "SKIP: multi-host tests need network namespaces: $reason"
  exit 77
fi
launcher_pid=
cleanup() {
  [[ -n $launcher_pid ]] && kill -9 "$launcher_pid" 2>/dev/null || true
  hosts_down
}
trap 'exit 143' TERM # a timeout's SIGTERM still removes the hosts (through the EXIT trap)
trap 'exit 130' INT

hosts_up "$work/hosts" 2 || fail "could not make the hosts"
h0=$(host_addr 0) h1=$(host_addr 1)
# shellcheck source=tiny_corpus.sh
source "$here/tiny_corpus.sh"
write_tiny_corpus "$work/corpus"
{ tiny_pretrain_toml "$work"
  cat <<TOML
[zero_optimization]
stage = 2

[checkpoint]
save_interval = 2
TOML
} > "$work/pre.toml"
# The data once, before any job (every host reads it through the shared file system).
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/prep\"" --set train_steps=1 >/dev/null 2>&1 ||
  fail "preparing the data"

# Runs `dsactor launch` on host 0, in $work, with the fixture's ssh first on PATH.
launch_on_host0() {
  (cd "$work" && on_host 0 env PATH="$work/hosts/bin:$PATH" "$dsactor" launch "$@")
}

# 1. 2 hosts x 2 ranks with ZeRO-2 = 4 in-process ranks, bit for bit.
launch_on_host0 --hostfile "$work/hosts/hostfile" "$work/pre.toml" --set "run_dir=\"$work/hosts2\"" \
  >"$work/out" 2>"$work/err" || { tail -30 "$work/err"; fail "2 hosts x 2 ranks"; }
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/threads\"" --set devices.ranks=4 >/dev/null 2>&1 ||
  fail "4 in-process ranks"
step4=checkpoints/step_00000004
cmp "$work/hosts2/$step4/model.safetensors" "$work/threads/$step4/model.safetensors" ||
  fail "2 hosts x 2 ranks ended with other parameters than 4 in-process ranks"
for r in 0 1 2 3; do
  cmp "$work/hosts2/$step4/optimizer_0_rank$r.safetensors" "$work/threads/$step4/optimizer_0_rank$r.safetensors" ||
    fail "rank $r's optimizer partition differs"
done
grep -q "^\[$h1 rank 3\] " "$work/err" || fail "rank 3's output is not prefixed with its host: $(head -5 "$work/err")"
# Each rank ran on its own host (its hostname is in its log).
grep -q "on host dsa-h1" "$work/hosts2/train.rank3.log" || fail "rank 3 did not run on host 1: $(head -3 "$work/hosts2/train.rank3.log")"
# UCX's endpoints on the interface that routes to the rendezvous, not every interface.
grep -q "UCX_NET_DEVICES=eth1: the interface that routes to the rendezvous" "$work/err" ||
  fail "the ranks did not pin UCX to eth1"
echo "ok: 2 hosts x 2 ranks with ZeRO-2 = 4 in-process ranks, bit for bit; UCX on eth1"

# 1b. The same job started by OpenMPI's mpirun (--launcher mpirun; its daemons reach host 1
#     over the fixture's ssh): the same parameters, bit for bit.
if command -v mpirun >/dev/null; then
  launch_on_host0 --hostfile "$work/hosts/hostfile" --launcher mpirun \
    --launcher_args "--allow-run-as-root --mca oob_tcp_if_include eth1" "$work/pre.toml" \
    --set "run_dir=\"$work/mpirun\"" >"$work/out" 2>"$work/err" || { tail -30 "$work/err"; fail "the job under mpirun"; }
  cmp "$work/mpirun/$step4/model.safetensors" "$work/threads/$step4/model.safetensors" ||
    fail "under mpirun the job ended with other parameters than 4 in-process ranks"
  grep -q "on host dsa-h1" "$work/mpirun/train.rank3.log" || fail "under mpirun rank 3 did not run on host 1"
  echo "ok: --launcher mpirun runs the job on both hosts, the same parameters bit for bit"
else
  echo "skipped: --launcher mpirun (no mpirun; Debian: openmpi-bin)"
fi

# 1c. Without ssh (--nnodes/--node_rank, as a scheduler or a user on each host would start
#     it): node 0's launcher hosts the rendezvous on a fixed port (the namespace is the
#     test's own, so the port is free), both share the token through DSA_JOB_TOKEN; the same
#     parameters, bit for bit.
token=$("$dsactor" launch --new_token)
[[ $token =~ ^[0-9a-f]{32}$ ]] || fail "--new_token printed '$token'"
node_args=(--nnodes 2 --nproc_per_node 2 --master_addr "$h0" --master_port 29577)
(cd "$work" && exec nsenter --target "$(host_pid 0)" --net --uts --mount -- env DSA_JOB_TOKEN="$token" \
  "$dsactor" launch "${node_args[@]}" --node_rank 0 "$work/pre.toml" --set "run_dir=\"$work/nodes\"") \
  >"$work/out0" 2>"$work/err0" &
node0=$!
(cd "$work" && on_host 1 env DSA_JOB_TOKEN="$token" "$dsactor" launch "${node_args[@]}" --node_rank 1 \
  "$work/pre.toml" --set "run_dir=\"$work/nodes\"") >"$work/out1" 2>"$work/err1" ||
  { tail -20 "$work/err1"; fail "node 1 of a --nnodes job"; }
wait "$node0" || { tail -20 "$work/err0"; fail "node 0 of a --nnodes job"; }
cmp "$work/nodes/$step4/model.safetensors" "$work/threads/$step4/model.safetensors" ||
  fail "the --nnodes job ended with other parameters than 4 in-process ranks"
grep -q "on host dsa-h1" "$work/nodes/train.rank2.log" || fail "node 1's first rank is not rank 2 on host 1"
echo "ok: --nnodes 2 started by hand on each host, the same parameters bit for bit"

# 1d. A host list naming the launching host by a loopback address (as Debian's /etc/hosts
#     resolves a machine's own name): the rendezvous still listens on host 0's address
#     towards host 1, which host 1's ranks reach.
printf '127.0.0.1 slots=2\n%s slots=2\n' "$h1" >"$work/loopback-first"
launch_on_host0 --hostfile "$work/loopback-first" "$work/pre.toml" --set "run_dir=\"$work/loopback\"" \
  >"$work/out" 2>"$work/err" || { tail -20 "$work/err"; fail "a host list starting with a loopback address"; }
cmp "$work/loopback/$step4/model.safetensors" "$work/threads/$step4/model.safetensors" ||
  fail "the loopback-first host list ended with other parameters"
echo "ok: a host list naming this host by 127.0.0.1 first: the rendezvous listens where host 1 reaches it"

# 1e. Pipeline stages across the hosts: one process per host, stage 0 on host 0 and stage 1
#     on host 1, activations over UCX between them = one process of 2 stages, bit for bit.
printf '%s slots=1\n%s slots=1\n' "$h0" "$h1" >"$work/one-slot-each"
launch_on_host0 --hostfile "$work/one-slot-each" "$work/pre.toml" --set "run_dir=\"$work/pp_hosts\"" \
  --set pipeline.stages=2 >"$work/out" 2>"$work/err" || { tail -20 "$work/err"; fail "2 hosts x 1 stage"; }
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/pp_one\"" --set pipeline.stages=2 >/dev/null 2>&1 ||
  fail "1 process of 2 stages"
cmp "$work/pp_hosts/metrics.csv" "$work/pp_one/metrics.csv" ||
  { diff "$work/pp_hosts/metrics.csv" "$work/pp_one/metrics.csv"; fail "2 hosts x 1 stage logged other metrics than 1 process of 2 stages"; }
for f in model optimizer_0 optimizer_1; do
  cmp "$work/pp_hosts/$step4/$f.safetensors" "$work/pp_one/$step4/$f.safetensors" ||
    fail "2 hosts x 1 stage ended with another $f than 1 process of 2 stages"
done
grep -q "on host dsa-h1" "$work/pp_hosts/train.rank1.log" && grep -q "stage(s) 1 of replica 0" "$work/pp_hosts/train.rank1.log" ||
  fail "stage 1 did not run on host 1: $(head -3 "$work/pp_hosts/train.rank1.log")"
echo "ok: 2 hosts x 1 pipeline stage = 1 process of 2 stages, bit for bit"

# 2. Include/exclude and slot selection start exactly the selected ranks on the selected hosts.
show='echo "$(hostname) rank $RANK local $LOCAL_RANK slot $DSA_SLOT of $WORLD_SIZE"'
launch_on_host0 --hostfile "$work/hosts/hostfile" --include "$h0:1@$h1" -- sh -c "$show" >"$work/out" 2>"$work/err" ||
  { cat "$work/err"; fail "--include"; }
sort "$work/out" >"$work/got"
printf '%s\n' "[$h0 rank 0] dsa-h0 rank 0 local 0 slot 1 of 3" "[$h1 rank 1] dsa-h1 rank 1 local 0 slot 0 of 3" \
  "[$h1 rank 2] dsa-h1 rank 2 local 1 slot 1 of 3" | sort >"$work/want"
diff "$work/want" "$work/got" || fail "--include $h0:1@$h1 started other ranks"
launch_on_host0 --hostfile "$work/hosts/hostfile" --exclude "$h0" -- sh -c "$show" >"$work/out" 2>"$work/err" ||
  { cat "$work/err"; fail "--exclude"; }
sort "$work/out" >"$work/got"
printf '%s\n' "[$h1 rank 0] dsa-h1 rank 0 local 0 slot 0 of 2" "[$h1 rank 1] dsa-h1 rank 1 local 1 slot 1 of 2" |
  sort >"$work/want"
diff "$work/want" "$work/got" || fail "--exclude $h0 started other ranks"
echo "ok: --include and --exclude start exactly the selected ranks on their hosts"

# Starts a long training job on host 0 in the background (launcher_pid), and waits for its
# checkpoint of step 4, so the job is mid-run.
start_long_job() {
  local dir=$1
  shift
  (cd "$work" && exec nsenter --target "$(host_pid 0)" --net --uts --mount -- env PATH="$work/hosts/bin:$PATH" \
    "$dsactor" launch --hostfile "$work/hosts/hostfile" --heartbeat_timeout 5 "$@" "$work/pre.toml" \
    --set "run_dir=\"$dir\"" --set train_steps=100000) >"$work/out" 2>"$work/err" &
  launcher_pid=$!
  local waited=0
  until [[ -d $dir/checkpoints/step_00000004 ]]; do
    kill -0 "$launcher_pid" 2>/dev/null || { tail -20 "$work/err"; fail "the job ended before its step-4 checkpoint"; }
    (( ++waited > 1200 )) && fail "no step-4 checkpoint after 60 s"
    sleep 0.05
  done
}

# Waits for the launcher to end; sets job_rc and job_s (seconds from `since`).
wait_job() {
  local since=$1
  set +e
  wait "$launcher_pid"
  job_rc=$?
  set -e
  launcher_pid=
  job_s=$(( $(date +%s) - since ))
}

# Whether no rank of the job is left on either host within 30 s.
no_ranks_left() {
  local i
  for ((i = 0; i < 300; i++)); do
    pgrep -f "$dsactor run $work/pre.toml" >/dev/null || return 0
    sleep 0.1
  done
  return 1
}

# What is left of the job's ranks, and where they wait, for a failure message.
leftovers() {
  local p t
  for p in $(pgrep -f "$dsactor run $work/pre.toml"); do
    echo "pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-60)... $(tr '\0' '\n' <"/proc/$p/environ" | grep -x 'RANK=[0-9]*')"
    for t in /proc/"$p"/task/*; do echo "  thread $(cat "$t/comm"): $(cat "$t/wchan")"; done
    command -v gdb >/dev/null && gdb -p "$p" -batch -ex "thread apply all bt 6" 2>/dev/null | grep -E "^#|^Thread" | head -40
  done
  for f in "$1"/train*.log; do echo "--- $f"; tail -3 "$f"; done
}

# 3. kill -9 of a rank on host 1: the job ends non-zero within 30 s naming host 1; then the
#    last checkpoint resumes on another host list (host 0 alone, 4 slots).
start_long_job "$work/killed"
# No command line on either host shows the job token (ssh passes it on standard input).
if ps -eo args | grep -q "DSA_JOB_TOKEN=[0-9a-f]"; then fail "a command line shows the job token"; fi
# The process of rank `$1` of the job (its environment says RANK=$1).
rank_pid() {
  local p
  # The rank itself (its program is dsactor), not the ssh client that started it, whose
  # command line and environment match too.
  for p in $(pgrep -f "$dsactor run $work/pre.toml" || true); do
    [[ $(tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | head -1) == "$dsactor" ]] || continue
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$1"; then echo "$p"; return 0; fi
  done
  return 0
}
# 3a. SIGUSR1 to the launcher reaches the ranks of both hosts (through the rendezvous): each
#     writes a flight record into its trace and runs on.
kill -USR1 "$launcher_pid"
for _ in $(seq 1200); do # each rank's trace writer writes within its 1 s interval
  (( $(grep -c "flight record written" "$work/err") >= 4 )) && break
  sleep 0.05
done
grep -q "SIGUSR1: asked every rank on every host through the rendezvous" "$work/err" ||
  fail "the launcher did not pass SIGUSR1 on through the rendezvous"
for r in 2 3; do
  grep -q "^\[$h1 rank $r\] .*flight record written" "$work/err" ||
    { grep "flight record" "$work/err"; fail "rank $r on host 1 wrote no flight record on the launcher's SIGUSR1"; }
done
echo "ok: SIGUSR1 to the launcher: the ranks on both hosts wrote a flight record"
victim=$(rank_pid 3)
[[ -n $victim ]] || fail "no process of rank 3"
since=$(date +%s)
kill -9 "$victim"
wait_job "$since"
[[ $job_rc -ne 0 ]] || fail "the job exited 0 after a rank was killed"
(( job_s <= 30 )) || fail "the job took $job_s s to stop after a rank was killed"
grep -q "rank 3.*$h1\|$h1.*rank 3" "$work/err" || { tail -5 "$work/err"; fail "the failure does not name rank 3's host $h1"; }
no_ranks_left || fail "ranks still running 30 s after the job failed: $(leftovers "$work/killed")"
echo "$h0 slots=4" >"$work/host0only"
last=$(basename "$(ls -d "$work/killed/checkpoints"/step_* | sort | tail -1)")
next=$(( 10#${last#step_} + 2 ))
launch_on_host0 --hostfile "$work/host0only" "$work/pre.toml" --set "run_dir=\"$work/killed\"" \
  --set train_steps=$next --resume >"$work/out" 2>"$work/err" || { tail -20 "$work/err"; fail "resume on host 0 alone"; }
[[ -d $work/killed/checkpoints/$(printf 'step_%08d' "$next") ]] || fail "the resumed run did not reach step $next"
grep -q "resumed from .*$last" "$work/killed/train.log" || fail "the run did not resume from $last"
echo "ok: kill -9 of a rank on host 1 stopped the job in $job_s s naming $h1; $last resumed on host 0 alone"

# 3b. Ctrl-C of the launcher stops every rank on every host after its step (the ranks over
#     ssh hear it from the rendezvous), with a checkpoint; the job exits 130.
start_long_job "$work/interrupted"
since=$(date +%s)
kill -INT "$launcher_pid"
wait_job "$since"
[[ $job_rc -eq 130 ]] || { tail -10 "$work/err"; fail "Ctrl-C of the launcher should exit 130, got $job_rc"; }
grep -q "stopped by signal after step" "$work/interrupted/train.log" || fail "rank 0 did not stop after its step"
grep -q "the launcher was interrupted: stopping after the current step" "$work/err" ||
  fail "the ranks over ssh did not hear of the interrupt"
no_ranks_left || fail "ranks still running after Ctrl-C"
echo "ok: Ctrl-C of the launcher stopped every rank on both hosts after its step, in $job_s s"

# 4. A rank on host 1 presenting a wrong job token is refused, and the refusal logged with
#    its address on host 1; the job fails.
rc=0
launch_on_host0 --hostfile "$work/hosts/hostfile" -- sh -c \
  'if [ "$RANK" = 2 ]; then DSA_JOB_TOKEN=guess; fi; exec "$0" run "$1" --set "run_dir=\"$2\""' \
  "$dsactor" "$work/pre.toml" "$work/token" >"$work/out" 2>"$work/err" || rc=$?
[[ $rc -ne 0 ]] || fail "a job with a rank presenting a wrong token should fail"
grep -q "rendezvous: refused the connection from $h1:[0-9]*: wrong job token" "$work/err" ||
  { tail -5 "$work/err"; fail "the refusal of host 1's connection was not logged with its address"; }
grep -q "guess" "$work/err" && fail "the presented token was logged"
echo "ok: a wrong token from host 1 is refused and logged with its address"

# 6. --max_restarts on a host list: host 1 lost while rank 0 waits after step 3 (the
#    test-only DSA_TEST_WAIT_ONCE, so no timing decides where); the job fails, the launcher
#    finds host 1 no longer answers and restarts on host 0 alone: 2 ranks instead of 4, the
#    global batch kept by twice the accumulation, from the latest checkpoint (step 2). It
#    ends with the parameters of that checkpoint resumed by hand on host 0's 2 slots.
#    Host 1 is lost twice: its link cut (6), and the whole host killed, its sshd too (6b).
printf '%s slots=2\n' "$h0" >"$work/host0two"
# same_as_by_hand NAME CHECKPOINT HOSTFILE: the job in $work/NAME ended (step 6) with the
# parameters of its CHECKPOINT resumed by hand on HOSTFILE's ranks.
same_as_by_hand() {
  local name=$1 checkpoint=$2 hosts=$3
  launch_on_host0 --hostfile "$hosts" "$work/pre.toml" --set "run_dir=\"$work/$name-byhand\"" \
    --set train_steps=6 --set "checkpoint.load=\"$work/$name/checkpoints/$checkpoint\"" >"$work/out" 2>"$work/err" ||
    { tail -20 "$work/err"; fail "$name: resuming $checkpoint by hand"; }
  cmp "$work/$name/checkpoints/step_00000006/model.safetensors" \
    "$work/$name-byhand/checkpoints/step_00000006/model.safetensors" ||
    fail "$name: the restarted job's parameters differ from $checkpoint resumed by hand"
}
# elastic_case NAME LOSE RESTORE: the job in $work/NAME, LOSE host 1 (a fixture function) while
# rank 0 holds, RESTORE it after the job ended.
elastic_case() {
  local name=$1 lose=$2 restore=$3
  (cd "$work" && exec nsenter --target "$(host_pid 0)" --net --uts --mount -- env PATH="$work/hosts/bin:$PATH" \
    DSA_TEST_WAIT_ONCE="$work/hold-$name:0:2" "$dsactor" launch --hostfile "$work/hosts/hostfile" --heartbeat_timeout 5 \
    --grace 2 --max_restarts 1 --min_procs 2 "$work/pre.toml" --set "run_dir=\"$work/$name\"" \
    --set train_steps=6) >"$work/out" 2>"$work/err" &
  launcher_pid=$!
  local waited=0
  until [[ -e $work/hold-$name ]]; do
    kill -0 "$launcher_pid" 2>/dev/null || { tail -20 "$work/err"; fail "$name: the job ended before rank 0 held after step 3"; }
    (( ++waited > 1200 )) && fail "$name: rank 0 did not hold after step 3 within 60 s"
    sleep 0.05
  done
  since=$(date +%s)
  "$lose" 1
  touch "$work/hold-$name.go"
  wait_job "$since"
  "$restore" 1
  [[ $job_rc -eq 0 ]] || { tail -20 "$work/err"; fail "$name: the restarted job failed ($job_rc)"; }
  grep -q "restart 1 of 1: .*; 4 process(es) on 2 host(s) before, 2 process(es) on 1 host(s) after ($h1 did not answer)" \
    "$work/err" || { grep "dsactor launch" "$work/err"; fail "$name: the restart on the hosts that answer"; }
  resumed=$(grep -o "resumed from [^ ]*step_[0-9]*" "$work/$name/train.log" | grep -o "step_[0-9]*$" | tail -1)
  [[ -n $resumed ]] || fail "$name: the restarted job did not resume from a checkpoint"
  grep -q "accumulation 2 x 2 rank" "$work/$name/train.log" || fail "$name: the restart did not keep the batch with 2 ranks"
  # Step 3 was done before host 1 was lost and is done again: the restart's lost step, counted.
  grep -q "metrics: 1 step(s) logged after step 2's checkpoint run again" "$work/$name/train.log" ||
    fail "$name: the restart did not count the step it lost"
  grep -q "the job finished after 1 restart(s)" "$work/err" || fail "$name: the launcher did not count the restarts"
  same_as_by_hand "$name" "$resumed" "$work/host0two"
  no_ranks_left || fail "$name: ranks still running after the elastic job: $(leftovers "$work/$name")"
}
elastic_case elastic cut_host uncut_host
echo "ok: host 1 cut mid-run, the job restarted on host 0's 2 ranks from $resumed in $job_s s, as the resume by hand"
elastic_case elastic-killed kill_host revive_host
echo "ok: host 1 killed mid-run (its sshd too), the job restarted on host 0's 2 ranks from $resumed in $job_s s, as the resume by hand"

# 7. A host lost at one restart rejoins at the next (--max_procs: the job's own 4 by
#    default). Attempt 0 on 4 ranks: rank 0 holds after step 3 and host 1's link is cut:
#    restart 1 on host 0's 2 ranks, from step 2. There process 1 holds after step 5 while
#    host 1's link comes back, then kills itself (DSA_TEST_KILL_ONCE): restart 2 finds host 1
#    answering again and starts 4 ranks from step 4's checkpoint, and the job finishes.
(cd "$work" && exec nsenter --target "$(host_pid 0)" --net --uts --mount -- env PATH="$work/hosts/bin:$PATH" \
  DSA_TEST_WAIT_ONCE="$work/r0:0:2,$work/r1:1:4" DSA_TEST_KILL_ONCE="$work/k1:1:4" "$dsactor" launch \
  --hostfile "$work/hosts/hostfile" --heartbeat_timeout 5 --grace 2 --max_restarts 2 --min_procs 2 "$work/pre.toml" \
  --set "run_dir=\"$work/rejoin\"" --set train_steps=6) >"$work/out" 2>"$work/err" &
launcher_pid=$!
# hold_reached MARKER WHAT: the job's process created MARKER (it holds) within 60 s.
hold_reached() {
  local waited=0
  until [[ -e $1 ]]; do
    kill -0 "$launcher_pid" 2>/dev/null || { tail -20 "$work/err"; fail "the job ended before $2"; }
    (( ++waited > 1200 )) && fail "$2 did not happen within 60 s"
    sleep 0.05
  done
}
hold_reached "$work/r0" "rank 0's hold after step 3"
since=$(date +%s)
cut_host 1
touch "$work/r0.go"
hold_reached "$work/r1" "process 1's hold after step 5 of the restarted job"
uncut_host 1
touch "$work/r1.go"
wait_job "$since"
[[ $job_rc -eq 0 ]] || { tail -20 "$work/err"; fail "the job with a rejoining host failed ($job_rc)"; }
grep -q "restart 1 of 2: .*; 4 process(es) on 2 host(s) before, 2 process(es) on 1 host(s) after ($h1 did not answer)" \
  "$work/err" || { grep "dsactor launch" "$work/err"; fail "restart 1 on host 0 alone"; }
grep -q "restart 2 of 2: .*; 2 process(es) on 1 host(s) before, 4 process(es) on 2 host(s) after ($h1 rejoined)" \
  "$work/err" || { grep "dsactor launch" "$work/err"; fail "restart 2 with host 1 back"; }
grep -q "the job finished after 2 restart(s)" "$work/err" || fail "the launcher did not count 2 restarts"
grep "resumed from" "$work/rejoin/train.log" | tail -1 | grep -q "step_00000004" ||
  fail "the second restart did not resume from step 4's checkpoint"
[[ -s $work/rejoin/checkpoints/step_00000006/model.safetensors ]] || fail "the rejoined job did not reach step 6"
no_ranks_left || fail "ranks still running after the rejoined job: $(leftovers "$work/rejoin")"
same_as_by_hand rejoin step_00000004 "$work/hosts/hostfile" # on both hosts' 4 ranks
echo "ok: host 1 lost at restart 1 rejoined at restart 2; the job finished on 4 ranks again, as the resume by hand"

# 5. (last: the host stays cut off) Host 1's link cut mid-run: the job ends non-zero within 30 s naming host 1;
#    --max_restarts with --min_nodes 2 does not restart it on host 0 alone.
start_long_job "$work/cut" --max_restarts 1 --min_nodes 2 --grace 2
since=$(date +%s)
cut_host 1
wait_job "$since"
[[ $job_rc -ne 0 ]] || fail "the job exited 0 after host 1 was cut off"
(( job_s <= 30 )) || fail "the job took $job_s s to stop after host 1 was cut off"
grep -q "the job failed: .*rank [23].* on host $h1" "$work/err" || { tail -5 "$work/err"; fail "the failure does not name the lost host $h1"; }
grep -q "not restarting: 2 process(es) on 1 host(s) of the hosts answer ($h1 did not), fewer than --min_nodes 2" \
  "$work/err" || { grep "dsactor launch" "$work/err"; fail "--min_nodes 2 should have kept the job from restarting on host 0 alone"; }
no_ranks_left || fail "ranks still running 30 s after host 1 was cut off: $(leftovers "$work/cut")"
echo "ok: host 1's link cut stopped the job in $job_s s naming $h1; --min_nodes 2 kept it from restarting on host 0 alone"
