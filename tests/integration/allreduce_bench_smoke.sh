#!/usr/bin/env bash
# Integration: 'dsactor bench allreduce --quick' between two processes: every peer that is
# installed gives a figure, the last line is one JSON object with the keys the issue names
# (the weak-scaling figures null in a quick run), and an unknown size is refused. No timing
# is asserted. Usage: allreduce_bench_smoke.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
err=$work/err

out=$("$dsactor" bench allreduce --quick 2>"$err") || fail "bench allreduce exited non-zero"
echo "$out"
python3 - "$(tail -n 1 <<<"$out")" <<'PY' || fail "bench allreduce: the last line is not the expected JSON"
import json, sys
j = json.loads(sys.argv[1])
assert j["bench"] == "allreduce" and j["ranks"] == 2 and j["dtype"] == "f32", j
for k in ("busbw_64MiB_GBps", "gloo_busbw_64MiB_GBps", "mpi_busbw_64MiB_GBps", "copy_GBps",
          "dp1_step_s", "dp2_step_s", "weak_scaling_efficiency"):
    assert k in j, k
# A quick run measures 1 and 4 MiB only and skips the training runs.
assert j["busbw_64MiB_GBps"] is None and j["weak_scaling_efficiency"] is None, j
PY
grep -qE '^ +4 MiB +[0-9.]+ ' <<<"$out" || fail "no 4 MiB row with dsactor's figure"
rc=0
"$dsactor" bench allreduce --sizes-mib 0 >/dev/null 2>"$err" || rc=$?
[[ $rc -eq 2 ]] && grep -q "sizes-mib 0 is not a positive size" "$err" || fail "a size of 0 should be refused (exit 2)"
echo "ok: bench allreduce --quick"
