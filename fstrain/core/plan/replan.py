"""Re-planning for a world that changed size: the same model and the same global batch
(sequences per optimizer step) on the ranks that are left, and one line that says what changed.

What moves, in this order of preference:

1. ``dp``: the world divided by the model-parallel ranks (``tp x pp x cp``), which stay as
   they were whenever the new world is a multiple of them;
2. ``grad_accum_steps``, then ``micro_batch_size`` (only ever smaller: a rank's activations
   must still fit), so that ``micro x accum x dp`` is the old global batch;
3. ``tp`` and ``pp`` only when the new world is not a multiple of ``tp x pp x cp``: the layout
   of the same ``cp`` whose ``tp`` divides a node's ranks and the heads, whose ``pp`` divides
   the layers, and whose ``tp x pp`` is closest to the old one (a larger one first: it holds
   less per rank). Said in the message.

A layout on which some ``micro x accum`` keeps the global batch comes before a closer one on
which none does. When no layout keeps it, the first layout's nearest batch is taken and the
message says what the global batch becomes (``exact=True`` refuses instead). A world that
no layout fits is refused with one line. ``ep`` and a hybrid shard group shrink to what divides
the new ``dp``; every result passes the plan file's own checks.

Pure: values in, values out (fstrain/core).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fstrain.core.plan.planfile import PlanFile, validate_cp, validate_ep, validate_knobs
from fstrain.core.plan.schema import ModelSpec, PlanKnobs
from fstrain.errors import ConfigError, InputError

_WHERE = "re-plan"


@dataclass(frozen=True)
class Replanned:
    knobs: PlanKnobs
    message: str  # "4 nodes -> 3: dp 8 -> 6, grad-accum 3 -> 4; the global batch of 48 sequences is kept"
    global_batch_kept: bool = True


def replan(knobs: PlanKnobs, model: ModelSpec, old_world_ranks: int, new_world_ranks: int,
           ranks_per_node: int, exact: bool = False) -> Replanned:
    """The knobs for ``new_world_ranks`` ranks (``ranks_per_node`` a node) that keep ``knobs``'
    model and global batch; raises ConfigError with one line when none can."""
    if knobs.world_size != old_world_ranks:
        raise ConfigError(f"the plan's world is {knobs.dp} x {knobs.cp} x {knobs.tp} x {knobs.pp} = "
                          f"{knobs.world_size} ranks, not the {old_world_ranks} it ran on",
                          "re-plan from the plan the run was launched with", _WHERE)
    if new_world_ranks < 1 or ranks_per_node < 1:
        raise ConfigError(f"cannot re-plan for {new_world_ranks} ranks ({ranks_per_node} a node)",
                          "at least one node must be left", _WHERE)
    global_batch = knobs.global_batch_size
    layouts = _layouts(knobs, model, new_world_ranks, ranks_per_node)
    if not layouts:
        raise ConfigError(
            f"no layout of {new_world_ranks} ranks keeps cp={knobs.cp} with tp dividing {ranks_per_node} ranks a "
            f"node and {model.num_heads} heads and pp dividing {model.num_layers} layers",
            "keep more nodes (--min-nodes), add a spare host, or re-plan by hand with `fstrain plan`", _WHERE)
    problems: list[str] = []
    for keep_only in (True, False) if not exact else (True,):  # a layout that keeps the batch, if any does
        for tp, pp in layouts:
            dp = new_world_ranks // (tp * pp * knobs.cp)
            micro, accum = _batch(knobs.micro_batch_size, global_batch, dp)
            kept = micro * accum * dp == global_batch
            if keep_only and not kept:
                problems.append(f"tp {tp} pp {pp} dp {dp}: {micro * accum * dp} sequences")
                continue
            candidate = _with_layout(knobs, model, tp, pp, dp, micro, accum)
            try:
                validate_knobs(candidate, _WHERE)
                validate_ep(candidate, model, _WHERE)
                validate_cp(candidate, model, _WHERE)
            except InputError as error:
                problems.append(f"tp {tp} pp {pp} dp {dp}: {error.message}")
                continue
            message = describe(knobs, candidate, old_world_ranks, new_world_ranks, ranks_per_node)
            return Replanned(candidate, message, kept)
    raise ConfigError(f"no layout of {new_world_ranks} ranks keeps the global batch of {global_batch} sequences "
                      f"({'; '.join(problems[:3])})",
                      "keep more nodes (--min-nodes), add a spare host, or allow another global batch", _WHERE)


def _layouts(knobs: PlanKnobs, model: ModelSpec, world: int, ranks_per_node: int) -> list[tuple[int, int]]:
    """(tp, pp) pairs that tile ``world`` with the plan's cp: the plan's own first, then by
    closeness of tp x pp to the old product, larger before smaller, tp kept before pp."""
    if world % (knobs.tp * knobs.pp * knobs.cp) == 0:
        return [(knobs.tp, knobs.pp)]
    tps = [t for t in _divisors(ranks_per_node) if model.num_heads % t == 0 and model.num_kv_heads % t == 0]
    if knobs.tp not in tps and world % knobs.tp == 0:
        tps.append(knobs.tp)
    pps = _divisors(model.num_layers)
    old = knobs.tp * knobs.pp
    pairs = [(t, p) for t in tps for p in pps if world % (t * p * knobs.cp) == 0]
    return sorted(pairs, key=lambda tp_pp: (abs(math.log(tp_pp[0] * tp_pp[1] / old)), tp_pp[0] * tp_pp[1] < old,
                                            tp_pp[0] != knobs.tp, abs(tp_pp[1] - knobs.pp)))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _batch(micro: int, global_batch: int, dp: int) -> tuple[int, int]:
    """(micro, accum) with micro x accum x dp == global_batch, micro at most the old one and as
    large as can be; else the old micro and the accumulation nearest the global batch."""
    for size in range(micro, 0, -1):
        if global_batch % (size * dp) == 0:
            return size, global_batch // (size * dp)
    return micro, max(1, round(global_batch / (micro * dp)))


def _with_layout(knobs: PlanKnobs, model: ModelSpec, tp: int, pp: int, dp: int, micro: int,
                 accum: int) -> PlanKnobs:
    ep = knobs.ep
    if ep > 1 and dp % ep:
        ep = math.gcd(ep, dp)
    group = {"ddp": 1, "fsdp-hybrid": math.gcd(knobs.shard_group_size, dp)}.get(knobs.strategy, dp)
    schedule, chunks = knobs.pp_schedule, knobs.pp_virtual_stages
    if pp != knobs.pp and (pp == 1 or model.num_layers % (pp * chunks)):
        schedule, chunks = "1f1b", 1  # the interleaving or the schedule does not fit the new pipeline
    return replace(knobs, tp=tp, pp=pp, dp=dp, micro_batch_size=micro, grad_accum_steps=accum, ep=ep,
                   shard_group_size=group, pp_schedule=schedule, pp_virtual_stages=chunks)


_SHOWN = (("tp", "tp"), ("pp", "pp"), ("pp_schedule", "pp schedule"), ("dp", "dp"), ("ep", "ep"),
          ("shard_group_size", "shard group"), ("micro_batch_size", "micro-batch"), ("grad_accum_steps", "grad-accum"))


def describe(old: PlanKnobs, new: PlanKnobs, old_world: int, new_world: int, ranks_per_node: int) -> str:
    """``4 nodes -> 3: dp 8 -> 6, grad-accum 3 -> 4; the global batch of 48 sequences is kept``."""
    if old_world % ranks_per_node == 0 and new_world % ranks_per_node == 0:
        where = f"{old_world // ranks_per_node} nodes -> {new_world // ranks_per_node}"
    else:
        where = f"{old_world} ranks -> {new_world}"
    shown = [f"{label} {getattr(old, key)} -> {getattr(new, key)}" for key, label in _SHOWN
             if getattr(old, key) != getattr(new, key)
             and not (key == "shard_group_size" and new.strategy not in ("fsdp-hybrid",))]
    changes = ", ".join(shown) or f"dp {new.dp} (unchanged)"
    before, after = old.global_batch_size, new.global_batch_size
    batch = (f"the global batch of {before} sequences is kept" if before == after else
             f"the global batch becomes {after} sequences (was {before}): no micro-batch x grad-accum "
             f"of dp {new.dp} makes {before}")
    return f"{where}: {changes}; {batch}"


def replan_file(plan: PlanFile, hosts: tuple[str, ...], ranks_per_node: int,
                exact: bool = False) -> tuple[PlanFile, str]:
    """A plan file for ``hosts`` (``ranks_per_node`` each): its knobs re-planned, its cluster
    summary the new hosts; and the message."""
    old_world = plan.knobs.world_size
    result = replan(plan.knobs, plan.model, old_world, len(hosts) * ranks_per_node, ranks_per_node, exact)
    cluster = replace(plan.cluster, num_nodes=len(hosts), gpus_per_node=ranks_per_node, hosts=tuple(hosts))
    return replace(plan, knobs=result.knobs, cluster=cluster), result.message
