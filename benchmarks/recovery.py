"""Recovery from a lost node: `fstrain launch --on-failure exclude` against torchrun `--max-restarts`.

Numbers, not a test. On the real namespace cluster (`scripts/testcluster.sh up N`, cluster id
FSTRAIN_TESTCLUSTER_ID or 21, in a temporary state folder), both tools train the bundled model
(`python -m fstrain.train --model tiny`, FSDP2 on CPU/gloo, one rank per host) with a checkpoint
every --checkpoint-interval steps into a folder every host sees (the hosts share this disk).
When rank 0 has logged step --kill-at-step, the last host dies:

- fstrain: its sshd is stopped (`testcluster.sh stop-sshd N`), which also ends its sessions'
  processes; the launcher finds the host lost, excludes it and resumes on the others;
- torchrun, started on every host over SSH as a user would: the same (`stop-sshd N`). The
  other agents run torchrun's elastic loop (`--rdzv-backend c10d --max-restarts 3`, fixed
  `--nnodes N`): they restart the workers and wait at the rendezvous for N nodes, until the
  rendezvous join timeout (`--rdzv-conf join_timeout=--join-timeout-s`) ends them.

Measured per tool: the exit code; whether the last step was reached; time to recover, from the
kill to the first step line after the restart (none: never); steps lost (the steps trained
again). One run each; the cluster starts and goes down once.

    python benchmarks/recovery.py [--hosts 4] [--steps 24] [--kill-at-step 8] [--checkpoint-interval 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_line, namespace_cluster

REPO = Path(__file__).resolve().parent.parent
CLUSTER_ID = os.environ.get("FSTRAIN_TESTCLUSTER_ID") or "21"
STEP_RE = re.compile(r"\[fstrain\.train\] step (\d+)/(\d+) loss ([0-9.]+)")
RESUMED_RE = re.compile(r"resumed from step (\d+)")


class Lines:
    """A process's output lines (stdout and stderr), each with the monotonic time it arrived."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[tuple[float, str]] = []
        for stream in (proc.stdout, proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: object) -> None:
        for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
            self.lines.append((time.monotonic(), line))

    def first(self, pattern: re.Pattern[str], after: float = 0.0) -> tuple[float, re.Match[str]] | None:
        for at, line in list(self.lines):
            match = pattern.search(line)
            if at >= after and match:
                return at, match
        return None


def wait_for_step(sources: list[Lines], step: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(s.proc.poll() is None for s in sources):
        for source in sources:
            if any(int(m.group(1)) >= step for m in (STEP_RE.search(line) for _, line in list(source.lines)) if m):
                return
        time.sleep(0.1)
    tail = "".join(line for s in sources for _, line in s.lines[-15:])
    raise RuntimeError(f"no step {step} within {timeout_s:g} s, or every process ended first:\n{tail}")


def recovered(sources: list[Lines], killed_at: float) -> tuple[float | None, int | None, int | None]:
    """(seconds from the kill to the first step logged by the restarted ranks, the step they
    resumed from, the last step before the kill)."""
    before = [int(m.group(1)) for s in sources for at, line in s.lines
              if at < killed_at and (m := STEP_RE.search(line))]
    resumed = [(at, int(m.group(1))) for s in sources for at, line in s.lines
               if at > killed_at and (m := RESUMED_RE.search(line))]
    if not resumed:
        return None, None, max(before) if before else None
    resumed_at = min(at for at, _ in resumed)
    steps = [at for s in sources for at, line in s.lines if at > resumed_at and STEP_RE.search(line)]
    return (min(steps) - killed_at if steps else None), resumed[0][1], max(before) if before else None


def run_fstrain(state: Path, args: argparse.Namespace, work: Path) -> dict[str, object]:
    run_dir = work / "fstrain-run"
    argv = [sys.executable, "-m", "fstrain", "launch", "--ssh-config", str(state / "ssh_config"),
            "--hosts", f"node[1-{args.hosts}]", "--nproc-per-node", "1", "--python", sys.executable,
            "--model", "tiny", "--steps", str(args.steps), "--checkpoint-interval", str(args.checkpoint_interval),
            "--checkpoint-dir", str(work / "fstrain-checkpoints"), "--on-failure", "exclude", "--max-restarts", "2",
            "--heartbeat-timeout", "4", "--grace", "3", "--run-dir", str(run_dir), "--workdir", str(REPO)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = Lines(proc)
    wait_for_step([lines], args.kill_at_step, 600)
    killed_at = time.monotonic()
    script(state, "stop-sshd", str(args.hosts))
    try:
        code = proc.wait(timeout=600)
    finally:
        script(state, "start-sshd", str(args.hosts))
    time.sleep(0.5)
    seconds, resumed, before = recovered([lines], killed_at)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    last = [int(m.group(1)) for _, line in lines.lines if (m := STEP_RE.search(line))]
    (work / "fstrain-output.txt").write_text("".join(line for _, line in lines.lines))
    return {"tool": "fstrain launch --on-failure exclude", "exit_code": code, "final_step_reached":
            bool(last) and max(last) == args.steps, "recover_s": seconds, "resumed_from": resumed,
            "last_step_before_kill": before, "attempts": manifest.get("attempts")}


def run_torchrun(state: Path, args: argparse.Namespace, work: Path) -> dict[str, object]:
    port = 29411
    master = f"198.18.{CLUSTER_ID}.11"
    checkpoints = work / "torchrun-checkpoints"
    procs = []
    for index in range(1, args.hosts + 1):
        # As a user would start it: one torchrun per host over SSH, in the repository.
        remote = ["env", "PYTHONUNBUFFERED=1", "GLOO_SOCKET_IFNAME=eth0", f"PYTHONPATH={REPO}", sys.executable,
                  "-m", "torch.distributed.run", "--nnodes", str(args.hosts), "--nproc-per-node", "1",
                  "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master}:{port}", "--rdzv-id", "recovery-bench",
                  "--max-restarts", "3", "--rdzv-conf", f"join_timeout={args.join_timeout_s}", "-m",
                  "fstrain.train", "--model", "tiny", "--steps", str(args.steps), "--checkpoint-dir", str(checkpoints),
                  "--checkpoint-interval", str(args.checkpoint_interval), "--resume"]
        argv = ["ssh", "-F", str(state / "ssh_config"), f"node{index}", f"cd {shlex.quote(str(REPO))} && "
                f"exec {shlex.join(remote)}"]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    sources = [Lines(p) for p in procs]
    wait_for_step(sources, args.kill_at_step, 600)
    killed_at = time.monotonic()
    script(state, "stop-sshd", str(args.hosts))  # the same failure as fstrain's: sshd and its sessions gone
    codes = []
    for proc in procs[:-1]:
        try:
            codes.append(proc.wait(timeout=args.join_timeout_s + 300))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            codes.append(proc.wait())
    ended_s = time.monotonic() - killed_at
    procs[-1].wait()
    script(state, "start-sshd", str(args.hosts))
    time.sleep(0.5)
    seconds, resumed, before = recovered(sources, killed_at)
    last = [int(m.group(1)) for s in sources for _, line in s.lines if (m := STEP_RE.search(line))]
    (work / "torchrun-output.txt").write_text("".join(line for s in sources for _, line in s.lines))
    return {"tool": "torchrun --max-restarts 3", "exit_codes": codes, "final_step_reached":
            bool(last) and max(last) == args.steps, "recover_s": seconds, "resumed_from": resumed,
            "last_step_before_kill": before, "ended_s_after_kill": round(ended_s, 1),
            "restarts_seen": sum("Restarting workers" in line or "restarting worker group" in line.lower()
                                 for src in sources[:-1] for _, line in src.lines),
            "why": sorted({line.strip()[:200] for src in sources[:-1] for _, line in src.lines
                           if re.search(r"^[\w.]*(Error|Exception):", line.strip())})[:3]}


def script(state: Path, *argv: str) -> None:
    env = {**os.environ, "FSTRAIN_TESTCLUSTER_ID": CLUSTER_ID, "FSTRAIN_TESTCLUSTER_DIR": str(state)}
    subprocess.run([str(REPO / "scripts" / "testcluster.sh"), *argv], check=True, env=env, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--kill-at-step", type=int, default=8)
    parser.add_argument("--checkpoint-interval", type=int, default=3)
    parser.add_argument("--join-timeout-s", type=int, default=60)
    parser.add_argument("--only", choices=("fstrain", "torchrun"), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fstrain-recovery-bench-") as base, \
            namespace_cluster(args.hosts, Path(base), CLUSTER_ID, []) as state:
        work = Path(base) / "work"
        work.mkdir()
        results = []
        if args.only in (None, "fstrain"):
            results.append(run_fstrain(state, args, work))
            print(json.dumps(results[-1], indent=2), file=sys.stderr, flush=True)
        if args.only in (None, "torchrun"):
            results.append(run_torchrun(state, args, work))
            print(json.dumps(results[-1], indent=2), file=sys.stderr, flush=True)
        print(json.dumps({"machine": machine_line(), "hosts": args.hosts, "steps": args.steps,
                          "kill_at_step": args.kill_at_step, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
