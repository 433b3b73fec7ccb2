"""Testing the hosts a failure points at, before any is excluded.

After an attempt fails, :func:`fstrain.core.launch.blame.blame` names suspects from the
evidence. :func:`test_suspects` puts them to the test beside the survivors:

1. a quick ``doctor`` of the suspects and of up to :data:`COMPARED_HOSTS` other hosts of the
   attempt (:func:`tested_hosts`; :data:`QUICK_CHECKS`: can it be reached and logged into, does
   its Python run, are its GPUs, ECC, PCIe, NVLinks, RDMA ports and ``/dev/shm`` sound, do the
   others reach it over TCP): at 200 nodes a doctor of every node made a recovery take minutes,
   and at 1,000 it grows with the cluster where the evidence does not;
2. where the evidence points at a link or a GPU (``bench_suites``: ``pairs`` for a connection
   error, ``compute`` for a GPU fault), a short ``bench`` of the hosts that answered, whose
   verdicts name a slow link or a straggler only once a re-time confirms it (the quick bench of
   ``doctor --bench``: :func:`fstrain.api.doctor.quick_bench`).

A suspect is guilty only on evidence: it cannot be reached, a check fails on it, or the bench
names it. A failure every tested host shares (a setting of the job, not of one machine) is no
evidence against any of them. :func:`weigh` is that rule, on values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fstrain.core.doctor.result import CheckResult
from fstrain.core.hosts.hostfile import Host
from fstrain.io.transport.base import Transport

# One host's health, quickly: no checkpoint writes, no cross-host consistency (a run that
# started had the same software everywhere).
QUICK_CHECKS = ("ssh.connect", "sw.interpreter", "gpu.count", "gpu.ecc", "gpu.pcie", "topo.nvlink", "rdma.ports",
                "sys.shm", "net.reachability")
# Hosts not suspected, tested beside the suspects: what every tested host fails is no one host's
# fault, and the pairs bench needs partners; more adds time, not evidence against a suspect.
COMPARED_HOSTS = 3


@dataclass(frozen=True)
class SuspectReport:
    guilty: tuple[str, ...]  # suspects the tests found at fault, in the order given
    why: Mapping[str, str]  # per tested host: the evidence against it, or that nothing was found
    also_failing: tuple[str, ...] = ()  # hosts not suspected that failed a test too (said, not excluded)
    checks: tuple[CheckResult, ...] = field(default_factory=tuple)  # every row, for the run's record


def weigh(results: Sequence[CheckResult], tested: Sequence[str], suspects: Sequence[str]) -> SuspectReport:
    """Guilty suspects from the rows of the tests: a ``fail`` naming a host is evidence against
    it unless every tested host (two or more) shares it."""
    evidence: dict[str, list[str]] = {}
    shared: list[str] = []
    for row in results:
        if row.verdict != "fail":
            continue
        named = [h for h in row.hosts if h in tested] or list(row.hosts)
        if len(tested) > 1 and set(tested) <= set(named):
            shared.append(f"{row.id} fails on every host ({row.message}): not one host's fault")
            continue
        for host in named:
            evidence.setdefault(host, []).append(f"{row.id}: {row.message}")
    guilty = tuple(h for h in suspects if h in evidence)
    why = {host: "; ".join(evidence[host]) if host in evidence else
           ("nothing found" + (f" ({shared[0]})" if shared else "")) for host in tested}
    also = tuple(h for h in tested if h in evidence and h not in suspects)
    return SuspectReport(guilty, why, also, tuple(results))


def test_suspects(hosts: Sequence[Host], suspects: Sequence[str], connect: Callable[[Host], Transport],
                  python: str = "python3", *, bench_suites: Sequence[str] = (), workdir: str | None = None,
                  run_dir: Path | None = None, fanout: int = 16, checks: Sequence[str] = QUICK_CHECKS,
                  env: Mapping[str, str] | None = None) -> SuspectReport:
    """Test ``suspects`` (names of ``hosts``) beside a few other ``hosts`` of the attempt; see
    the module's docstring. ``run_dir``: where the bench keeps its logs (default runs/<id>)."""
    from fstrain.api.doctor import gather, quick_bench
    from fstrain.core.doctor import run_checks, select, stages
    from fstrain.io.doctor import DoctorOptions

    chosen = select(",".join(checks))
    options = DoctorOptions(stages=stages(chosen), python=python, workdir=workdir)
    hosts = tested_hosts(hosts, suspects)
    facts = gather(hosts, connect, options, fanout, None)
    rows = run_checks(facts, chosen)
    names = [h.name for h in hosts]
    rows = [_by_name(row, hosts) for row in rows]
    if bench_suites:
        unreachable = {h for row in rows if row.id == "ssh.connect" and row.verdict == "fail" for h in row.hosts}
        reached = [h for h in hosts if h.name not in unreachable]
        if len(reached) >= (2 if "pairs" in bench_suites else 1):
            rows += quick_bench(reached, bench_suites, connect, python=python, workdir=workdir, run_dir=run_dir,
                                env=env, fanout=fanout)
    return weigh(rows, names, suspects)


def tested_hosts(hosts: Sequence[Host], suspects: Sequence[str], compared: int = COMPARED_HOSTS) -> list[Host]:
    """The suspects and the first ``compared`` other hosts, in the order of ``hosts``."""
    others = [h.name for h in hosts if h.name not in suspects][:compared]
    return [h for h in hosts if h.name in suspects or h.name in others]


test_suspects.__test__ = False  # type: ignore[attr-defined]  # a function of the API, not a pytest test


def _by_name(row: CheckResult, hosts: Sequence[Host]) -> CheckResult:
    """Doctor names hosts by their label (``user@host:port``); the verdicts speak of names."""
    names = {h.label(): h.name for h in hosts}
    return CheckResult(row.id, row.verdict, tuple(names.get(h, h) for h in row.hosts), row.message, row.fix)


def describe(report: SuspectReport) -> list[str]:
    """One line per tested host, for the run's record and the user."""
    return [f"{host}: {'guilty: ' if host in report.guilty else ''}{why}" for host, why in report.why.items()]


def as_dict(report: SuspectReport) -> dict[str, Any]:
    return {"guilty": list(report.guilty), "why": dict(report.why), "also_failing": list(report.also_failing),
            "checks": [row.to_dict() for row in report.checks]}
