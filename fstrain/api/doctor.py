"""``doctor``: preflight checks across every selected host, each with a verdict and a fix.

Bad input (an unknown check, a plan file that cannot be read, bad host options) raises before
any host is contacted. Then every host is probed in parallel (fstrain/io/doctor.py), the
catalogue's checks judge the facts (fstrain/core/doctor) and, with ``bench``, a quick bench
adds its verdicts (:func:`quick_bench`, the same one the recovery loop's suspect tests run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fstrain.api.hosts import quiet
from fstrain.api.requests import HostRequest

if TYPE_CHECKING:
    from fstrain.core.doctor import Check, CheckResult, DoctorFacts
    from fstrain.core.hosts.hostfile import Host
    from fstrain.core.progress import Reporter
    from fstrain.io.fanout import Connector

QUICK_BENCH_EXTRA = ("--quick", "--seconds", "0.2")  # the worker's quick settings: seconds, not minutes


@dataclass(frozen=True)
class DoctorRequest:
    """`fstrain doctor`'s options: which hosts, which checks, and what to check them against."""

    hosts: HostRequest = field(default_factory=HostRequest)
    only: str | None = None  # run only these checks or families: 'gpu,net.mtu'
    skip: str | None = None  # leave these out
    plan: str | None = None  # a plan.yaml: GPU memory and disk checked against it
    checkpoint_dir: str | None = None  # space, write speed and sharing
    master_port: int | None = None  # the rendezvous port to test
    python: str = "python3"  # the program's interpreter on the hosts
    workdir: str | None = None  # must exist on every host
    orphans: bool = False  # list the processes earlier fstrain runs left
    kill_orphans: bool = False  # end them (by the runs' recorded ids only)
    write_test_mib: int = 256  # MiB written to time checkpoint_dir
    bench: bool = False  # after the checks, quick collectives and pairs benchmarks as verdicts


@dataclass(frozen=True)
class Diagnosed:
    """What doctor found: every row of every check, and the facts they were judged on."""

    source: str  # where the hosts came from
    facts: DoctorFacts
    results: tuple[CheckResult, ...]
    summary: Mapping[str, Any]  # checks, ok, skipped, warn, fail, verdict, exit_code
    list_orphans: bool  # the run records were asked for (orphans or kill_orphans)

    @property
    def exit_code(self) -> int:
        """0 every check ok (or skipped), 1 warnings only, 2 any failure."""
        return int(self.summary["exit_code"])

    @property
    def hosts(self) -> list[str]:
        return [h.name for h in self.facts.hosts]


def chosen_checks(request: DoctorRequest) -> tuple[Check, ...]:
    """The catalogue's checks the request selects (``orphans`` adds the run-record check)."""
    from fstrain.core.doctor import select

    only = request.only
    if (request.orphans or request.kill_orphans) and not only:
        only = "proc.orphans"  # the orphan listing alone, fast
    elif (request.orphans or request.kill_orphans) and only and "proc" not in only.split(","):
        only = f"{only},proc.orphans"
    return select(only, request.skip)


def doctor(request: DoctorRequest, *, report: Callable[[str], None] = quiet,
           progress: Reporter | None = None) -> Diagnosed:
    """Probe every selected host and run the chosen checks over what was found; ``report`` hears
    what is said once (how the hosts are reached, the bench's run), ``progress`` the hosts answering."""
    from fstrain.api.hosts import reach, select
    from fstrain.core.doctor import run_checks, stages, summary
    from fstrain.io.doctor import DoctorOptions, load_plan

    checks = chosen_checks(request)
    needs = load_plan(request.plan) if request.plan else None  # bad input fails before anything is contacted
    selection = select(request.hosts)
    reached = reach(selection, request.hosts, report)
    options = DoctorOptions(stages=stages(checks), python=request.python, workdir=request.workdir,
                            checkpoint_dir=request.checkpoint_dir, master_port=request.master_port, plan=needs,
                            kill_orphans=request.kill_orphans, write_test_bytes=request.write_test_mib << 20,
                            reached_through=reached.through)
    facts = gather(selection.hosts, reached.connect, options, request.hosts.fanout, progress)
    results = list(run_checks(facts, checks))
    if request.bench:
        results += quick_bench(selection.hosts, ("collectives", "pairs"), reached.connect, python=request.python,
                               workdir=request.workdir, master_port=request.master_port,
                               fanout=request.hosts.fanout, report=report)
    return Diagnosed(selection.source, facts, tuple(results), summary(results),
                     request.orphans or request.kill_orphans)


def gather(hosts: Sequence[Host], connect: Connector, options: Any, fanout: int,
           progress: Reporter | None) -> DoctorFacts:
    """Every host's facts, each host's answer an event of the ``hosts`` stage."""
    from fstrain.core.progress import Event, Silent
    from fstrain.io.doctor import collect

    reporter = progress or Silent()
    total = len(hosts)
    answered: set[str] = set()
    unreachable: set[str] = set()

    def update(host: str, what: str) -> None:  # collect calls it under its lock
        if what in ("done", "unreachable"):
            answered.add(host)
        if what == "unreachable":
            unreachable.add(host)
        reporter.event(Event("hosts", len(answered), total, f"{host}: {what}"))

    reporter.event(Event("hosts", 0, total))
    facts = collect(list(hosts), connect, options, fanout=fanout, progress=update)
    reporter.event(Event("hosts", total - len(unreachable), total, ended=True, failed=bool(unreachable),
                         text=f"{len(unreachable)} cannot be reached" if unreachable else ""))
    return facts


def quick_bench(hosts: Sequence[Host], suites: Sequence[str], connect: Connector, *, python: str = "python3",
                workdir: str | None = None, master_port: int | None = None, run_dir: Path | None = None,
                env: Mapping[str, str] | None = None, fanout: int = 16,
                report: Callable[[str], None] = quiet) -> list[CheckResult]:
    """A short bench of ``suites`` through the launch path, as check rows naming hosts by name.

    One rule for `doctor --bench` and the recovery loop's suspect tests (fstrain/api/diagnose.py):
    a bench that could not start, or that ended without a result, is a ``fail`` row naming every
    host it ran on (what was asked for could not be measured; doctor says so with its exit code),
    and the suspect tests' ``weigh`` reads a failure every tested host shares as no one's fault.
    """
    from fstrain.api.bench import BenchRequest, run_bench
    from fstrain.api.job import interface_env, new_run_id
    from fstrain.core.bench.checks import bench_checks, bench_failed
    from fstrain.core.doctor.result import CheckResult
    from fstrain.errors import FstrainError

    run_id = new_run_id()
    node_env = dict(env or {})
    request = BenchRequest(hosts=list(hosts), suites=list(suites), run_id=run_id,
                           run_dir=run_dir or Path("runs") / run_id, python=python, workdir=workdir, env=node_env,
                           master_port=master_port, extra=list(QUICK_BENCH_EXTRA))
    report(f"bench {run_id}: quick {' and '.join(suites)}; logs in {request.run_dir}/logs")
    names = [h.name for h in hosts]
    try:
        run = run_bench(request, connect, fanout=fanout, node_env=lambda ifname: interface_env(ifname, node_env))
    except FstrainError as error:  # preflight or rendezvous: a verdict, beside the other checks
        return [CheckResult("bench.run", "fail", tuple(names), f"the benchmark could not start: {error.message}",
                            error.hint or "fix the hosts above and rerun")]
    if run.document is None:
        return bench_failed(run.outcome.exit_code, f"{request.run_dir}/logs", names)
    return bench_checks(run.document, names)
