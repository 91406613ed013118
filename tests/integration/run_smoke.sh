#!/usr/bin/env bash
# Integration: the real dsactor binary on a tiny generated corpus — pre-training
# with 2 stages, outputs in the run directory, the Chrome trace, a bad config,
# SIGINT (finish the step, checkpoint, exit 130) and --resume, SQuAD generation,
# fine-tuning and evaluation. Usage: run_smoke.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1

# shellcheck source=tiny_corpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/tiny_corpus.sh"
write_tiny_corpus "$work/corpus"

cat > "$work/pre.toml" <<TOML
train_batch_size = 8
train_micro_batch_size_per_gpu = 2
train_steps = 4
steps_per_print = 1
run_dir = "$work/run"

$(tiny_bert_tables "$work")

[optimizer]
type = "Lamb"
params = { lr = 2e-3, weight_decay = 0.01 }

[scheduler]
type = "WarmupDecayLR"
params = { warmup_num_steps = 2, total_num_steps = 4, warmup_max_lr = 2e-3 }

[pipeline]
stages = 2

[checkpoint]
dir = "$work/ckpt"
save_interval = 2
TOML

out=$("$dsactor" run "$work/pre.toml" --trace-chrome "$work/trace.json" 2>"$work/pre.log") || { cat "$work/pre.log"; fail "pre-training run"; }
for f in config.toml train.log metrics.csv metrics.jsonl trace.dsat eval.json; do [[ -s $work/run/$f ]] || fail "run dir lacks $f"; done
head -1 "$work/run/metrics.csv" | grep -q "Train/Samples/train_loss,Train/Samples/lr,Train/Samples/loss_scale" || fail "metrics.csv header"
[[ $(wc -l < "$work/run/metrics.csv") -eq 5 ]] || fail "metrics.csv should have 4 rows"
grep -q '"Train/Samples/lr"' "$work/run/metrics.jsonl" || fail "metrics.jsonl"
[[ $(cat "$work/ckpt/latest") == step_00000004 ]] || fail "latest should name step 4"
python3 -c "import json,sys; t=json.load(open('$work/trace.json')); ev=t['traceEvents'] if isinstance(t,dict) else t; assert any(e.get('name')=='forward' and 'stage' in e.get('args',{}) for e in ev)" || fail "chrome trace"
echo "$out" | tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); assert 0<=d['mlm_accuracy']<=1" || fail "eval line"
grep -q "stage 1: idle" "$work/pre.log" || fail "idle fraction report"
grep -q "training done" "$work/run/train.log" || fail "train.log lacks the run's log lines"
echo "ok: pre-training run, outputs, trace, eval"

# The same run under the OpenMP settings dsactor chooses for itself (this suite sets
# OMP_WAIT_POLICY=passive for every run): the same losses, to the bit.
sed -e "s|^run_dir = .*|run_dir = \"$work/run_omp\"|" -e "s|^dir = .*|dir = \"$work/ckpt_omp\"|" "$work/pre.toml" > "$work/omp.toml"
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u DSA_OMP_ENV "$dsactor" run "$work/omp.toml" >/dev/null 2>"$work/omp.log" ||
  { cat "$work/omp.log"; fail "pre-training under dsactor's OpenMP settings"; }
losses() { python3 -c "import csv,sys; print([r['Train/Samples/train_loss'] for r in csv.DictReader(open(sys.argv[1]))])" "$1"; }
[[ $(losses "$work/run/metrics.csv") == "$(losses "$work/run_omp/metrics.csv")" ]] ||
  fail "losses under dsactor's OpenMP settings differ: $(losses "$work/run/metrics.csv") vs $(losses "$work/run_omp/metrics.csv")"
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u DSA_OMP_ENV -u LOCAL_SIZE "$dsactor" report 2>/dev/null |
  grep -q "^openmp *: OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000 (dsactor set" || fail "dsactor should choose its OpenMP settings"
echo "ok: the same losses under dsactor's own OpenMP settings"

# dsactor trace: the run points at its trace; the summary reads it.
grep -qF "dsactor trace $work/run summary" "$work/pre.log" || fail "the run should point at its trace summary"
summary=$("$dsactor" trace "$work/run" summary) || fail "dsactor trace RUN summary"
for part in "actors (busy" "steps of rank 0" "stage 1" "reducer 0" "(S-1)/(M+S-1)" "complete"; do
  grep -qF "$part" <<<"$summary" || { echo "$summary"; fail "trace summary lacks '$part'"; }
done
step_rows() { grep -cE '^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+% ' <<<"$1" || true; }
grep -qE "^steps of rank 0: 4 \(" <<<"$summary" || { echo "$summary"; fail "trace summary should count 4 steps"; }
grep -qE "^  step time  median [0-9.]+ s, p90 [0-9.]+ s, max [0-9.]+ s; slowest steps: " <<<"$summary" ||
  { echo "$summary"; fail "trace summary lacks the step-time distribution"; }
grep -qE "^the step is bound by " <<<"$summary" || { echo "$summary"; fail "trace summary has no verdict"; }
(( $(wc -l <<<"$summary") <= 40 )) || { echo "$summary"; fail "trace summary of a 4-step run should fit a screen"; }
rows=$("$dsactor" trace "$work/run" summary --steps) || fail "dsactor trace RUN summary --steps"
[[ $(step_rows "$rows") -eq 4 ]] || { echo "$rows"; fail "trace summary --steps should list 4 steps"; }
# dsactor trace check: the finished run's schedule keeps every invariant. A shared machine
# may stall a thread for any time, so the starvation rule gets a wide tolerance here (its
# detection is tested on injected traces).
check=$("$dsactor" trace "$work/run" check --idle-tolerance-ms 600000) || { echo "$check"; fail "dsactor trace RUN check should pass a real run"; }
grep -qF "OK: no violation" <<<"$check" || { echo "$check"; fail "trace check should say it passed"; }
grep -qF "within the plan's slot counts" <<<"$check" || { echo "$check"; fail "trace check should bound slots by the plan"; }
# The analyses: a step's critical path, one actor's table, a run against itself.
path=$("$dsactor" trace "$work/run" critical-path --step 1) || { echo "$path"; fail "dsactor trace RUN critical-path"; }
grep -qF "share of the step on the path" <<<"$path" || { echo "$path"; fail "critical path lacks the shares"; }
view=$("$dsactor" trace "$work/run" actor "stage 1" --step 1) || fail "dsactor trace RUN actor"
grep -qF "bound by" <<<"$view" || { echo "$view"; fail "actor view lacks the waits"; }
if err=$("$dsactor" trace "$work/run" actor nosuch 2>&1); then fail "an unknown actor should fail"; fi
grep -qF "its actors are: " <<<"$err" || { echo "$err"; fail "an unknown actor should list the actors"; }
if "$dsactor" trace "$work/run" critical-path >/dev/null 2>&1; then fail "critical-path without --step should fail"; fi
diff_out=$("$dsactor" trace "$work/run" diff "$work/run") || fail "dsactor trace RUN diff RUN"
grep -qF "the same order of spans" <<<"$diff_out" || { echo "$diff_out"; fail "a run diffed with itself should match"; }
# dsactor trace export --chrome: the recorded trace as Chrome JSON, flows and credit counters.
"$dsactor" trace "$work/run" export --chrome "$work/export.json" >/dev/null || fail "dsactor trace RUN export --chrome"
python3 - "$work/export.json" <<'PY' || fail "exported Chrome trace"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
tracks = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
assert {"stage 0", "stage 1", "feeder"} <= tracks, tracks
starts = {e["id"] for e in ev if e["ph"] == "s"}
assert starts and starts == {e["id"] for e in ev if e["ph"] == "f"}, "flows should pair"
assert any(e["ph"] == "C" and e["name"].startswith("credits edge") for e in ev), "no credit counter"
PY
if "$dsactor" trace "$work/run" export >/dev/null 2>&1; then fail "export without --chrome should fail"; fi
if "$dsactor" trace "$work/run" check --idle-tolerance-ms -1 >/dev/null 2>&1; then fail "a negative tolerance should fail"; fi
grep -qF "starvation (rank 0): 64 forward/backward spans of 2 stages" <<<"$check" || { echo "$check"; fail "trace check should check starvation"; }
# A run killed with kill -9 keeps its trace up to the writer's last flush (about
# every second): wait, with a bound, until the file holds a whole step, then kill.
sed -e "s|^run_dir = .*|run_dir = \"$work/killed\"|" -e "s|^train_steps = .*|train_steps = 100000|" \
  -e "s|^dir = .*|dir = \"$work/ckpt_killed\"|" -e "s|^save_interval = .*|save_interval = 100000|" \
  -e "s|total_num_steps = 4|total_num_steps = 100000|" "$work/pre.toml" > "$work/killed.toml"
"$dsactor" run "$work/killed.toml" >/dev/null 2>"$work/killed.log" &
pid=$!
rows=0
for _ in $(seq 1 240); do
  if [[ -s $work/killed/trace.dsat ]]; then
    rows=$(step_rows "$("$dsactor" trace "$work/killed" summary --steps 2>/dev/null)")
    [[ $rows -ge 2 ]] && break
  fi
  kill -0 "$pid" 2>/dev/null || { cat "$work/killed.log"; fail "the run to be killed ended early"; }
  sleep 0.25
done
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
[[ $rows -ge 2 ]] || fail "the killed run's trace never held two steps"
summary=$("$dsactor" trace "$work/killed/trace.dsat" summary --steps) || fail "summary of a killed run's trace"
grep -qF "the trace ends at byte" <<<"$summary" || { echo "$summary"; fail "the summary should say where a torn trace ends"; }
[[ $(step_rows "$summary") -ge 2 ]] || fail "the killed run's summary lost its steps"
check=$("$dsactor" trace "$work/killed" check --idle-tolerance-ms 600000) || { echo "$check"; fail "trace check of a killed run's torn trace"; }
grep -qF "torn trace" <<<"$check" || { echo "$check"; fail "trace check should say where it stopped in a torn trace"; }
echo "ok: dsactor trace summary and check of a finished and of a killed run"

# Pre-training from the shards alone: no data.vocab, the vocabulary size from their metadata.
sed -e '/^\[data.prepare\]/,/^$/d' -e "s|^run_dir = .*|run_dir = \"$work/run_shards\"|" \
  -e "s|^train_steps = .*|train_steps = 2\ninit_checkpoint = \"$work/ckpt\"|" \
  -e "s|^dir = .*|dir = \"$work/ckpt_shards\"|" "$work/pre.toml" > "$work/shards.toml"
printf '[data]\ntrain_shards = "%s"\n' "$work/data/train" >> "$work/shards.toml"
grep -q vocab "$work/shards.toml" && fail "shards.toml should name no vocabulary"
"$dsactor" run "$work/shards.toml" >/dev/null 2>"$work/shards.log" || { cat "$work/shards.log"; fail "pre-training from shards without data.vocab"; }
echo "ok: pre-training from shards without a vocabulary"

# Every problem of a bad config is reported in one run, unknown keys first, naming the
# key and the --set flag it came from; the run exits 2.
if "$dsactor" run "$work/pre.toml" --set 'scheduler.type="Cosine"' --set optimizer.params.lrr=1 \
  --set train_stepz=3 2>"$work/bad.log"; then fail "bad config accepted"; else rc=$?; fi
[[ $rc -eq 2 ]] || fail "bad config exit code $rc"
grep -q "3 problems in the configuration" "$work/bad.log" || { cat "$work/bad.log"; fail "not every problem reported"; }
order=$(grep -o "key '[a-z_.]*'" "$work/bad.log" | tr '\n' ' ')
[[ $order == "key 'optimizer.params.lrr' key 'train_stepz' key 'scheduler.type' " ]] ||
  { cat "$work/bad.log"; fail "problems out of order: $order"; }
grep -q -- "--set train_stepz=3: key 'train_stepz': unknown key (did you mean 'train_steps'?)" "$work/bad.log" ||
  { cat "$work/bad.log"; fail "unknown key without its flag or suggestion"; }
grep -q "known: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest" "$work/bad.log" ||
  { cat "$work/bad.log"; fail "unknown scheduler without the known ones"; }
echo "ok: bad config"

# SIGINT: finish the current step, checkpoint, exit 130; then --resume continues.
"$dsactor" run "$work/pre.toml" --set train_steps=100000 --set checkpoint.save_interval=0 \
  --set "run_dir=\"$work/run2\"" --set "checkpoint.dir=\"$work/ckpt2\"" 2>"$work/int.log" &
pid=$!
for _ in $(seq 1 600); do
  [[ -f $work/run2/metrics.csv && $(wc -l < "$work/run2/metrics.csv") -ge 3 ]] && break
  sleep 0.1
done
kill -INT $pid
rc=0; wait $pid || rc=$?
[[ $rc -eq 130 ]] || { cat "$work/int.log"; fail "SIGINT exit code $rc"; }
step=$(sed 's/step_0*//' "$work/ckpt2/latest")
[[ $step -ge 2 ]] || fail "no checkpoint after SIGINT"
"$dsactor" run "$work/pre.toml" --resume --set "train_steps=$((step + 2))" \
  --set "run_dir=\"$work/run2\"" --set "checkpoint.dir=\"$work/ckpt2\"" 2>"$work/res.log" >/dev/null || { cat "$work/res.log"; fail "resume"; }
grep -q "resumed from" "$work/res.log" || fail "resume log"
python3 - "$work/run2/metrics.csv" "$step" <<'PY' || fail "metrics.csv after resume: steps must run 1..N once each"
import csv, sys
steps = [int(r["step"]) for r in csv.DictReader(open(sys.argv[1]))]
assert steps == list(range(1, int(sys.argv[2]) + 3)), steps
PY
[[ $(cat "$work/ckpt2/latest") == $(printf 'step_%08d' $((step + 2))) ]] || fail "resumed run's checkpoint"
echo "ok: SIGINT checkpoint and resume"

# A corrupted checkpoint is refused on resume, naming the file; nothing is trained.
latest=$(cat "$work/ckpt2/latest")
python3 - "$work/ckpt2/$latest/model.safetensors" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-5] ^= 0xFF; open(p, "wb").write(bytes(b))
PY
if "$dsactor" run "$work/pre.toml" --resume --set "train_steps=$((step + 4))" \
  --set "run_dir=\"$work/run2\"" --set "checkpoint.dir=\"$work/ckpt2\"" 2>"$work/corrupt.log" >/dev/null; then
  fail "resume from a corrupted checkpoint succeeded"
fi
grep -q "model.safetensors" "$work/corrupt.log" || { cat "$work/corrupt.log"; fail "error does not name the corrupted file"; }
[[ $(cat "$work/ckpt2/latest") == "$latest" ]] || fail "latest changed after a refused resume"
echo "ok: corrupted checkpoint refused"

# --resume with the default (timestamped) run directory continues the newest earlier run.
(cd "$work" && sed -e '/^run_dir/d' -e '/^dir = /d' pre.toml > auto.toml \
  && "$dsactor" run auto.toml --set train_steps=2 >/dev/null 2>&1 \
  && "$dsactor" run auto.toml --resume --set train_steps=3 >/dev/null 2>"$work/auto.log") || { cat "$work/auto.log"; fail "resume in a default run_dir"; }
grep -q "resumed from runs/auto-" "$work/auto.log" || fail "resume did not find the earlier default run_dir"
echo "ok: --resume finds the default run directory"

# SQuAD: generate a QA set, fine-tune from the pre-trained checkpoint on 2 stages, evaluate.
"$dsactor" prep qa-from-corpus --corpus "$work/corpus" --out "$work/qa" >/dev/null 2>&1 || fail "qa-from-corpus"
# Answers as hand-made files hold them: another case, a wrong offset, other spacing, and
# (training only) a text not in the context. Scoring reads answer texts only; training
# moves or skips and counts.
python3 - "$work/qa" <<'PY' || fail "perturbing the QA files"
import json, sys
for name, absent in (("dev.json", False), ("train.json", True)):
    path = f"{sys.argv[1]}/{name}"
    d = json.load(open(path))
    answers = [q["answers"][0] for a in d["data"] for p in a["paragraphs"] for q in p["qas"]]
    answers[0]["text"] = answers[0]["text"].upper()
    answers[1]["answer_start"] += 3
    answers[2]["text"] = "\n" + answers[2]["text"].replace(" ", "  ") + " "
    if absent:
        answers[-1]["text"] = "zzz not in the context"
    json.dump(d, open(path, "w"))
PY
cat > "$work/squad.toml" <<TOML
train_batch_size = 4
train_micro_batch_size_per_gpu = 4
train_steps = 3
run_dir = "$work/squad"
init_checkpoint = "$work/ckpt/step_00000004/model.safetensors"

$(tiny_squad_tables "$work")
TOML
out=$("$dsactor" run "$work/squad.toml" 2>"$work/squad.log") || { cat "$work/squad.log"; fail "squad run"; }
[[ -s $work/squad/predictions.json ]] || fail "predictions.json"
last=$(echo "$out" | tail -1)
echo "$last" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); assert set(d)=={'exact_match','f1'}" || fail "squad result line: $last"
official=$("$dsactor" eval squad --data "$work/qa/dev.json" --predictions "$work/squad/predictions.json" 2>/dev/null | tail -1)
[[ $official == "$last" ]] || fail "eval squad ($official) disagrees with the run ($last)"
grep -q "baseline first sentence" "$work/squad.log" || fail "baselines not printed"
grep -Eq "[1-9][0-9]* answers found away from answer_start" "$work/squad.log" || fail "moved answers not counted"
grep -q "(1 answers not in the context" "$work/squad.log" || fail "skipped answer not counted"
echo "ok: squad fine-tuning and evaluation"
