#!/usr/bin/env bash
# Integration: 'dsactor bench pipeline --quick' on a tiny corpus: 2 stages in 2 processes,
# 1F1B and zero-bubble interleaved; checks the table and that the last line is one JSON
# object with the keys the issue names, bubbles in [0, 1) and positive rates. No timing is
# asserted (the figures of a smoke run are noise). Usage: pipeline_bench_smoke.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1

# shellcheck source=tiny_corpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/tiny_corpus.sh"
write_tiny_corpus "$work/corpus"
tiny_pretrain_toml "$work" >"$work/pre.toml"

out=$("$dsactor" bench pipeline --quick --config "$work/pre.toml" --layers 2 --micro-batch 2 --work "$work/runs" \
  2>"$work/err") || { tail -20 "$work/err"; fail "bench pipeline exited non-zero"; }
echo "$out"
grep -q "^  1f1b  samples/s" <<<"$out" && grep -q "^  zb    samples/s" <<<"$out" || fail "the table lacks a schedule"
grep -q "^  M 4 run 2 " <<<"$out" || fail "each schedule should run twice"
python3 - "$(tail -n 1 <<<"$out")" <<'PY' || fail "bench pipeline: last line is not the expected JSON"
import json, sys
j = json.loads(sys.argv[1])
for k in ("bubble_1f1b", "bubble_zb", "samples_per_s_1f1b", "samples_per_s_zb", "theory_bubble_1f1b",
          "theory_bubble_zb", "bubble_ratio", "speedup"):
    assert k in j, k
for k in ("bubble_1f1b", "bubble_zb"):
    assert 0 <= j[k] < 1, (k, j[k])
for k in ("samples_per_s_1f1b", "samples_per_s_zb"):
    assert j[k] > 0, (k, j[k])
assert abs(j["theory_bubble_1f1b"] - 0.2) < 1e-12, j  # (S-1)/(M+S-1) at S = 2, M = 4
assert j["bench"] == "pipeline" and j["stages"] == 2, j
PY
[[ -d $work/runs/m4_zb_1 ]] || fail "the runs should be kept in --work"
echo "ok: bench pipeline --quick prints both schedules and the JSON keys"
