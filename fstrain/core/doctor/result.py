"""Check results: one row per check and group of hosts that share a verdict, message and fix."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Worst last: the verdict of a set of results is the worst one in it.
VERDICTS = ("ok", "skipped", "warn", "fail")
EXIT_CODES = {"ok": 0, "skipped": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict for some hosts (all of them when ``hosts`` lists every host)."""

    id: str
    verdict: str
    hosts: tuple[str, ...]
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "verdict": self.verdict, "hosts": list(self.hosts), "message": self.message,
                "fix": self.fix}


@dataclass(frozen=True)
class Finding:
    """What one check found on one host, before identical hosts are grouped."""

    host: str
    verdict: str
    message: str
    fix: str = ""


def severity(verdict: str) -> int:
    return VERDICTS.index(verdict)


def group(check_id: str, findings: Iterable[Finding]) -> list[CheckResult]:
    """Merge hosts with the same verdict, message and fix; worst verdict first, then first seen."""
    hosts: dict[tuple[str, str, str], list[str]] = {}
    for finding in findings:
        hosts.setdefault((finding.verdict, finding.message, finding.fix), []).append(finding.host)
    keys = sorted(hosts, key=lambda k: -severity(k[0]))  # stable: first seen within a verdict
    return [CheckResult(check_id, v, tuple(dict.fromkeys(hosts[(v, m, f)])), m, f) for v, m, f in keys]


def skipped(check_id: str, reason: str, hosts: Sequence[str] = ()) -> list[CheckResult]:
    return [CheckResult(check_id, "skipped", tuple(hosts), reason)]


def overall(results: Sequence[CheckResult]) -> str:
    """The worst verdict, a skipped check counting as ok (``ok`` for no results)."""
    worst = max((r.verdict for r in results), key=severity, default="ok")
    return "ok" if worst == "skipped" else worst


def exit_code(results: Sequence[CheckResult]) -> int:
    """0: everything ok or skipped; 1: warnings only; 2: any failure."""
    return EXIT_CODES[overall(results)]


def summary(results: Sequence[CheckResult]) -> dict[str, object]:
    """Counts per verdict (of checks: a check counts once, with its worst row), the verdict and exit code."""
    worst: dict[str, str] = {}
    for result in results:
        if result.id not in worst or severity(result.verdict) > severity(worst[result.id]):
            worst[result.id] = result.verdict
    counts = {verdict: sum(1 for v in worst.values() if v == verdict) for verdict in VERDICTS}
    verdict = overall(results)
    return {"checks": len(worst), **counts, "verdict": verdict, "exit_code": EXIT_CODES[verdict]}
