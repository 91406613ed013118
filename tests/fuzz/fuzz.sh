#!/usr/bin/env bash
# Fuzzing the parsers of input from outside: ./ds fuzz [TARGET...] [--seconds S] [--budget B]
# Builds each libFuzzer target (tests/fuzz/fuzz_<target>.cpp with the sources it parses
# with) by clang with AddressSanitizer and UndefinedBehaviorSanitizer into BUILD/fuzz, seeds
# it from tests/fuzz/seeds/<target> (inputs the tests use), runs it for S seconds (default 20)
# and prints its executions and findings; a crash, leak or sanitizer report fails, leaving
# the input in BUILD/fuzz/<target>-crashes. Exit 77 when clang or libFuzzer is missing.
# --budget B: the whole run, building included, in about B seconds: a target runs for fewer
# than S seconds (at least 1) when what is left of B, shared by the targets still to run,
# is less (CI's 3 minutes for every target; the time is reported, never a failure).
# Usage: fuzz.sh BUILD_DIR [TARGET...] [--seconds S] [--budget B]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(realpath "$1")
shift
seconds=20
budget=0
targets=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
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
  [safetensors]="io/ckpt/safetensors.cpp io/ckpt/safetensors_header.cpp io/ckpt/safetensors_reader.cpp
    io/ckpt/posix_file.cpp io/ckpt/atomic_file.cpp core/file_backed.cpp core/tensor.cpp core/host_allocator.cpp core/misc.cpp core/log.cpp core/error.cpp"
  [shard]="io/data/pretrain_shard.cpp models/tokenizer/vocab.cpp io/ckpt/safetensors.cpp io/ckpt/safetensors_header.cpp
    io/ckpt/posix_file.cpp io/ckpt/atomic_file.cpp core/file_backed.cpp core/tensor.cpp core/host_allocator.cpp
    core/misc.cpp core/log.cpp core/error.cpp"
  [trace]="actors/trace/trace_file.cpp actors/trace/trace_frame.cpp actors/trace/trace_recorder.cpp io/ckpt/crc32c.cpp
    io/net/flight_recorder.cpp
    io/ckpt/posix_file.cpp core/error.cpp"
  [wire]="io/net/wire.cpp io/net/am_header.cpp io/net/transport.cpp core/misc.cpp core/error.cpp"
)
[[ ${#targets[@]} -gt 0 ]] || targets=(hostfile manifest rendezvous squad toml deepspeed_json safetensors shard trace wire)
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
flags=(-std=c++17 -O1 -gline-tables-only -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root" -I"$build"
  -DTOML_HEADER_ONLY=0 -DTOML_SHARED_LIB=1)
# Each source is compiled once into BUILD/fuzz/obj (the targets share most of theirs), in
# parallel, again only when it or a header it includes (its depfile) is newer.
objdir=$out/obj
object_of() { echo "$objdir/${1%.cpp}.o"; }
stale_object() { # source: true when its object must be rebuilt
  local o d f
  o=$(object_of "$1")
  [[ -f $o && -f $o.d && $o -nt "$root/$1" && $o -nt "${BASH_SOURCE[0]}" ]] || return 0
  for f in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$o.d"); do
    [[ $f -nt $o ]] && return 0
  done
  return 1
}
compile_one() { # source
  local o
  o=$(object_of "$1")
  mkdir -p "$(dirname "$o")"
  if "$cxx" "${flags[@]}" -MMD -MF "$o.d" -c "$root/$1" -o "$o.tmp" 2>"$o.log"; then
    mv "$o.tmp" "$o"
  else
    grep -m5 "error" "$o.log" >&2 || true
    echo "fuzz: FAILED to compile $1 (log: $o.log)"
    return 1
  fi
}
declare -A needed=()
for t in "${targets[@]}"; do
  needed[tests/fuzz/fuzz_$t.cpp]=1
  for s in ${sources[$t]}; do needed[$s]=1; done
done
stale=()
for s in "${!needed[@]}"; do stale_object "$s" && stale+=("$s"); done
failed=0
if [[ ${#stale[@]} -gt 0 ]]; then
  start=$SECONDS
  jobs=$(nproc)
  for s in "${stale[@]}"; do
    while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n || failed=1; done
    compile_one "$s" &
  done
  while [[ $(jobs -rp | wc -l) -gt 0 ]]; do wait -n || failed=1; done
  echo "fuzz: compiled ${#stale[@]} source(s) in $((SECONDS - start)) s ($jobs at a time)"
fi
left=${#targets[@]}
for t in "${targets[@]}"; do
  # This target's share of what is left of the budget (3 s of it for linking and start-up).
  run_for=$seconds
  if (( budget > 0 )); then
    share=$(( (budget - SECONDS) / left - 3 ))
    (( share < run_for )) && run_for=$share
    (( run_for < 1 )) && run_for=1
  fi
  left=$((left - 1))
  bin=$out/fuzz_$t
  objs=("$(object_of "tests/fuzz/fuzz_$t.cpp")")
  for s in ${sources[$t]}; do objs+=("$(object_of "$s")"); done
  missing=0
  for o in "${objs[@]}"; do [[ -f $o ]] || missing=1; done
  if [[ $missing -eq 1 ]]; then
    echo "fuzz: $t: FAILED to build (a source did not compile)"
    failed=1
    continue
  fi
  newest=$(ls -t "${objs[@]}" | head -1)
  if [[ ! -x $bin || $newest -nt $bin ]]; then
    if ! "$cxx" "${flags[@]}" "${objs[@]}" -ltomlplusplus -lfmt -o "$bin.tmp" 2>"$out/$t.build.log"; then
      grep -m5 "error" "$out/$t.build.log" >&2 || true
      echo "fuzz: $t: FAILED to link (log: $out/$t.build.log)"
      failed=1
      continue
    fi
    mv "$bin.tmp" "$bin"
  fi
  corpus=$out/$t-corpus crashes=$out/$t-crashes
  mkdir -p "$corpus" "$crashes"
  cp -n "$root/tests/fuzz/seeds/$t"/* "$corpus/" 2>/dev/null || true
  log=$out/$t.log
  rc=0
  (cd "$crashes" && "$bin" -max_total_time="$run_for" -timeout=10 -rss_limit_mb=1024 -max_len=65536 \
    -print_final_stats=1 "$corpus" >"$log" 2>&1) || rc=$?
  runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
  if [[ $rc -ne 0 ]]; then
    failed=1
    grep -m3 "ERROR\|SUMMARY\|==[0-9]*==" "$log" || tail -5 "$log"
    echo "fuzz: $t: FAILED after ${runs:-?} executions; the input is in $crashes (log: $log)"
  else
    echo "fuzz: $t: ${runs:-?} executions in ${run_for} s, corpus $(ls "$corpus" | wc -l) inputs, no findings"
  fi
done
echo "fuzz: ${#targets[@]} target(s) in $SECONDS s, building included$( (( budget > 0 )) && echo " (budget $budget s)")"
exit $failed
