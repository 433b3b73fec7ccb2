"""The format version of every document fstrain writes for a later command or another process.

A plan file, a run's manifest and records, a node's state files, the watchdog's header and the
coordinator's messages each carry the version of their layout (``format``; a plan file's is
its ``fstrain_plan`` key). A reader accepts every version up to the one it writes and refuses a
newer one with one line that says so, instead of misreading it. A document without the key
was written before documents carried it: it is format 1.

Pure and stdlib-only: the node-side scripts (fstrain/io/remote) hold their own copy of the few
versions they write and check, each named after its kind here (a unit test holds them equal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fstrain.errors import InputError

FORMAT_KEY = "format"
WRITER_KEY = "fstrain"  # the version of fstrain that wrote a run folder's document, where known


@dataclass(frozen=True)
class Kind:
    """One kind of document: what a user calls it, the version this fstrain writes, the key
    that holds it and what to do with one that no fstrain can read."""

    title: str
    current: int
    redo: str
    key: str = FORMAT_KEY


_RUN_FOLDER = "it comes from a pre-release fstrain: start the run again, and remove this folder with `fstrain gc`"
KINDS: dict[str, Kind] = {
    # 2: the knobs fsdp2_no_sync and tp_replicated_logits
    "plan": Kind("plan file", 2, "it comes from a pre-release fstrain: write it again with "
                 "`fstrain plan --out plan.yaml`", key="fstrain_plan"),
    # RUN_DIR/manifest.json; 2: "attempts" (a run with a recovery policy), reason "restarting" between them
    "manifest": Kind("run manifest", 2, _RUN_FOLDER),
    "index": Kind("run index entry", 1, "it comes from a pre-release fstrain: remove it"),  # ~/.fstrain/launched
    "detached": Kind("detached run record", 1, _RUN_FOLDER),  # RUN_DIR/detached.json
    "slurm": Kind("Slurm run record", 1, _RUN_FOLDER),  # RUN_DIR/slurm.json
    "keeper": Kind("recovery keeper record", 1, _RUN_FOLDER),  # RUN_DIR/keeper.json (a detached recovering run)
    # RUN_DIR/events.jsonl: one per line (fstrain/core/runs/runevents.py)
    "events": Kind("run event", 1, _RUN_FOLDER),
    "watch": Kind("run watch document", 1, "upgrade fstrain"),  # each line of `status --watch --json`
    "state": Kind("run state cache", 1, "remove it: the next `fstrain status` writes it again"),  # RUN_DIR/state.json
    "node": Kind("node state", 1, _RUN_FOLDER),  # node<I>.json and ~/.fstrain/active/*.json on a node
    "run": Kind("run record", 1, _RUN_FOLDER),  # run.json on node 0: the coordinator's record
    "coordinator": Kind("coordinator record", 1, _RUN_FOLDER),  # coordinator.json on node 0
    "ended_views": Kind("ended run's node views", 1, _RUN_FOLDER),  # ended-views.json on node 0
    "header": Kind("watchdog header", 1, "send it from the fstrain that sends the watchdog"),
    "message": Kind("coordinator message", 1, "use the fstrain that started the run"),
    "hang_report": Kind("hang report", 1, _RUN_FOLDER),  # RUN_DIR/stacks/report.json
    # the bundled trainer's: rank 0's RUN_DIR/summary.json, and each checkpoint's trainer_state.json
    "summary": Kind("training summary", 1, "it comes from a pre-release fstrain: train again"),
    "trainer_state": Kind("trainer checkpoint state", 1, "resume from a checkpoint this fstrain wrote"),
    # the launch's hand-off to its recovery keeper (fstrain/api/keeper.py), on the keeper's stdin
    # 3: the DriveRequest in it groups its node access, output and attempt settings
    # 4: the launch request carries its trackers (TrackerRequest)
    "handoff": Kind("recovery keeper hand-off", 4, "start the keeper from the same fstrain that runs it"),
}


def stamped(document: Mapping[str, Any], kind: str, writer: str = "") -> dict[str, Any]:
    """The document with this fstrain's format version of ``kind`` (and the writer's version) first."""
    spec = KINDS[kind]
    head: dict[str, Any] = {spec.key: spec.current}
    if writer:
        head[WRITER_KEY] = writer
    return {**head, **{k: v for k, v in document.items() if k not in head}}


def version(document: Any, kind: str) -> int | None:
    """The document's format version (1 without the key); None where it is no version at all."""
    if not isinstance(document, Mapping):
        return None
    value = document.get(KINDS[kind].key, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def problem(document: Any, kind: str) -> tuple[str, str] | None:
    """Why this fstrain cannot read the document, as (message, hint); None when it can."""
    spec = KINDS[kind]
    found = version(document, kind)
    if found is not None and found <= spec.current:
        return None
    if found is None:
        shown = document.get(spec.key) if isinstance(document, Mapping) else type(document).__name__
        return f"{spec.title} of format {shown!r}, which no fstrain release writes", spec.redo
    writer = document.get(WRITER_KEY) if isinstance(document, Mapping) else None
    by = f"written by fstrain {writer} " if isinstance(writer, str) and writer else "written by a newer fstrain "
    known = "format 1" if spec.current == 1 else f"formats 1-{spec.current}"
    return f"{spec.title} {by}(format {found}); this fstrain reads {known}", "upgrade fstrain"


def check_format(document: Any, kind: str, where: str) -> int:
    """The document's format version, or an InputError with the one line that says why not."""
    found = problem(document, kind)
    if found is not None:
        raise InputError(found[0], found[1], where)
    return version(document, kind) or 1
