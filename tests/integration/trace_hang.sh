#!/usr/bin/env bash
# Integration: the flight recorder and `dsactor trace hang` on real multi-process jobs. A
# test-only switch (DSA_TEST_COLLECTIVE_FAULT=stall|skip:RANK:CHANNEL:CALL) makes one rank
# stall before, or skip, one gradient allreduce (channel 1, the reducer of stage 0, call #3:
# step 3's sum); the others wait in it. Each time the report must name that rank and that
# call:
#   1. 2 processes, rank 1 stalls: the watchdog (5 s) stops the job; the records come from
#      the failure (each process captures its collectives before it aborts the group).
#   2. 3 processes, rank 2 skips the call and goes on to the next one.
#   3. 2 processes, rank 0 stalls, no watchdog in reach: SIGUSR1 to each rank writes its
#      record while the job hangs (`trace hang --last` reads the latest); then Ctrl-C twice
#      ends it.
# Usage: trace_hang.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
launcher_pid=
cleanup() { [[ -n $launcher_pid ]] && kill -9 "$launcher_pid" 2>/dev/null || true; }

# shellcheck source=tiny_corpus.sh
source "$(dirname "${BASH_SOURCE[0]}")/tiny_corpus.sh"
write_tiny_corpus "$work/corpus"
tiny_pretrain_toml "$work" >"$work/pre.toml"

# hang_report RUN EXPECTED...: dsactor trace hang RUN's verdict holds each EXPECTED string.
hang_report() {
  local run=$1
  shift
  "$dsactor" trace hang "$run" >"$work/hang" 2>&1 || { cat "$work/hang"; fail "dsactor trace hang $run"; }
  local verdict
  verdict=$(grep "^verdict: " "$work/hang") || { cat "$work/hang"; fail "no verdict"; }
  for want in "$@"; do
    [[ $verdict == *"$want"* ]] || { cat "$work/hang"; fail "the verdict should say '$want'"; }
  done
}

# 1. A stall on rank 1 of 2; the watchdog ends the job.
rc=0
DSA_TEST_COLLECTIVE_FAULT=stall:1:1:3 "$dsactor" launch --num_procs 2 "$work/pre.toml" \
  --set "run_dir=\"$work/stall\"" --set watchdog_seconds=5 >"$work/out" 2>"$work/err" || rc=$?
[[ $rc -ne 0 ]] || fail "a job with a stalled rank should fail"
grep -q "watchdog: no step completed" "$work/err" || fail "the watchdog should have stopped the stalled job"
hang_report "$work/stall" "rank 1 never entered allreduce" "#3 on channel 1 (gradient reducer of stage 0" \
  "rank 0 waited"
grep -q "^    rank 1 never entered #3: its last call here was allreduce .* #2 .*, finished" "$work/hang" ||
  { cat "$work/hang"; fail "rank 1's line should give its last call, #2"; }
echo "ok: 2 processes, rank 1 stalled before allreduce #3: the report names it"

# 2. Rank 2 of 3 skips the call.
rc=0
DSA_TEST_COLLECTIVE_FAULT=skip:2:1:3 "$dsactor" launch --num_procs 3 "$work/pre.toml" \
  --set "run_dir=\"$work/skip\"" --set watchdog_seconds=5 --set train_batch_size=6 >"$work/out" 2>"$work/err" || rc=$?
[[ $rc -ne 0 ]] || fail "a job with a skipped collective should fail"
hang_report "$work/skip" "rank 2 never entered allreduce" "#3 on channel 1" "ranks 0 and 1 waited"
grep -q "^    rank 2 never entered #3: it skipped it and went on to allreduce .* #4" "$work/hang" ||
  { cat "$work/hang"; fail "rank 2's line should say it went on to #4"; }
echo "ok: 3 processes, rank 2 skipped allreduce #3: the report names it"

# 3. SIGUSR1 while the job hangs (the watchdog is far away).
DSA_TEST_COLLECTIVE_FAULT=stall:0:1:3 "$dsactor" launch --num_procs 2 "$work/pre.toml" \
  --set "run_dir=\"$work/usr1\"" --set watchdog_seconds=600 >"$work/out" 2>"$work/err" &
launcher_pid=$!
for _ in $(seq 1200); do # the stall's log line: rank 0 is in it (60 s at most)
  grep -q "DSA_TEST_COLLECTIVE_FAULT: world rank 0 stalls" "$work/err" && break
  sleep 0.05
done
grep -q "DSA_TEST_COLLECTIVE_FAULT: world rank 0 stalls" "$work/err" || fail "rank 0 did not reach the stall"
# Rank 1 may still be on its way into the call when rank 0 stalls: ask again (each SIGUSR1
# adds a record) until the last records show it waiting, within 60 s.
named=
for attempt in $(seq 60); do
  for r in 0 1; do
    pid=$(rank_pid "$launcher_pid" "$r")
    [[ -n $pid ]] || fail "rank $r's process not found"
    kill -USR1 "$pid"
  done
  for _ in $(seq 1200); do # each rank's trace writer writes within its 1 s interval
    [[ $(grep -c "flight record written" "$work/err") -ge $((2 * attempt)) ]] && break
    sleep 0.05
  done
  [[ $(grep -c "flight record written" "$work/err") -ge $((2 * attempt)) ]] ||
    fail "both ranks should write a flight record on SIGUSR1"
  "$dsactor" trace hang "$work/usr1" --last >"$work/hang" 2>&1 || { cat "$work/hang"; fail "dsactor trace hang --last"; }
  if grep -q "^verdict: rank 0 never entered allreduce" "$work/hang"; then named=1; break; fi
done
[[ -n $named ]] || { cat "$work/hang"; fail "the SIGUSR1 records should name rank 0"; }
# Ctrl-C: the ranks would stop after the step, which never ends; a second one ends them at
# once. The second only once the launcher has taken the first (two signals sent at once
# arrive as one).
kill -INT "$launcher_pid"
for _ in $(seq 1200); do
  grep -q "SIGINT: passing it on" "$work/err" && break
  sleep 0.05
done
grep -q "SIGINT: passing it on" "$work/err" || fail "the launcher did not pass the first SIGINT on"
kill -INT "$launcher_pid"
rc=0
wait "$launcher_pid" || rc=$?
launcher_pid=
[[ $rc -ne 0 ]] || fail "the interrupted job should end non-zero"
grep -q "^verdict: rank 0 never entered allreduce .* #3 on channel 1 .*; rank 1 waited" "$work/hang" ||
  { cat "$work/hang"; fail "the verdict should name rank 0, call #3 and rank 1 waiting"; }
grep -q "^  rank 1: SIGUSR1 " "$work/hang" || { cat "$work/hang"; fail "rank 1's record should say SIGUSR1"; }
echo "ok: SIGUSR1 while 2 processes hang: each wrote a record, the report names rank 0"
