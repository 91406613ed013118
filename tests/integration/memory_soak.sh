#!/usr/bin/env bash
# Integration: a long run's resident memory stays flat. A tiny BERT (2 layers, 32 wide)
# trains two epochs of one sequence per step over a generated corpus (about 10,000
# instances: at least 20,000 steps), while this script reads the process's RssAnon from
# /proc every 0.2 s beside the step it is at (metrics.csv's rows). After warm-up (the
# first 2,000 steps) the anonymous resident set may grow by less than 4 MiB from the
# steps [2000, 4000) to the last 2,000 (both the window's peak and its median): per-step
# state lives only while a step is open (the coordinator's reports) or goes to files
# (trace, metrics); the losses kept for the run's result are 8 bytes a step, allocated at
# the start; large tensors come from a size-keyed page cache bounded by the tensors' peak
# (core/host_allocator.hpp), so the malloc heap holds only small objects. Before those
# fixes a tiny model grew 135 -> 300 MB over its first 2,500 steps.
# Usage: memory_soak.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
# shellcheck source=tiny_corpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/tiny_corpus.sh"
write_tiny_corpus "$work/corpus" 300

cat > "$work/soak.toml" <<TOML
train_batch_size = 1
train_micro_batch_size_per_gpu = 1
epochs = 2
steps_per_print = 2000
run_dir = "$work/run"

[model]
size = "custom"
num_layers = 2
hidden_size = 32
num_heads = 2
max_position_embeddings = 32

[data.prepare]
corpus = "$work/corpus"
out_dir = "$work/data"
vocab_size = 150
seq_length = 32
dupe_factor = 6
holdout_docs = 3

[data]
eval_batches = 0

[checkpoint]
save_final = false

[optimizer]
type = "AdamW"
params = { lr = 1e-3, weight_decay = 0.01 }
TOML

"$dsactor" run "$work/soak.toml" >"$work/out" 2>"$work/err" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; }
: >"$work/samples"
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/^RssAnon:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  rows=0
  [[ -f $work/run/metrics.csv ]] && rows=$(($(wc -l <"$work/run/metrics.csv") - 1))
  [[ -n $rss ]] && echo "$rows $rss" >>"$work/samples"
  sleep 0.2
done
rc=0
wait "$pid" || rc=$?
pid=
[[ $rc == 0 ]] || fail "the soak run exited with $rc"
steps=$(($(wc -l <"$work/run/metrics.csv") - 1))
((steps >= 20000)) || fail "the soak ran $steps steps, expected at least 20,000 (two epochs)"

# Peak and median RssAnon (kB) of the samples whose step is in [lo, hi).
window() {
  awk -v lo="$1" -v hi="$2" '$1 >= lo && $1 < hi {print $2}' "$work/samples" | sort -n |
    awk '{v[NR] = $1} END {if (NR < 5) {print "none"; exit} print v[NR], v[int((NR + 1) / 2)], NR}'
}
read -r early_peak early_median early_n <<<"$(window 2000 4000)"
read -r late_peak late_median late_n <<<"$(window $((steps - 2000)) "$steps")"
[[ $early_peak != none && $late_peak != none ]] || fail "too few RSS samples (steps $steps)"
echo "memory soak: $steps steps; RssAnon steps 2000-4000 peak ${early_peak} kB median ${early_median} kB" \
  "($early_n samples); last 2000 steps peak ${late_peak} kB median ${late_median} kB ($late_n samples)"
((late_peak - early_peak < 4096)) || fail "the resident set's peak grew $((late_peak - early_peak)) kB after warm-up"
((late_median - early_median < 4096)) || fail "the resident set's median grew $((late_median - early_median)) kB after warm-up"
echo "ok: resident memory flat over $steps steps (peak +$((late_peak - early_peak)) kB, median +$((late_median - early_median)) kB)"
