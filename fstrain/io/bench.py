"""``fstrain bench`` on the hosts: the benchmark worker started through the launch path.

The stages are ``fstrain launch``'s own (fstrain/io/launch.py): preflight, rendezvous, one
torchrun per node under the watchdog (heartbeats, teardown on failure or Ctrl-C), the manifest.
The job is ``python -m fstrain.bench``; every node's first rank writes the result document into
its run directory, and this module copies node 0's into the local run directory.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fstrain.core.bench.arithmetic import worker_argv
from fstrain.core.bench.report import check_document
from fstrain.core.hosts.hostfile import Host
from fstrain.core.launch.spec import plan_launches, resolve_nproc
from fstrain.errors import FstrainError, InputError
from fstrain.io.fanout import HostPool
from fstrain.io.launch import (
    HostFacts,
    Rendezvous,
    RunOptions,
    RunOutcome,
    choose_rendezvous,
    preflight,
    remote_run_dir,
    run_nodes,
    write_manifest,
)
from fstrain.io.transport.base import Transport

DOCUMENT = "bench.json"


class BenchError(FstrainError):
    """The benchmark ran but left no result to read."""


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
              node_env: Callable[[str], Mapping[str, str]], out: Any = sys.stderr) -> BenchRun:
    """Preflight, rendezvous, run the worker on every node, fetch the document.
    ``node_env(interface)`` is the environment a node adds for the interface that reaches the
    master (NCCL/GLOO_SOCKET_IFNAME)."""
    hosts = list(request.hosts)
    with HostPool(hosts, connect, fanout=fanout) as pool:
        facts = preflight(pool, request.python, request.workdir)
        rendezvous = choose_rendezvous(pool, connect, facts, request.python, request.run_id, request.master_port)
    nprocs = bench_nprocs(hosts, request.nproc_per_node, [int(f.info.get("nvidia_gpus") or 0) for f in facts])
    program = worker_argv(request.python, suites=request.suites, json_out="{run_dir}/" + DOCUMENT,
                          sizes=request.sizes, backend=request.backend, extra=request.extra)
    # The worker names nodes as the inventory does, so the report speaks of the hosts the user listed.
    per_node = [{**node_env(ifname), "FSTRAIN_BENCH_NODE_NAME": host.name}
                for host, ifname in zip(hosts, rendezvous.interfaces, strict=True)]
    launches = plan_launches(hosts, backend="torchrun", nprocs=nprocs, program=program, python=request.python,
                             master_addr=rendezvous.master_addr, master_port=rendezvous.master_port,
                             run_id=request.run_id, max_restarts=0, env=dict(request.env), per_node_env=per_node)
    run_dirs = [remote_run_dir(h, f.info.get("home"), request.run_id, request.run_dir)
                for h, f in zip(hosts, facts, strict=True)]
    options = RunOptions(run_id=request.run_id, run_dir=request.run_dir, grace_s=request.grace_s,
                         heartbeat_timeout_s=request.heartbeat_timeout_s, workdir=request.workdir,
                         node_run_dirs=run_dirs, out=out)
    outcome = run_nodes(launches, connect, request.python, options)
    write_manifest(request.run_dir / "manifest.json", run_id=request.run_id, backend="torchrun",
                   rendezvous=rendezvous, launches=launches, outcome=outcome, facts=facts, env=dict(request.env),
                   plan=None)
    document = fetch_document(hosts[0], run_dirs[0], connect, request.run_dir) if outcome.exit_code == 0 else None
    return BenchRun(outcome, document, facts, rendezvous)


def fetch_document(host: Host, node_run_dir: str, connect: Callable[[Host], Transport],
                   local_run_dir: Path) -> dict[str, Any]:
    """Node 0's bench.json, checked, and kept in the local run directory."""
    transport = connect(host)
    try:
        result = transport.run(["cat", f"{node_run_dir}/{DOCUMENT}"], timeout_s=60)
    finally:
        transport.close()
    where = f"{host.label()}:{node_run_dir}/{DOCUMENT}"
    if not result.ok:
        raise BenchError(f"the benchmark finished but left no result: {result.error or result.stderr.strip()}",
                         "see the logs in the run directory", where)
    try:
        document = check_document(json.loads(result.stdout), where)
    except json.JSONDecodeError as exc:
        raise BenchError(f"unreadable result: {exc}", "see the logs in the run directory", where) from None
    save_document(local_run_dir / DOCUMENT, document)
    return document


def save_document(path: Path, document: Mapping[str, Any]) -> None:
    """Write a document whole, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n")
    tmp.replace(path)


def read_json(path: str) -> Any:
    """A JSON file, or one InputError naming it."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError("file not found", "check the path", path) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read JSON: {exc}", "give a file fstrain wrote", path) from None


def read_document(path: str) -> dict[str, Any]:
    """A bench document from a file (for ``doctor --bench-file`` and tests)."""
    return check_document(read_json(path), path)
