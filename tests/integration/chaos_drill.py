#!/usr/bin/env python3
"""Chaos drill: 8 seeded faults in 3-process `dsactor launch` jobs, each checked for what a user
needs after a fault.

Seed N injects fault kind N (modulo 8): kill -9 of a rank, or SIGSTOP of a rank (only the
rendezvous' heartbeat can notice it), from outside at a step's checkpoint plus 0-100 ms; a rank
killing itself (test-only DSA_TEST_KILL_IN) in a forward, in a gradient reduction, in the
checkpoint commit (staged, not yet renamed) or in an NVMe swap transfer; a rank stalled before
a gradient reduction (DSA_TEST_COLLECTIVE_FAULT, the collective watchdog at 5 s must stop it);
host 1's link cut (the network-namespace hosts of hosts_fixture.sh: host 0 runs ranks 0 and 1,
host 1 rank 2, UCX on TCP; skipped, and said so, where namespaces cannot be made). The seed
also picks the job (plain, or the optimizer state swapped to NVMe under ZeRO-1), whether the
launcher may restart it (--max_restarts 1 or 0; 0 for the stall and the cut), the rank and
the step. Then it checks:
  1. the job ends within 30 s of the fault: finished after a restart (exit 0), or stopped
     naming the rank (exit non-zero; a stall: `dsactor trace hang` names it);
  2. no process of the job is left (within 30 s), and no swap file (the ranks remove theirs, the
     launcher those of ranks that died: tools/launch/swap_janitor.hpp);
  3. the last committed checkpoint loads: a job stopped is resumed (--resume, same layout);
  4. the job's end equals the uninterrupted job's: model.safetensors byte for byte;
and reports the steps lost (done after the checkpoint the job resumed from, so done again).
It prints a line per seed (the seed replays it) and exits 1 on any failed check.
Usage: chaos_drill.py PATH/TO/dsactor [SEED...]
"""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DSACTOR = os.path.realpath(sys.argv[1])
SEEDS = [int(s) for s in sys.argv[2:]] or list(range(1, 9))
HERE = os.path.dirname(os.path.realpath(__file__))
STEPS = 16
WORK = tempfile.mkdtemp(prefix="dsactor-chaos-")
KINDS = ["kill -9", "SIGSTOP", "kill in forward", "kill in allreduce", "kill in commit", "kill in swap",
         "stall in allreduce", "link cut"]


def sh(script):
    """Runs bash with tiny_corpus.sh and hosts_fixture.sh sourced; its stdout."""
    return subprocess.run(["bash", "-c", f'work={WORK}; fail() {{ echo "FAIL: $*" >&2; exit 1; }}; '
                           f'source "{HERE}/tiny_corpus.sh"; source "{HERE}/hosts_fixture.sh"; {script}'],
                          check=True, capture_output=True, text=True).stdout


class Hosts:
    """Two hosts of hosts_fixture.sh (made on first use, removed at the end): host 0 runs
    ranks 0 and 1, host 1 rank 2."""

    def __init__(self):
        self.state = None  # the fixture's shell variables, once made
        self.reason = sh("hosts_skip_reason").strip()

    def up(self):
        if self.state is None:
            # The fixture's names fixed here, so that hosts a failed hosts_up made part of
            # are still removed (down()).
            names = f'hosts_prefix=dsa{os.getpid()}; hosts_net={os.getpid() % 200 + 20}; hosts_dir="{WORK}/hosts"'
            try:
                self.state = sh(f'{names}; hosts_up "{WORK}/hosts" 2 >&2 && '
                                'declare -p hosts_prefix hosts_net hosts_count hosts_dir')
            except subprocess.CalledProcessError:
                self.state = names + "; hosts_count=2"
                raise
            a0, a1 = self.run("host_addr 0; host_addr 1").split()
            with open(f"{WORK}/hosts/drill-hostfile", "w") as f:
                f.write(f"{a0} slots=2\n{a1} slots=1\n")

    def run(self, script):
        return sh(f"{self.state}\n{script}")

    def down(self):
        if self.state is not None:
            self.run("hosts_down")
            self.state = None

    def launch_prefix(self):
        pid = open(f"{WORK}/hosts/sshd0.pid").read().strip()
        return ["nsenter", "--target", pid, "--net", "--uts", "--mount", "--", "env",
                f"PATH={WORK}/hosts/bin:{os.environ['PATH']}", "UCX_TLS=tcp"]


def launch(run_dir, extra, restarts=0, env=None, log=".err", hosts=None):
    """The 3-process job in run_dir (on the two hosts when given): a Popen with its stderr in
    run_dir + log."""
    where = ["--num_procs", "3"] if hosts is None else ["--hostfile", f"{WORK}/hosts/drill-hostfile"]
    cmd = ([] if hosts is None else hosts.launch_prefix()) + [
        DSACTOR, "launch"] + where + ["--heartbeat_timeout", "3", "--grace", "2", "--max_restarts", str(restarts),
        f"{WORK}/pre.toml", "--set", f'run_dir="{run_dir}"', "--set", f"train_steps={STEPS}"] + extra
    err = open(run_dir + log, "w")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=WORK, env=env)


def job_pids(run_dir):
    """{rank: pid} of the processes whose command line names run_dir."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if not args or os.path.basename(args[0].decode()) != "dsactor" or b"run" not in args[1:2]:
                continue
            if not any(run_dir.encode() in a for a in args):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            found[int(env.get(b"RANK", b"-1"))] = int(pid)
        except (OSError, ValueError):
            continue
    return found


def wait_until(ready, proc, limit=60.0):
    """Polls ready() every 10 ms until it holds (True), the job ends or limit s pass (False)."""
    start = time.monotonic()
    while not ready():
        if proc.poll() is not None or time.monotonic() - start > limit:
            return ready()
        time.sleep(0.01)  # polling what the job writes
    return True


def swap_files(swap):
    """The swap files under the NVMe folder (every job's and rank's)."""
    return sorted(os.path.join(d, f) for d, _, files in os.walk(swap) for f in files if f.endswith(".swp"))


def model(run_dir):
    with open(f"{run_dir}/checkpoints/step_{STEPS:08d}/model.safetensors", "rb") as f:
        return f.read()


def plan(seed, jobs):
    """What seed injects: (kind, job, restarts, victim, step, delay_ms)."""
    rng = random.Random(seed)
    kind = KINDS[(seed - 1) % len(KINDS)]
    name = "nvme" if kind == "kill in swap" else rng.choice(sorted(jobs))
    restarts = 0 if kind in ("stall in allreduce", "link cut") else rng.choice([0, 1])
    victim = 0 if kind == "kill in commit" else 2 if kind == "link cut" else rng.randrange(3)
    step = rng.choice([4, 6]) if kind == "kill in commit" else rng.choice([2, 4, 6])
    delay_ms = rng.randrange(101)
    return kind, name, restarts, victim, step, delay_ms


def drill(seed, jobs, reference, hosts, swap):
    """Runs one seed; (the line's fault point and outcome, the problems found)."""
    kind, name, restarts, victim, step, delay_ms = plan(seed, jobs)
    run_dir = f"{WORK}/seed{seed}"
    problems = []
    env, extra, on = None, list(jobs[name]), None
    if kind == "link cut":
        if hosts.reason:
            return f"skipped: the hosts cannot be made here ({hosts.reason})", [], kind, name, restarts, victim
        hosts.up()
        on = hosts
    if kind.startswith("kill in "):
        phase = kind.split()[-1]
        env = dict(os.environ, DSA_TEST_KILL_IN=f"{run_dir}.fired:{victim}:{phase}:{step if phase == 'commit' else step + 1}")
        what = {"forward": "a forward", "allreduce": "a gradient reduction", "swap": "an NVMe swap transfer"}
        point = f"step {step}'s commit" if phase == "commit" else f"{what[phase]} of step {step + 1}"
    elif kind == "stall in allreduce":
        call = 3 * step  # a reduction of the step's gradients, some steps in
        env = dict(os.environ, DSA_TEST_COLLECTIVE_FAULT=f"stall:{victim}:1:{call}")
        extra += ["--set", "watchdog_seconds=5"]
        point = f"before reduction #{call}"
    else:
        point = f"step {step}'s checkpoint +{delay_ms} ms"
    p = launch(run_dir, extra, restarts, env=env, hosts=on)
    err_path = run_dir + ".err"
    if env is None:  # from outside: at the checkpoint plus the delay
        if not wait_until(lambda: os.path.exists(f"{run_dir}/checkpoints/step_{step:08d}/manifest.json"), p):
            problems.append(f"the job ended or stalled before {point}")
        time.sleep(delay_ms / 1000)  # the seeded point of the fault
        pid = job_pids(run_dir).get(victim)
        if pid is None:
            problems.append(f"rank {victim} was not running at {point}")
        elif kind == "link cut":
            hosts.run("cut_host 1")
        else:
            os.kill(pid, signal.SIGKILL if kind == "kill -9" else signal.SIGSTOP)
    elif kind == "stall in allreduce":
        if not wait_until(lambda: "stalls before" in open(err_path).read(), p):
            problems.append(f"rank {victim} never stalled {point}")
    elif not wait_until(lambda: os.path.exists(f"{run_dir}.fired"), p):
        problems.append(f"rank {victim} never reached {point}")
    hit = time.monotonic()
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        problems.append("the job did not end within 60 s of the fault")
    ended = time.monotonic() - hit
    err = open(err_path).read()
    if ended > 30:
        problems.append(f"the job took {ended:.1f} s to end")
    if rc == 0:
        outcome = f"finished after a restart in {ended:.1f} s"
        if "restart 1 of 1" not in err:
            problems.append("exit 0 without a restart")
    else:
        outcome = f"stopped (exit {rc}) in {ended:.1f} s"
        if restarts and "restart 1 of 1" in err:
            outcome = f"restarted, then stopped (exit {rc})"
            problems.append("the restarted job failed too")
        elif restarts:
            problems.append("a job allowed a restart stopped without one")
    if kind == "stall in allreduce":
        hang = subprocess.run([DSACTOR, "trace", "hang", run_dir], capture_output=True, text=True).stdout
        if f"rank {victim} never entered" not in hang:
            problems.append(f"`dsactor trace hang` does not name rank {victim}:\n{hang}")
    else:
        # The cause the launcher gives first (it then lists every rank's end; a restart
        # names it too) names the rank.
        first = re.search(r"dsactor launch: (?:the job failed|restart 1 of 1): ([^\n]*)", err)
        if not first or f"rank {victim} " not in first.group(1):
            problems.append(f"the launcher's first cause does not name rank {victim}: "
                            f"{first.group(1) if first else 'none given'}")
    # The other ranks end by the launcher's SIGTERM/SIGKILL or with an error, never crash.
    for m in re.finditer(r"dsactor launch: rank (\d+) (was killed by signal (\d+)|exited with code (\d+))", err):
        other, sig, code = int(m.group(1)), m.group(3), m.group(4)
        if other != victim and ((sig and int(sig) in (4, 6, 7, 8, 11)) or (code and int(code) >= 128)):
            problems.append(f"rank {other} crashed: {m.group(2)}")
    # 2. no process left
    deadline = time.monotonic() + 30
    while job_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = job_pids(run_dir)
    if left:
        problems.append(f"processes left: {left}")
        for q in left.values():
            os.kill(q, signal.SIGKILL)
    # ... and no swap file: the ranks remove theirs, the launcher those of ranks that died.
    if name == "nvme" and swap_files(swap):
        problems.append(f"swap files left after the job ended: {swap_files(swap)}")
    # 3. the last committed checkpoint loads and resumes (same layout; a cut host back first)
    if kind == "link cut":
        hosts.run("uncut_host 1")
    if rc != 0:
        r = launch(run_dir, jobs[name] + ["--resume"], log=".resume.err", hosts=on)
        if r.wait() != 0:
            problems.append(f"--resume of the stopped job failed; see {run_dir}.resume.err")
    # 4. the same parameters as uninterrupted
    try:
        if model(run_dir) != reference[name]:
            problems.append("the parameters differ from the uninterrupted job's")
    except OSError as e:
        problems.append(f"no final model: {e}")
    # The steps done after the checkpoint the job resumed from (they ran again).
    lost = 0
    try:
        for line in open(f"{run_dir}/train.log"):
            m = re.search(r"metrics: (\d+) step\(s\) logged after step", line)
            if m:
                lost = int(m.group(1))
    except OSError:
        pass
    outcome += f", {lost} step(s) lost"
    if name == "nvme" and swap_files(swap):
        problems.append(f"swap files left after the resumed run: {swap_files(swap)}")
    return f"{point}, {outcome}", problems, kind, name, restarts, victim


def main(hosts):
    sh(f'write_tiny_corpus "{WORK}/corpus" 40; tiny_pretrain_toml "{WORK}" > "{WORK}/pre.toml"')
    base = ["--set", "train_batch_size=12", "--set", "checkpoint.save_interval=2"]
    swap = f"{WORK}/swap"
    jobs = {
        "plain": base,
        "nvme": base + ["--set", "zero_optimization.stage=1", "--set",
                        'zero_optimization.offload_optimizer.device="nvme"', "--set",
                        f'zero_optimization.offload_optimizer.nvme_path="{swap}"'],
    }
    # The data once (rank 0 of each job would prepare it), then each job uninterrupted.
    subprocess.run([DSACTOR, "run", f"{WORK}/pre.toml", "--set", f'run_dir="{WORK}/prep"', "--set",
                    "train_steps=1"], check=True, capture_output=True, cwd=WORK)
    reference = {}
    for name, extra in jobs.items():
        p = launch(f"{WORK}/ref-{name}", extra)
        if p.wait() != 0:
            sys.exit(f"FAIL: the uninterrupted {name} job failed; see {WORK}/ref-{name}.err")
        reference[name] = model(f"{WORK}/ref-{name}")
    failures = skipped = 0
    print("seed  job    restarts  fault               rank  point, outcome")
    for seed in SEEDS:
        line, problems, kind, name, restarts, victim = drill(seed, jobs, reference, hosts, swap)
        skip = line.startswith("skipped")
        verdict = "skipped" if skip else "ok" if not problems else "FAIL: " + "; ".join(problems)
        failures += bool(problems)
        skipped += skip
        print(f"{seed:<5} {name:<6} {restarts:<9} {kind:<19} {victim:<5} {line}: {verdict}", flush=True)
    print(f"chaos drill: {len(SEEDS) - failures - skipped} of {len(SEEDS)} seeds ok"
          + (f", {skipped} skipped (see above)" if skipped else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    hosts = Hosts()
    code = 1
    try:
        code = main(hosts)
    finally:
        hosts.down()
        # The logs a failure points to stay (KEEP_CHAOS_WORK keeps them always).
        if os.environ.get("KEEP_CHAOS_WORK") is None and code == 0:
            shutil.rmtree(WORK, ignore_errors=True)
        elif code != 0:
            print(f"chaos drill: the jobs' logs are in {WORK}")
    sys.exit(code)
