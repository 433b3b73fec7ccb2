"""``fstrain bench`` on the hosts: the benchmark worker, a job of the run driver.

The stages are every run's (fstrain/api/driver.py): preflight, rendezvous, one torchrun per
node under the watchdog and the supervisor (heartbeats, teardown on failure or Ctrl-C), the
manifest. The job is ``python -m fstrain.bench``; every node's first rank writes the result
document into its run directory, and node 0's is copied into the local run directory.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fstrain.api.driver import Checked, DriveRequest, NodeJob, drive
from fstrain.core.bench.arithmetic import worker_argv
from fstrain.core.hosts.hostfile import Host
from fstrain.core.launch.spec import plan_launches, resolve_nproc
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
              node_env: Callable[[str], Mapping[str, str]], out: TextIO = sys.stderr) -> BenchRun:
    """Run the worker on every node through the driver, then fetch node 0's document.
    ``node_env(interface)`` is the environment a node adds for the interface that reaches the
    master (NCCL/GLOO_SOCKET_IFNAME)."""
    hosts = list(request.hosts)

    def worker(checked: Checked) -> NodeJob:
        nprocs = bench_nprocs(hosts, request.nproc_per_node,
                              [int(f.info.get("nvidia_gpus") or 0) for f in checked.facts])
        program = worker_argv(request.python, suites=request.suites, json_out="{run_dir}/" + DOCUMENT,
                              sizes=request.sizes, backend=request.backend, extra=request.extra)
        # The worker names nodes as the inventory does, so the report speaks of the hosts the user listed.
        per_node = [{**node_env(ifname), "FSTRAIN_BENCH_NODE_NAME": host.name}
                    for host, ifname in zip(hosts, checked.rendezvous.interfaces, strict=True)]
        launches = plan_launches(hosts, backend="torchrun", nprocs=nprocs, program=program, python=request.python,
                                 master_addr=checked.rendezvous.master_addr,
                                 master_port=checked.rendezvous.master_port, run_id=request.run_id,
                                 max_restarts=0, env=dict(request.env), per_node_env=per_node)
        return NodeJob("torchrun", launches)

    drive_request = DriveRequest(hosts=hosts, run_id=request.run_id, run_dir=request.run_dir, python=request.python,
                                 workdir=request.workdir, here_by_default=False, packages=(), env=dict(request.env),
                                 master_port=request.master_port, fanout=fanout, grace_s=request.grace_s,
                                 heartbeat_timeout_s=request.heartbeat_timeout_s, record=False, out=out)
    driven = drive(drive_request, connect, worker)
    document = fetch_document(hosts[0], driven.checked.run_dirs[0], connect, request.run_dir) \
        if driven.outcome.exit_code == 0 else None
    return BenchRun(driven.outcome, document, driven.checked.facts, driven.checked.rendezvous)
