#!/usr/bin/env python3
"""Runs crash_fixture (a doctest program that aborts in its second of four cases) as meson
would, then tools/test_summary.py over a one-line test log: the totals must hold the crash
and the two cases that never ran, by name. Also a run that does not crash, a log whose
program died without doctest's report, and the vector-path and CPU-skip lines.
Usage: test_summary_check.py FIXTURE SUMMARY_SCRIPT"""
import json
import os
import subprocess
import sys
import tempfile

fixture, summary = sys.argv[1], sys.argv[2]
problems = []


def summarize(entry):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as log:
        log.write(json.dumps(entry) + "\n")
    try:
        r = subprocess.run([sys.executable, summary, log.name], capture_output=True, text=True)
    finally:
        os.unlink(log.name)
    return r.returncode, r.stdout


def expect(what, cond, out):
    if not cond:
        problems.append(f"{what}\n--- summary output ---\n{out}")


crash = subprocess.run([fixture], capture_output=True, text=True)
entry = {"name": "fixture", "result": "FAIL", "stdout": crash.stdout, "command": [fixture], "env": {}}
rc, out = summarize(entry)
last = out.strip().splitlines()[-1]
expect("a crash: exit status 1", rc == 1, out)
expect("a crash: 1 passed and 3 failed (the crash and two cases not run)", last == "1 passed, 3 failed", out)
expect("a crash: names the crashed case", "crashed in 'fixture: second case aborts'" in out, out)
expect("a crash: names both cases not run",
       "did not run: fixture: third case never runs" in out and "did not run: fixture: fourth case never runs" in out, out)
expect("a crash: the vector paths run before it", "vector paths run: fixture: scalar" in out, out)

expect("messages print a const char* as its text", "message: a const char* printed as its text" in crash.stdout,
       crash.stdout)

# A crash in a run on a subset: only the subset's cases that did not run count.
subset = [fixture, "--test-case=*second*,*third*"]
crash = subprocess.run(subset, capture_output=True, text=True)
entry = {"name": "fixture", "result": "FAIL", "stdout": crash.stdout, "command": subset, "env": {}}
rc, out = summarize(entry)
expect("a crash in a subset: 0 passed, 2 failed (the crash and the third case)",
       out.strip().splitlines()[-1] == "0 passed, 2 failed", out)
expect("a crash in a subset: the cases outside it are not named", "fourth case" not in out, out)

# Killed before doctest could report anything: the listed cases all count as not run.
entry = {"name": "fixture", "result": "TIMEOUT", "stdout": "", "command": [fixture], "env": {}}
rc, out = summarize(entry)
expect("killed: 0 passed, 4 failed (the four listed cases)", out.strip().splitlines()[-1] == "0 passed, 4 failed",
       out)

# A failed script is never run again to list cases: it counts as one failure.
entry = {"name": "script", "result": "FAIL", "stdout": "", "command": [sys.executable, "-c", "raise SystemExit(1)"],
         "env": {}}
rc, out = summarize(entry)
expect("a failed script: 0 passed, 1 failed", out.strip().splitlines()[-1] == "0 passed, 1 failed", out)

whole = subprocess.run([fixture], capture_output=True, text=True, env={**os.environ, "DSA_FIXTURE_NO_CRASH": "1"})
entry = {"name": "fixture", "result": "OK", "stdout": whole.stdout, "command": [fixture], "env": {}}
rc, out = summarize(entry)
expect("no crash: 3 passed, 0 failed (the CPU skip counts as a skip)",
       rc == 0 and out.strip().splitlines()[-1] == "3 passed, 0 failed", out)
expect("no crash: one skip counted", "1 skipped" in out, out)
expect("no crash: the CPU skip is listed by name",
       "skipped on this CPU: fixture: fixture: fourth case never runs (needs a feature no CPU has)" in out, out)

for p in problems:
    print("FAIL:", p)
print("test summary checks passed" if not problems else f"{len(problems)} problem(s)")
sys.exit(1 if problems else 0)
