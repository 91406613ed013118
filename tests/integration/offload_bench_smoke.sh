#!/usr/bin/env bash
# Integration: 'dsactor bench offload --quick' on a scratch directory trains BERT-tiny in
# memory and offloaded to NVMe; checks the last line is one JSON object with both step
# times, their ratio, the swap bytes and the achieved rate, that the in-memory and offloaded
# runs agree on their losses, that every offloaded update streamed over the backward
# (no clipping by default), and that nothing is left behind. No timing is asserted.
# Usage: offload_bench_smoke.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
cleanup() { rm -f "$work.err"; } # beside work: the bench must leave work empty

out=$("$dsactor" bench offload "$work" --quick 2>"$work.err") || { tail -20 "$work.err"; fail "bench offload exited non-zero"; }
echo "$out"
last=$(tail -n 1 <<<"$out")
python3 - "$last" <<'PY' || fail "bench offload: last line is not the expected JSON"
import json, sys
j = json.loads(sys.argv[1])
assert j["bench"] == "offload" and j["model"] == "tiny", j
for k in ("in_memory_step_s", "offload_step_s", "ratio", "swap_bytes_per_step", "nvme_GBps",
          "disk_read_GBps", "disk_write_GBps", "io_s_per_step"):
    assert k in j and j[k] > 0, k
assert j["swap_bytes_per_step"] == 24 * j["params"], "AdamW swaps 12 B/param in and 12 out"
assert abs(j["ratio"] - j["offload_step_s"] / j["in_memory_step_s"]) < 1e-3 * j["ratio"]
assert j["bound"] in ("io", "compute") and j["cpu"]
# No clipping by default: every offloaded update streamed over the backward (3 steps, one run).
assert j["gradient_clipping"] == 0 and j["streamed_updates"] == 3, j
# From the offloaded run's trace: the share of its swap reading during chunk updates.
assert 0 <= j["reads_during_update_share"] <= 1, j
PY
grep -q "in memory" <<<"$out" && grep -q "offloaded to NVMe" <<<"$out" || fail "the table lacks a row"
grep -q "^bound: " <<<"$out" && grep -q "^goal: " <<<"$out" || fail "no bound or goal line"
# Both runs train the same model on the same data: the same loss at every step.
mapfile -t losses < <(grep -o 'step [0-9]*/3 | loss [0-9.]*' "$work.err")
[[ ${#losses[@]} -eq 6 ]] || fail "expected 3 steps per run in the log, got ${#losses[@]} lines"
[[ "${losses[*]:0:3}" == "${losses[*]:3:3}" ]] || fail "the runs' losses differ: ${losses[*]}"
[[ -z $(ls -A "$work") ]] || fail "bench offload left files behind: $(ls -A "$work")"

grep -q "streamed over the backward in 3 of 3 updates" <<<"$out" || fail "the streamed updates are not reported"
grep -q "^trace: .* of the offloaded steps' swap reading" <<<"$out" || fail "no trace line on reads during updates"

# A negative --clip is refused naming the option.
if "$dsactor" bench offload "$work" --quick --clip -1 2>"$work.err"; then fail "--clip -1 was accepted"; fi
grep -q -- "--clip" "$work.err" || { cat "$work.err"; fail "the error does not name --clip"; }

# A model size that does not exist is refused naming it.
if "$dsactor" bench offload "$work" --model huge 2>"$work.err"; then fail "--model huge was accepted"; fi
grep -q "huge" "$work.err" || { cat "$work.err"; fail "the error does not name the model"; }
echo "offload bench smoke: ok"

# --backend: cpu is this bench (the flag is not passed on), cuda needs a GPU, anything else
# is refused.
"$dsactor" bench offload "$work" --backend=cpu --help >/dev/null || fail "--backend=cpu --help should print the help"
rc=0
"$dsactor" bench offload "$work" --backend tpu 2>"$work.err" || rc=$?
[[ $rc -eq 2 ]] && grep -q "expected cpu or cuda" "$work.err" || fail "--backend tpu: exit $rc, expected 2 naming the choices"
if [[ ! -e /dev/nvidia0 ]]; then
  rc=0
  "$dsactor" bench offload "$work" --backend cuda 2>"$work.err" || rc=$?
  [[ $rc -eq 3 ]] || fail "--backend cuda without a GPU: exit $rc, expected 3"
fi
echo "ok: bench offload --backend: cpu is this bench, tpu refused, cuda without a GPU exits 3"
