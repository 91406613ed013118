#!/usr/bin/env bash
# Integration: the flight recorder and `dsactor trace hang` on real multi-process jobs. A
# test-only switch (DSA_TEST_COLLECTIVE_FAULT=stall|skip:RANK:CHANNEL:CALL) makes one rank
# stall before, or skip, one gradient allreduce (channel 1, the reducer of stage 0, call #3:
# step 3's sum); the others wait in it. Each time the report must name that rank and that
# call:
#   1. 2 processes, rank 1 stalls: the watchdog (5 s) stops the job; the records come from
#      the failure (each process captures its collectives before it aborts the group).
#   2. 3 processes, rank 2 skips the call and goes on to the next one.
#   3. 2 processes, rank 0 stalls, no watchdog in reach: SIGUSR1 to the launcher makes each
#      rank write its record while the job hangs (`trace hang --last` reads the latest); then
#      Ctrl-C twice ends it.
#   4. 2 processes, rank 1 stalls and is then killed (kill -9: no record of its own): rank 0
#      records the loss, and the report names rank 1 and the call rank 0 waited in.
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

# ask_until_named PID RECORDS RUN PATTERN: SIGUSR1 to PID (the launcher, which passes it on
# to each rank, or one rank) until `trace hang --last` gives a verdict matching PATTERN, each
# try waiting for RECORDS more "flight record written" lines (each rank writes a record and
# runs on): one rank may still be on its way into the call when the other stalls. Within
# 60 tries.
ask_until_named() {
  local attempt
  for attempt in $(seq 60); do
    kill -USR1 "$1"
    for _ in $(seq 1200); do # each rank's trace writer writes within its 1 s interval
      [[ $(grep -c "flight record written" "$work/err") -ge $(($2 * attempt)) ]] && break
      sleep 0.05
    done
    [[ $(grep -c "flight record written" "$work/err") -ge $(($2 * attempt)) ]] ||
      fail "each rank asked should write a flight record on SIGUSR1"
    "$dsactor" trace hang "$3" --last >"$work/hang" 2>&1 || { cat "$work/hang"; fail "dsactor trace hang --last"; }
    grep -q "$4" "$work/hang" && return 0
  done
  cat "$work/hang"
  fail "the SIGUSR1 records should match '$4'"
}

# wait_for_line PATTERN: the job's stderr shows PATTERN within 60 s.
wait_for_line() {
  for _ in $(seq 1200); do
    grep -q "$1" "$work/err" && return 0
    sleep 0.05
  done
  fail "no '$1' in the job's output within 60 s"
}

# start_hung RANK RUN: a 2-process job in RUN whose RANK stalls before step 3's gradient sum,
# the watchdog far away; returns once the rank stalls (launcher_pid is the launcher's).
start_hung() {
  DSA_TEST_COLLECTIVE_FAULT=stall:$1:1:3 "$dsactor" launch --num_procs 2 "$work/pre.toml" \
    --set "run_dir=\"$2\"" --set watchdog_seconds=600 >"$work/out" 2>"$work/err" &
  launcher_pid=$!
  wait_for_line "DSA_TEST_COLLECTIVE_FAULT: world rank $1 stalls"
}

# 3. SIGUSR1 while the job hangs (the watchdog is far away), sent to the launcher.
start_hung 0 "$work/usr1"
ask_until_named "$launcher_pid" 2 "$work/usr1" "^verdict: rank 0 never entered allreduce"
grep -q "SIGUSR1: asked every rank on every host through the rendezvous" "$work/err" || fail "the launcher should say it passed SIGUSR1 on"
grep -q "^verdict: rank 0 never entered allreduce .* #3 on channel 1 .*; rank 1 waited" "$work/hang" ||
  { cat "$work/hang"; fail "the verdict should name rank 0, call #3 and rank 1 waiting"; }
grep -q "^  rank 1: SIGUSR1 " "$work/hang" || { cat "$work/hang"; fail "rank 1's record should say SIGUSR1"; }
# Ctrl-C: the ranks would stop after the step, which never ends; a second one ends them at
# once. The second only once the launcher has taken the first (two signals sent at once
# arrive as one) and each rank has written the first's flight record.
# (Counted per rank: Ctrl-C reaches a rank twice, by signal and through the rendezvous, and
# may make it write two records.)
records_of() { grep -c "^\[rank $1\] .*flight record written" "$work/err" || true; }
written0=$(records_of 0) written1=$(records_of 1)
kill -INT "$launcher_pid"
wait_for_line "SIGINT: passing it on"
for _ in $(seq 1200); do
  (( $(records_of 0) > written0 && $(records_of 1) > written1 )) && break
  sleep 0.05
done
(( $(records_of 0) > written0 && $(records_of 1) > written1 )) || fail "each rank should write a flight record on Ctrl-C"
kill -INT "$launcher_pid"
rc=0
wait "$launcher_pid" || rc=$?
launcher_pid=
[[ $rc -ne 0 ]] || fail "the interrupted job should end non-zero"
"$dsactor" trace hang "$work/usr1" --last >"$work/hang" 2>&1 || { cat "$work/hang"; fail "dsactor trace hang --last"; }
# (Ctrl-C reaches a rank twice, as the launcher's signal and through the rendezvous; the
# first to arrive names the record.)
for r in 0 1; do
  grep -q "^  rank $r: \(SIGINT\|stop requested by the launcher\) " "$work/hang" ||
    { cat "$work/hang"; fail "rank $r's last record should be Ctrl-C's"; }
done
echo "ok: SIGUSR1 to the launcher while 2 processes hang: each rank wrote a record, the report names rank 0; Ctrl-C wrote one too"

# 4. A lost peer: rank 1 stalls, and once rank 0's records show it waiting in the call
#    (SIGUSR1 to rank 0 alone), rank 1 is killed (kill -9: it never writes a record); rank 0
#    learns of the loss, records what it was in and stops.
start_hung 1 "$work/lost"
rank0=$(rank_pid "$launcher_pid" 0)
victim=$(rank_pid "$launcher_pid" 1)
[[ -n $rank0 && -n $victim ]] || fail "the ranks' processes not found"
lost_verdict="^verdict: rank 1 wrote no flight record (lost, or killed before it could); rank 0 waited up to .* in allreduce .* #3 on channel 1"
ask_until_named "$rank0" 1 "$work/lost" "$lost_verdict"
kill -9 "$victim"
rc=0
wait "$launcher_pid" || rc=$?
launcher_pid=
[[ $rc -ne 0 ]] || fail "a job that lost a rank should end non-zero"
[[ ! -s $work/lost/trace.rank1.dsat ]] || ! "$dsactor" trace hang "$work/lost/trace.rank1.dsat" >/dev/null 2>&1 ||
  fail "rank 1 was killed before any record: its trace should hold none"
"$dsactor" trace hang "$work/lost" --last >"$work/hang" 2>&1 || { cat "$work/hang"; fail "dsactor trace hang --last"; }
grep -q "$lost_verdict" "$work/hang" || { cat "$work/hang"; fail "the verdict should name the lost rank 1 and the call rank 0 waited in"; }
# Rank 0 wrote a record when it learnt of the loss, after the SIGUSR1 ones (the launcher's
# SIGTERM, which may come first, writes another).
grep -q "^    its records in the order written: 1\. SIGUSR1; .*[0-9]\. [^;]* failed in step 3: [^;]*rank 1 lost" "$work/hang" ||
  { cat "$work/hang"; fail "rank 0 should have written a record when it learnt of rank 1's loss"; }
# (The rendezvous learns it from the closed connection or from the launcher, which reaped
# the process, whichever comes first.)
grep -q "rank 1 lost (\(its connection closed without a leave\|was killed by signal 9\)" "$work/err" ||
  fail "rank 0 should have been told of the loss"
echo "ok: rank 1 killed while rank 0 waited for it: the report names rank 1 and allreduce #3"
