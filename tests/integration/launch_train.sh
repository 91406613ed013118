#!/usr/bin/env bash
# Integration: `dsactor launch` training for real — 2 processes x 2 pipeline stages give
# the parameters of 2 ranks in one process bit for bit (and 2 processes with ZeRO stage 3); ranks with differing configs are
# refused naming the key; kill -9 of a rank mid-run ends the job non-zero naming it, and
# the last checkpoint resumes on one process. Usage: launch_train.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
launcher_pid=
cleanup() { [[ -n $launcher_pid ]] && kill -9 "$launcher_pid" 2>/dev/null || true; }

# shellcheck source=tiny_corpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/tiny_corpus.sh"
write_tiny_corpus "$work/corpus"
{ tiny_pretrain_toml "$work"
  cat <<TOML
[pipeline]
stages = 2
stages_per_process = 2 # every process runs both stages: the processes are data-parallel ranks
TOML
} > "$work/pre.toml"

# 1. Two processes (each 2 stages, ZeRO stage 2, buckets sent during backward) equal two
#    ranks in one process, bit for bit: the model (masters gathered into model.safetensors)
#    equals the run without ZeRO, and each rank's optimizer partition file, written by
#    that rank, equals the one an in-process rank writes (ZeRO against stage 0 for the
#    optimizer state is checked in tests/train/test_run_data_parallel.cpp).
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/procs\"" \
  --set zero_optimization.overlap_comm=true --set zero_optimization.reduce_bucket_size=2000 \
  --set zero_optimization.stage=2 --set checkpoint.save_interval=2 \
  >"$work/out" 2>"$work/err" || fail "2-process training"
for f in train.log train.rank1.log trace.dsat trace.rank1.dsat metrics.csv; do
  [[ -s $work/procs/$f ]] || fail "the job's run dir lacks $f"
done
grep -q "as rank 1 of 2 processes" "$work/procs/train.rank1.log" || fail "rank 1 did not say which rank it is"
# The two processes' traces on one clock: one host, so the steady clock they share.
"$dsactor" trace "$work/procs" summary --steps >"$work/summary" 2>&1 || fail "trace summary of the 2-process run"
grep -q "clocks: 2 ranks of one host" "$work/summary" || { cat "$work/summary"; fail "the ranks' traces should align on one host's clock"; }
# Without --steps the 2 ranks fit a screen, with one verdict: the slowest rank's.
"$dsactor" trace "$work/procs" summary >"$work/compact" 2>&1 || fail "trace summary of the 2-process run"
(( $(wc -l <"$work/compact") <= 40 )) && grep -q "^the slowest rank is rank [01] " "$work/compact" &&
  [[ $(grep -c "^the step is bound by" "$work/compact") -eq 1 ]] || { cat "$work/compact"; fail "the 2-rank summary should fit a screen with one verdict"; }
# Each rank estimated the rendezvous server's clock at the start (what several hosts align
# on); sharing one clock, the estimates must agree within their error bounds.
grep -q "the rendezvous clock estimates agree" "$work/summary" || { cat "$work/summary"; fail "the ranks' rendezvous clock estimates should agree"; }
# Every step summed gradients over the 2 processes: its allreduce bytes and bus bandwidth show.
awk '/^steps of rank 0/ {t = 1; next} t && /^ *[0-9]+ / {n++; if ($8 > 0 && $9 > 0) ok++} t && /^$/ {t = 0}
     END {exit !(n == 4 && ok == 4)}' "$work/summary" || { cat "$work/summary"; fail "each step's allreduce MiB and bus GB/s"; }
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/threads\"" --set devices.ranks=2 >"$work/out" 2>"$work/err" ||
  fail "2 ranks in one process"
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/zthreads\"" --set devices.ranks=2 \
  --set zero_optimization.stage=2 >"$work/out" 2>"$work/err" || fail "2 ranks in one process with ZeRO stage 2"
step4=checkpoints/step_00000004
cmp "$work/procs/$step4/model.safetensors" "$work/threads/$step4/model.safetensors" ||
  fail "2 processes and 2 in-process ranks ended with different model state"
for f in optimizer_0_rank0 optimizer_0_rank1 optimizer_1_rank0 optimizer_1_rank1; do
  cmp "$work/procs/$step4/$f.safetensors" "$work/zthreads/$step4/$f.safetensors" ||
    fail "2 processes and 2 in-process ranks wrote different $f files"
done
ls -a "$work/procs/checkpoints" | grep -q staging && fail "a staging folder was left behind"
cmp "$work/procs/metrics.csv" "$work/threads/metrics.csv" || fail "2 processes and 2 in-process ranks logged different metrics"
echo "ok: 2 processes x 2 stages with ZeRO stage 2 = 2 in-process ranks, bit for bit; each rank wrote its own partition"

# 1b. The same with each process's optimizer state swapped to NVMe (small sub-groups, both
#     pipelines): the model is bit for bit the in-memory run's, the checkpoint streams each
#     rank's moments one file per swap chunk, the same files 2 in-process ranks write with
#     the same settings, and no swap file is left behind.
offload=(--set zero_optimization.stage=2 --set zero_optimization.sub_group_size=2048
  --set 'zero_optimization.offload_optimizer.device="nvme"'
  --set "zero_optimization.offload_optimizer.nvme_path=\"$work/swap\""
  --set zero_optimization.offload_optimizer.pipeline_read=true
  --set zero_optimization.offload_optimizer.pipeline_write=true
  --set zero_optimization.offload_optimizer.buffer_count=9)
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/oprocs\"" "${offload[@]}" \
  >"$work/out" 2>"$work/err" || fail "2-process training with the optimizer state on NVMe"
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/othreads\"" --set devices.ranks=2 "${offload[@]}" \
  >"$work/out" 2>"$work/err" || fail "2 in-process ranks with the optimizer state on NVMe"
cmp "$work/oprocs/$step4/model.safetensors" "$work/zthreads/$step4/model.safetensors" ||
  fail "2 processes with NVMe offload and 2 in-process ranks in memory ended with different models"
parts=$(cd "$work/oprocs/$step4" && ls optimizer_*_part*.safetensors | wc -l)
[[ $parts -gt 8 ]] || fail "expected one optimizer file per swap chunk, found $parts"
[[ $(cd "$work/oprocs/$step4" && ls) == $(cd "$work/othreads/$step4" && ls) ]] ||
  fail "2 processes and 2 in-process ranks with offload wrote different files"
for f in "$work/oprocs/$step4"/optimizer_*.safetensors; do
  cmp "$f" "$work/othreads/$step4/$(basename "$f")" || fail "$(basename "$f") differs between processes and threads"
done
[[ -z $(ls -A "$work/swap") ]] || fail "swap files were left behind: $(ls -R "$work/swap")"
echo "ok: 2 processes with the optimizer state on NVMe = in memory, bit for bit"

# 1c. ZeRO stage 3 (one pipeline stage; the matrices and embeddings gathered by each
#     process's parameter fetcher over UCX, each micro-batch's gradients summed into the
#     partitions), with the optimizer state and the weights on NVMe, equals 2 in-process ranks with stage 3
#     in memory, bit for bit (against stage 0, within a tolerance, in
#     tests/train/test_run_zero3.cpp).
zero3=(--set pipeline.stages=1 --set zero_optimization.stage=3
  --set zero_optimization.stage3_param_persistence_threshold=1000)
z3offload=(--set zero_optimization.sub_group_size=2048 --set 'zero_optimization.offload_optimizer.device="nvme"'
  --set "zero_optimization.offload_optimizer.nvme_path=\"$work/swap\""
  --set 'zero_optimization.offload_param.device="nvme"' --set "zero_optimization.offload_param.nvme_path=\"$work/swap\""
  --set zero_optimization.offload_param.max_in_cpu=0 --set zero_optimization.offload_param.buffer_size=1000)
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/z3procs\"" "${zero3[@]}" "${z3offload[@]}" \
  >"$work/out" 2>"$work/err" || fail "2-process training with ZeRO stage 3 and the optimizer state and weights on NVMe"
grep -q "ZeRO-3 fetcher of rank 0: gathered [1-9]" "$work/z3procs/train.log" || fail "rank 0's fetcher gathered nothing"
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/z3threads\"" --set devices.ranks=2 "${zero3[@]}" \
  >"$work/out" 2>"$work/err" || fail "2 in-process ranks with ZeRO stage 3"
cmp "$work/z3procs/$step4/model.safetensors" "$work/z3threads/$step4/model.safetensors" ||
  fail "2 processes and 2 in-process ranks with ZeRO stage 3 ended with different models"
[[ -z $(ls -A "$work/swap") ]] || fail "ZeRO-3 swap files were left behind"
echo "ok: 2 processes with ZeRO stage 3, the optimizer state and the weights on NVMe = 2 in-process ranks with stage 3 in memory, bit for bit"

# 1c'. ZeRO stage 2 on one pipeline stage (each micro-batch's gradients summed into the
#      partitions during the backward): 2 processes equal 2 in-process ranks bit for bit.
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/z2procs\"" --set pipeline.stages=1 \
  --set zero_optimization.stage=2 >"$work/out" 2>"$work/err" || fail "2-process training with ZeRO stage 2 on one stage"
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/z2threads\"" --set devices.ranks=2 --set pipeline.stages=1 \
  --set zero_optimization.stage=2 >"$work/out" 2>"$work/err" || fail "2 in-process ranks with ZeRO stage 2 on one stage"
for f in model optimizer_0_rank0 optimizer_0_rank1; do
  cmp "$work/z2procs/$step4/$f.safetensors" "$work/z2threads/$step4/$f.safetensors" ||
    fail "ZeRO stage 2 on one stage: 2 processes and 2 in-process ranks wrote different $f files"
done
echo "ok: 2 processes with ZeRO stage 2 on one stage = 2 in-process ranks, bit for bit"

# 1d. Ctrl-C of a ZeRO-3 job: the ranks agree to stop after a step while their stages may
#     be in the next one's forward; its gathers wait for a step that is never allowed, and
#     the run ends cleanly (exit 130, a final checkpoint) instead of hanging in a gather.
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/z3stop\"" "${zero3[@]}" \
  --set train_steps=100000 --set checkpoint.save_interval=2 >"$work/out" 2>"$work/err" &
launcher_pid=$!
for _ in $(seq 600); do
  [[ -f $work/z3stop/checkpoints/latest ]] && break
  sleep 0.05
done
[[ -f $work/z3stop/checkpoints/latest ]] || fail "no ZeRO-3 checkpoint within 30 s"
kill -INT "$launcher_pid"
for _ in $(seq 600); do
  kill -0 "$launcher_pid" 2>/dev/null || break
  sleep 0.05
done
kill -0 "$launcher_pid" 2>/dev/null && fail "the ZeRO-3 job still runs 30 s after Ctrl-C"
rc=0
wait "$launcher_pid" || rc=$?
launcher_pid=
[[ $rc -eq 130 ]] || fail "Ctrl-C of a ZeRO-3 job should exit 130, got $rc: $(tail -5 "$work/err")"
grep -q "stopped by signal after step" "$work/z3stop/train.log" || fail "rank 0 did not report the stop"
echo "ok: Ctrl-C of a 2-process ZeRO-3 job stops it cleanly"

# 1e. ZeRO stage 1 with LAMB, fp16 loss scaling and clipping, 2 processes x 2 stages, equals
#     2 in-process ranks bit for bit (model and every rank's optimizer file).
stage1=(--set zero_optimization.stage=1 --set 'optimizer.type="Lamb"' --set fp16.enabled=true
  --set fp16.initial_scale_power=8 --set gradient_clipping=0.05)
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/s1procs\"" "${stage1[@]}" \
  >"$work/out" 2>"$work/err" || fail "2-process training with ZeRO stage 1, LAMB, fp16 and clipping"
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/s1threads\"" --set devices.ranks=2 "${stage1[@]}" \
  >"$work/out" 2>"$work/err" || fail "2 in-process ranks with ZeRO stage 1, LAMB, fp16 and clipping"
for f in model optimizer_0_rank0 optimizer_0_rank1 optimizer_1_rank0 optimizer_1_rank1; do
  cmp "$work/s1procs/$step4/$f.safetensors" "$work/s1threads/$step4/$f.safetensors" ||
    fail "ZeRO stage 1 with LAMB and fp16: 2 processes and 2 in-process ranks wrote different $f files"
done
echo "ok: 2 processes x 2 stages with ZeRO stage 1, LAMB, fp16 and clipping = 2 in-process ranks, bit for bit"

# 1g. The compressed optimizers over 2 processes x 2 pipeline stages, fp16 and clipping: two
#     warm-up steps, then gradients kept local and 1-bit exchanges on each stage's shard
#     channel; equal to 2 in-process ranks bit for bit (the 1-bit collective adds in rank
#     order on either transport).
#     The three also with ZeRO stage 1 (their partitions all-gathered between the processes).
for opt in 'OneBitAdam:freeze_step' 'ZeroOneAdam:var_freeze_step' 'OneBitLamb:freeze_step' 'OneBitAdam:freeze_step:1' \
  'OneBitLamb:freeze_step:1' 'ZeroOneAdam:var_freeze_step:1'; do
  name=${opt%%:*}
  rest=${opt#*:}
  zero=${rest#*:}
  [ "$zero" = "$rest" ] && zero=0
  onebit=(--set "optimizer.type=\"$name\"" --set "optimizer.params.${rest%%:*}=2" --set fp16.enabled=true
    --set fp16.initial_scale_power=8 --set gradient_clipping=0.05 --set zero_optimization.stage=$zero)
  name=$name$zero
  "$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/c$name\"" "${onebit[@]}" \
    >"$work/out" 2>"$work/err" || fail "2-process training with $name"
  "$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/ct$name\"" --set devices.ranks=2 "${onebit[@]}" \
    >"$work/out" 2>"$work/err" || fail "2 in-process ranks with $name"
  cmp "$work/c$name/$step4/model.safetensors" "$work/ct$name/$step4/model.safetensors" ||
    fail "$name: 2 processes and 2 in-process ranks ended with different models"
  grep -q "compressed communication: 2 of the steps kept their gradients local" "$work/c$name/train.log" ||
    fail "$name: the run did not report its compressed steps: $(grep communication "$work/c$name/train.log")"
done
echo "ok: 1-bit Adam, 0/1 Adam and 1-bit LAMB (ZeRO stages 0 and 1) over 2 processes x 2 stages = 2 in-process ranks, bit for bit"

# 1f. ZeRO stage 1 on one pipeline stage with each process's optimizer state on NVMe and no
#     clipping, so the update streams over the backward (each reduce bucket updated as it is
#     summed over the processes): 2 processes equal 2 in-process ranks in memory bit for bit.
s1nvme=(--set zero_optimization.stage=1 --set pipeline.stages=1 --set gradient_clipping=0.0)
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/s1oprocs\"" "${s1nvme[@]}" \
  --set zero_optimization.sub_group_size=2048 --set 'zero_optimization.offload_optimizer.device="nvme"' \
  --set "zero_optimization.offload_optimizer.nvme_path=\"$work/swap\"" \
  >"$work/out" 2>"$work/err" || fail "2-process training with ZeRO stage 1 and the optimizer state on NVMe"
grep -q "updates streamed over the backward" "$work/s1oprocs/train.log" || fail "ZeRO stage 1 on NVMe: no update streamed"
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/s1mthreads\"" --set devices.ranks=2 "${s1nvme[@]}" \
  >"$work/out" 2>"$work/err" || fail "2 in-process ranks with ZeRO stage 1 in memory"
cmp "$work/s1oprocs/$step4/model.safetensors" "$work/s1mthreads/$step4/model.safetensors" ||
  fail "ZeRO stage 1: 2 processes with NVMe offload and 2 in-process ranks in memory ended with different models"
[[ -z $(ls -A "$work/swap") ]] || fail "ZeRO stage 1 swap files were left behind"
echo "ok: 2 processes with ZeRO stage 1 and the optimizer state on NVMe (streamed update) = in memory, bit for bit"

# The ZeRO run's model as one fp32 HuggingFace-named file, from the checkpoint root.
"$dsactor" convert zero-to-fp32 "$work/procs/checkpoints" "$work/model-fp32.safetensors" >"$work/out" 2>"$work/err" ||
  fail "convert zero-to-fp32"
grep -q "tensors, .* parameters in fp32, from .*step_00000004/model.safetensors" "$work/out" || fail "convert's summary"
cmp "$work/model-fp32.safetensors" "$work/procs/checkpoints/step_00000004/model.safetensors" ||
  fail "the converted file differs from the checkpoint's fp32 model"
rc=0
"$dsactor" convert zero-to-fp32 "$work/nowhere" "$work/x.safetensors" >"$work/out" 2>"$work/err" || rc=$?
[[ $rc -eq 2 ]] && grep -q "nowhere: no such file or directory" "$work/err" || fail "a missing checkpoint should be named (exit 2)"
echo "ok: convert zero-to-fp32"

# 2. Ranks whose configs differ are refused at the rendezvous, naming the key (exit 2).
rc=0
"$dsactor" launch --num_procs 2 -- sh -c "exec '$dsactor' run '$work/pre.toml' --set run_dir='\"$work/differ\"' \
  --set optimizer.params.lr=\$((RANK + 1))e-3" >"$work/out" 2>"$work/err" || rc=$?
[[ $rc -ne 0 ]] || fail "differing configs should fail the job"
grep -q "\[rank 1\] dsactor run: rank 1's config differs from rank 0's: optimizer.params.lr = 0.001 vs 0.002" "$work/err" ||
  fail "rank 1 should name the differing key"
grep -q "rank 1 exited with code 2" "$work/err" || fail "a config refusal should exit 2"
echo "ok: differing configs refused naming the key"

# 3. kill -9 of rank 1 mid-run: the job ends non-zero within 30 s naming rank 1, and the
#    last checkpoint resumes on one process.
"$dsactor" launch --num_procs 2 "$work/pre.toml" --set "run_dir=\"$work/killed\"" --set train_steps=100000 \
  --set checkpoint.save_interval=2 >"$work/out" 2>"$work/err" &
launcher_pid=$!
kill_rank_after_checkpoint "$work/killed" 1
rc=$job_rc elapsed=$job_elapsed
[[ $rc -ne 0 ]] || fail "the job should fail when a rank is killed"
[[ $elapsed -le 30 ]] || fail "the job took ${elapsed} s to end after the kill"
grep -q "rank 1" "$work/err" || fail "the launcher should name rank 1"
last=$(cat "$work/killed/checkpoints/latest")
steps=$((10#${last#step_}))
"$dsactor" run "$work/pre.toml" --set "run_dir=\"$work/killed\"" --set checkpoint.load=\"latest\" \
  --set "train_steps=$((steps + 1))" >"$work/out" 2>"$work/err" || fail "resuming the killed job's last checkpoint"
grep -q "resumed from" "$work/killed/train.log" || fail "the resumed run did not load the checkpoint"
echo "ok: kill -9 of rank 1 ended the job in ${elapsed} s; its last checkpoint resumes on one process"
