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
