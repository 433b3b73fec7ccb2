"""The constants fitted on the calibration runs, as shipped.

Written from ``fstrain.core.plan.fit.fit_constants`` over every source in
tests/fixtures/planner/measured/ (``python benchmarks/planner_accuracy.py --fit`` prints them);
tests/unit/test_planner_accuracy.py fails when these differ from that fit, so nobody tunes them
by hand.
"""

COMPUTE_TIME_SCALE: dict[str, float] = {"all": 1.213, "ampere": 0.999, "hopper": 1.324, "volta": 0.814}
FRAGMENTATION_FRACTION = 0.299
