#!/usr/bin/env bash
# Integration: 'dsactor bench aio' and 'dsactor nvme-tune' at quick sizes on a scratch
# directory; checks the bench's last line is one JSON object with the engine's and the peers'
# rates, and that nvme-tune ends with an [aio] section. Usage: aio_smoke.sh PATH/TO/dsactor
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1

out=$("$dsactor" bench aio "$work" --size 8 --reps 1) || fail "bench aio exited non-zero"
echo "$out"
last=$(tail -n 1 <<<"$out")
python3 - "$last" <<'PY' || fail "bench aio: last line is not the expected JSON"
import json, sys
j = json.loads(sys.argv[1])
for k in ("read_GBps", "write_GBps", "posix_direct_read_GBps", "posix_direct_write_GBps",
          "posix_buffered_read_GBps", "posix_buffered_write_GBps", "read_ratio_to_posix_direct",
          "swap_engine_read_GBps", "swap_actor_read_GBps", "swap_actor_write_GBps", "swap_actor_read_ratio"):
    assert k in j and j[k] > 0, k
assert j["bench"] == "aio" and j["bytes"] == 8 << 20
# fio, the reference peer: measured where it is installed (./ds setup installs it), null otherwise.
for k in ("fio_read_GBps", "fio_write_GBps", "read_ratio_to_fio", "write_ratio_to_fio"):
    assert k in j, k
import shutil
if shutil.which("fio"):
    assert j["fio_read_GBps"] > 0 and j["fio_write_GBps"] > 0 and j["read_ratio_to_fio"] > 0, j
else:
    assert j["fio_read_GBps"] is None, j
PY
[[ -z $(ls -A "$work") ]] || fail "bench aio left files behind: $(ls -A "$work")"

out=$("$dsactor" nvme-tune "$work" --quick) || fail "nvme-tune exited non-zero"
echo "$out"
grep -q '^\[aio\]$' <<<"$out" || fail "nvme-tune printed no [aio] section"
for key in block_size queue_depth intra_op_parallelism single_submit overlap_events; do
  grep -Eq "^$key = " <<<"$out" || fail "nvme-tune's [aio] section lacks $key"
done
[[ $(grep -cE '^ +[0-9]+K +[0-9]+ ' <<<"$out") -eq 8 ]] || fail "nvme-tune --quick should measure 8 settings"

# A directory that cannot hold files is an error naming it, not a crash.
if "$dsactor" bench aio "$work/missing" --size 1 2>"$work.err"; then fail "bench aio on a missing dir succeeded"; fi
grep -q "$work/missing" "$work.err" || { cat "$work.err"; fail "the error does not name the directory"; }
rm -f "$work.err"
echo "aio smoke: ok"
