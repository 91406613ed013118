#!/usr/bin/env python3
"""compare_runs.py REF GOT --tolerance NAME [--steps N]: two `dsactor run` metrics files
(metrics.jsonl) step by step, as the GPU check compares a CUDA run against the CPU run of
the same config made before it (tools/gpu-check rank).

Per step: train_loss and grad_norm within the named tolerance of
tests/support/tolerances.hpp (|got - ref| <= abs + rel * |ref|; a skipped step's null
norm on both sides), and loss_scale and skipped equal (an fp16 overflow must skip the same steps). Prints one line per step and
the largest error as a share of what the tolerance allows; exit 0 when every step holds,
1 when one does not, 2 on bad input (a missing file, step or key, an unknown tolerance).
"""
import argparse
import json
import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLOSE = ("Train/Samples/train_loss", "Train/Samples/grad_norm")
EQUAL = ("Train/Samples/loss_scale", "Train/Samples/skipped")


def tolerance(name):
    path = os.path.join(ROOT, "tests", "support", "tolerances.hpp")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"inline constexpr tolerance " + re.escape(name) + r"\{\s*([^,]+),\s*([^,]+),", text)
    if not m:
        raise ValueError(f"{path}: no tolerance named {name}")
    return float(m.group(1)), float(m.group(2))


def read(path):
    steps = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
                steps[int(row["step"])] = row
            except (ValueError, KeyError) as e:
                raise ValueError(f"{path}:{number}: not a metrics line ({e})")
    if not steps:
        raise ValueError(f"{path}: no steps")
    return steps


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ref")
    p.add_argument("got")
    p.add_argument("--tolerance", required=True, help="an entry of tests/support/tolerances.hpp")
    p.add_argument("--steps", type=int, default=0, help="steps the runs must both have (0: the reference's)")
    a = p.parse_args()
    try:
        abs_tol, rel_tol = tolerance(a.tolerance)
        ref, got = read(a.ref), read(a.got)
    except (OSError, ValueError) as e:
        print(f"compare_runs: {e}", file=sys.stderr)
        return 2
    steps = sorted(ref) if a.steps == 0 else list(range(1, a.steps + 1))
    worst, failed = 0.0, 0
    print(f"{a.got} against {a.ref}, tolerance {a.tolerance}: abs {abs_tol:g}, rel {rel_tol:g}")
    for s in steps:
        if s not in ref or s not in got:
            print(f"compare_runs: step {s} missing from {a.ref if s not in ref else a.got}", file=sys.stderr)
            return 2
        r, g = ref[s], got[s]
        bad = []
        shares = []
        for key in CLOSE + EQUAL:
            if key not in r or key not in g:
                print(f"compare_runs: step {s} has no {key}", file=sys.stderr)
                return 2
        for key in CLOSE:
            if r[key] is None or g[key] is None:  # a skipped step has no gradient norm
                if r[key] is not g[key]:
                    bad.append(f"{key.split('/')[-1]} {g[key]} vs {r[key]}")
                continue
            allowed = abs_tol + rel_tol * abs(r[key])
            diff = abs(g[key] - r[key]) if math.isfinite(g[key]) else math.inf
            if allowed == 0.0:  # an exact tolerance: equal, or out
                share = 0.0 if g[key] == r[key] else math.inf
            else:
                share = diff / allowed
            shares.append(share)
            if not share <= 1.0:
                bad.append(f"{key.split('/')[-1]} {g[key]:.6g} vs {r[key]:.6g}")
        for key in EQUAL:
            if g[key] != r[key]:
                bad.append(f"{key.split('/')[-1]} {g[key]} vs {r[key]}")
        worst = max(worst, *shares)
        failed += 1 if bad else 0
        loss = "Train/Samples/train_loss"
        print(f"step {s:3d}: loss {g[loss]:.6f} vs {r[loss]:.6f}, {max(shares):.2f} of the tolerance"
              + ("; " + "; ".join(bad) if bad else ""))
    print(f"{len(steps)} steps, {failed} outside the tolerance; largest error {worst:.2f} of what it allows")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
