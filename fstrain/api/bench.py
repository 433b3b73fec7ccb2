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

from fstrain.api.driver import Checked, DriveRequest, NodeAccess, NodeJob, RunOutput, drive
from fstrain.api.hosts import quiet
from fstrain.api.requests import HostRequest
from fstrain.core.bench.arithmetic import worker_argv
from fstrain.core.hosts.hostfile import Host
from fstrain.core.job.spec import LaunchJob, plan_launches, resolve_nproc
from fstrain.core.progress import Reporter
from fstrain.core.runs.limits import RunLimits
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
    limits: RunLimits = field(default_factory=lambda: RunLimits(heartbeat_timeout_s=60.0))
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
    model: str | None = None  # the compute suite times this model's GEMMs: a shipped recipe or Hugging Face id
    recipe: str | None = None  # ... or a recipe file's
    seq_len: int | None = None  # default: the recipe's
    micro_batch: int | None = None  # default: the recipe's, else 1
    tp: int = 1
    gemm_dtype: str = "auto"  # auto, bf16, fp16, fp32
    max_gemm_flops: str | None = None  # GEMMs above this many FLOPs are not timed


def gemm_args(options: BenchOptions, suites: Sequence[str]) -> list[str]:
    """The worker's GEMM-sweep flags: the model's shapes (``--model``/``--recipe``), the dtype, the cap."""
    import json

    from fstrain.core.bench.gemm import format_shapes, parse_flops
    from fstrain.core.plan.gemmshapes import model_gemms
    from fstrain.errors import InputError

    if options.gemm_dtype not in ("auto", "bf16", "fp16", "fp32"):
        raise InputError(f"unknown GEMM dtype {options.gemm_dtype!r}", "use auto, bf16, fp16 or fp32", "--gemm-dtype")
    args = ["--gemm-dtype", options.gemm_dtype]
    if options.max_gemm_flops:
        args += ["--max-gemm-flops", repr(parse_flops(options.max_gemm_flops))]
    if not (options.model or options.recipe):
        return args
    flag = "--model" if options.model else "--recipe"
    if options.model and options.recipe:
        raise InputError("give one of --model and --recipe", "drop one of them", "fstrain bench")
    if "compute" not in suites:
        raise InputError(f"the compute suite times a model's GEMMs, and --suite {','.join(suites)} leaves it out",
                         "add compute to --suite", flag)
    from fstrain.io.recipes import load_model, load_recipe_file

    recipe = load_model(options.model) if options.model else load_recipe_file(str(options.recipe))
    seq_len = options.seq_len or recipe.model.seq_len
    micro_batch = options.micro_batch or recipe.training.micro_batch_size or 1
    shapes = model_gemms(recipe.model, seq_len * micro_batch, options.tp)
    described = {"name": recipe.model.name, "seq_len": seq_len, "micro_batch": micro_batch, "tp": options.tp,
                 "tokens": seq_len * micro_batch}
    return [*args, "--gemm-shapes", format_shapes(shapes), "--gemm-model", json.dumps(described, sort_keys=True)]


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
    gemm = gemm_args(options, suites)
    selection = resolve_hosts(hosts.hostfile, hosts.hosts, hosts.include, hosts.exclude, hosts.gpus_per_node)
    run_id = new_run_id()
    extra = ["--pairs-mode", options.pairs_mode, "--seconds", str(options.seconds), *gemm]
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

    nodes = NodeAccess(hosts, request.python, request.workdir, here_by_default=False, packages=("torch",),
                       fanout=fanout)
    drive_request = DriveRequest(nodes, request.run_id, request.run_dir, env=dict(request.env),
                                 master_port=request.master_port, limits=request.limits, record=False,
                                 first_step=False, output=RunOutput(out))
    driven = drive(drive_request, connect, worker, progress)
    document = fetch_document(hosts, driven.checked.run_dirs, connect, request.run_dir) \
        if driven.outcome.exit_code == 0 else None
    return BenchRun(driven.outcome, document, driven.checked.facts, driven.checked.rendezvous)


EXIT_OUTLIERS = 1  # measured, and a link, a host or a rank stands out
EXIT_NOT_MEASURED = 3  # nothing to judge: a host could not run it, the job failed, or its result was lost


@dataclass(frozen=True)
class BenchRunRequest:
    """`fstrain bench`: which hosts, what to measure, and where to keep the result."""

    hosts: HostRequest = field(default_factory=HostRequest)
    options: BenchOptions = field(default_factory=BenchOptions)
    out: str | None = None  # also write the result document (JSON) here


@dataclass(frozen=True)
class Benched:
    """A bench's result: the document with its analysis, or why nothing was measured."""

    run_id: str
    run_dir: Path  # logs, manifest, bench.json
    source: str  # where the hosts came from
    document: dict[str, Any] | None  # None: nothing measured (``failure`` says why)
    exit_code: int  # 0 nothing stands out, 1 outliers, 3 not measured
    failure: str = ""
    outcome: RunOutcome | None = None  # the job's, when it ran


def has_outliers(analysis: Mapping[str, Any]) -> bool:
    """A bench analysis names an outlier link or host, or a straggler rank."""
    return bool(analysis.get("outlier_hosts") or analysis.get("pairs", {}).get("outlier_hosts")
                or analysis.get("compute", {}).get("stragglers"))


def bench(request: BenchRunRequest, *, report: Callable[[str], None] = quiet, out: TextIO = sys.stderr,
          progress: Reporter | None = None) -> Benched:
    """Check every option (before any host is contacted), run the suites on the selected hosts
    through the run driver, and judge the result; ``report`` hears what is said once (where the
    hosts came from, the run's id and logs), ``out`` the ranks' lines, ``progress`` the stages."""
    from fstrain.api.hosts import HostSelection, reach
    from fstrain.api.job import interface_env
    from fstrain.core.bench.report import analysis
    from fstrain.errors import FstrainError
    from fstrain.io.bench import save_document

    job, source = bench_request(request.hosts, request.options)
    if request.out and not Path(request.out).parent.is_dir():
        from fstrain.errors import InputError

        raise InputError("the folder for --out does not exist", "create it first or give another path", request.out)
    if source.startswith("localhost"):
        report(f"hosts: {source}")
    connect = reach(HostSelection(list(job.hosts), source), request.hosts, report).connect
    report(f"bench {job.run_id}: {', '.join(job.suites)} on {len(job.hosts)} hosts; logs in {job.run_dir}/logs")
    try:
        run = run_bench(job, connect, fanout=request.hosts.fanout, out=out, progress=progress,
                        node_env=lambda ifname: interface_env(ifname, dict(job.env)))
    except FstrainError as error:  # a host down or without torch, a lost result: nothing to judge
        return Benched(job.run_id, job.run_dir, source, None, EXIT_NOT_MEASURED, error.one_line())
    if run.document is None:
        return Benched(job.run_id, job.run_dir, source, None, EXIT_NOT_MEASURED,
                       f"the benchmark job exited {run.outcome.exit_code}", run.outcome)
    document = {**run.document, "run_id": job.run_id, "run_dir": str(job.run_dir),
                "analysis": analysis(run.document)}
    save_document(job.run_dir / "bench.json", document)
    if request.out:
        save_document(Path(request.out), document)
    return Benched(job.run_id, job.run_dir, source, document,
                   EXIT_OUTLIERS if has_outliers(document["analysis"]) else 0, outcome=run.outcome)


def read_bench(path: str) -> dict[str, Any]:
    """A saved result (bench.json), checked, with its analysis computed again; no host is contacted."""
    from fstrain.core.bench.report import analysis
    from fstrain.io.bench import read_document

    saved = read_document(path)
    return {**saved, "analysis": analysis(saved)}
