#!/usr/bin/env bash
# Integration: `dsactor prep pretrain` streams its corpus. On a generated corpus of about
# 9 MB of text, one block (the default --block-mb 64: the whole corpus in memory, its
# tokens and instances too) against blocks of 0.5 MB: the shards of the streamed run hold
# about as many instances, and its peak resident set (VmHWM, read from /proc every 0.1 s)
# is under half the one-block run's: memory follows the block, not the corpus.
# Usage: prep_stream.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1

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

# prep OUT BLOCK_MB: runs prep pretrain, sets peak (VmHWM, kB).
prep() {
  "$dsactor" prep pretrain --corpus "$work/corpus.txt" --vocab "$work/vocab.txt" --out "$work/$1" --seq 64 \
    --dupe-factor 2 --block-mb "$2" >"$work/out" 2>"$work/err" &
  local pid=$! hwm rc=0
  peak=0
  while kill -0 "$pid" 2>/dev/null; do
    hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    [[ -n $hwm ]] && ((hwm > peak)) && peak=$hwm
    sleep 0.1
  done
  wait "$pid" || rc=$?
  [[ $rc == 0 ]] || fail "prep pretrain --block-mb $2 exited with $rc"
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
