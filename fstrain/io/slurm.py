"""Slurm at the edge: commands on allocated nodes through ``srun`` steps, and sbatch jobs.

Inside an allocation every per-node command fstrain would run over SSH (preflight, the
rendezvous check, the watchdog and its job, the doctor's probes) runs as a one-task job step
on that node instead (:class:`SrunTransport`): same argv, same stdin, same output lines, so the
launcher and the doctor need no Slurm-specific code, and no SSH server is needed on the nodes.
The step's stdin carries the watchdog's header and heartbeats; its exit code is the watchdog's.

From a login node, :func:`submit` hands a rendered batch script to ``sbatch`` and
:func:`follow` prints the job's output file as it grows until the job ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from fstrain.core.hosts.hostfile import Host
from fstrain.core.slurm.job import (
    NEVER_STARTS_AFTER_S,
    Allocation,
    JobStatus,
    cannot_start,
    check_hostnames,
    cpus_per_task_from_env,
    ended_by_slurm,
    job_nodes_note,
    parse_hostnames,
    parse_partition_nodes,
    parse_sbatch_job_id,
    parse_scontrol_job,
    parse_step_ids,
    rejected_nodelist,
    srun_step_argv,
)
from fstrain.errors import FstrainError, ParseError, TransportError
from fstrain.io.transport.base import CommandResult, Transport
from fstrain.io.transport.local import LocalRunning, LocalTransport

POLL_S = 1.0
ABANDON_AFTER_S = 2.0  # a step's srun still running this long after its input ended


class SlurmError(FstrainError):
    """Slurm refused or failed a request (sbatch, scontrol, srun missing)."""


class SbatchRefused(SlurmError):
    """sbatch ran and refused the job (a partition that does not exist, a limit...)."""


def require_tool(name: str, where: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SlurmError(f"{name} not found on PATH", "run this on a Slurm login or compute node, "
                         "or load the Slurm module", where)
    return path


class SrunTransport:
    """Runs argv on one allocated node as a job step (``srun --nodelist=NODE ...``).

    A step's ``srun`` has no link check to offer: when its node dies it waits, silent and deaf
    to SIGINT and SIGTERM, until Slurm declares the node down (``SlurmdTimeout``, 300 s by
    default). So the node's watchdog answers every heartbeat (``answers_heartbeats``), the
    launcher takes a node whose answers stop as lost, and the step's ``srun`` is then ended here
    with SIGKILL (:meth:`SrunRunning.abandon`)."""

    answers_heartbeats = True

    def __init__(self, node: str, prefix: Sequence[str]) -> None:
        self.host = node
        self.prefix = list(prefix)
        self._local = LocalTransport(node)
        self._reached = False

    def connect(self) -> None:
        """A first step (``true``) on the node: it fails here, with Slurm's reason, when the node
        cannot run steps; later calls do nothing (as on an open SSH connection)."""
        if self._reached:
            return
        result = self.run(["true"], timeout_s=120)
        if not result.ok:
            raise TransportError(f"srun on {self.host} failed: {result.error or result.stderr.strip()[-300:]}",
                                 "check the node with `scontrol show node` and the job with `squeue`", self.host)
        self._reached = True

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout_s: float | None = None) -> CommandResult:
        return self._local.run([*self.prefix, *argv], stdin=stdin, timeout_s=timeout_s)

    def start(self, argv: Sequence[str]) -> SrunRunning:
        """srun in a session of its own: a Ctrl-C at the terminal reaches fstrain only, which
        stops every node through its watchdog (srun would otherwise kill its step at once)."""
        proc = subprocess.Popen([*self.prefix, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        return SrunRunning(self.host, proc)

    def close(self) -> None:
        """Nothing to close: every command is its own step."""


class SrunRunning(LocalRunning):
    """A step's ``srun`` client, started by :meth:`SrunTransport.start`."""

    def abandon(self) -> None:
        """The node is lost: SIGKILL this ``srun`` (the only signal it heeds while its node does
        not answer; on the test Slurm one SIGINT, two within a second, and SIGTERM each left it
        waiting). Slurm keeps the step until it declares the node down; the job's other nodes
        take new steps meanwhile."""
        with contextlib.suppress(OSError):
            self._proc.kill()

    def close(self) -> None:
        """End of input; an ``srun`` still waiting ABANDON_AFTER_S later (its node lost, or its
        watchdog given up on) is abandoned, so that nothing of this run is left waiting here."""
        self.close_stdin()
        try:
            self._proc.wait(timeout=ABANDON_AFTER_S)
        except subprocess.TimeoutExpired:
            self.abandon()
        super().close()


def srun_connector(extra: Sequence[str] = ()) -> Callable[[Host], Transport]:
    """A connector for HostPool and the launcher: every host is a node of this allocation (its
    steps get the CPUs the job holds per task, ``SLURM_CPUS_PER_TASK``, where it says)."""
    srun = require_tool("srun", "--launcher srun")
    cpus = cpus_per_task_from_env(os.environ)

    def connect(host: Host) -> Transport:
        return SrunTransport(host.name, srun_step_argv(host.name, srun=srun, extra=extra, cpus_per_task=cpus))

    return connect


def allocation_nodes(allocation: Allocation, warn: Callable[[str], None],
                     environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The job's nodes in order, as Slurm has them, where ``scontrol`` exists:

    - ``SLURM_JOB_NODELIST`` cross-checked with ``scontrol show hostnames``; on a disagreement
      scontrol wins (it is Slurm's own expansion) and ``warn`` says so; a list it cannot read
      is one InventoryError naming the variable;
    - then the job's own node list (``scontrol show job``): inside an srun step the variable
      names the step's nodes only (``srun --jobid=J -N1``), and the launch runs on the job's,
      said in one line."""
    env = os.environ if environ is None else environ
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return allocation.nodes
    name = "SLURM_JOB_NODELIST" if env.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    nodelist = env.get(name) or ",".join(allocation.nodes)
    result = LocalTransport().run([scontrol, "show", "hostnames", nodelist], timeout_s=30)
    if not result.ok:
        warn(f"`scontrol show hostnames` failed ({result.error or result.stderr.strip()[-200:]}); "
             "using fstrain's expansion of SLURM_JOB_NODELIST")
        return allocation.nodes
    theirs = parse_hostnames(result.stdout)
    if not theirs:
        raise rejected_nodelist(name, nodelist, result.stderr)
    problem = check_hostnames(allocation.nodes, theirs)
    if problem is not None:
        warn(problem + "; using scontrol's")
    job = LocalTransport().run([scontrol, "show", "job", "-o", allocation.job_id], timeout_s=30)
    try:
        job_nodelist = parse_scontrol_job(job.stdout).nodes if job.ok else ""
    except ParseError:
        job_nodelist = ""
    if not job_nodelist or job_nodelist == nodelist:
        return tuple(theirs)
    expanded = LocalTransport().run([scontrol, "show", "hostnames", job_nodelist], timeout_s=30)
    job_nodes = parse_hostnames(expanded.stdout) if expanded.ok else []
    if not job_nodes:
        return tuple(theirs)
    note = job_nodes_note(allocation.job_id, theirs, job_nodes)
    if note is not None:
        warn(note)
    return tuple(job_nodes)


def slurm_ended_run(job_id: str) -> str | None:
    """Why Slurm ended job ``job_id`` (``scancel``), or ``None`` while it runs, or when
    scontrol cannot say: asked when a run inside the job ends or fstrain gets SIGTERM."""
    if shutil.which("scontrol") is None:
        return None
    try:
        job = job_status(job_id, "launch", timeout_s=15)
    except (FstrainError, subprocess.TimeoutExpired):
        return None
    return ended_by_slurm(job) if job is not None else None


def submit(script: Path, environ: Mapping[str, str] | None = None) -> str:
    """``sbatch --parsable SCRIPT`` -> the job id."""
    sbatch = require_tool("sbatch", "--slurm")
    result = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True, text=True, timeout=120,
                            env=dict(environ) if environ is not None else None, check=False)
    if result.returncode != 0:
        reason = last_error_line(result.stderr or result.stdout, f"sbatch exited {result.returncode}", "sbatch: error:")
        raise SbatchRefused(f"sbatch refused the job: {reason}",
                            f"check the options in {script} (they are sbatch's), then submit it by hand "
                            f"with `sbatch {script}`", "sbatch")
    return parse_sbatch_job_id(result.stdout)


def last_error_line(text: str, fallback: str, prefix: str = "") -> str:
    """A Slurm tool's reason on one line: the last line it printed (the lines before it say where),
    without ``prefix`` (``sbatch: error:``), at most 300 characters; ``fallback`` if it printed none."""
    lines = [line.strip().removeprefix(prefix).strip() for line in text.splitlines() if line.strip()]
    return lines[-1][-300:] if lines else fallback


def job_status(job_id: str, where: str = "--slurm", timeout_s: float = 60) -> JobStatus | None:
    """The job as ``scontrol show job`` sees it; ``None`` once Slurm has forgotten it."""
    scontrol = require_tool("scontrol", where)
    result = subprocess.run([scontrol, "show", "job", "-o", job_id], capture_output=True, text=True,
                            timeout=timeout_s, check=False)
    if result.returncode != 0:
        if "Invalid job id" in result.stderr:
            return None
        raise TransportError(f"scontrol show job {job_id} failed: {result.stderr.strip()[-300:]}", "", "scontrol")
    return parse_scontrol_job(result.stdout)


def partition_size(partition: str) -> int | None:
    """How many nodes ``partition`` has (``scontrol show partition``); None where it cannot say."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    result = LocalTransport().run([scontrol, "show", "partition", "-o", partition], timeout_s=30)
    return parse_partition_nodes(result.stdout) if result.ok else None


def cancel(job_id: str) -> None:
    scancel = require_tool("scancel", "--slurm")
    subprocess.run([scancel, job_id], capture_output=True, text=True, timeout=60, check=False)


def kill_steps(job_id: str, where: str = "stop") -> list[str]:
    """SIGKILL to each srun step of the job (``scancel --signal=KILL JOB.N``): every process of
    the step (a node's watchdog, launcher and ranks) at once. A SIGKILL to the whole job is no
    such thing: Slurm takes it as a cancellation (SIGTERM, SIGKILL after KillWait). The steps
    signalled."""
    squeue = require_tool("squeue", where)
    scancel = require_tool("scancel", where)
    listed = subprocess.run([squeue, "-s", "-j", job_id, "-h", "-o", "%i"], capture_output=True, text=True,
                            timeout=60, check=False)
    steps = parse_step_ids(listed.stdout, job_id) if listed.returncode == 0 else []
    for step in steps:
        subprocess.run([scancel, "--signal=KILL", step], capture_output=True, text=True, timeout=60, check=False)
    return steps


def signal_job(job_id: str, signal: str | None, where: str = "stop") -> str | None:
    """``scancel --signal=SIG --full JOB`` (every step and the batch script; the job ends when
    they exit), or a plain ``scancel JOB`` when ``signal`` is None. Slurm's complaint, or None."""
    scancel = require_tool("scancel", where)
    argv = [scancel, *([f"--signal={signal}", "--full"] if signal else []), job_id]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        return last_error_line(result.stderr, f"scancel exited {result.returncode}")
    return None


class OutputFollower:
    """Prints a file's new whole lines as it grows (the job's output on a shared file system)."""

    def __init__(self, path: Path, out: TextIO) -> None:
        self.path = path
        self.out = out
        self.offset = 0
        self.partial = b""

    def poll(self, final: bool = False) -> None:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        for line in lines:
            self.out.write(line.decode("utf-8", "replace") + "\n")
        if lines:
            self.out.flush()


def follow(job_id: str, output: Path, out: TextIO = sys.stdout, poll_s: float = POLL_S,
           status: Callable[[str], JobStatus | None] = job_status,
           on_state: Callable[[JobStatus], None] | None = None,
           never_starts_after_s: float = NEVER_STARTS_AFTER_S,
           partition_nodes: Callable[[str], int | None] | None = None) -> JobStatus | None:
    """Print the job's output until the job has ended; its final status (``None``: Slurm no
    longer knows the job). ``on_state`` hears of every change of state (PENDING, RUNNING...).
    A job pending for ``never_starts_after_s`` with a reason under which it never starts
    (``cannot_start``; ``partition_nodes(partition)``: its size, by default from scontrol) is
    returned as it is, still pending: the caller decides about it.
    KeyboardInterrupt propagates: the caller decides about cancelling."""
    ask_size = partition_nodes or partition_size
    sizes: dict[str, int | None] = {}  # asked once per partition, not at every look

    def size_of(partition: str) -> int | None:
        if partition not in sizes:
            sizes[partition] = ask_size(partition)
        return sizes[partition]

    follower = OutputFollower(output, out)
    current = status(job_id)
    seen = None
    stuck_since: float | None = None
    while current is not None and not current.final:
        if on_state is not None and (current.state, current.reason) != seen:
            seen = (current.state, current.reason)
            on_state(current)
        size = size_of(current.partition) if current.reason == "PartitionNodeLimit" and current.partition else None
        if cannot_start(current, size) is None:
            stuck_since = None
        elif stuck_since is None:
            stuck_since = time.monotonic()
        elif time.monotonic() - stuck_since >= never_starts_after_s:
            return current
        follower.poll()
        time.sleep(poll_s)
        current = status(job_id)
    # The output file is written by the node: give its last lines a moment on a shared file system.
    for _ in range(3):
        follower.poll()
        time.sleep(0.2)
    follower.poll(final=True)
    return current
