#!/usr/bin/env python3
"""Chaos drill: 8 seeded faults in 3-process `dsactor launch` jobs, each checked for what a user
needs after a fault.

Each seed picks a job (plain, or with the optimizer state swapped to NVMe), whether the launcher
may restart it (--max_restarts 1 or 0), a fault (kill -9 of a rank, or a rank stalled with
SIGSTOP, which only the rendezvous' heartbeat can notice), the rank, and the point: right after
step 2's, 4's or 6's checkpoint is committed, plus 0-100 ms. Then it checks:
  1. the job ends within 30 s of the fault: finished after a restart (exit 0), or stopped
     naming the rank (exit non-zero);
  2. no process of the job is left (within 30 s) and, once a clean run has ended, no swap file;
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


def sh(script):
    """Runs bash with tiny_corpus.sh sourced (write_tiny_corpus, tiny_pretrain_toml); its stdout."""
    return subprocess.run(["bash", "-c", f'work={WORK}; fail() {{ echo "FAIL: $*" >&2; exit 1; }}; '
                           f'source "{HERE}/tiny_corpus.sh"; {script}'],
                          check=True, capture_output=True, text=True).stdout


def launch(run_dir, extra, restarts=0, env=None, log=".err"):
    """The 3-process job in run_dir: a Popen with its stderr in run_dir + log."""
    cmd = [DSACTOR, "launch", "--num_procs", "3", "--heartbeat_timeout", "3", "--grace", "2",
           "--max_restarts", str(restarts), f"{WORK}/pre.toml", "--set", f'run_dir="{run_dir}"',
           "--set", f"train_steps={STEPS}"] + extra
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


def wait_for(path, proc, limit=60.0):
    start = time.monotonic()
    while not os.path.exists(path):
        if proc.poll() is not None:
            return False
        if time.monotonic() - start > limit:
            return False
        time.sleep(0.01)  # polling a file the job writes
    return True


def model(run_dir):
    with open(f"{run_dir}/checkpoints/step_{STEPS:08d}/model.safetensors", "rb") as f:
        return f.read()


def main():
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
    failures = 0
    print("seed  job    restarts  fault          rank  point                    outcome")
    for seed in SEEDS:
        rng = random.Random(seed)
        name = rng.choice(sorted(jobs))
        restarts = rng.choice([0, 1])
        fault = rng.choice(["kill -9", "SIGSTOP"])
        victim = rng.randrange(3)
        after = rng.choice([2, 4, 6])
        delay_ms = rng.randrange(101)
        run_dir = f"{WORK}/seed{seed}"
        problems = []
        p = launch(run_dir, jobs[name], restarts)
        point = f"step {after}'s checkpoint +{delay_ms} ms"
        if not wait_for(f"{run_dir}/checkpoints/step_{after:08d}/manifest.json", p):
            problems.append(f"the job ended or stalled before {point}")
        time.sleep(delay_ms / 1000)  # the seeded point of the fault
        pid = job_pids(run_dir).get(victim)
        if pid is None:
            problems.append(f"rank {victim} was not running at {point}")
            p.wait()
        else:
            os.kill(pid, signal.SIGKILL if fault == "kill -9" else signal.SIGSTOP)
            hit = time.monotonic()
            try:
                rc = p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
                problems.append("the job did not end within 60 s of the fault")
            ended = time.monotonic() - hit
            err = open(run_dir + ".err").read()
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
                if f"rank {victim} " not in err:
                    problems.append(f"the launcher's stop does not name rank {victim}")
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
            # 3. the last committed checkpoint loads and resumes (same layout)
            if rc != 0:
                r = launch(run_dir, jobs[name] + ["--resume"], log=".resume.err")
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
            if name == "nvme" and os.path.isdir(swap) and any(f.endswith(".swp") for f in os.listdir(swap)):
                problems.append(f"swap files left in {swap}: {sorted(os.listdir(swap))}")
            point += f", {outcome}"
        verdict = "ok" if not problems else "FAIL: " + "; ".join(problems)
        failures += bool(problems)
        print(f"{seed:<5} {name:<6} {restarts:<9} {fault:<14} {victim:<5} {point}: {verdict}", flush=True)
    print(f"chaos drill: {len(SEEDS) - failures} of {len(SEEDS)} seeds ok")
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        code = main()
    finally:
        if os.environ.get("KEEP_CHAOS_WORK") is None:
            shutil.rmtree(WORK, ignore_errors=True)
    sys.exit(code)
