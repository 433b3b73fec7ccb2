"""The training programs `fstrain render --trainer NAME` writes a config for, and their refusals.

The names are the framework profiles of the same programs (``fstrain plan --framework``,
:mod:`fstrain.core.plan.frameworks`), so one word names a trainer everywhere:

``hf-trainer``
    Hugging Face ``transformers.Trainer``: a ``TrainingArguments`` JSON (and, for a ZeRO plan,
    the DeepSpeed JSON it points at) (:mod:`.hftrainer`).
``lightning``
    Lightning's ``Trainer`` and its ``FSDPStrategy``, ``DeepSpeedStrategy`` or ``DDPStrategy``
    (:mod:`.lightning`).
``torchtitan``
    torchtitan's ``ConfigManager`` command-line overrides (:mod:`.torchtitan`).

A plan a trainer cannot run as planned is refused, in one line that names the knob and what
to re-plan with: a config that runs something else than the plan (another sharding, other
checkpointing) would make the planner's memory and time figures wrong without a word.
"""

from __future__ import annotations

from collections.abc import Sequence

from fstrain.core.plan.schema import PlanKnobs
from fstrain.errors import ConfigError, InputError

TRAINERS = ("hf-trainer", "lightning", "torchtitan")
# What each trainer is called in a message.
TRAINER_TITLES = {
    "hf-trainer": "the Hugging Face Trainer",
    "lightning": "Lightning",
    "torchtitan": "torchtitan",
}


def check_trainers(names: Sequence[str], where: str = "--trainer") -> tuple[str, ...]:
    """The trainers asked for, each once, in the order of :data:`TRAINERS`; an unknown name is
    one InputError."""
    for name in names:
        if name not in TRAINERS:
            raise InputError(f"unknown trainer {name!r}", f"use one of {', '.join(TRAINERS)}", where)
    return tuple(name for name in TRAINERS if name in names)


def cannot_run(trainer: str, knob: str, value: object, why: str, instead: str) -> ConfigError:
    """The refusal of a plan ``trainer`` cannot run: ``plan.<knob> is <value>: <why>``, with the
    knob to re-plan with (``instead``) as the hint."""
    return ConfigError(f"plan.{knob} is {value}: {why}", instead, f"--trainer {trainer}")


def check_fsdp2_habits(knobs: PlanKnobs, trainer: str) -> None:
    """Refuse fsdp2_no_sync and tp_replicated_logits (fstrain.core.plan.fsdp2habits): none of these
    trainers has an argument for them. torchtitan and Lightning reduce-scatter every micro-batch
    (the Trainer runs FSDP1's no_sync, a profile of its own: --framework hf-trainer), and torchtitan's
    TP shards the embedding (its disable_loss_parallel gathers the logits, not the embedding)."""
    title = TRAINER_TITLES[trainer]
    if knobs.fsdp2_no_sync:
        raise cannot_run(trainer, "fsdp2_no_sync", "true",
                         f"{title} has no setting that skips FSDP2's gradient sync between micro-batches",
                         "re-plan without --fsdp2-no-sync (or with --framework for the trainer's own habits)")
    if knobs.tp_replicated_logits and knobs.tp > 1:
        raise cannot_run(trainer, "tp_replicated_logits", "true",
                         f"{title} has no setting that keeps the token embedding whole on every TP rank",
                         "re-plan without --tp-replicated-logits")


def check_model_parallel(knobs: PlanKnobs, trainer: str) -> None:
    """Refuse tp, pp, cp or ep > 1: the data-parallel trainers (HF Trainer, Lightning's FSDP and
    DeepSpeed strategies) have none of them in their arguments."""
    title = TRAINER_TITLES[trainer]
    for knob, flag in (("tp", "--tp"), ("pp", "--pp"), ("cp", "--cp"), ("ep", "--ep")):
        value = getattr(knobs, knob)
        if value > 1:
            raise cannot_run(
                trainer, knob, value,
                f"{title}'s config is rendered for data parallelism only (tp, pp, cp and ep of 1)",
                f"re-plan with {flag} 1, or use --trainer torchtitan" if knob != "ep" else
                f"re-plan with {flag} 1",
            )
