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
    "all": (-0.111, 0.232, 48),
    "ddp": (-0.018, 0.279, 14),
    "ddp, 1-gpu": (-0.018, 0.279, 14),
    "zero3-fsdp": (-0.122, 0.442, 23),
    "zero3-fsdp, 1-node": (-0.157, 0.083, 9),
}
THROUGHPUT_BANDS: dict[str, tuple[float, float, int]] = {
    "all": (-0.158, 0.358, 86),
    "ddp": (-0.439, 1.012, 15),
    "ddp, 1-gpu": (-0.439, 1.012, 13),
    "tp-cp-ep": (-0.026, 0.358, 9),
    "zero3-fsdp": (-0.146, 0.107, 53),
    "zero3-fsdp, 1-node": (-0.155, 0.818, 24),
    "zero3-fsdp, multi-node": (-0.158, 0.103, 23),
}
# quantity: (held-out runs inside the band learned without their source, held-out runs)
HELD_OUT_COVERAGE: dict[str, tuple[int, int]] = {"memory": (39, 48), "throughput": (66, 86)}
