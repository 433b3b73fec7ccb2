"""The recovery policy of a run: after an attempt fails, stop, restart the same hosts, or
exclude the hosts found guilty and restart on the rest (docs/recovery.md).

Pure: the run driver (fstrain/api/driver.py) runs the attempts, collects the evidence, has
fstrain/core/launch/blame.py give the verdict and fstrain/api/diagnose.py test the suspects;
this module decides what follows, and keeps each attempt's record as values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fstrain.core.launch.blame import APPLICATION, Verdict
from fstrain.errors import InputError

POLICIES = ("stop", "restart", "exclude")
CHECKPOINT_DIR_ENV = "FSTRAIN_CHECKPOINT_DIR"
RESTART_ENV = "FSTRAIN_RESTART"
# Checkpoints named by their step, as each trainer names them (docs/your-trainer.md): the bundled
# trainer's step_0000006 (fstrain/train/steps.py), transformers' Trainer's checkpoint-6
# (trainer_utils.py PREFIX_CHECKPOINT_DIR), torchtitan's step-6 (checkpointer/dcp.py
# _create_checkpoint_id), DeepSpeed's global_step6 (engine.py save_checkpoint's default tag),
# Megatron-LM's iter_0000006, Lightning's epoch=0-step=6.ckpt (ModelCheckpoint's default name).
_STEP_DIR = re.compile(r"^(?:step_|step-|checkpoint-|global_step|iter_|(?:.*-)?step=)(\d+)(?:\.ckpt)?$")


@dataclass(frozen=True)
class Policy:
    """What a failed attempt leads to (``--on-failure``), and what bounds it."""

    on_failure: str = "stop"  # stop | restart (the same hosts) | exclude (the guilty hosts)
    max_restarts: int = 0  # attempts after the first
    min_nodes: int = 1  # fewer hosts left than this: the run ends

    def __post_init__(self) -> None:
        if self.on_failure not in POLICIES:
            raise InputError(f"--on-failure must be one of {', '.join(POLICIES)}, got {self.on_failure!r}",
                             "stop ends the run (the default), restart starts the same hosts again, exclude "
                             "leaves out the hosts found guilty", "--on-failure")
        if self.max_restarts < 0 or self.min_nodes < 1:
            raise InputError(f"--max-restarts must be >= 0 and --min-nodes >= 1, got {self.max_restarts} and "
                             f"{self.min_nodes}", "give a restart budget and the fewest nodes a run may shrink to",
                             "--max-restarts/--min-nodes")

    @property
    def recovers(self) -> bool:
        return self.on_failure != "stop"


@dataclass(frozen=True)
class Next:
    """What follows a failed attempt: ``stop`` (with why), or ``restart`` on ``hosts``."""

    action: str
    why: str
    hosts: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    spares_used: tuple[str, ...] = ()


def decide(policy: Policy, restarts_done: int, hosts: Sequence[str], spares: Sequence[str], verdict: Verdict,
           guilty: Sequence[str] = ()) -> Next:
    """What follows a failed attempt on ``hosts``, given the verdict and the hosts its tests
    found ``guilty`` (fstrain/api/diagnose.py).

    An application error ends the run at once: a restart would hit it again. ``exclude`` takes
    the guilty hosts out and puts as many spares in (the world keeps its size while spares
    last); ``restart`` starts the same hosts again, as does ``exclude`` when no host is guilty.
    The budget and ``min_nodes`` bound both."""
    if not policy.recovers:
        return Next("stop", "--on-failure stop")
    if verdict.kind == APPLICATION:
        return Next("stop", f"an application error, not a host's: no restart ({verdict.why})")
    if restarts_done >= policy.max_restarts:
        return Next("stop", f"the restart budget is spent ({restarts_done} of --max-restarts {policy.max_restarts})")
    excluded: tuple[str, ...] = ()
    spares_used: tuple[str, ...] = ()
    kept = tuple(hosts)
    if policy.on_failure == "exclude" and guilty:
        excluded = tuple(h for h in hosts if h in guilty)
        free = [s for s in spares if s not in guilty and s not in hosts]
        spares_used = tuple(free[:len(excluded)])
        # A spare takes an excluded host's place; the rest keep their node ranks' order.
        replacements = iter(spares_used)
        kept = tuple(h for h in (next(replacements, None) if h in excluded else h for h in hosts) if h is not None)
    if len(kept) < policy.min_nodes:
        return Next("stop", f"{len(kept)} node{'' if len(kept) == 1 else 's'} left after excluding "
                    f"{', '.join(excluded)}, fewer than --min-nodes {policy.min_nodes}", kept, excluded)
    why = verdict.why if excluded or policy.on_failure == "restart" else f"{verdict.why}; no host found guilty"
    return Next("restart", why, kept, excluded, spares_used)


def checkpoint_step(names: Sequence[str]) -> int | None:
    """The newest step among a checkpoint folder's entries (``step_0000006``, ``checkpoint-6``,
    ``step-6``, ``global_step6``, ``iter_0000006``, ``epoch=0-step=6.ckpt``); None if none."""
    steps = [int(m.group(1)) for m in map(_STEP_DIR.match, names) if m]
    return max(steps) if steps else None


@dataclass(frozen=True)
class Checkpoints:
    """What a checkpoint folder holds at one moment: the newest step (the bundled trainer's
    layout), and the newest modification time of anything in it (any program's)."""

    step: int | None = None
    newest_mtime: float | None = None

    def newer_than(self, before: Checkpoints) -> bool:
        if self.step is not None and before.step is not None:
            return self.step > before.step
        if self.step is not None and before.step is None:
            return True
        if self.newest_mtime is None:
            return False
        return before.newest_mtime is None or self.newest_mtime > before.newest_mtime


@dataclass(frozen=True)
class Attempt:
    """One attempt of a run, as `fstrain status`, the manifest and `--json` list it."""

    number: int  # 1 for the first
    hosts: tuple[str, ...]
    started: float
    ended: float
    exit_code: int
    reason: str
    detail: str = ""
    verdict: Verdict | None = None
    tested: dict[str, str] = field(default_factory=dict)  # per tested host: the evidence, or none found
    excluded: tuple[str, ...] = ()  # taken out after this attempt
    spares_used: tuple[str, ...] = ()  # put in after this attempt
    next_action: str = "stop"  # what followed it: stop or restart
    next_why: str = ""
    resumed_from: int | None = None  # the checkpoint step it started from
    last_checkpoint: int | None = None  # the newest step when it ended
    progress: bool | None = None  # a newer checkpoint than at its start (None: the first attempt)
    recover_s: float | None = None  # from the previous attempt's end to this one's start
    steps_lost: int | None = None  # steps trained after its last checkpoint, done again
    replanned: str = ""  # what changed in the plan for this attempt's world
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.number, "hosts": list(self.hosts), "started": self.started, "ended": self.ended,
            "exit_code": self.exit_code, "reason": self.reason, "detail": self.detail,
            "verdict": None if self.verdict is None else {"kind": self.verdict.kind,
                                                          "suspects": list(self.verdict.suspects),
                                                          "why": self.verdict.why},
            "tested": dict(self.tested),
            "excluded": list(self.excluded), "spares_used": list(self.spares_used),
            "next": self.next_action, "next_why": self.next_why,
            "resumed_from_step": self.resumed_from, "last_checkpoint_step": self.last_checkpoint,
            "progress": self.progress, "recover_s": self.recover_s, "steps_lost": self.steps_lost,
            "replanned": self.replanned, **self.extra,
        }


def steps_lost(last_step: int | None, last_checkpoint: int | None) -> int | None:
    """Steps an attempt trained past its newest checkpoint: the next attempt trains them again."""
    if last_step is None:
        return None
    return max(0, last_step - (last_checkpoint or 0))


def attempt_banner(number: int, hosts: Sequence[str]) -> str:
    """The line that marks where an attempt begins, in the logs and on the terminal."""
    return f"==== attempt {number} (hosts {','.join(hosts)}) ===="


def describe_attempt(attempt: Mapping[str, Any]) -> str:
    """One line per attempt for `fstrain status` and the launch summary."""
    verdict = attempt.get("verdict") or {}
    parts = [f"attempt {attempt.get('attempt')}: {','.join(attempt.get('hosts') or [])}",
             f"{attempt.get('reason')} (exit {attempt.get('exit_code')})"]
    if verdict:
        parts.append(f"verdict {verdict.get('kind')}: {verdict.get('why')}")
    for host, why in (attempt.get("tested") or {}).items():
        parts.append(f"tested {host}: {why}")
    if attempt.get("excluded"):
        parts.append(f"excluded {','.join(attempt['excluded'])}")
    if attempt.get("spares_used"):
        parts.append(f"spares in: {','.join(attempt['spares_used'])}")
    if attempt.get("replanned"):
        parts.append(f"replanned: {attempt['replanned']}")
    if attempt.get("resumed_from_step") is not None:
        parts.append(f"resumed from step {attempt['resumed_from_step']}")
    if attempt.get("last_checkpoint_step") is not None:
        parts.append(f"last checkpoint step {attempt['last_checkpoint_step']}")
    if attempt.get("steps_lost") is not None:
        parts.append(f"{attempt['steps_lost']} step{'' if attempt['steps_lost'] == 1 else 's'} lost")
    if attempt.get("recover_s") is not None:
        parts.append(f"recovered in {attempt['recover_s']:.1f} s")
    if attempt.get("progress") is False:
        parts.append("no newer checkpoint than at its start: no progress")
    if attempt.get("next") == "restart":
        parts.append("then restarted")
    elif attempt.get("next_why"):
        parts.append(f"then stopped: {attempt['next_why']}")
    return "; ".join(parts)
