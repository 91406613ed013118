#!/usr/bin/env bash
# Integration: the faults of NVMe optimizer offload in real `dsactor run`s. kill -9 mid-run
# then --resume equals the uninterrupted offloaded run bit for bit and clears the stale swap
# files; a swap file cut under a running run fails it naming the file, and its last
# checkpoint resumes without offload; a full disk (a small tmpfs, where mount is allowed)
# fails naming the swap file and "No space left" and leaves the checkpoint loadable; an
# nvme_path under a regular file fails at start naming it; ZeRO-3 with the weights on NVMe
# too survives kill -9 and --resume bit for bit. Usage: offload_faults.sh PATH/TO/dsactor [--cuda]
# --cuda (tools/gpu-check offload, on a GPU machine): every run on a CUDA rank in deterministic
# mode, and only the kill -9 and --resume of the offloaded run and of ZeRO-3 (the others are
# host-side faults that do not depend on where the stages compute).
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
extra=()
if [[ ${2:-} == --cuda ]]; then
  extra=(--set 'devices.backend="cuda"' --set devices.deterministic=true)
fi
run_pid=
mounted=
cleanup() {
  [[ -n $run_pid ]] && kill -9 "$run_pid" 2>/dev/null || true
  [[ -n $mounted ]] && umount "$mounted" 2>/dev/null || true
}

# shellcheck source=tiny_corpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/tiny_corpus.sh"
write_tiny_corpus "$work/corpus"
# One rank, one stage: one swap store (stage0.*.swp), in 26 chunks of 4096 elements.
cat > "$work/pre.toml" <<TOML
train_batch_size = 4
train_micro_batch_size_per_gpu = 2
train_steps = 4
steps_per_print = 1

$(tiny_bert_tables "$work")

[optimizer]
type = "AdamW"
params = { lr = 2e-3, weight_decay = 0.01 }

[zero_optimization]
stage = 1
sub_group_size = 4096

[zero_optimization.offload_optimizer]
device = "nvme"
nvme_path = "$work/nvme"
pipeline_read = true
pipeline_write = true
buffer_count = 9

[checkpoint]
save_interval = 2
TOML
run() { # run RUN_DIR [--set k=v | --resume]...: dsactor run, output in $work/out and $work/err
  local dir=$1
  shift
  "$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/$dir\"" "${extra[@]}" "$@" >"$work/out" 2>"$work/err"
}
step_of() { local last; last=$(cat "$1/checkpoints/latest"); echo $((10#${last#step_})); }

# 1. kill -9 of an offloaded run once a checkpoint exists; --resume (offloaded, same run dir)
#    says it removed the swap files the killed run left and ends with the parameters of an
#    uninterrupted offloaded run, bit for bit. kill_and_resume NAME [--set k=v ...]: with
#    NAME's run dir and these settings on every run; sets $steps and $final.
kill_and_resume() {
  local name=$1
  shift
  "$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/$name\"" --set train_steps=100000 "${extra[@]}" "$@" \
    >"$work/out" 2>"$work/err" &
  run_pid=$!
  for _ in $(seq 600); do # poll the file system, at most 30 s
    [[ -f $work/$name/checkpoints/latest ]] && break
    kill -0 "$run_pid" 2>/dev/null || break
    sleep 0.05
  done
  [[ -f $work/$name/checkpoints/latest ]] || fail "$name: no checkpoint within 30 s"
  kill -9 "$run_pid"
  wait "$run_pid" 2>/dev/null || true
  run_pid=
  local swap_dir
  swap_dir=$(echo "$work"/nvme/"$name"-*/rank0)
  [[ -f $swap_dir/stage0.master.swp ]] || fail "the killed run left no swap files in $swap_dir"
  steps=$(( $(step_of "$work/$name") + 2 ))
  run "$name" --resume --set "train_steps=$steps" "$@" || fail "resuming the killed offloaded run $name"
  grep -q "resumed from" "$work/$name/train.log" || fail "the resumed run did not load the checkpoint"
  grep -q "removing the swap files an earlier run of this job left in $swap_dir" "$work/err" ||
    fail "the resumed run did not say it removed the stale swap files"
  [[ ! -e $swap_dir ]] || fail "the swap folder outlived the resumed run"
  run "$name-whole" --set "train_steps=$steps" "$@" || fail "the uninterrupted offloaded run $name-whole"
  final=$(printf 'step_%08d' "$steps")
  for f in "$work/$name-whole/checkpoints/$final"/*.safetensors; do # the model and the optimizer state
    cmp "$f" "$work/$name/checkpoints/$final/${f##*/}" ||
      fail "kill -9 and resume ended with another state (${f##*/}) than the uninterrupted run"
  done
}
kill_and_resume killed
mv "$work/killed-whole" "$work/whole"
echo "ok: kill -9 at step >= $((steps - 2)), --resume removed the stale swap files and equals the uninterrupted run at step $steps"
# ZeRO stage 3 on one rank with the weights on NVMe too (offload_param, each part read back
# before the model runs it; on a CUDA rank each part's weights then go onto the GPU as it
# runs): kill -9 and --resume equal the uninterrupted run bit for bit, the weights' swap file
# (stage0.params.swp) included in the clean-up.
zero3_kill_and_resume() {
  local params=(--set zero_optimization.stage=3 --set 'zero_optimization.offload_param.device="nvme"'
    --set "zero_optimization.offload_param.nvme_path=\"$work/nvme\"" --set zero_optimization.offload_param.max_in_cpu=0)
  kill_and_resume zero3 "${params[@]}"
  echo "ok: ZeRO-3 with the weights and the optimizer state on NVMe: kill -9 and --resume equal the uninterrupted run"
}
if [[ ${#extra[@]} -gt 0 ]]; then
  zero3_kill_and_resume
  echo "ok: on a CUDA rank (deterministic mode); the host-side faults below run on CPU ranks only"
  exit 0
fi

# 2. A swap file cut under a running run. The run resumes step 2 and, at its first sweep
#    that reads the swap files, waits on a FIFO (DSA_SWAP_HOLD_FIFO, io/aio/swap_store.cpp):
#    opening it for writing returns once the run waits there, the master file is cut to
#    half, and closing the FIFO lets the run go on. It must fail naming the file.
run cut --set train_steps=2 || fail "the run before the cut"
mkfifo "$work/hold"
DSA_SWAP_HOLD_FIFO=$work/hold "$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/cut\"" --resume \
  --set train_steps=6 >"$work/out" 2>"$work/err" &
run_pid=$!
# The open returns when the run is held; the FIFO closes when the subshell ends; the
# timeout bounds the wait should the run never get there.
timeout 60 bash -c 'exec 3>"$1" && f=$(echo "$2"/cut-*/rank0/stage0.master.swp) &&
  truncate -s $(($(stat -c %s "$f") / 2)) "$f"' _ "$work/hold" "$work/nvme" ||
  fail "the run was not held at its first swap-in within 60 s, or had no master swap file"
rc=0
wait "$run_pid" || rc=$?
run_pid=
[[ $rc -ne 0 ]] || fail "a run whose swap file was cut should fail"
grep -q "'$work/nvme/cut-[0-9a-f]*/rank0/stage0.master.swp': the file has [0-9]* bytes, expected" "$work/err" ||
  fail "the error should name the cut swap file and its size"
[[ $(step_of "$work/cut") -eq 2 ]] || fail "the failed run should not have saved a checkpoint"
cp -r "$work/cut/checkpoints/step_00000002" "$work/cut-step2"
run cut --resume --set train_steps=4 --set zero_optimization.offload_optimizer.device=\"none\" ||
  fail "the last checkpoint of the failed run does not resume without offload"
grep -q "resumed from .*step_00000002" "$work/cut/train.log" || fail "the resume did not load step 2"
cmp "$work/cut/checkpoints/step_00000004/model.safetensors" "$work/whole/checkpoints/step_00000004/model.safetensors" ||
  fail "the resume without offload should equal the offloaded run at step 4"
echo "ok: a swap file cut under the run fails it naming the file; its last checkpoint resumes without offload"

# 3. A full disk during a swap: nvme_path on a 128 KiB tmpfs (each of the 3 arrays is
#    416 KiB). The run resumed from a checkpoint fails writing the state to its swap files,
#    naming the file and "No space left"; the checkpoint is unchanged and still resumes.
mkdir -p "$work/small"
if mount -t tmpfs -o size=128k tmpfs "$work/small" 2>/dev/null; then
  mounted=$work/small
  cp -r "$work/whole/checkpoints/step_00000002" "$work/before"
  rc=0
  run whole --set checkpoint.load=\"step_00000002\" --set train_steps=4 \
    --set "zero_optimization.offload_optimizer.nvme_path=\"$work/small\"" || rc=$?
  [[ $rc -ne 0 ]] || fail "a run on a full disk should fail"
  grep -q "$work/small/whole-[0-9a-f]*/rank0/stage0\.[a-z_]*\.swp.*No space left" "$work/err" ||
    fail "the error should name the swap file and say No space left"
  diff -r "$work/before" "$work/whole/checkpoints/step_00000002" >/dev/null ||
    fail "the checkpoint changed under the failed run"
  run whole --set checkpoint.load=\"step_00000002\" --set train_steps=4 || fail "the checkpoint no longer resumes"
  umount "$work/small" && mounted=
  echo "ok: a full disk fails the run naming the swap file and No space left; the checkpoint still resumes"
else
  echo "skip: a full disk (mount -t tmpfs is not allowed here: it needs root with CAP_SYS_ADMIN)"
fi

# 4. nvme_path under a regular file fails at start, naming the folder it cannot create.
touch "$work/plain"
rc=0
run unwritable --set "zero_optimization.offload_optimizer.nvme_path=\"$work/plain/swap\"" || rc=$?
[[ $rc -ne 0 ]] || fail "an nvme_path under a regular file should fail"
grep -q "zero_optimization.offload_optimizer.nvme_path: cannot create '$work/plain/swap/unwritable-[0-9a-f]*': Not a directory" \
  "$work/err" || fail "the error should name the nvme_path folder"
[[ ! -e $work/unwritable/checkpoints ]] || fail "the refused run should not have trained"
echo "ok: an nvme_path under a regular file fails at start naming it"

# 5. ZeRO-3 (above).
zero3_kill_and_resume
