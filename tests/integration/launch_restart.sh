#!/usr/bin/env bash
# Integration: `dsactor launch --max_restarts`. A job of 2 processes whose rank 1 kills
# itself after step 3 (index 2; SIGKILL, through the test-only DSA_TEST_KILL_ONCE, so no timing is
# involved) restarts by itself, names the cause, resumes in the run directory its first
# attempt chose from the latest committed checkpoint, and ends with the uninterrupted job's
# parameters bit for bit. A refused configuration is not restarted; --launcher mpirun and
# --nnodes refuse the flag by name. Usage: launch_restart.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
# shellcheck source=tiny_corpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/tiny_corpus.sh"
write_tiny_corpus "$work/corpus"
tiny_pretrain_toml "$work" "train_steps = 5" | grep -v "^train_steps = 4$" >"$work/pre.toml"
cd "$work" || fail "cd $work"

# The uninterrupted job.
"$dsactor" launch --num_procs 2 pre.toml --set "run_dir=\"$work/ref\"" --set checkpoint.save_interval=1 \
  >"$work/out" 2>"$work/err" || fail "the uninterrupted 2-process job"
final=checkpoints/step_00000005/model.safetensors
[[ -s $work/ref/$final ]] || fail "the uninterrupted job wrote no $final"

# The same job, rank 1 killed after step 3 (DSA_TEST_KILL_ONCE counts from 0), one restart allowed; no run_dir in the config.

DSA_TEST_KILL_ONCE="$work/fault:1:2" "$dsactor" launch --num_procs 2 --max_restarts 1 pre.toml \
  --set checkpoint.save_interval=1 >"$work/out" 2>"$work/err" || { cat "$work/err"; fail "the restarted job failed"; }
[[ -f $work/fault ]] || fail "the fault never fired"
grep -q "restart 1 of 1: rank 1 was killed by signal 9" "$work/err" || { cat "$work/err"; fail "the restart and its cause"; }
runs=(runs/pre-*)
[[ ${#runs[@]} == 1 && -d ${runs[0]} ]] || fail "the attempts should share one run directory, found: ${runs[*]}"
grep -q "resumed from .*step_0000000[1-4] at step [1-4]" "${runs[0]}/train.log" ||
  { cat "${runs[0]}/train.log"; fail "the restart should resume from a checkpoint of steps 1 to 4"; }
cmp "${runs[0]}/$final" "$work/ref/$final" || fail "the restarted job's parameters differ from the uninterrupted job's"
grep -q "the job finished after 1 restart(s)" "$work/err" || fail "the launcher did not count the restarts"
echo "ok: a killed rank restarted the job, which $(grep -o "resumed from [^ ]*" "${runs[0]}/train.log" | head -1): the same parameters"

# Pipeline stages in separate processes (2 processes = 1 replica of 2 stages), fp16 with
# dynamic loss scaling and a warm-up schedule: stage 1's process killed after step 3, the
# restart gives the same parameters, and the same loss scaler, schedule position and data
# position in the last checkpoint's manifest.
pp=(--set pipeline.stages=2 --set fp16.enabled=true --set fp16.initial_scale_power=8
    --set 'scheduler.type="WarmupLR"' --set scheduler.params.warmup_num_steps=4 --set checkpoint.save_interval=1)
"$dsactor" launch --num_procs 2 pre.toml --set "run_dir=\"$work/ppref\"" "${pp[@]}" >"$work/out" 2>"$work/err" ||
  { cat "$work/err"; fail "the uninterrupted 2-stage fp16 job"; }
DSA_TEST_KILL_ONCE="$work/ppfault:1:2" "$dsactor" launch --num_procs 2 --max_restarts 1 pre.toml \
  --set "run_dir=\"$work/pp\"" "${pp[@]}" >"$work/out" 2>"$work/err" || { cat "$work/err"; fail "the restarted 2-stage job"; }
grep -q "restart 1 of 1: rank 1 was killed by signal 9" "$work/err" || { cat "$work/err"; fail "the 2-stage job's restart"; }
cmp "$work/pp/$final" "$work/ppref/$final" || fail "the restarted 2-stage job's parameters differ"
python3 - "$work/pp/checkpoints/step_00000005/manifest.json" "$work/ppref/checkpoints/step_00000005/manifest.json" <<'PY' ||
import json, sys
a, b = (json.load(open(p))["state"] for p in sys.argv[1:])
for key in ("loss_scaler", "schedule_iteration", "data_cursor"):
    assert a[key] == b[key], f"{key}: {a[key]} after the restart, {b[key]} uninterrupted"
PY
  fail "the restarted job's manifest differs"
echo "ok: stage 1's process killed in a 2-stage fp16 job: restarted, the same parameters, loss scaler, schedule and data position"

# On fewer processes (--max_procs 2 after 3, one host): train_batch_size 12 = 2 x 2 x 3 is
# kept as 2 x 3 x 2 (the accumulation grows), the ZeRO-1 partitions are cut again on load, and
# the job ends with the parameters of its checkpoint resumed by hand on 2 processes.
shrink=(--set train_batch_size=12 --set zero_optimization.stage=1 --set checkpoint.save_interval=1)
DSA_TEST_KILL_ONCE="$work/shrinkfault:2:2" "$dsactor" launch --num_procs 3 --max_restarts 1 --max_procs 2 pre.toml \
  --set "run_dir=\"$work/shrink\"" "${shrink[@]}" >"$work/out" 2>"$work/err" ||
  { cat "$work/err"; fail "the job restarted on 2 of its 3 processes"; }
grep -q "restart 1 of 1: rank 2 was killed by signal 9 .*; 3 process(es) before, 2 process(es) after" "$work/err" ||
  { grep "dsactor launch" "$work/err"; fail "the restart on 2 processes and its layout"; }
grep -q "accumulation 3 x 2 rank" "$work/shrink/train.log" || fail "the restart did not keep the batch with 2 ranks"
resumed=$(grep -o "resumed from [^ ]*step_[0-9]*" "$work/shrink/train.log" | grep -o "step_[0-9]*$" | tail -1)
[[ -n $resumed ]] || fail "the shrunk job did not resume from a checkpoint"
"$dsactor" launch --num_procs 2 pre.toml --set "run_dir=\"$work/shrinkhand\"" "${shrink[@]}" \
  --set "checkpoint.load=\"$work/shrink/checkpoints/$resumed\"" >"$work/out" 2>"$work/err" ||
  { cat "$work/err"; fail "resuming $resumed by hand on 2 processes"; }
cmp "$work/shrink/$final" "$work/shrinkhand/$final" || fail "the shrunk restart's parameters differ from the resume by hand"
# A batch 2 processes cannot keep (6 = 2 x 1 x 3; 2 x 1.5 x 2): the restart is refused by
# the ranks naming the keys, and not tried again.
rc=0
DSA_TEST_KILL_ONCE="$work/oddfault:2:2" "$dsactor" launch --num_procs 3 --max_restarts 2 --max_procs 2 pre.toml \
  --set "run_dir=\"$work/odd\"" --set train_batch_size=6 --set checkpoint.save_interval=1 >"$work/out" 2>"$work/err" ||
  rc=$?
[[ $rc == 2 ]] || { cat "$work/err"; fail "a restart that cannot keep the batch should end with 2, got $rc"; }
grep -q "train_batch_size (6) must equal train_micro_batch_size_per_gpu (2) x gradient_accumulation_steps" "$work/err" ||
  { cat "$work/err"; fail "the refused restart should name the batch keys"; }
grep -q "restart 1 was refused by the ranks (exit code 2" "$work/err" || { grep "dsactor launch" "$work/err"; fail "the launcher's word on the refused restart"; }
grep -q "restart 2 of" "$work/err" && fail "a refused restart was tried again"
echo "ok: 3 processes restarted on 2 keep the global batch (the resume by hand's parameters); a batch they cannot keep is refused by name"

# A configuration every rank refuses is not restarted.
if "$dsactor" launch --num_procs 2 --max_restarts 3 pre.toml --set train_stepz=1 >"$work/out" 2>"$work/err"; then
  fail "a bad config was accepted"
else rc=$?; fi
[[ $rc == 2 ]] || fail "a refused config should end with 2, got $rc"
grep -q "not restarting: the job's configuration was refused" "$work/err" || { cat "$work/err"; fail "no restart for a refused config"; }
grep -q "restart 1 of" "$work/err" && fail "a refused config was restarted"

# Where the launcher does not start every rank itself, the flag is refused by name.
echo "localhost slots=2" >"$work/hosts"
if "$dsactor" launch --hostfile "$work/hosts" --launcher mpirun --max_restarts 1 pre.toml 2>"$work/err"; then
  fail "--max_restarts with mpirun was accepted"
fi
grep -q -- "--max_restarts with --launcher mpirun" "$work/err" || { cat "$work/err"; fail "mpirun's refusal"; }
if "$dsactor" launch --hostfile "$work/hosts" --launcher slurm --max_restarts 1 pre.toml 2>"$work/err"; then
  fail "--max_restarts with slurm was accepted"
fi
grep -q -- "--max_restarts with --launcher slurm" "$work/err" || { cat "$work/err"; fail "slurm's refusal"; }
if DSA_JOB_TOKEN=x "$dsactor" launch --nnodes 1 --node_rank 0 --nproc_per_node 2 --max_restarts 1 pre.toml \
  2>"$work/err"; then fail "--max_restarts with --nnodes was accepted"; fi
grep -q -- "--max_restarts needs one launcher" "$work/err" || { cat "$work/err"; fail "--nnodes' refusal"; }
# --min_nodes counts the hosts of a list: refused without one, or above its count.
if "$dsactor" launch --num_procs 2 --max_restarts 1 --min_nodes 2 pre.toml 2>"$work/err"; then
  fail "--min_nodes 2 without a host list was accepted"
fi
grep -q -- "--min_nodes 2 counts the hosts of a --hostfile list" "$work/err" || { cat "$work/err"; fail "--min_nodes' refusal"; }
if "$dsactor" launch --hostfile "$work/hosts" --max_restarts 1 --min_nodes 2 pre.toml 2>"$work/err"; then
  fail "--min_nodes 2 on a 1-host list was accepted"
fi
grep -q -- "--min_nodes 2 is more than the 1 host(s)" "$work/err" || { cat "$work/err"; fail "--min_nodes' count"; }
printf 'localhost slots=2\nworker-x slots=2\n' >"$work/twohosts"
if "$dsactor" launch --hostfile "$work/twohosts" --max_restarts 1 --min_nodes 2 --max_procs 2 pre.toml 2>"$work/err"; then
  fail "--min_nodes 2 with --max_procs filled by the first host was accepted"
fi
grep -q -- "--max_procs 2 is filled by the first 1 host(s) of the list" "$work/err" || { cat "$work/err"; fail "--min_nodes against --max_procs"; }
# The restarts' bounds without restarts: refused, naming the flag.
if "$dsactor" launch --num_procs 2 --min_procs 2 pre.toml 2>"$work/err"; then fail "--min_procs without --max_restarts was accepted"; fi
grep -q -- "--min_procs bounds the restarts of --max_restarts N" "$work/err" || { cat "$work/err"; fail "--min_procs alone"; }
echo "ok: --max_restarts refuses configs and launchers it cannot restart; --min_nodes beyond the list is refused"
