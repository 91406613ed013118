#!/usr/bin/env bash
# Integration: 'dsactor bench kernels --quick' prints its tables and ends with one JSON
# object; the vector ISA it names is the one `dsactor report` names, and the bf16 GEMM
# figures are numbers exactly when `dsactor report` says bf16 GEMM can run here (null
# otherwise); the report's CUDA line says what this build holds, and DSA_CPU_ISA=avx2 hides
# AVX-512 and the bf16 GEMM from it. A dsactor without dsactor-bench beside it says how to
# build it (exit 2). No timing is asserted.
# Usage: kernels_bench_smoke.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1

alone=$work/alone
mkdir "$alone"
cp "$dsactor" "$alone/dsactor"
rc=0
"$alone/dsactor" bench kernels --quick >/dev/null 2>"$alone/err" || rc=$?
[[ $rc -eq 2 ]] || fail "bench without dsactor-bench: exit $rc, expected 2"
grep -q "dsactor-bench, which this build does not have" "$alone/err" || fail "bench without dsactor-bench: $(cat "$alone/err")"
grep -q "ninja -C BUILD_DIR tools/dsactor-bench" "$alone/err" || fail "bench without dsactor-bench names no way to build it"

out=$("$dsactor" bench kernels --quick) || fail "bench kernels exited non-zero"
echo "$out"
report=$("$dsactor" report)
grep -q "^GEMM (OpenBLAS f32)" <<<"$out" || fail "no f32 GEMM table"
isa=$(sed -n 's/^kernels *: vector kernels: \([a-z0-9]*\).*/\1/p' <<<"$report")
[ -n "$isa" ] || fail "dsactor report names no vector ISA"
# The report speaks of what this build does, not of the project's work list.
grep -q "^cuda kernels *: \(compiled in\|not compiled in this build\)" <<<"$report" || fail "report: no cuda kernels line"
! grep -qi "issue" <<<"$report" || fail "report mentions issues: $(grep -i issue <<<"$report")"
# DSA_CPU_ISA limits what the program believes: no AVX-512 path and no AVX512_BF16 below it.
report2=$(DSA_CPU_ISA=avx2 "$dsactor" report)
if [[ $isa != scalar ]]; then
  grep -q "^kernels *: vector kernels: avx2 " <<<"$report2" || fail "DSA_CPU_ISA=avx2 not taken: $(grep '^kernels' <<<"$report2")"
  grep -q "^bf16 gemm *: not available" <<<"$report2" || fail "DSA_CPU_ISA=avx2 still offers the bf16 GEMM"
fi
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
