#!/usr/bin/env python3
"""One-off check that splitting the old README into README.md + docs/ lost no figure.

Usage: check_readme_move.py OLD_README NEW_ROOT

Every line of OLD_README that holds a figure must reappear, with its figures, in
NEW_ROOT/README.md or NEW_ROOT/docs/**/*.md: the multiset of the line's numbers must
all lie inside one paragraph (a run of lines between blank lines) of one new file.
Text may be reworded and a line may be split over several lines of the new file; only
the numbers are compared.

A line holds a figure when it has
  - a number followed by a unit: %, x or × (a ratio), a time (ns, us, µs, ms, s, min,
    minutes, hours), a size (B, bytes, KiB, MiB, GiB, TiB, KB, MB, GB, TB, k), a rate
    (GB/s, GFLOP/s, TFLOP/s, samples/s, params/s), GFLOP, TFLOP, or a count of things
    measured (steps, ranks, records, calls, sequences, ..., "2-core"); or
  - a decimal number (2.5, 1e-3): measured values and tolerances.
The numbers of a line are every number in it not glued to a word (fp16, AVX2, sm_90 and
v1.1 hold none; AVX-512, 2026-11-24 and 1e-3 do), with thousands separators removed.
Project bookkeeping ("issue 17") and link targets ("](#avx-512)") are dropped before
looking: the new text does not speak of issues, and its links point elsewhere.

This is a one-off tool (the old README does not exist after the move), so it is not a
registered test. Exit 0 when nothing is lost, 1 otherwise (each lost line listed).
"""
import collections
import pathlib
import re
import sys

UNIT = (r"(?:%|x\b|×|ns\b|us\b|µs\b|ms\b|s\b|min\b|minutes?\b|hours?\b|B\b|bytes?\b"
        r"|KiB|MiB|GiB|TiB|KB\b|MB\b|GB\b|TB\b|k\b|GB/s|GFLOP|TFLOP|samples/s|params/s"
        r"|-core\b|(?:elements?|steps?|cores?|ranks?|parameters|records|times|calls|requests|chunks?"
        r"|spans|messages|questions|sequences|tokens|documents|sentences|pairs|runs|rounds"
        r"|processes|hosts|slots|buffers|threads|primitives|mallocs|faults|regions|sleeps"
        r"|updates|shards|micro-batches|layers|heads|stages|cases|seconds)\b)")
NUMBER = r"(?<![A-Za-z_\d.])\d{1,3}(?:,\d{3})+(?![\d,])|(?<![A-Za-z_\d.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
FIGURE = re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?\s?" + UNIT + r"|(?<![A-Za-z_\d.])\d+\.\d+|\d[eE]-?\d")
BOOKKEEPING = re.compile(r"\b[Ii]ssues?\s+\d+(?:\s*(?:,|and)\s*\d+)*")
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")  # where a link points is not a figure


def clean(text):
    return LINK_TARGET.sub("]", BOOKKEEPING.sub("", text))


def numbers(text):
    return collections.Counter(m.group(0).replace(",", "") for m in re.finditer(NUMBER, clean(text)))


def paragraphs(path):
    block = []
    for line in path.read_text(encoding="utf-8").splitlines() + [""]:
        if line.strip():
            block.append(line)
        elif block:
            yield " ".join(block)
            block = []


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old = pathlib.Path(sys.argv[1]).read_text(encoding="utf-8").splitlines()
    root = pathlib.Path(sys.argv[2])
    files = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    paras = [(f, numbers(p)) for f in files if f.exists() for p in paragraphs(f)]
    if not paras:
        sys.exit(f"no README.md or docs/**/*.md with text under {root}")

    checked, lost = 0, []
    for lineno, line in enumerate(old, 1):
        text = clean(line)
        if not FIGURE.search(text):
            continue
        want = numbers(text)
        if not want:
            continue
        checked += 1
        if not any(not (want - have) for _, have in paras):
            best = max(paras, key=lambda fp: sum((want & fp[1]).values()))
            missing = want - best[1]
            lost.append((lineno, line.strip(), best[0].relative_to(root), dict(missing)))

    for lineno, line, near, missing in lost:
        print(f"LOST old line {lineno}: {line[:160]}")
        print(f"     closest paragraph in {near}, missing {missing}")
    print(f"{checked} figure lines checked in {sys.argv[1]} against {len(files)} files: "
          f"{checked - len(lost)} found, {len(lost)} lost")
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
