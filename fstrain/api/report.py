"""`fstrain report RUN`: gather a run's output, records and summary, and make its report.

The output is read as `fstrain logs` reads it (every rank's lines, from the nodes for a
detached run, from the run directory for an attached or Slurm run); the plan and the events
from the run's manifest (a detached run: its nodes' records), and so the failing rank's last
lines; the measured numbers from the bundled trainer's summary.json (a detached run's is
fetched from node 0 into the run directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fstrain.core.monitor.metricline import PREFIX as METRIC_MARK
from fstrain.core.monitor.metricline import PROGRESS_MARK
from fstrain.core.report.series import RESUMED_MARK
from fstrain.errors import FstrainError, InputError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fstrain.api.runs import Access, Outputs, Run
    from fstrain.core.report.numbers import Report


def report(reference: str, access: Access | None = None) -> Report:
    """The report of run ``reference`` (an id, a unique prefix or its run directory)."""
    from fstrain.api.runs import open_run

    return report_of(open_run(reference, access))


def report_of(run: Run) -> Report:
    from fstrain.api.runs import SlurmRun, SshRun
    from fstrain.core.report import events as timeline
    from fstrain.core.report import excerpt
    from fstrain.core.report.numbers import build
    from fstrain.core.report.series import rank_series, resumed_steps
    from fstrain.io.runs import read_summary

    state = run.state()
    unread: dict[str, str] = {}  # host -> why it could not be read
    summary: dict[str, Any] | None
    backend = run.backend
    if isinstance(backend, SshRun):
        node0 = run.record.hosts[0].label()
        try:
            summary = backend.training_summary()
        except FstrainError as exc:  # node 0 does not answer: the copy fetched before, if any
            unread[node0] = exc.one_line()
            summary = read_summary(run.run_dir / "summary.json")
        views = backend.views()
        names = [h.label() for h in run.record.hosts]
        events = timeline.from_views(run.record.started, names, views, state)
        # A recovering run's keeper writes each attempt's end into the manifest: the nodes' records
        # first (the current attempt), the manifest where they name no failure.
        failure = excerpt.from_views(names, views) or excerpt.from_manifest(run.record.manifest)
    else:
        folder = run.record.job_dir if isinstance(backend, SlurmRun) else run.run_dir
        summary = read_summary(folder / "summary.json")
        events = timeline.from_manifest(run.record.manifest, state, run.record.started)
        failure = excerpt.from_manifest(run.record.manifest)
    tokens_per_step = (summary or {}).get("tokens_per_step")
    resumes: list[str] = []
    outputs = run.outputs()
    try:
        series = rank_series(numbered_lines(outputs, resumes),
                             tokens_per_step if isinstance(tokens_per_step, int) else None)
    finally:
        outputs.close()
    unread.update(outputs.failed)
    recorded = run.events()
    if recorded is not None:  # the run's own record of its events: the one source where it exists
        events = timeline.from_run_events(recorded.events, nodes=events)
    else:
        events = [*events, *timeline.restarts(resumed_steps(resumes))]
    manifest = run.record.manifest
    plan = manifest.plan if manifest is not None else None
    world_size = sum(node.nproc for node in manifest.nodes) if manifest is not None and manifest.nodes else None
    result = build(run.run_id, run.kind, state, series=series, events=events,
                   plan=dict(plan) if plan is not None else None, summary=summary, failure=failure,
                   world_size=world_size)
    if unread:
        from dataclasses import replace

        said = ", ".join(f"{host} ({why})" for host, why in sorted(unread.items()))
        result = replace(result, notes=(*result.notes, f"the output of {said} could not be read"))
    return result


def numbered_lines(outputs: Outputs, resumes: list[str]) -> Iterator[str]:
    """The run's lines that carry a step's numbers (metricline.read_step: the metric line, the
    bundled trainer's progress line, a trainer's own), as they are read (every other line is
    dropped at once: a long run's output is never held whole); a resume's lines go to
    ``resumes``. Lines end at "\\n" only: a tqdm bar's "\\r" redraws stay in their line."""
    from fstrain.core.monitor.metricline import read_step, transformers_bar_written

    for chunk in outputs.read():
        for line in chunk.rstrip("\n").split("\n"):
            if RESUMED_MARK in line:
                resumes.append(line)
            elif (METRIC_MARK in line or PROGRESS_MARK in line or read_step(line) is not None
                  or transformers_bar_written(line)):  # a Trainer's log dict on its own line
                yield line


def write_html(result: Report, out: Path) -> Path:
    """The page, written whole or not at all."""
    from fstrain import __version__
    from fstrain.core.report.page import render
    from fstrain.io.documents import write_text_atomic

    try:
        write_text_atomic(out, render(result, __version__))
    except OSError as exc:
        raise InputError(f"cannot write the report: {exc.strerror or exc}", "give another --out FILE",
                         str(out)) from None
    return out
