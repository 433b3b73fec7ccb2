"""What a run's deciding process writes to RUN_DIR/events.jsonl, stage by stage
(docs/observability.md#events): each function turns the driver's values (an attempt's hosts,
its outcome, the verdict, what follows) into the event of its kind and hands it to the writer
(fstrain/io/runevents.py ``EventLog``). None for the writer: this process writes no events.

Who calls them: the run driver (fstrain/api/driver.py) for an attached launch, a Slurm job's
launch and the recovery loop; the keeper (fstrain/api/keeper.py) for a detached run with a
recovery policy or trackers; fstrain/api/launch.py for the run's end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fstrain.core.runs import runevents

if TYPE_CHECKING:
    from fstrain.core.launch.blame import Verdict
    from fstrain.core.launch.recovery import Next
    from fstrain.core.runs.manifest import Manifest
    from fstrain.io.launch import NodeState, RunOutcome
    from fstrain.io.runevents import EventLog


def started(events: EventLog | None, attempt: int, hosts: Sequence[str], at: float | None = None) -> None:
    """The run's first attempt (``started``), or a later one (``attempt``), starts on ``hosts``."""
    if events is None:
        return
    nodes = f"{len(hosts)} node{'' if len(hosts) == 1 else 's'} ({', '.join(hosts)})"
    if attempt == 1:
        events.write(runevents.STARTED, 1, f"run {events.run_id} started on {nodes}", at=at, hosts=tuple(hosts))
    else:
        events.write(runevents.ATTEMPT, attempt, f"attempt {attempt} started on {nodes}", at=at, hosts=tuple(hosts))


def resumed(events: EventLog | None, attempt: int, step: int | None) -> None:
    """The attempt starts from the checkpoint of ``step`` (nothing where there is none)."""
    if events is not None and step is not None:
        events.write(runevents.RESUMED, attempt, f"attempt {attempt} resumes from the checkpoint of step {step}",
                     step=step)


def first_step(events: EventLog | None, attempt: int) -> Callable[[int], None] | None:
    """What the attempt's stages call with the first step a rank reports."""
    if events is None:
        return None
    log = events

    def write(step: int) -> None:
        log.write(runevents.FIRST_STEP, attempt, f"first step reported: step {step}", step=step)

    return write


def failure(events: EventLog | None, attempt: int, node: NodeState, detail: str, run_code: int | None) -> None:
    """The attempt's first failure: the node that failed first, its failed rank where known
    (``run_code``, the run's code, where neither says one: a node lost)."""
    if events is None:
        return
    rank = node.failure
    code = rank.exit_code if rank is not None else node.exit_code if node.exit_code is not None else run_code
    events.write(runevents.FAILURE, attempt, detail or node.error or f"the job on {node.launch.host.name} failed",
                 at=node.ended, host=node.launch.host.name, rank=rank.rank if rank is not None else None,
                 exit_code=code, signal=(rank.signal_name or None) if rank is not None else None)


def first_failure(events: EventLog | None, attempt: int) -> Callable[[NodeState, str, int | None], None] | None:
    """What an attached attempt's supervision calls the moment its first failure is named."""
    if events is None:
        return None
    log = events

    def write(node: NodeState, detail: str, run_code: int | None) -> None:
        failure(log, attempt, node, detail, run_code)

    return write


def outcome_failure(events: EventLog | None, attempt: int, outcome: RunOutcome) -> None:
    """An ended attempt's first failure, from its outcome (a detached attempt the keeper followed)."""
    first = outcome.first_failure
    if first is not None and 0 <= first < len(outcome.nodes):
        failure(events, attempt, outcome.nodes[first], outcome.detail, outcome.exit_code)


def blame(events: EventLog | None, attempt: int, verdict: Verdict | None, tested: dict[str, str]) -> None:
    """Who the failed attempt is put on, on what evidence, and what each suspect's test found."""
    if events is None or verdict is None:
        return
    who = ", ".join(verdict.suspects) or "no host"
    events.write(runevents.BLAME, attempt, f"verdict {verdict.kind}: {who}", verdict=verdict.kind,
                 suspects=tuple(verdict.suspects), evidence=verdict.why, tested=dict(tested))


def excluded(events: EventLog | None, attempt: int, next_: Next | None) -> None:
    """Each host the next attempt leaves out (only when there is a next attempt)."""
    if events is None or next_ is None or next_.action != "restart":
        return
    for host in next_.excluded:
        events.write(runevents.EXCLUDED, attempt, f"{host} is left out of attempt {attempt + 1}", host=host,
                     evidence=next_.why)


def finished(events: EventLog | None, attempt: int, manifest: Manifest) -> None:
    """The run's end: its state and exit code, as its manifest records them."""
    from fstrain.core.runs.runstate import from_manifest

    if events is None:
        return
    state = from_manifest(manifest)
    said = f" ({manifest.detail})" if manifest.detail else ""
    events.write(runevents.FINISHED, attempt, f"run {state.state}, exit code {state.exit_code}{said}",
                 at=manifest.ended, state=state.state, exit_code=state.exit_code)
