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
    "all": (-0.085, 0.171, 64),
    "ddp": (-0.018, 0.279, 14),
    "ddp, 1-gpu": (-0.018, 0.279, 14),
    "tp-cp-ep": (-0.051, 0.072, 17),
    "tp-cp-ep, multi-node": (-0.012, -0.003, 9),
    "zero3-fsdp": (-0.122, 0.442, 27),
    "zero3-fsdp, 1-node": (-0.157, 0.083, 11),
    "zero3-fsdp, multi-node": (-0.085, 0.443, 10),
}
THROUGHPUT_BANDS: dict[str, tuple[float, float, int]] = {
    "all": (-0.145, 0.194, 102),
    "ddp": (-0.47, 0.244, 15),
    "ddp, 1-gpu": (-0.47, 0.244, 13),
    "tp-cp-ep": (-0.074, 0.322, 21),
    "tp-cp-ep, multi-node": (-0.074, 0.293, 11),
    "zero3-fsdp": (-0.145, 0.16, 57),
    "zero3-fsdp, 1-node": (-0.285, 0.827, 26),
    "zero3-fsdp, multi-node": (-0.222, 0.132, 25),
}
# quantity: (held-out runs inside the band learned without their source, held-out runs)
HELD_OUT_COVERAGE: dict[str, tuple[int, int]] = {"memory": (51, 64), "throughput": (76, 102)}
