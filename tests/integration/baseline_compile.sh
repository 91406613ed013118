#!/usr/bin/env bash
# Build: the CPU kernels compile for a baseline x86-64 target (what -Dsimd=false builds and
# what meson picks on a build host without AVX2), not only for the default x86-64-v3. Their
# AVX-512 paths carry their own target attributes; a missing one (say, a 256-bit FMA
# intrinsic in a function marked only avx512f) is an error that the default build never
# shows. Each kernels/cpu source is compiled with its own command from compile_commands.json,
# -march=x86-64 and -O0 (always_inline target mismatches are reported at every level).
# Usage: baseline_compile.sh BUILD_DIR
set -euo pipefail
build=$(realpath "$1")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 - "$build" "$out" <<'PY'
import json, os, re, shlex, subprocess, sys
build, out = sys.argv[1], sys.argv[2]
entries = [e for e in json.load(open(os.path.join(build, "compile_commands.json")))
           if re.search(r"kernels/cpu/[^/]+\.cpp$", e["file"])]
if not entries:
    sys.exit("no kernels/cpu sources in compile_commands.json")
failed = []
for e in entries:
    args = shlex.split(e["command"])
    if not any(a.startswith("-march=") for a in args):
        print(f"skip {e['file']}: built without -march (a non-x86 or baseline build already)")
        continue
    args = [("-march=x86-64" if a.startswith("-march=") else "-O0" if re.fullmatch(r"-O[0-9s]", a) else a) for a in args]
    # Drop the output and dependency-file options; write to our own directory.
    cleaned, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MQ", "-MT"):
            skip = True
            continue
        if a in ("-MD", "-MMD"):
            continue
        cleaned.append(a)
    cleaned += ["-o", os.path.join(out, os.path.basename(e["file"]) + ".o")]
    r = subprocess.run(cleaned, cwd=e["directory"], capture_output=True, text=True)
    name = os.path.relpath(e["file"] if os.path.isabs(e["file"]) else os.path.join(e["directory"], e["file"]))
    print(("ok   " if r.returncode == 0 else "FAIL ") + name)
    if r.returncode != 0:
        failed.append(name)
        print("\n".join(r.stderr.splitlines()[:8]))
if failed:
    sys.exit(f"{len(failed)} kernel source(s) do not compile for baseline x86-64: {', '.join(failed)}")
print(f"{len(entries)} kernel sources compile for baseline x86-64")
PY
