# shellcheck shell=bash
# Sourced first by the integration scripts (bash), whose first argument is the dsactor
# binary: strict mode, and
#   dsactor        the binary's absolute path;
#   work           a fresh scratch directory, removed on exit. A script with more to undo
#                  (a process to kill, a mount, hosts) defines a function `cleanup`, which
#                  the EXIT trap runs first;
#   fail MESSAGE   says what failed with the tails of $work/out and $work/err, where the
#                  scripts keep the last command's output, and exits 1.
set -euo pipefail
# shellcheck disable=SC2034 # read by the scripts that source this
dsactor=$(realpath "$1")
work=$(mktemp -d)

on_exit() {
  if declare -F cleanup >/dev/null; then cleanup; fi
  rm -rf "$work"
}
trap on_exit EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/out "$work"/err; do [[ -f $f ]] && { echo "--- $f" >&2; tail -30 "$f" >&2; }; done
  exit 1
}

# rank_pid LAUNCHER_PID RANK: the pid of the launcher's child whose environment has RANK=RANK
# ("" when there is none).
rank_pid() {
  local environ pid found=
  for environ in /proc/[0-9]*/environ; do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    [[ $(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null) == "$1" ]] || continue
    if tr '\0' '\n' <"$environ" 2>/dev/null | grep -qx "RANK=$2"; then found=$pid; fi
  done
  echo "$found"
}

# kill_rank_after_checkpoint RUN_DIR RANK: once RUN_DIR has a checkpoint (within 30 s),
# kill -9 rank RANK of the job $launcher_pid runs and wait for the launcher; sets
# job_rc (its exit code) and job_elapsed (seconds from the kill to its end).
kill_rank_after_checkpoint() {
  local victim start
  for _ in $(seq 600); do
    [[ -f $1/checkpoints/latest ]] && break
    sleep 0.05
  done
  [[ -f $1/checkpoints/latest ]] || fail "no checkpoint within 30 s"
  victim=$(rank_pid "$launcher_pid" "$2")
  [[ -n $victim ]] || fail "rank $2's process not found"
  kill -9 "$victim"
  start=$(date +%s)
  job_rc=0
  wait "$launcher_pid" || job_rc=$?
  launcher_pid=
  job_elapsed=$(( $(date +%s) - start ))
}
