#!/usr/bin/env bash
# Integration: 'dsactor bench compressed --quick' on a tiny corpus trains a 2-layer BERT with
# 4 in-process ranks once per optimizer (AdamW, 1-bit Adam, 0/1 Adam, Lamb, 1-bit LAMB);
# checks the table, that the last line is one JSON object with the issue's keys, that the
# byte counts add up (the transport's counts, not timing: deterministic), and that the
# compressed runs sent less than the full-precision ones. No timing is asserted.
# Usage: compressed_bench_smoke.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1

# shellcheck source=tiny_corpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/tiny_corpus.sh"
write_tiny_corpus "$work/corpus"
cat > "$work/pre.toml" <<TOML
train_batch_size = 8
train_micro_batch_size_per_gpu = 2
train_steps = 4
gradient_clipping = 1.0

$(tiny_bert_tables "$work")

[optimizer]
type = "AdamW"
params = { lr = 2e-3, weight_decay = 0.01 }

[scheduler]
type = "WarmupDecayLR"
params = { warmup_num_steps = 2, total_num_steps = 4, warmup_max_lr = 2e-3 }
TOML

out=$("$dsactor" bench compressed --quick --steps 10 --config "$work/pre.toml" --work "$work/runs" 2>"$work/err") ||
  { tail -20 "$work/err"; fail "bench compressed exited non-zero"; }
echo "$out"
for name in AdamW OneBitAdam ZeroOneAdam Lamb OneBitLamb; do
  grep -q "^  $name " <<<"$out" || fail "the table lacks $name"
done
python3 - "$(tail -n 1 <<<"$out")" <<'PY' || fail "bench compressed: last line is not the expected JSON"
import json, math, sys
j = json.loads(sys.argv[1])
for k in ("onebitadam_loss_ratio", "zerooneadam_loss_ratio", "onebitlamb_loss_ratio",
          "onebitadam_phase_wire_ratio", "zerooneadam_wire_ratio"):
    assert k in j and math.isfinite(j[k]) and j[k] > 0, k
assert j["ranks"] == 4 and j["steps"] == 10, j
# 1-bit: the compressed phase sends about 1/16 of fp16 allreduce's bytes (less the headers
# and scales, which weigh more on a tiny model).
assert j["onebitadam_phase_wire_ratio"] > 10, j
for k in ("onebitadam", "zerooneadam", "onebitlamb"):
    assert j[k + "_bytes_sent"] < j["adamw_bytes_sent"], k
assert j["adamw_bytes_sent"] == j["lamb_bytes_sent"], "the same gradients allreduced"
PY
grep -q "compressed communication: 8 of the steps kept their gradients local" "$work/runs/onebitadam/train.log" ||
  fail "1-bit Adam (freeze_step 2 of 10) should keep 8 steps local"
echo "ok: bench compressed --quick"
