#!/usr/bin/env python3
"""Counts test cases across meson's test log and prints 'N passed, N failed'.

doctest programs report their own case counts; any other test (an integration script)
counts as one case. A doctest program that crashed counts its crashed case and every
case it did not run as failures, and names them: the program's own "[dsactor-test] did
not run" lines where its crash handler printed them, else the cases its
--list-test-cases names beyond those it reported. A skipped program (exit 77, such as
the gpu suite without a device) is listed with the last line it printed. The CPU
vector paths each program ran and the cases skipped because this CPU lacks a feature
are listed above the totals; the latter count as skipped, not passed. Exit status is
non-zero when anything failed."""
import json
import os
import re
import subprocess
import sys

SUMMARY = re.compile(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped")
LISTED = re.compile(r"\[doctest\] unskipped test cases passing the current filters:\s*(\d+)")
NOTE = re.compile(r"^\[dsactor-test\] ([A-Za-z ]+?): (.*)$", re.M)
FILTERS = ("--source-file", "-sf=", "--test-case", "-tc=")
SHOWN = 12  # names printed per crashed program before "and N more"


def is_doctest_program(path):
    """Whether `path` is a compiled doctest program (an ELF file holding doctest's own
    words). Nothing else is run again to list cases: a second run of an integration script
    or of an interpreter would redo its work."""
    marker = b"unskipped test cases passing the current filters"
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return False
            tail = b""
            while chunk := f.read(1 << 20):
                if marker in tail + chunk:
                    return True
                tail = chunk[-len(marker):]
    except OSError:
        pass
    return False


def listed_cases(test):
    """The case names the program would run with its arguments, from doctest's
    --list-test-cases, or None (not a doctest program, or it would not list them)."""
    cmd = test.get("command")
    if not cmd or not is_doctest_program(cmd[0]):
        return None
    try:
        out = subprocess.run(cmd + ["--list-test-cases", "--no-version"], capture_output=True, text=True,
                             timeout=60, env={**os.environ, **(test.get("env") or {})}).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line for line in out.splitlines() if line.strip() and not line.startswith("[doctest]")
             and not set(line.strip()) <= set("=")]
    return names if LISTED.search(out) else None


def crashed_cases(test, out, reported):
    """(crashed case or None, names of cases that did not run) for a program that died."""
    notes = NOTE.findall(out)
    crashed = next((v for k, v in notes if k == "crashed in"), None)
    not_run = [v for k, v in notes if k == "did not run"]
    if crashed is not None:
        # The listener names every registered case it did not start; a run on a subset
        # (--source-file, --test-case) would not have run the others anyway.
        if any(a.startswith(FILTERS) for a in test.get("command") or []):
            wanted = listed_cases(test)
            if wanted is not None:
                not_run = [n for n in not_run if n in set(wanted)]
        return crashed, not_run
    # Died where doctest's handler could not report (killed, or before any case): every
    # listed case beyond those it reported did not run; which of them is unknown.
    names = listed_cases(test)
    if names is None:
        return None, []
    return None, names[reported:]


def main(path):
    passed = failed = skipped = 0
    paths_run = {}
    cpu_skips = []
    with open(path, encoding="utf-8") as log:
        for line in log:
            if not line.strip():
                continue
            test = json.loads(line)
            name = test.get("name")
            result = test.get("result", "")
            out = test.get("stdout", "") or ""
            found = SUMMARY.findall(out)
            program_cpu_skips = 0
            for key, value in NOTE.findall(out):
                if key == "vector paths run":
                    paths_run[name] = value
                elif key == "skipped on this CPU":
                    cpu_skips.append(f"{name}: {value}")
                    program_cpu_skips += 1
            if result == "SKIP":
                skipped += 1
                lines = [x for x in out.splitlines() if x.strip()]
                reason = lines[-1] if lines else "no reason printed"
                print(f"skipped: {name}: {reason}")
                continue
            if not found and result == "OK":
                passed += 1
                continue
            reported = 0
            if found:
                total, p, f, s = (int(x) for x in found[-1])
                reported = total
                # doctest counts a case that skipped for the CPU as passed: it is a skip.
                moved = min(program_cpu_skips, p)
                p -= moved
                skipped += moved
                passed += p
                failed += f
                # A program run on a subset (--source-file, --test-case) counts the rest
                # as skipped: those are not skips of this run.
                if not any(a.startswith(FILTERS) for a in test.get("command") or []):
                    skipped += s
            if result == "OK":
                continue
            if found and f > 0 and "[dsactor-test] crashed in" not in out:
                print(f"failed: {name}: {f} case(s) ({result})")
                continue
            crashed, not_run = crashed_cases(test, out, reported)
            if not found and crashed is None and not not_run:
                failed += 1
                print(f"failed: {name} ({result})")
                continue
            if found and f == 0 and crashed is None and not not_run:
                failed += 1  # the program failed outside its test cases
                print(f"failed: {name}: outside its test cases ({result})")
                continue
            failed += len(not_run)
            if crashed is not None:
                print(f"failed: {name}: crashed in '{crashed}' ({result}); {len(not_run)} case(s) did not run")
            else:
                print(f"failed: {name}: died ({result}); {len(not_run)} listed case(s) did not run")
            for case in not_run[:SHOWN]:
                print(f"  did not run: {case}")
            if len(not_run) > SHOWN:
                print(f"  ... and {len(not_run) - SHOWN} more")
    for name, value in sorted(paths_run.items()):
        print(f"vector paths run: {name}: {value}")
    for entry in cpu_skips:
        print(f"skipped on this CPU: {entry}")
    # CI reads the last line, which must be exactly "N passed, N failed": skips go above it.
    if skipped:
        print(f"{skipped} skipped (programs and cases listed above, and doctest's own; not failures)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


USAGE = "usage: test_summary.py BUILD/meson-logs/testlog.json"

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(USAGE + "\n\n" + __doc__, file=sys.stderr if len(sys.argv) != 2 else sys.stdout)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    if not os.path.isfile(sys.argv[1]):
        print(f"test_summary.py: {sys.argv[1]}: no such file (meson test writes it)\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
