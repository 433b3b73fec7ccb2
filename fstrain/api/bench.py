"""``fstrain bench`` on the hosts: the benchmark worker, a job of the run driver.

The stages are every run's (fstrain/api/driver.py): preflight, rendezvous, one torchrun per
node under the watchdog and the supervisor (heartbeats, teardown on failure or Ctrl-C), the
manifest. The job is ``python -m fstrain.bench``; every node's first rank writes the result
document into its run directory, and node 0's is copied into the local run directory (another
node's copy when node 0's cannot be read). The preflight checks that every host's Python imports
torch, so a host without it stops the run before anything starts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fstrain.api.driver import Checked, DriveRequest, NodeJob, drive
from fstrain.api.requests import HostRequest
from fstrain.core.bench.arithmetic import worker_argv
from fstrain.core.hosts.hostfile import Host
from fstrain.core.launch.spec import LaunchJob, plan_launches, resolve_nproc
from fstrain.core.progress import Reporter
from fstrain.io.bench import DOCUMENT, fetch_document
from fstrain.io.launch import HostFacts, Rendezvous, RunOutcome
from fstrain.io.transport.base import Transport


@dataclass(frozen=True)
class BenchRequest:
    """What to measure where; ``extra`` goes to the worker as it is (its own flags)."""

    hosts: Sequence[Host]
    suites: Sequence[str]
    run_id: str
    run_dir: Path
    python: str = "python3"
    sizes: str = ""
    backend: str = ""
    nproc_per_node: int | None = None
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    master_port: int | None = None
    grace_s: float = 15.0
    heartbeat_timeout_s: float = 60.0
    extra: Sequence[str] = ()


@dataclass(frozen=True)
class BenchOptions:
    """`fstrain bench`'s options as given (checked by ``bench_request``)."""

    suite: str = "all"  # collectives, pairs, compute, all, or a comma list
    sizes: str | None = None  # message sizes: 1M-1G (x2 steps), 1M-1G:4, 1M,64M
    backend: str | None = None  # nccl or gloo (default: nccl where there are GPUs)
    python: str = "python3"
    nproc_per_node: int | None = None
    pairs_mode: str = "auto"  # all, ring or auto
    pair_bytes: str | None = None
    seconds: float = 0.5  # time budget per collective and size
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    master_port: int | None = None
    run_dir: str | None = None


def bench_request(hosts: HostRequest, options: BenchOptions) -> tuple[BenchRequest, str]:
    """Every option checked, before any host is contacted; the request and where the hosts came from."""
    from fstrain.api.hosts import resolve_hosts
    from fstrain.api.job import new_run_id
    from fstrain.core.bench.arithmetic import parse_size, parse_sizes, parse_suites
    from fstrain.core.bench.pairs import pair_rounds
    from fstrain.errors import InputError

    suites = parse_suites(options.suite)
    if options.sizes:
        parse_sizes(options.sizes)
    if options.pair_bytes:
        parse_size(options.pair_bytes, where="--pair-bytes")
    if options.backend not in (None, "nccl", "gloo"):
        raise InputError(f"unknown backend {options.backend!r}", "use nccl or gloo", "--backend")
    pair_rounds(2, options.pairs_mode)  # checks the mode's name
    selection = resolve_hosts(hosts.hostfile, hosts.hosts, hosts.include, hosts.exclude, hosts.gpus_per_node)
    run_id = new_run_id()
    extra = ["--pairs-mode", options.pairs_mode, "--seconds", str(options.seconds)]
    if options.pair_bytes:
        extra += ["--pair-bytes", options.pair_bytes]
    request = BenchRequest(hosts=selection.hosts, suites=suites, run_id=run_id,
                           run_dir=Path(options.run_dir) if options.run_dir else Path("runs") / run_id,
                           python=options.python, sizes=options.sizes or "", backend=options.backend or "",
                           nproc_per_node=options.nproc_per_node, workdir=options.workdir, env=dict(options.env),
                           master_port=options.master_port, extra=extra)
    return request, selection.source


@dataclass
class BenchRun:
    outcome: RunOutcome
    document: dict[str, Any] | None
    facts: list[HostFacts]
    rendezvous: Rendezvous


def bench_nprocs(hosts: Sequence[Host], requested: int | None, gpu_counts: Sequence[int]) -> list[int]:
    """Processes per host: --nproc-per-node, else slots, else one per GPU, else one (a CPU host)."""
    return [resolve_nproc(h, requested, n) if requested or h.num_selected_slots or n else 1
            for h, n in zip(hosts, gpu_counts, strict=True)]


def run_bench(request: BenchRequest, connect: Callable[[Host], Transport], *, fanout: int,
              node_env: Callable[[str], Mapping[str, str]], out: TextIO = sys.stderr,
              progress: Reporter | None = None) -> BenchRun:
    """Run the worker on every node through the driver, then fetch node 0's document.
    ``node_env(interface)`` is the environment a node adds for the interface that reaches the
    master (NCCL/GLOO_SOCKET_IFNAME); ``progress`` hears the driver's stages and the worker's
    measurements (its rank 0's progress lines)."""
    hosts = list(request.hosts)

    def worker(checked: Checked) -> NodeJob:
        nprocs = bench_nprocs(hosts, request.nproc_per_node,
                              [int(f.info.get("nvidia_gpus") or 0) for f in checked.facts])
        program = worker_argv(request.python, suites=request.suites, json_out="{run_dir}/" + DOCUMENT,
                              sizes=request.sizes, backend=request.backend, extra=request.extra)
        # The worker names nodes as the inventory does, so the report speaks of the hosts the user listed.
        per_node = [{**node_env(ifname), "FSTRAIN_BENCH_NODE_NAME": host.name}
                    for host, ifname in zip(hosts, checked.rendezvous.interfaces, strict=True)]
        job = LaunchJob("torchrun", program, request.python, checked.rendezvous.master_addr,
                        checked.rendezvous.master_port, request.run_id, env=dict(request.env))
        launches = plan_launches(hosts, nprocs, job, per_node)
        return NodeJob("torchrun", launches)

    drive_request = DriveRequest(hosts=hosts, run_id=request.run_id, run_dir=request.run_dir, python=request.python,
                                 workdir=request.workdir, here_by_default=False, packages=("torch",),
                                 env=dict(request.env),
                                 master_port=request.master_port, fanout=fanout, grace_s=request.grace_s,
                                 heartbeat_timeout_s=request.heartbeat_timeout_s, record=False, out=out,
                                 first_step=False)
    driven = drive(drive_request, connect, worker, progress)
    document = fetch_document(hosts, driven.checked.run_dirs, connect, request.run_dir) \
        if driven.outcome.exit_code == 0 else None
    return BenchRun(driven.outcome, document, driven.checked.facts, driven.checked.rendezvous)
