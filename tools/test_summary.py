#!/usr/bin/env python3
"""Counts test cases across meson's test log and prints 'N passed, N failed'.

doctest programs report their own case counts; any other test (an integration
script) counts as one case. A program that crashed before its summary counts
as one failure. A skipped program (exit 77, such as the gpu suite without a
device) is listed with the last line it printed, so the reason is visible. Exit status is non-zero when anything failed."""
import json
import re
import sys

SUMMARY = re.compile(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed\s*\|\s*(\d+) skipped")


def main(path):
    passed = failed = skipped = 0
    with open(path, encoding="utf-8") as log:
        for line in log:
            if not line.strip():
                continue
            test = json.loads(line)
            result = test.get("result", "")
            out = test.get("stdout", "") or ""
            found = SUMMARY.findall(out)
            if result == "SKIP":
                skipped += 1
                lines = [x for x in out.splitlines() if x.strip()]
                reason = lines[-1] if lines else "no reason printed"
                print(f"skipped: {test.get('name')}: {reason}")
            elif found:
                _, p, f, s = (int(x) for x in found[-1])
                passed += p
                failed += f
                skipped += s
                if result != "OK" and f == 0:
                    failed += 1  # the program failed outside its test cases
            elif result == "OK":
                passed += 1
            else:
                failed += 1
                print(f"failed: {test.get('name')} ({result})")
    # CI reads the last line, which must be exactly "N passed, N failed": skips go above it.
    if skipped:
        print(f"{skipped} skipped (listed above; not failures)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
