"""Pipeline schedules: the bubble, what each rank holds in flight, the boundary traffic.

Three schedules (``schema.PP_SCHEDULES``), each with its source:

- ``1f1b``: PipeDream-Flush / one-forward-one-backward (DeepSpeed's ``TrainSchedule``, torch's
  ``Schedule1F1B``). ``m + p - 1`` micro-batch slots a step, so the bubble is ``(p - 1)/m`` of the
  work (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", SC21, section 2.2.1); rank ``r`` (0 first) holds ``min(p - r, m)``
  micro-batches' activations.
- ``interleaved``: interleaved 1F1B with ``v`` model chunks per rank (Narayanan et al. 2021,
  section 2.2.2; torch's ``ScheduleInterleaved1F1B``): the bubble shrinks to ``(p - 1)/(v m)``,
  each micro-batch crosses ``v`` times as many stage boundaries, and the first rank holds
  ``p (1 + (p - 1)/(p v))`` micro-batches' worth of activations (Megatron-LM's
  ``interleaved_schedule_memory_penalty`` in megatron/training/theoretical_memory_usage.py),
  counted here chunk by chunk from Megatron's warm-up (megatron/core/pipeline_parallel/
  schedules.py: rank ``r`` runs ``2 (p - r - 1) + (v - 1) p`` warm-up chunks, plus one in the
  steady state; with ``m == p`` every chunk of every micro-batch is in flight at once).
- ``zero-bubble``: ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241,
  section 2.1, "memory efficient schedule"): the backward is split into the input gradient (B)
  and the weight gradient (W), and W passes fill the bubble, which falls from ``(p - 1)(T_F + T_B + T_W)`` to
  ``(p - 1)(T_F + T_B - T_W)``: a third of 1F1B's with ``T_F = T_B = T_W``. Its peak
  activation memory is 1F1B's (the paper's ZB-H1 holds at most ``p`` micro-batches; ZB-H2,
  which removes the bubble, holds up to ``2p - 1`` and is not modelled). torch implements it as
  ``ScheduleInterleavedZeroBubble`` ("the ZB1P schedule in the paper").
"""

from __future__ import annotations

import math

ZB_H1_BUBBLE_FRACTION = 1 / 3  # of 1F1B's bubble, with T_F = T_B = T_W (Qi et al. 2023, section 2.1)


def bubble_slots(schedule: str, pp: int, virtual_stages: int = 1) -> float:
    """Idle micro-batch slots a step adds on every rank (a slot: one micro-batch's forward and
    backward through the rank's layers): ``p - 1`` for 1F1B, ``(p - 1)/v`` interleaved, a third
    of ``p - 1`` for ZB-H1."""
    if pp <= 1:
        return 0.0
    if schedule == "interleaved":
        return (pp - 1) / virtual_stages
    if schedule == "zero-bubble":
        return (pp - 1) * ZB_H1_BUBBLE_FRACTION
    return float(pp - 1)


def layers_per_rank(num_layers: int, pp: int, virtual_stages: int = 1) -> int:
    """Blocks on the most loaded rank: ``v`` chunks of ``ceil(L / (p v))`` blocks each."""
    return virtual_stages * math.ceil(num_layers / (pp * virtual_stages))


def in_flight_chunks(schedule: str, pp: int, micro_batches: int, rank: int, virtual_stages: int = 1) -> int:
    """(micro-batch, model chunk) pairs whose activations pipeline rank ``rank`` holds at its peak.

    1F1B and ZB-H1: ``min(p - r, m)`` micro-batches of one chunk. Interleaved: Megatron's warm-up
    chunks plus one, at most all ``m v`` of them (all of them when ``m == p``).
    """
    if pp <= 1:
        return virtual_stages
    if schedule != "interleaved":
        return min(pp - rank, micro_batches)
    total = micro_batches * virtual_stages
    if micro_batches == pp:
        return total
    return min(2 * (pp - rank - 1) + (virtual_stages - 1) * pp + 1, total)


def boundary_crossings(schedule: str, virtual_stages: int = 1) -> int:
    """How many times each micro-batch leaves (and enters) a rank per pass: ``v`` interleaved."""
    return virtual_stages if schedule == "interleaved" else 1


def schedule_label(schedule: str, virtual_stages: int = 1) -> str:
    """'1f1b', 'interleaved x2', 'zero-bubble' (the plan table's column)."""
    return f"interleaved x{virtual_stages}" if schedule == "interleaved" else schedule


def schedule_problem(schedule: str, pp: int, micro_batches: int, num_layers: int, virtual_stages: int = 1,
                     megatron: bool = False) -> str:
    """Why ``schedule`` cannot run this pipeline as modelled ('' when it can): interleaved and ZB-H1
    need a steady state (at least pp micro-batches) and torch's round rule; 1F1B takes any count
    (DeepSpeed's engine runs fewer micro-batches than stages). ``megatron``: Megatron-LM's
    interleaved schedule instead needs whole groups of pp micro-batches (its
    ``microbatch_group_size_per_vp_stage`` defaults to pp: megatron/core/model_parallel_config.py
    @d98e8a6 L567-568; a remainder below pp is an error, pipeline_parallel/schedules.py
    L1160-1180)."""
    if pp <= 1:
        return "" if schedule == "1f1b" else f"the {schedule} schedule needs a pipeline (pp > 1)"
    if schedule == "1f1b":
        return ""
    if micro_batches < pp:
        return f"{micro_batches} micro-batch(es) for {pp} stages: the {schedule} schedule needs at least pp"
    if schedule == "interleaved" and pp * virtual_stages > num_layers:
        return f"pp={pp} x {virtual_stages} virtual stages is more than the {num_layers} layers"
    if megatron:
        if micro_batches % pp:
            return f"{micro_batches} micro-batches are not whole groups of {pp} (Megatron's interleaved schedule)"
        return ""
    rounds = max(1, micro_batches // pp)
    if micro_batches % rounds:
        # torch's ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble: micro-batches must be a
        # multiple of the rounds of pp.
        return f"{micro_batches} micro-batches are not a multiple of {rounds} rounds of {pp}"
    return ""
