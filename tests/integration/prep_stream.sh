#!/usr/bin/env bash
# Integration: `dsactor prep pretrain` streams its corpus. On a generated corpus of about
# 9 MB of text, one block (the default --block-mb 64: the whole corpus in memory, its
# tokens and instances too) against blocks of 0.5 MB: the shards of the streamed run hold
# about as many instances, and its peak resident set (VmHWM, read from /proc every 0.1 s)
# is under half the one-block run's: memory follows the block, not the corpus. Then the
# same for `vocab build` (the same vocabulary from many blocks) and for a run's own
# [data.prepare] (data.prepare.block_mb: as many instances, a lower peak).
# Usage: prep_stream.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
# shellcheck source=tiny_corpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/tiny_corpus.sh" || exit 1

python3 - "$work/corpus.txt" <<'PY'
import random, sys
words = ("the river ran past old mill where children played every summer and sang songs about green "
         "hills far away from town mary went to boston in 1961 with john").split()
rng = random.Random(7)
with open(sys.argv[1], "w") as f:
    for d in range(20000):
        for s in range(rng.randint(6, 14)):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randint(5, 12))) + ".\n")
        f.write("\n")
PY
"$dsactor" vocab build --corpus "$work/corpus.txt" --size 120 --out "$work/vocab.txt" >"$work/out" 2>"$work/err" ||
  fail "vocab build"

# watch WHAT CMD...: runs CMD with stdout in $work/out, sets peak (its VmHWM, kB).
watch() {
  local what=$1 pid hwm rc=0
  shift
  "$@" >"$work/out" 2>"$work/err" &
  pid=$!
  peak=0
  while kill -0 "$pid" 2>/dev/null; do
    hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    [[ -n $hwm ]] && ((hwm > peak)) && peak=$hwm
    sleep 0.1
  done
  wait "$pid" || rc=$?
  [[ $rc == 0 ]] || { cat "$work/err" >&2; fail "$what exited with $rc"; }
}
# prep OUT BLOCK_MB: runs prep pretrain, sets peak.
prep() {
  watch "prep pretrain --block-mb $2" "$dsactor" prep pretrain --corpus "$work/corpus.txt" --vocab "$work/vocab.txt" \
    --out "$work/$1" --seq 64 --dupe-factor 2 --block-mb "$2"
}
instances() { grep -o "prep: train: [0-9]* instances" "$work/$1.log" | awk '{s += $3} END {print s}'; }

prep whole 64
cp "$work/out" "$work/whole.log"
whole_peak=$peak
prep blocks 0.5
cp "$work/out" "$work/blocks.log"
blocks_peak=$peak
blocks=$(grep -c "^prep: block [0-9]*:" "$work/blocks.log")
((blocks >= 10)) || fail "the streamed run read $blocks blocks, expected at least 10"
a=$(instances whole) b=$(instances blocks)
echo "prep stream: one block: $a instances, peak $((whole_peak / 1024)) MiB; $blocks blocks: $b instances, peak $((blocks_peak / 1024)) MiB"
((b * 10 > a * 9 && b * 10 < a * 11)) || fail "the streamed run made $b instances, the one-block run $a"
((blocks_peak * 2 < whole_peak)) || fail "streaming peaked at $blocks_peak kB, the whole corpus at $whole_peak kB"
echo "ok: prep pretrain streams the corpus ($blocks blocks)"

# vocab build: the word counts add up block by block, so many blocks give the same file.
"$dsactor" vocab build --corpus "$work/corpus.txt" --size 120 --block-mb 0.5 --out "$work/vocab_blocks.txt" \
  >"$work/vocab_blocks.log" 2>"$work/err" || fail "vocab build --block-mb 0.5"
vblocks=$(grep -c "^vocab: block [0-9]*:" "$work/vocab_blocks.log")
((vblocks >= 10)) || fail "vocab build read $vblocks blocks, expected at least 10"
cmp -s "$work/vocab.txt" "$work/vocab_blocks.txt" || fail "vocab build in $vblocks blocks wrote another vocabulary"
echo "ok: vocab build streams the corpus ($vblocks blocks, the same vocabulary)"

# A run's own [data.prepare] (vocabulary and shards), one block against blocks of 0.5 MB,
# then one training step of the tiny model. runprep NAME BLOCK_MB sets peak.
runprep() {
  cat >"$work/$1.toml" <<TOML
train_batch_size = 4
train_micro_batch_size_per_gpu = 4
train_steps = 1
run_dir = "$work/run_$1"
$(tiny_model_table)

[data.prepare]
corpus = "$work/corpus.txt"
out_dir = "$work/$1"
vocab_size = 120
seq_length = 64
dupe_factor = 2
holdout_docs = 3
block_mb = $2

[data]
eval_batches = 1

[optimizer]
type = "AdamW"
params = { lr = 1e-3 }

[checkpoint]
save_final = false
TOML
  watch "a run preparing its data in blocks of $2 MB" "$dsactor" run "$work/$1.toml"
}
runprep prep_whole 64
whole_peak=$peak
runprep prep_blocks 0.5
blocks_peak=$peak
pblocks=$(ls "$work/prep_blocks"/train-*.safetensors | wc -l)
pwhole=$(ls "$work/prep_whole"/train-*.safetensors | wc -l)
cmp -s "$work/prep_whole/vocab.txt" "$work/prep_blocks/vocab.txt" || fail "[data.prepare] in blocks built another vocabulary"
grep -q "block 1[0-9]: instances" "$work/run_prep_blocks/train.log" || fail "[data.prepare] did not read 10 blocks or more"
echo "run prepare: one block: $pwhole shards, peak $((whole_peak / 1024)) MiB; blocks: $pblocks shards, peak $((blocks_peak / 1024)) MiB"
((blocks_peak * 2 < whole_peak)) || fail "the run's preparation in blocks peaked at $blocks_peak kB, in one block at $whole_peak kB"
echo "ok: a run's [data.prepare] streams the corpus"

# A preparation that stopped half-way (its marker still there) is made again, not trained on:
# the stray shard goes and the set comes out as before.
mkdir -p "$work/before" && cp "$work/prep_blocks"/*.safetensors "$work/before/"
touch "$work/prep_blocks/.preparing"
cp "$work/prep_blocks/train-00000.safetensors" "$work/prep_blocks/train-00999.safetensors"
runprep prep_blocks 0.5
grep -q "did not finish: its shards are made again" "$work/run_prep_blocks/train.log" ||
  fail "an interrupted preparation was not said"
[[ ! -e $work/prep_blocks/.preparing && ! -e $work/prep_blocks/train-00999.safetensors ]] ||
  fail "the marker or the stray shard is still there"
for f in "$work/before"/*.safetensors; do
  cmp -s "$f" "$work/prep_blocks/$(basename "$f")" || fail "$(basename "$f") differs after the preparation was redone"
done
echo "ok: an interrupted [data.prepare] is made again"
