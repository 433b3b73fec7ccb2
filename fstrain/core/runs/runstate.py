"""The state of a run, as values: from what the nodes report and what the launcher recorded.

States: ``starting`` (not every node's watchdog has joined the coordinator), ``running``,
``stalled`` (ended by --stall-timeout/--finish-timeout), ``succeeded`` (every node exited 0),
``failed`` (a rank or node failed: the run's exit code is that rank's), ``stopped`` (Ctrl-C,
SIGTERM, `fstrain stop` or Slurm's scancel), ``lost`` (a node, or the coordinator itself, vanished without a
record). Pure: the I/O edge (fstrain/io/runs.py) gathers the inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fstrain.core.runs.manifest import Manifest

STATES = ("starting", "running", "stalled", "succeeded", "failed", "stopped", "lost")
FINAL = frozenset({"stalled", "succeeded", "failed", "stopped", "lost"})
# The attached launcher's reasons (manifest.json) -> states.
_REASONS = {"ok": "succeeded", "failed": "failed", "lost": "lost", "interrupted": "stopped", "terminated": "stopped",
            "cancelled": "stopped", "stalled": "stalled"}


@dataclass(frozen=True)
class RunState:
    state: str
    exit_code: int | None
    reason: str = ""
    ended: float | None = None  # when the run ended, once it has


def from_manifest(manifest: Manifest) -> RunState:
    """An attached run's end, from its manifest."""
    return RunState(_REASONS.get(manifest.reason, "failed"), manifest.exit_code, manifest.reason, manifest.ended)


def from_nodes(views: Sequence[Mapping[str, Any] | None], names: Sequence[str] = ()) -> RunState:
    """A detached run's state from each node's view (``fstrain/io/remote/runctl.py state``;
    None for a node that could not be reached; ``names``: the nodes' hosts, for the reasons).
    Node 0's run record decides while it exists; any node's copy of the final record decides
    after the end."""
    for view in views:
        final = ((view or {}).get("node") or {}).get("final")
        if final:
            return RunState(final["state"], final.get("exit_code"), final.get("reason", ""), final.get("ended"))
    coordinator = views[0] if views else None
    node0 = names[0] if names else "node rank 0"
    if coordinator is None:
        return RunState("lost", None, f"{node0} (the coordinator's host) cannot be reached")
    record = coordinator.get("run") or {}
    if not coordinator.get("watchdog_alive"):
        if record.get("state") in FINAL:
            return RunState(record["state"], record.get("exit_code"), record.get("reason", ""), record.get("ended"))
        return RunState("lost", None, f"the coordinator ({node0}'s watchdog) is gone without a record")
    state = str(record.get("state") or "starting")
    if state in FINAL:  # decided, the nodes are still being torn down
        return RunState(state, record.get("exit_code"), record.get("reason", ""))
    return RunState(state if state in STATES else "running", None, record.get("reason", ""))


# What a detached run's node records say of one attempt -> the attached launcher's reason
# (fstrain/io/launch.py RunOutcome), which the recovery loop reads.
_ATTEMPT_REASONS = {"succeeded": "ok", "failed": "failed", "lost": "lost", "stalled": "stalled",
                    "stopped": "terminated"}
KEEPER_GONE = "recovery keeper gone"


def attempt_reason(state: str) -> str:
    """A detached attempt's final state as the recovery loop names how an attempt ended."""
    return _ATTEMPT_REASONS.get(state, "failed")


def with_keeper(nodes: RunState, manifest: Manifest | None, keeper_alive: bool) -> RunState:
    """A detached run with a recovery keeper (docs/recovery.md): ``nodes`` is what the current
    attempt's nodes say. The run has ended once the keeper wrote the manifest's end and exited;
    while the keeper lives, an attempt's end is not the run's (another may follow); a keeper
    gone without that end leaves the current attempt to run to its end, and nothing after it."""
    if manifest is not None and manifest.ended and not keeper_alive:
        return from_manifest(manifest)
    if keeper_alive:
        if nodes.state not in FINAL:
            return nodes
        return RunState("running", None, "between attempts: the recovery keeper starts the next or ends the run")
    if KEEPER_GONE in nodes.reason:  # said already (a state this machine cached)
        return nodes
    why = f"{KEEPER_GONE}: no further attempt"
    return RunState(nodes.state, nodes.exit_code, f"{nodes.reason}; {why}" if nodes.reason else why, nodes.ended)


def first_failure(views: Sequence[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """A detached run's first failure as its coordinator recorded it (the final record any node
    keeps, else node 0's live ``run.json``): the rank, its local rank, exit code or signal, and
    the host and node it ran on. None while nothing has failed."""
    records = [((v or {}).get("node") or {}).get("final") for v in views]
    records.append((views[0] or {}).get("run") if views else None)
    for record in records:
        if record and record.get("first_failure_node_rank") is not None:
            failure = dict(record.get("first_failure") or {})
            return {**failure, "node_rank": record["first_failure_node_rank"],
                    "host": record.get("first_failure_host"), "reason": record.get("reason", "")}
    return None


def from_host_records(run: Mapping[str, Any] | None, nodes: Sequence[Mapping[str, Any]]) -> RunState:
    """A run found on the hosts (not started from here), from the node records found there
    (each with ``watchdog_alive``) and node 0's run record where it was among them."""
    for node in nodes:
        if node.get("final"):
            final = node["final"]
            return RunState(final["state"], final.get("exit_code"), final.get("reason", ""), final.get("ended"))
    if any(node.get("watchdog_alive") for node in nodes):
        state = str((run or {}).get("state") or "running")
        return RunState(state if state in STATES else "running", (run or {}).get("exit_code"))
    return RunState("lost", None, "no watchdog of the run is alive and none left a record")
