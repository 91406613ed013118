#!/usr/bin/env bash
# Integration: pre-training data several times larger than limits.host_memory trains
# through more than one epoch within that budget, measured from outside the process.
# `dsactor prep synthetic` writes random shards (about 4x the budget: the shard reader maps
# them read-only and gives each row's pages back once it is read, so the resident set does
# not hold the data set); a small BERT trains 1.25 epochs over them with limits.host_memory
# set; its peak resident set is the kernel's own maximum for the child (getrusage's
# ru_maxrss, which VmHWM reports while it runs), read when it has ended.
# Usage: data_budget.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1

budget_mib=80
instances=200000
"$dsactor" prep synthetic --out "$work/data" --instances "$instances" --seq 128 --max-predictions 20 \
  --vocab-size 200 --shard-size 25000 >"$work/out" 2>"$work/err" || fail "prep synthetic"
data_kib=$(du -sk "$work/data" | cut -f1)
((data_kib > 3 * budget_mib * 1024)) || fail "the shards ($data_kib KiB) are not several times the budget ($budget_mib MiB)"

cat >"$work/run.toml" <<TOML
train_batch_size = 256
train_micro_batch_size_per_gpu = 32
epochs = 1.25
steps_per_print = 50
run_dir = "$work/run"

[model]
size = "custom"
num_layers = 1
hidden_size = 16
num_heads = 1
max_position_embeddings = 128

[data]
train_shards = "$work/data"
vocab = "$work/data/vocab.txt"

[checkpoint]
save_final = false

[limits]
host_memory = "${budget_mib}MiB"

[optimizer]
type = "AdamW"
params = { lr = 1e-3 }
TOML

# The child's peak resident set as the kernel kept it (ru_maxrss, KiB), not a sample.
read -r rc peak < <(OUT="$work/out" ERR="$work/err" python3 -c '
import os, resource, subprocess, sys
rc = subprocess.call(sys.argv[1:], stdout=open(os.environ["OUT"], "w"), stderr=open(os.environ["ERR"], "w"))
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
' "$dsactor" run "$work/run.toml")
[[ $rc == 0 ]] || fail "the run exited with $rc"
steps=$(($(wc -l <"$work/run/metrics.csv") - 1))
epoch_steps=$(((instances + 255) / 256))
((steps > epoch_steps)) || fail "$steps steps do not pass one epoch of $epoch_steps"
echo "data budget: shards $((data_kib / 1024)) MiB, limits.host_memory ${budget_mib} MiB, $steps steps" \
  "($epoch_steps an epoch), peak resident set (ru_maxrss) $((peak / 1024)) MiB"
((peak <= budget_mib * 1024)) || fail "the peak resident set $((peak / 1024)) MiB passed the budget of $budget_mib MiB"
echo "ok: $((data_kib / 1024)) MiB of shards trained through $steps steps within $budget_mib MiB"
