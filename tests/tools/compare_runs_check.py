#!/usr/bin/env python3
"""tools/compare_runs.py, the GPU check's comparison of a CUDA run with its CPU run, on
made-up metrics files: equal runs pass, a loss or a gradient norm past the tolerance
fails, a different skip or loss scale fails, a skipped step's null norm passes only when
both sides skipped, and a missing step, key or tolerance is bad input (exit 2)."""
import json
import math
import os
import subprocess
import sys
import tempfile

compare = sys.argv[1]
failures = []


def row(step, loss, norm=1.0, scale=1024.0, skipped=0):
    return {"step": step, "Train/Samples/train_loss": loss, "Train/Samples/grad_norm": norm,
            "Train/Samples/loss_scale": scale, "Train/Samples/skipped": skipped}


def write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def expect(name, code, ref_rows, got_rows, tolerance="gpu_run_half_vs_cpu"):
    with tempfile.TemporaryDirectory() as d:
        ref, got = os.path.join(d, "ref.jsonl"), os.path.join(d, "got.jsonl")
        write(ref, ref_rows)
        write(got, got_rows)
        p = subprocess.run([sys.executable, compare, ref, got, "--tolerance", tolerance],
                           capture_output=True, text=True)
        if p.returncode != code:
            failures.append(f"{name}: exit {p.returncode}, expected {code}\n{p.stdout}{p.stderr}")
        else:
            print(f"ok: {name} (exit {code})")


ref = [row(1, 5.0), row(2, 4.8), row(3, 4.6, norm=None, scale=512.0, skipped=1), row(4, 4.5, scale=512.0)]
expect("the same run", 0, ref, ref)
# gpu_run_half_vs_cpu allows 1e-4 + 3e-2 x |ref|: 1% passes, 5% does not.
expect("a loss 1% off", 0, ref, [dict(r, **{"Train/Samples/train_loss": r["Train/Samples/train_loss"] * 1.01}) for r in ref])
expect("a loss 5% off", 1, ref, ref[:1] + [row(2, 4.8 * 1.05)] + ref[2:])
expect("a gradient norm 5% off", 1, ref, ref[:1] + [row(2, 4.8, norm=1.05)] + ref[2:])
expect("another loss scale", 1, ref, ref[:3] + [row(4, 4.5, scale=1024.0)])
expect("a step skipped on one side only", 1, ref, ref[:2] + [row(3, 4.6, scale=512.0)] + ref[3:])
expect("a step missing", 2, ref, ref[:3])
expect("a key missing", 2, ref, ref[:1] + [{"step": 2, "Train/Samples/train_loss": 4.8}] + ref[2:])
expect("an unknown tolerance", 2, ref, ref, tolerance="no_such_tolerance")
# The f32 tolerance (1e-5 + 1e-3 x |ref|) is tighter: 1% fails it.
expect("a loss 1% off under gpu_run_f32_vs_cpu", 1, ref,
       [dict(r, **{"Train/Samples/train_loss": r["Train/Samples/train_loss"] * 1.01}) for r in ref],
       tolerance="gpu_run_f32_vs_cpu")
# bitwise (a deterministic run against its resume): equal passes; one ulp off does not.
expect("the same run under bitwise", 0, ref, ref, tolerance="bitwise")
expect("a loss one ulp off under bitwise", 1, ref,
       ref[:1] + [row(2, math.nextafter(4.8, 5.0))] + ref[2:], tolerance="bitwise")

for f in failures:
    print("FAILED: " + f)
sys.exit(1 if failures else 0)
