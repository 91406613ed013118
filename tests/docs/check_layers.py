#!/usr/bin/env python3
"""The include graph keeps the layering docs/architecture.md describes: a folder includes
only folders below it, and the rooms of actors/train only the rooms below them, so a
change in one room never needs one in a room beneath. Fails naming each file and include
that goes up or sideways.

Usage: check_layers.py REPOSITORY_ROOT"""
import pathlib
import re
import sys

# Top-level folders, lowest first; folders on one level do not include each other.
FOLDERS = {"core": 0, "kernels": 1, "optim": 2, "models": 2, "io": 3, "actors": 4, "tools": 5, "tests": 6}
# The rooms of actors/train, lowest first (eval and memory side by side).
ROOMS = {"config": 0, "data": 1, "stage": 2, "shard": 3, "memory": 4, "eval": 4, "run": 5}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([^"]+)"', re.M)
SOURCES = ("*.cpp", "*.hpp", "*.cu", "*.cuh")


def room_of(rel):
    """actors/train/<room>/..., the actor runtime ("runtime"), or None."""
    parts = rel.split("/")
    if parts[0] != "actors":
        return None
    if len(parts) > 2 and parts[1] == "train":
        return parts[2]
    if len(parts) > 2 and parts[1] == "trace" and parts[2] == "analysis":
        return "analysis"
    return "runtime"


def problems(root):
    out = []
    for pattern in SOURCES:
        for path in sorted(root.rglob(pattern)):
            rel = path.relative_to(root).as_posix()
            top = rel.split("/")[0]
            if top not in FOLDERS or rel.startswith("build"):
                continue
            text = path.read_text(errors="replace")
            for m in INCLUDE.finditer(text):
                target_top, rest = m.group(1), m.group(2)
                if target_top not in FOLDERS:
                    continue
                target = f"{target_top}/{rest}"
                if target_top != top and FOLDERS[target_top] >= FOLDERS[top]:
                    out.append(f"{rel}: includes {target}, a folder not below {top}/")
                    continue
                mine, theirs = room_of(rel), room_of(target)
                if top != "actors" or target_top != "actors":
                    continue
                if mine == "runtime" and theirs != "runtime":
                    out.append(f"{rel}: the actor runtime includes {target} (train or trace analysis)")
                elif mine in ROOMS and theirs in ROOMS and mine != theirs and ROOMS[theirs] >= ROOMS[mine]:
                    out.append(f"{rel}: room {mine}/ includes {target}, a room not below it")
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    found = problems(pathlib.Path(sys.argv[1]))
    for p in found:
        print(f"FAIL: {p}")
    if found:
        print(f"{len(found)} include(s) against the layering")
        return 1
    print("layering holds: folders and actors/train rooms include only what is below them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
