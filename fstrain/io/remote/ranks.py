"""``--backend direct``: one node's ranks, started by fstrain itself instead of torchrun.

Stdlib only (Python >= 3.8): written into the node's run directory by its watchdog (``files`` in
the watchdog's header) and started there as the job, in place of a per-node launcher::

    python3 -u fstrain-ranks.py --nnodes N --node-rank I --nproc P --rank-offset R --world-size W \
        --master-addr A --master-port PORT --run-id ID --log-dir DIR -- PROGRAM ARGS...

It starts ``P`` copies of the program, each with the environment torchrun gives its workers
(torch/distributed/elastic/agent/server/local_elastic_agent.py, ``_start_workers``): ``RANK``
(``R`` + local rank), ``LOCAL_RANK``, ``WORLD_SIZE`` (``W``: every node's ranks, which nodes may
have in different numbers), ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``GROUP_WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_NAME``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` and ``TORCHELASTIC_*`` (no agent store: rank 0 hosts the rendezvous store at the
master address, as ``init_process_group("env://")`` expects), and ``OMP_NUM_THREADS=1`` with more
than one rank where it is unset (torch/distributed/run.py). So a program written for torchrun
runs unchanged, and nothing on the node imports torch but the ranks themselves: no launcher
process of about 150 MB and 1.5 CPU-seconds per node.

Each rank's stdout and stderr go to files of its own in torchrun's layout
(``DIR/<run id>_direct/attempt_0/<local rank>/stdout.log`` and ``stderr.log``), which the
watchdog relays as whole tagged lines. The ranks share this process's process group, so the
watchdog's one SIGTERM reaches all of them; this process then waits for them (a launcher that
died at once would let the watchdog's sweep cut their grace period short), blocked in
``waitpid``: it costs no CPU while the ranks run. When a rank exits
non-zero, the others get SIGTERM, SIGKILL after ``FSTRAIN_GRACE_S``; the first failure is
reported as the watchdog's own ``rank_exit`` event (a line on stdout, relayed to the launcher
whole) and becomes this process's exit code (128 + signal for a signal death).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

EVENT_PREFIX = "fstrain-watchdog-event: "  # watchdog.py's: the launcher reads these lines as reports
POLL_S = 0.05
KILLED = (128 + signal.SIGTERM, 128 + signal.SIGKILL)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fstrain-ranks")
    for name in ("--nnodes", "--node-rank", "--nproc", "--rank-offset", "--world-size", "--master-port"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--master-addr", "--run-id", "--log-dir"):
        parser.add_argument(name, required=True)
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.program[:1] == ["--"]:
        args.program = args.program[1:]
    if not args.program:
        parser.error("no program after --")
    return args


def rank_env(args: argparse.Namespace, local_rank: int, base: dict[str, str]) -> dict[str, str]:
    """The environment of local rank ``local_rank``: ``base`` and torchrun's worker variables."""
    env = dict(base)
    env.update({
        "RANK": str(args.rank_offset + local_rank), "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(args.world_size), "LOCAL_WORLD_SIZE": str(args.nproc),
        "GROUP_RANK": str(args.node_rank), "GROUP_WORLD_SIZE": str(args.nnodes),
        "ROLE_RANK": str(args.rank_offset + local_rank), "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(args.world_size),
        "MASTER_ADDR": args.master_addr, "MASTER_PORT": str(args.master_port),
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": args.run_id, "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    })
    if args.nproc > 1 and "OMP_NUM_THREADS" not in base:
        env["OMP_NUM_THREADS"] = "1"
    return env


def log_folder(log_dir: str, run_id: str, local_rank: int) -> str:
    """Where local rank ``local_rank`` writes: torchrun's ``--redirects 3 --log-dir`` layout."""
    return os.path.join(log_dir, f"{run_id}_direct", "attempt_0", str(local_rank))


def exit_code(status: int) -> int:
    """A Popen return code as a shell reports it: a signal death is 128 + signal."""
    return 128 - status if status < 0 else status


class Ranks:
    """The node's rank processes, from their start to the last one's end."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.terminating = False  # SIGTERM came from the watchdog: every rank has it already
        self.grace_s = float(os.environ.get("FSTRAIN_GRACE_S") or 15)

    def start(self) -> int | None:
        """Every rank; an exit code where one cannot start (those started are ended)."""
        base = dict(os.environ)
        for local in range(self.args.nproc):
            folder = log_folder(self.args.log_dir, self.args.run_id, local)
            os.makedirs(folder, mode=0o700, exist_ok=True)
            try:
                with open(os.path.join(folder, "stdout.log"), "ab") as out, \
                        open(os.path.join(folder, "stderr.log"), "ab") as err:
                    self.procs[local] = subprocess.Popen(self.args.program, env=rank_env(self.args, local, base),
                                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            except OSError as exc:
                sys.stderr.write(f"fstrain-ranks: cannot start {self.args.program[0]!r}: {exc.strerror}\n")
                self.end_all()
                return 127
        return None

    def wait(self) -> int:
        """Until every rank has ended: 0, or the first failure's code (reported as ``rank_exit``).
        Blocks in ``waitpid`` while the ranks run: no CPU at all until one ends."""
        first: dict[str, Any] | None = None
        running = {proc.pid: local for local, proc in self.procs.items()}
        while running:
            failed = self.failures(self.collect(running, block=True))
            if failed and first is None and not self.terminating:
                time.sleep(POLL_S)  # ranks that fail together: the one not killed is the cause
                failed += self.failures(self.collect(running, block=False))
                failed.sort(key=lambda f: (f["exit_code"] in KILLED, f["rank"]))  # not the teardown's victims
                first = failed[0]
                self.report(first)
                if running:
                    self.end_all()
                    running = {}
        if first is not None:
            return int(first["exit_code"])
        return 128 + signal.SIGTERM if self.terminating else 0  # stopped: the ranks' codes are the stop's

    def collect(self, running: dict[int, int], block: bool) -> list[tuple[int, int]]:
        """(local rank, exit code) of the ranks that have ended, taken out of ``running`` (pid ->
        local rank); with ``block``, waits for the first of them."""
        ended = []
        flags = 0 if block else os.WNOHANG
        while running:
            try:
                pid, status = os.waitpid(-1, flags)  # retried after the SIGTERM handler (PEP 475)
            except ChildProcessError:
                running.clear()
                break
            if pid == 0:
                break
            flags = os.WNOHANG  # then whatever else has ended too
            local = running.pop(pid, None)
            if local is None:
                continue
            signalled = os.WIFSIGNALED(status)
            self.procs[local].returncode = -os.WTERMSIG(status) if signalled else os.WEXITSTATUS(status)
            ended.append((local, exit_code(self.procs[local].returncode)))
        return ended

    def failures(self, ended: list[tuple[int, int]]) -> list[dict[str, Any]]:
        return [{"rank": self.args.rank_offset + local, "local_rank": local, "exit_code": code}
                for local, code in ended if code != 0]

    def report(self, failure: dict[str, Any]) -> None:
        sys.stdout.write(EVENT_PREFIX + json.dumps({"rank_exit": failure}) + "\n")
        sys.stdout.flush()

    def end_all(self) -> None:
        """SIGTERM every rank still running, SIGKILL what is left after the grace period."""
        alive = [proc for proc in self.procs.values() if proc.poll() is None]
        for proc in alive:
            signal_quietly(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(proc.poll() is None for proc in alive):
            time.sleep(POLL_S)
        for proc in alive:
            if proc.poll() is None:
                signal_quietly(proc, signal.SIGKILL)
                proc.wait()


def signal_quietly(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def main(argv: list[str]) -> int:
    args = parse(argv)
    ranks = Ranks(args)

    def on_term(signum: int, frame: Any) -> None:
        ranks.terminating = True  # the watchdog signalled the whole process group: the ranks have it

    signal.signal(signal.SIGTERM, on_term)
    code = ranks.start()
    if code is not None:
        return code
    return ranks.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
