#!/usr/bin/env bash
# Fuzzing the parsers of input from outside: ./ds fuzz [TARGET...] [--seconds S]
# Builds each libFuzzer target (tests/fuzz/fuzz_<target>.cpp with the sources it parses
# with) by clang with AddressSanitizer and UndefinedBehaviorSanitizer into BUILD/fuzz, seeds
# it from tests/fuzz/seeds/<target> (inputs the tests use), runs it for S seconds (default 20)
# and prints its executions and findings; a crash, leak or sanitizer report fails, leaving
# the input in BUILD/fuzz/<target>-crashes. Exit 77 when clang or libFuzzer is missing.
# Usage: fuzz.sh BUILD_DIR [TARGET...] [--seconds S]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(realpath "$1")
shift
seconds=20
targets=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
# Each target's own sources (what it parses with).
declare -A sources=(
  [hostfile]="tools/launch/hostfile.cpp core/error.cpp"
  [manifest]="io/ckpt/checkpoint_manifest.cpp core/error.cpp"
  [squad]="io/data/squad_dataset.cpp io/data/squad_eval.cpp io/data/squad_text.cpp io/ckpt/atomic_file.cpp
    io/ckpt/posix_file.cpp core/error.cpp"
  [rendezvous]="io/net/rendezvous_frame.cpp core/error.cpp"
  [toml]="core/config.cpp core/config_problems.cpp core/error.cpp"
  [deepspeed_json]="actors/train/config/deepspeed_json.cpp core/config.cpp core/config_problems.cpp core/error.cpp"
)
[[ ${#targets[@]} -gt 0 ]] || targets=(hostfile manifest rendezvous squad toml deepspeed_json)
for t in "${targets[@]}"; do
  [[ -n ${sources[$t]-} ]] || { echo "fuzz: unknown target '$t' (known: ${!sources[*]})" >&2; exit 2; }
done
cxx=$(command -v clang++ || command -v clang++-14 || true)
if [[ -z $cxx ]] || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$cxx" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "SKIP: fuzzing needs clang and libFuzzer (Debian: clang libclang-rt-14-dev)"
  exit 77
fi
out=$build/fuzz
mkdir -p "$out"
# toml++ as dsactor links it (Debian's shared library, not the header-only parser, whose
# debug assertions the release library does not have).
flags=(-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root" -I"$build"
  -DTOML_HEADER_ONLY=0 -DTOML_SHARED_LIB=1)
failed=0
for t in "${targets[@]}"; do
  bin=$out/fuzz_$t
  srcs=("$root/tests/fuzz/fuzz_$t.cpp")
  for s in ${sources[$t]}; do srcs+=("$root/$s"); done
  newest=$(ls -t "${srcs[@]}" "${BASH_SOURCE[0]}" | head -1)
  if [[ ! -x $bin || $newest -nt $bin ]]; then
    start=$SECONDS
    if ! "$cxx" "${flags[@]}" "${srcs[@]}" -ltomlplusplus -lfmt -o "$bin.tmp" 2>"$out/$t.build.log"; then
      grep -m5 "error" "$out/$t.build.log" >&2 || true
      echo "fuzz: $t: FAILED to build (log: $out/$t.build.log)"
      failed=1
      continue
    fi
    mv "$bin.tmp" "$bin"
    echo "fuzz: built $t in $((SECONDS - start)) s"
  fi
  corpus=$out/$t-corpus crashes=$out/$t-crashes
  mkdir -p "$corpus" "$crashes"
  cp -n "$root/tests/fuzz/seeds/$t"/* "$corpus/" 2>/dev/null || true
  log=$out/$t.log
  rc=0
  (cd "$crashes" && "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=1024 -max_len=65536 \
    -print_final_stats=1 "$corpus" >"$log" 2>&1) || rc=$?
  runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
  if [[ $rc -ne 0 ]]; then
    failed=1
    grep -m3 "ERROR\|SUMMARY\|==[0-9]*==" "$log" || tail -5 "$log"
    echo "fuzz: $t: FAILED after ${runs:-?} executions; the input is in $crashes (log: $log)"
  else
    echo "fuzz: $t: ${runs:-?} executions in ${seconds} s, corpus $(ls "$corpus" | wc -l) inputs, no findings"
  fi
done
exit $failed
