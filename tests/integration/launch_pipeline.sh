#!/usr/bin/env bash
# Integration: pipeline stages in separate processes under `dsactor launch` — 2 processes x
# 1 stage train bit for bit as one process of 2 stages (clipping: the norm shares cross;
# the tied embedding's gradient crosses; fp16: the overflow flag), 4 processes as dp 2 x
# pp 2 as 2 in-process ranks of 2 stages, the checkpoint committed once with every stage's
# state, resumes across layouts, a wrong process count refused naming both numbers, a
# killed stage process named with its stage, Ctrl-C stopping after the step with a
# checkpoint. Usage: launch_pipeline.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
launcher_pid=
cleanup() { [[ -n $launcher_pid ]] && kill -9 "$launcher_pid" 2>/dev/null || true; }

# shellcheck source=tiny_corpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/tiny_corpus.sh"
write_tiny_corpus "$work/corpus"
{ tiny_pretrain_toml "$work" "gradient_clipping = 0.5"
  cat <<TOML
[pipeline]
stages = 2

[checkpoint]
save_interval = 2
TOML
} > "$work/pre.toml"

same_checkpoint() { # $1 $2: run dirs; the step-4 checkpoints' tensor files are equal
  local f
  for f in model optimizer_0 optimizer_1; do
    cmp "$1/checkpoints/step_00000004/$f.safetensors" "$2/checkpoints/step_00000004/$f.safetensors" ||
      fail "$3: $f differs"
  done
}

# 1. 2 processes x 1 stage = 1 process x 2 stages, bit for bit, in f32 and in fp16.
for precision in f32 fp16; do
  extra=()
  [[ $precision == fp16 ]] && extra=(--set fp16.enabled=true --set fp16.initial_scale_power=8)
  "$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/pp2_$precision\"" "${extra[@]}" \
    >"$work/out" 2>"$work/err" || fail "2 processes x 1 stage ($precision)"
  "$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/one_$precision\"" "${extra[@]}" \
    >"$work/out" 2>"$work/err" || fail "1 process x 2 stages ($precision)"
  cmp "$work/pp2_$precision/metrics.csv" "$work/one_$precision/metrics.csv" || fail "$precision: metrics differ"
  same_checkpoint "$work/pp2_$precision" "$work/one_$precision" "$precision"
  cmp "$work/pp2_$precision/eval.json" "$work/one_$precision/eval.json" || fail "$precision: evaluation differs"
done
grep -q "pipe-data layout: 2 processes = 2 pipeline position(s) x data-parallel 1" "$work/pp2_f32/train.log" ||
  fail "rank 0 should print the layout"
grep -q "this process: rank 1, stage(s) 1 of replica 0" "$work/pp2_f32/train.rank1.log" ||
  fail "rank 1 should say it runs stage 1"
[[ -f $work/pp2_f32/checkpoints/step_00000002/optimizer_1.safetensors ]] || fail "stage 1's state missing from the interval checkpoint"
ls -a "$work/pp2_f32/checkpoints" | grep -q "tmp\|staging" && fail "a temporary folder was left behind"
echo "ok: 2 processes x 1 stage = 1 process x 2 stages, bit for bit (f32 and fp16: metrics, checkpoint, evaluation)"

# 1b. The zero-bubble schedule and the speculative update across the processes: 1F1B's
#     bits (zb), and the unspeculated run's (speculation, with clipping that rolls back).
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/pp2_zb\"" --set 'pipeline.schedule="zb"' \
  >"$work/out" 2>"$work/err" || fail "2 processes x 1 stage with zb"
same_checkpoint "$work/pp2_zb" "$work/one_f32" "zb across processes"
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/pp2_spec\"" \
  --set pipeline.speculative_update=true >"$work/out" 2>"$work/err" || fail "2 processes x 1 stage, speculative"
same_checkpoint "$work/pp2_spec" "$work/one_f32" "speculative update across processes"
grep -q "speculative update: [1-9][0-9]* shard update(s) started before the global norm" "$work/pp2_spec/train.log" ||
  fail "rank 0 should report its speculative updates"
echo "ok: zb and the speculative update across 2 processes give the 1-process 1F1B bits"

# 2. 4 processes as dp 2 x pp 2 = 2 in-process ranks of 2 stages, bit for bit.
"$dsactor" launch --num_procs 4 "$work/pre.toml" --set "run_dir=\"$work/dp2pp2\"" --set train_batch_size=16 \
  >"$work/out" 2>"$work/err" || fail "4 processes as dp 2 x pp 2"
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/dp2\"" --set train_batch_size=16 --set devices.ranks=2 \
  >"$work/out" 2>"$work/err" || fail "2 in-process ranks of 2 stages"
cmp "$work/dp2pp2/metrics.csv" "$work/dp2/metrics.csv" || fail "dp 2 x pp 2: metrics differ"
same_checkpoint "$work/dp2pp2" "$work/dp2" "dp 2 x pp 2"
grep -q "  stage 1: ranks 2, 3" "$work/dp2pp2/train.log" || fail "the layout should put stage 1 on ranks 2 and 3"
echo "ok: 4 processes as dp 2 x pp 2 = 2 in-process ranks of 2 stages, bit for bit"

# 2b. ZeRO stages 1 and 2 and 1-bit Adam as dp 2 x pp 2 across 4 processes = 2 in-process
#     ranks of 2 stages, bit for bit: the model, every rank's optimizer partition or error
#     buffer files (each written by its own process, committed once by rank 0).
mkdir -p "$work/nvme"
for variant in zero1 zero2 onebit nvme; do
  case $variant in
    zero1) keys=(--set zero_optimization.stage=1) ;;
    zero2) keys=(--set zero_optimization.stage=2) ;;
    onebit) keys=(--set 'optimizer.type="OneBitAdam"' --set optimizer.params.freeze_step=2) ;;
    nvme) keys=(--set zero_optimization.stage=1 --set 'zero_optimization.offload_optimizer.device="nvme"'
                --set "zero_optimization.offload_optimizer.nvme_path=\"$work/nvme\"") ;;
  esac
  "$dsactor" launch --num_procs 4 "$work/pre.toml" --set "run_dir=\"$work/${variant}_procs\"" --set train_batch_size=16 \
    "${keys[@]}" >"$work/out" 2>"$work/err" || fail "dp 2 x pp 2 with $variant"
  "$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/${variant}_threads\"" --set train_batch_size=16 \
    --set devices.ranks=2 "${keys[@]}" >"$work/out" 2>"$work/err" || fail "2 in-process ranks with $variant"
  cmp "$work/${variant}_procs/metrics.csv" "$work/${variant}_threads/metrics.csv" || fail "$variant: metrics differ"
  files=0
  for f in "$work/${variant}_threads/checkpoints/step_00000004/"*.safetensors; do
    cmp "$f" "$work/${variant}_procs/checkpoints/step_00000004/$(basename "$f")" || fail "$variant: $(basename "$f") differs"
    files=$((files + 1))
  done
  (( files >= 5 )) || fail "$variant: expected the model and 4 per-rank files, got $files files"
done
# A ZeRO-2 checkpoint of dp 2 x pp 2 resumes on 2 in-process ranks, bit for bit.
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/zero2_resumed\"" --set train_batch_size=16 --set devices.ranks=2 \
  --set zero_optimization.stage=2 --set "checkpoint.load=\"$work/zero2_procs/checkpoints/step_00000002\"" \
  >"$work/out" 2>"$work/err" || fail "resuming the dp 2 x pp 2 ZeRO-2 checkpoint on 2 in-process ranks"
cmp "$work/zero2_resumed/checkpoints/step_00000004/model.safetensors" \
  "$work/zero2_threads/checkpoints/step_00000004/model.safetensors" || fail "ZeRO-2 resume: the model differs"
[[ -z $(find "$work/nvme" -type f) ]] || fail "swap files were left in the nvme_path: $(find "$work/nvme" -type f | head -3)"
echo "ok: ZeRO 1, ZeRO 2, 1-bit Adam and NVMe offload as dp 2 x pp 2 = 2 in-process ranks, bit for bit; the ZeRO-2 checkpoint resumes in one process"

# 3. Resumes across layouts: pp 2 -> pp 1 and pp 1 -> pp 2 end where the uninterrupted run
#    does; dp 2 x pp 2 -> dp 1 with both stages in one process (the same global batch, 8
#    accumulation steps) resumes.
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/to_one\"" \
  --set "checkpoint.load=\"$work/pp2_f32/checkpoints/step_00000002\"" >"$work/out" 2>"$work/err" ||
  fail "resuming the 2-process checkpoint in one process"
same_checkpoint "$work/to_one" "$work/one_f32" "pp 2 -> pp 1"
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/to_two\"" \
  --set "checkpoint.load=\"$work/one_f32/checkpoints/step_00000002\"" >"$work/out" 2>"$work/err" ||
  fail "resuming the 1-process checkpoint on 2 processes"
same_checkpoint "$work/to_two" "$work/one_f32" "pp 1 -> pp 2"
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/dp_to_one\"" --set train_batch_size=16 \
  --set "checkpoint.load=\"$work/dp2pp2/checkpoints/step_00000002\"" >"$work/out" 2>"$work/err" ||
  fail "resuming the dp 2 x pp 2 checkpoint in one process"
grep -q "resumed from .*step_00000002 at step 2" "$work/dp_to_one/train.log" || fail "dp 2 x pp 2 -> 1: no resume"
# On one stage: the 2-stage checkpoint repartitioned on load.
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/to_one_stage\"" --set pipeline.stages=1 \
  --set "checkpoint.load=\"$work/pp2_f32/checkpoints/step_00000002\"" >"$work/out" 2>"$work/err" ||
  fail "resuming the 2-process checkpoint on one stage"
grep -q "repartitioned on load to 'embeddings + layers \[0, 2) + head'" "$work/to_one_stage/train.log" ||
  fail "the resume on one stage should say it repartitioned"
echo "ok: resumes pp 2 -> pp 1 and pp 1 -> pp 2 (bit for bit), dp 2 x pp 2 -> dp 1 x pp 1, 2 stages -> 1"

# 3b. SQuAD fine-tuning from the pre-trained checkpoint, stages across 2 processes: the
#     predictions and scores of one process running both stages, exactly.
"$dsactor" prep qa-from-corpus --corpus "$work/corpus" --out "$work/qa" >"$work/out" 2>"$work/err" || fail "qa-from-corpus"
cat >"$work/squad.toml" <<TOML
train_batch_size = 4
train_micro_batch_size_per_gpu = 2
train_steps = 3
init_checkpoint = "$work/pp2_f32/checkpoints/step_00000004/model.safetensors"

$(tiny_squad_tables "$work")
TOML
"$dsactor" launch --num_procs 2 "$work/squad.toml" --set "run_dir=\"$work/squad_procs\"" >"$work/out" 2>"$work/err" ||
  fail "SQuAD on 2 processes x 1 stage"
"$dsactor" run "$work/squad.toml" --set "run_dir=\"$work/squad_one\"" >"$work/out" 2>"$work/err" || fail "SQuAD in one process"
for f in predictions.json eval.json metrics.csv; do
  cmp "$work/squad_procs/$f" "$work/squad_one/$f" || fail "SQuAD: $f differs between 2 processes and 1"
done
echo "ok: SQuAD fine-tuning and prediction on 2 processes x 1 stage = 1 process x 2 stages, exactly"

# 4. A process count that is not a multiple of the processes per replica: refused, both named.
rc=0
"$dsactor" launch --num_procs 3 "$work/pre.toml" --set "run_dir=\"$work/three\"" >"$work/out" 2>"$work/err" || rc=$?
[[ $rc -ne 0 ]] || fail "3 processes for 2-process replicas should be refused"
grep -q "a job of 3 processes cannot hold replicas of 2 processes" "$work/err" || fail "the refusal should name 3 and 2"
echo "ok: 3 processes for replicas of 2 refused, naming both"

# 5. kill -9 of the process running stage 1: every process stops within 30 s, rank 0
#    naming the lost rank and its stage.
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/killed\"" --set train_steps=100000 \
  >"$work/out" 2>"$work/err" &
launcher_pid=$!
kill_rank_after_checkpoint "$work/killed" 1
rc=$job_rc elapsed=$job_elapsed
[[ $rc -ne 0 ]] || fail "the job should fail when a stage process is killed"
[[ $elapsed -le 30 ]] || fail "the job took ${elapsed} s to end after the kill"
grep -q "rank 1 lost" "$work/err" || fail "the job should name the lost rank"
# Rank 0 fails on the abort and names the stage (the launcher's SIGTERM only asks it to stop
# after the step; its SIGKILL comes after --grace, 10 s).
grep -q "^\[rank 0\] dsactor run: .*rank 1 lost.*(rank 1 ran stage 1 of replica 0)" "$work/err" ||
  fail "rank 0 should name the lost rank and its stage"
echo "ok: kill -9 of stage 1's process ended the job in ${elapsed} s, naming rank 1 and its stage"

# 6. The launcher's Ctrl-C: every process stops after the same step; the checkpoint holds every stage.
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/intr\"" --set train_steps=100000 \
  --set checkpoint.save_interval=100000 >"$work/out" 2>"$work/err" &
launcher_pid=$!
for _ in $(seq 600); do
  [[ -f $work/intr/metrics.csv ]] && (( $(wc -l <"$work/intr/metrics.csv") > 3 )) && break
  sleep 0.05
done
kill -INT "$launcher_pid"
rc=0
wait "$launcher_pid" || rc=$?
launcher_pid=
[[ $rc -eq 130 ]] || fail "Ctrl-C should end the job with 130, got $rc"
last=$(cat "$work/intr/checkpoints/latest")
for f in model optimizer_0 optimizer_1; do
  [[ -s $work/intr/checkpoints/$last/$f.safetensors ]] || fail "the Ctrl-C checkpoint lacks $f"
done
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/intr_resumed\"" --set "checkpoint.load=\"$work/intr/checkpoints/$last\"" \
  --set "train_steps=$((10#${last#step_} + 1))" >"$work/out" 2>"$work/err" || fail "resuming the Ctrl-C checkpoint"
echo "ok: Ctrl-C stopped both processes after step $((10#${last#step_})) with a checkpoint of both stages"
