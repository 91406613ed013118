#!/usr/bin/env bash
# Integration: 'dsactor bench kernels --quick' prints its tables and ends with one JSON
# object; the vector ISA it names is the one `dsactor report` names, and the bf16 GEMM
# figures are numbers exactly when `dsactor report` says bf16 GEMM can run here (null
# otherwise). No timing is asserted.
# Usage: kernels_bench_smoke.sh PATH/TO/dsactor
set -euo pipefail
dsactor=$(realpath "$1")
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$dsactor" bench kernels --quick) || fail "bench kernels exited non-zero"
echo "$out"
report=$("$dsactor" report)
grep -q "^GEMM (OpenBLAS f32)" <<<"$out" || fail "no f32 GEMM table"
isa=$(sed -n 's/^kernels *: vector kernels: \([a-z0-9]*\).*/\1/p' <<<"$report")
[ -n "$isa" ] || fail "dsactor report names no vector ISA"
bf16=no
grep -q "^bf16 gemm *: oneDNN" <<<"$report" && bf16=yes
python3 - "$(tail -n 1 <<<"$out")" "$isa" "$bf16" <<'PY' || fail "bench kernels: last line is not the expected JSON"
import json, sys
j = json.loads(sys.argv[1])
isa, bf16 = sys.argv[2], sys.argv[3] == "yes"
assert j["bench"] == "kernels"
assert j["vector_isa"] == isa, (j["vector_isa"], isa)
for key in ("gemm_peak_gflops", "gemm_bert_gflops", "bert_mini_step_s"):
    assert j[key] > 0, key
for key in ("bf16_gemm_bert_gflops", "bf16_gemm_ratio_to_f32", "bf16_gemm_fixed_shapes_gflops",
            "bf16_gemm_runtime_shapes_gflops", "bf16_decoder_fixed_shapes_gflops",
            "bf16_decoder_runtime_shapes_gflops", "bert_mini_bf16_gemm_step_s", "bert_mini_bf16_gemm_speedup"):
    assert (j[key] is not None and j[key] > 0) == bf16, (key, j[key], bf16)
PY
if [ "$bf16" = yes ]; then
  grep -q "^GEMM (bf16 operands through oneDNN" <<<"$out" || fail "no bf16 GEMM table though report says it runs"
else
  grep -q "^GEMM (bf16): not measured" <<<"$out" || fail "no reason given for the missing bf16 GEMM table"
fi
echo "ok: bench kernels --quick (vector ISA $isa, bf16 GEMM $bf16)"
