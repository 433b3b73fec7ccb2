"""The planner's error bands, learned from the calibration runs, as shipped.

Written by the accuracy harness from the leave-one-source-out errors of the runs in
tests/fixtures/planner/measured/ (:mod:`fstrain.core.plan.errorband` says how); regenerate with
``python3 benchmarks/planner_accuracy.py --bands-module > fstrain/core/plan/fittedbands.py``.
tests/unit/test_planner_bands.py fails when these differ from what the harness computes, so
nobody tunes them by hand.
"""

NOMINAL_COVERAGE_PCT = 80
# class: (low, high, runs): the band of the error predicted / measured - 1, and the runs it is learned on
MEMORY_BANDS: dict[str, tuple[float, float, int]] = {
    "all": (-0.097, 0.232, 46),
    "ddp": (-0.018, 0.279, 14),
    "ddp, 1-gpu": (-0.018, 0.279, 14),
    "zero3-fsdp": (-0.122, 0.442, 21),
}
THROUGHPUT_BANDS: dict[str, tuple[float, float, int]] = {
    "all": (-0.141, 0.136, 80),
    "ddp": (-0.426, 1.344, 15),
    "ddp, 1-gpu": (-0.426, 1.344, 13),
    "zero3-fsdp": (-0.137, 0.098, 51),
    "zero3-fsdp, 1-node": (-0.137, 0.098, 22),
    "zero3-fsdp, multi-node": (-0.141, 0.103, 23),
}
# quantity: (held-out runs inside the band learned without their source, held-out runs)
HELD_OUT_COVERAGE: dict[str, tuple[int, int]] = {"memory": (37, 46), "throughput": (59, 80)}
