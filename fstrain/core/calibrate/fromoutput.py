"""What a run's ranks printed, as ``plan --calibrate RUN_DIR`` can use it where the run left no
trainer summary (its program is not the bundled trainer): the step numbers its report read from
the output (``fstrain report --json``'s ``ranks``, each read by metricline.read_step from the
metric line, the progress line or a trainer's own line: transformers' Trainer, Lightning,
DeepSpeed, torchtitan, Megatron-LM, ...).

Of those numbers, tokens/s is what a plan's assumptions can be calibrated with (``mfu``): this
rank's (scope ``rank``, torchtitan's ``tps``), or the job's over the ranks the run started. Each
rank's rate is the median over its steps, the first one left out (it includes one-time work). A
step time without the step's tokens, samples/s without the sequence length, one memory peak
without the other (``fragmentation_fraction`` needs the allocator's reserved and allocated
peaks) are what the output lacked, said as such.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OutputNumbers:
    """A run's measured numbers as its ranks printed them."""

    read_from: tuple[str, ...]
    """The forms the numbers were read from (``torchtitan``, ``metric line``, ...), in rank order."""
    tokens_per_s_per_rank: float | None
    """Tokens per second of one rank: the median over the ranks that printed a rate."""
    tokens_how: str
    """How ``tokens_per_s_per_rank`` was had, in words ("" where it was not)."""
    step_s: float | None
    """The median step time over the ranks' steps (the first of each left out)."""
    memory_bytes: int | None
    """The largest memory peak a rank printed."""
    lacked: tuple[str, ...]
    """What the output did not say that a calibration needs, each in words."""


def output_numbers(doc: Mapping[str, Any]) -> OutputNumbers:
    """The numbers of a report document's ``ranks`` (``fstrain.report/1``)."""
    ranks = [r for r in doc.get("ranks") or [] if isinstance(r, Mapping) and r.get("points")]
    read_from = tuple(dict.fromkeys(str(r.get("read_from") or r.get("source") or "") for r in ranks))
    world = doc.get("world_size")
    rates: list[float] = []
    scopes: set[str] = set()
    for rank in ranks:
        rate = _median_after_first(rank["points"], "tokens_per_s")
        if rate is not None:
            rates.append(rate)
            scopes.add(str(rank.get("tokens_scope") or "job"))
    lacked: list[str] = []
    per_rank, how = None, ""
    if rates and scopes == {"rank"}:
        per_rank = statistics.median(rates)
        how = f"{per_rank:,.0f} tokens/s per rank, as {len(rates)} rank{'s' if len(rates) > 1 else ''} printed it"
    elif rates and isinstance(world, int) and world > 0:
        per_rank = statistics.median(rates) / world
        how = f"{statistics.median(rates):,.0f} tokens/s of the job over its {world} ranks"
    elif rates:
        lacked.append("the run's world size, to share the job's tokens/s among its ranks (its manifest names no nodes)")
    step_s = _median([value for rank in ranks if (value := _median_after_first(rank["points"], "step_s")) is not None])
    if not rates and step_s is not None:
        lacked.append(f"tokens/s: the output gives a step time ({step_s:.3g} s) but not the tokens of a step")
    elif not rates:
        lacked.append("tokens/s: the output gives none (DeepSpeed's and Megatron-LM's lines count samples, "
                      "not tokens, and do not say the sequence length)")
    peaks = [p["memory_bytes"] for rank in ranks for p in rank["points"] if isinstance(p.get("memory_bytes"), int)]
    memory = max(peaks) if peaks else None
    lacked.append("fragmentation_fraction: it needs the allocator's reserved and allocated peaks, "
                  + ("the output gives one peak" if memory is not None else "the output gives neither"))
    return OutputNumbers(read_from, per_rank, how, step_s, memory, tuple(lacked))


def _median_after_first(points: Sequence[Mapping[str, Any]], name: str) -> float | None:
    values = [float(p[name]) for p in points if isinstance(p.get(name), (int, float)) and p[name] > 0]
    return _median(values[1:] if len(values) > 1 else values)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None
