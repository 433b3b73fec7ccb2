"""Orphans: processes left by an earlier fstrain run, found through the watchdog's records
(``~/.fstrain/active/<run>.node<N>.json``) and verified by the run id in their environment."""

from __future__ import annotations

from fstrain.core.doctor.facts import DoctorFacts, RunRecord
from fstrain.core.doctor.result import CheckResult, Finding, group, skipped


def describe(run: RunRecord) -> str:
    pids = ",".join(map(str, run.pids)) or str(run.job_pid)
    return f"run {run.run_id} node {run.node_rank} (pids {pids})"


def check_orphans(facts: DoctorFacts) -> list[CheckResult]:
    hosts = [h for h in facts.reached if h.runs is not None]
    if not hosts:
        return skipped("proc.orphans", "the run records were not read")
    findings = []
    for host in hosts:
        runs = host.runs or ()
        orphans = [r for r in runs if r.state == "orphan"]
        killed = [r for r in orphans if r.killed and not r.survivors]
        left = [r for r in orphans if r not in killed]
        running = [r for r in runs if r.state == "running"]
        odd = [r for r in runs if r.state == "unverified"]
        if left:
            findings.append(Finding(host.name, "fail", "left by an earlier run, still alive: "
                                    + "; ".join(describe(r) for r in left),
                                    "end them: `fstrain doctor --kill-orphans` (by the recorded ids only)"))
        if killed:
            findings.append(Finding(host.name, "ok", "ended orphans of " + "; ".join(describe(r) for r in killed)))
        if running:
            findings.append(Finding(host.name, "warn", "a run is in progress: " + "; ".join(describe(r)
                                    for r in running), "let it finish, or stop its launcher (Ctrl-C)"))
        if odd:
            findings.append(Finding(host.name, "warn", "records whose pid now belongs to another process: "
                                    + "; ".join(f"run {r.run_id} ({r.note})" for r in odd),
                                    "nothing is killed for them; delete the records: "
                                    + " ".join(r.record for r in odd)))
        if not (left or killed or running or odd):
            findings.append(Finding(host.name, "ok", "no process left by an earlier fstrain run"))
    return group("proc.orphans", findings)
