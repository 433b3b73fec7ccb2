"""The planner's error bands (fstrain/core/plan/errorband.py) from the measured runs, and their
coverage.

The bands are learned from the leave-one-source-out errors of the accuracy harness
(tests/unit/test_planner_accuracy.py): each run predicted with the fitted constants re-fitted
without its source. What ships (fstrain/core/plan/fittedbands.py) must equal what this computes,
so the bands move with the models and nobody tunes them by hand; regenerate with
``python3 benchmarks/planner_accuracy.py --bands-module > fstrain/core/plan/fittedbands.py``.

Coverage is measured nested: for each source, the constants are fitted without it and the bands
are learned from the other sources' runs, each predicted with constants fitted without both
sources; the source's runs count as covered when their error lies inside the band of their
class. That share, over all runs, is what a new run's band can be expected to hold.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from fstrain.core.plan import errorband, fittedbands
from fstrain.core.plan.errorband import Band, BandSet, Residual, class_keys, coverage, learn_bands
from fstrain.core.plan.fit import FittedConstants, fit_constants
from fstrain.core.plan.schema import PlanKnobs
from tests.unit.test_planner_accuracy import (
    CASES,
    Case,
    Outcome,
    case_generation,
    evaluate,
    fit_runs,
    fitted_assumptions,
    scored,
    throughput_scored,
)

NOMINAL_COVERAGE_PCT = 80
QUANTITIES = ("memory", "throughput")
# How far the held-out coverage may fall from the nominal before the bands stop meaning what they
# say: runs of one source share their errors, so a source left out can sit outside together.
COVERAGE_TOLERANCE = 0.15
REGENERATE = "python3 benchmarks/planner_accuracy.py --bands-module > fstrain/core/plan/fittedbands.py"


def run_residuals(outcomes: Iterable[Outcome]) -> dict[str, list[tuple[str, Residual]]]:
    """Each scored run's memory and throughput error (``predicted / measured - 1``) with its
    classes, by quantity, each with its source file: the runs the accuracy targets count."""
    outcomes = list(outcomes)
    found: dict[str, list[tuple[str, Residual]]] = {quantity: [] for quantity in QUANTITIES}
    for quantity, runs in (("memory", scored(outcomes)), ("throughput", throughput_scored(outcomes))):
        for o in runs:
            error = o.memory_error_pct if quantity == "memory" else o.throughput_error_pct
            if o.plan is None or error is None:
                continue
            keys = class_keys(o.plan.knobs, o.case.flags["num_nodes"])
            found[quantity].append((o.case.file, Residual(keys, error / 100)))
    return found


@dataclass(frozen=True)
class NestedLoso:
    """Leave one source out, and inside it, leave a second source out."""

    outcomes: list[Outcome]  # each run with the constants fitted without its source (evaluate_loso's)
    sources: list[str]  # the source files, in the order of the folds
    # by quantity, one fold per source: (the other sources' residuals, each predicted without
    # both sources; the source's own residuals, predicted without it)
    folds: dict[str, list[tuple[list[Residual], list[Residual]]]]


def nested_loso(cases: Iterable[Case]) -> NestedLoso:
    cases = [c for c in cases if c.expressible]
    times, memories = fit_runs(cases)
    sources = sorted({c.file for c in cases})
    planned: dict[tuple[str, float, float], Outcome] = {}

    def outcome(case: Case, constants: FittedConstants) -> Outcome:
        # Folds that leave out a source with no fitted runs refit the same constants: plan once.
        key = (case.id, constants.scale_for(case_generation(case)), constants.fragmentation_fraction)
        if key not in planned:
            planned[key] = evaluate(case, fitted_assumptions(constants, case))
        return planned[key]

    def without(*left_out: str) -> FittedConstants:
        return fit_constants([r for r in times if r.source not in left_out],
                             [r for r in memories if r.source not in left_out])

    held_out: dict[str, list[Outcome]] = {}
    folds: dict[str, list[tuple[list[Residual], list[Residual]]]] = {quantity: [] for quantity in QUANTITIES}
    for source in sources:
        constants = without(source)
        held_out[source] = [outcome(c, constants) for c in cases if c.file == source]
        inner = []
        for other in sources:
            if other != source:
                constants = without(source, other)
                inner += [outcome(c, constants) for c in cases if c.file == other]
        learned, judged = run_residuals(inner), run_residuals(held_out[source])
        for quantity in QUANTITIES:
            folds[quantity].append(([r for _, r in learned[quantity]], [r for _, r in judged[quantity]]))
    return NestedLoso([o for case in cases for o in held_out[case.file] if o.case.id == case.id], sources, folds)


def harness_bands(nested: NestedLoso, nominal_pct: int = NOMINAL_COVERAGE_PCT) -> BandSet:
    """The bands over every source's leave-one-source-out errors, with their nested coverage."""
    residuals = run_residuals(nested.outcomes)
    learned = {quantity: learn_bands((r for _, r in residuals[quantity]), nominal_pct) for quantity in QUANTITIES}
    held_out = {quantity: coverage(nested.folds[quantity], nominal_pct) for quantity in QUANTITIES}
    return BandSet(nominal_pct, learned["memory"], learned["throughput"], held_out)


def bands_module(bands: BandSet) -> str:
    """The text of fstrain/core/plan/fittedbands.py for ``bands``."""
    def table(name: str, rows: errorband.BandTable) -> list[str]:
        lines = [f"    {json.dumps(key)}: ({low!r}, {high!r}, {runs})," for key, (low, high, runs) in rows.items()]
        return [f"{name}: dict[str, tuple[float, float, int]] = {{", *lines, "}"]

    return "\n".join([
        '"""The planner\'s error bands, learned from the calibration runs, as shipped.',
        "",
        "Written by the accuracy harness from the leave-one-source-out errors of the runs in",
        "tests/fixtures/planner/measured/ (:mod:`fstrain.core.plan.errorband` says how); regenerate with",
        "``python3 benchmarks/planner_accuracy.py --bands-module > fstrain/core/plan/fittedbands.py``.",
        "tests/unit/test_planner_bands.py fails when these differ from what the harness computes, so",
        "nobody tunes them by hand.",
        '"""',
        "",
        f"NOMINAL_COVERAGE_PCT = {bands.nominal_pct}",
        "# class: (low, high, runs): the band of the error predicted / measured - 1, and the runs it is learned on",
        *table("MEMORY_BANDS", bands.memory),
        *table("THROUGHPUT_BANDS", bands.throughput),
        "# quantity: (held-out runs inside the band learned without their source, held-out runs)",
        "HELD_OUT_COVERAGE: dict[str, tuple[int, int]] = {"
        + ", ".join(f"{json.dumps(q)}: ({inside}, {total})" for q, (inside, total) in bands.held_out.items()) + "}",
        "",
    ])


def coverage_by_source(nested: NestedLoso, nominal_pct: int = NOMINAL_COVERAGE_PCT) -> str:
    """Each source's runs inside the band learned without it, per quantity, as markdown."""
    rows = ["| source | memory runs inside their band | throughput runs inside their band |", "|---|---|---|"]
    for index, source in enumerate(nested.sources):
        cells = []
        for quantity in QUANTITIES:
            inside, total = coverage([nested.folds[quantity][index]], nominal_pct)
            cells.append(f"{inside} of {total}" if total else "-")
        rows.append(f"| `{source}` | {' | '.join(cells)} |")
    return "\n".join(rows)


def bands_markdown(bands: BandSet) -> str:
    """The bands per class and their held-out coverage, as markdown."""
    rows = ["| quantity | class | runs | error low | error high | measured for a prediction P |",
            "|---|---|---|---|---|---|"]
    for quantity, table in (("memory", bands.memory), ("throughput", bands.throughput)):
        for key, (low, high, runs) in table.items():
            rows.append(f"| {quantity} | {key} | {runs} | {100 * low:+.1f} % | {100 * high:+.1f} % | "
                        f"P / {1 + high:.3f} to P / {1 + low:.3f} |")
    rows += ["", "| quantity | nominal coverage | held-out runs inside their band | coverage |", "|---|---|---|---|"]
    for quantity, (inside, total) in bands.held_out.items():
        rows.append(f"| {quantity} | {bands.nominal_pct} % | {inside} of {total} | {inside / total:.0%} |")
    return "\n".join(rows)


# --- on values ------------------------------------------------------------------------------------

def knobs(strategy: str = "fsdp-full", dp: int = 8, tp: int = 1, pp: int = 1, offload: str = "none",
          framework: str = "fstrain") -> PlanKnobs:
    return PlanKnobs(strategy, 3, dp, tp, pp, dp, 1, 1, offload=offload, framework=framework)


def test_classes_on_values() -> None:
    assert class_keys(knobs(), 1) == ("zero3-fsdp, 1-node", "zero3-fsdp", "all")
    assert class_keys(knobs(dp=1), 1)[0] == "zero3-fsdp, 1-gpu"
    assert class_keys(knobs("zero2", dp=64), 8)[0] == "zero1-2, multi-node"
    assert class_keys(knobs("ddp", dp=64, tp=4), 32)[0] == "tp-cp-ep, 256+gpus"
    assert class_keys(knobs("zero1", dp=4, tp=2, pp=2), 2)[0] == "pipeline, multi-node"
    assert class_keys(knobs("zero2", offload="optimizer", pp=2), 2)[0] == "offload, multi-node"
    assert class_keys(knobs(framework="lightning"), 1) == ("lightning, zero3-fsdp, 1-node", "zero3-fsdp, 1-node",
                                                           "zero3-fsdp", "all")


def test_interval_is_the_conformal_order_statistics() -> None:
    # k = floor((n + 1) * 0.2 / 2): 9 runs give k = 1 (the extremes), 19 give 2, 8 none at all.
    assert errorband.min_runs(80) == 9 and errorband.min_runs(90) == 19 and errorband.min_runs(50) == 3
    errors = [0.01 * i for i in range(9)]
    assert errorband.interval(errors, 80) == (0.0, 0.08)
    assert errorband.interval(errors[:8], 80) is None
    assert errorband.interval([0.01 * i for i in range(19)], 80) == (0.01, 0.17)
    with pytest.raises(ValueError):
        errorband.min_runs(100)


def test_bands_fall_back_to_a_coarser_class() -> None:
    fine, coarse = ("zero3-fsdp, 1-node", "zero3-fsdp", "all"), ("ddp, 1-gpu", "ddp", "all")
    residuals = [Residual(fine, 0.01 * i) for i in range(9)] + [Residual(coarse, -0.2)] * 3
    bands = learn_bands(residuals, 80)
    assert bands == {"zero3-fsdp, 1-node": (0.0, 0.08, 9), "zero3-fsdp": (0.0, 0.08, 9), "all": (-0.2, 0.08, 12)}
    assert errorband.band_for(bands, coarse) == Band(-0.2, 0.08, 12, "all")
    assert errorband.band_for(bands, fine) == Band(0.0, 0.08, 9, "zero3-fsdp, 1-node")
    assert errorband.band_for({}, fine) is None


def test_band_sign_convention_by_hand() -> None:
    # Over-predicting by 0 to 10 %: a prediction of 110 is consistent with a measurement of 100 to 110.
    band = Band(0.0, 0.10, 9, "all")
    assert band.measured_range(110.0) == pytest.approx((100.0, 110.0))
    # Under-predicting by 20 % to over-predicting by 25 %: 100 predicted, 80 to 125 measured.
    assert Band(-0.2, 0.25, 9, "all").measured_range(100.0) == pytest.approx((80.0, 125.0))
    assert band.holds(0.1) and band.holds(0.0) and not band.holds(-0.01)


def test_coverage_by_hand() -> None:
    keys = ("ddp, 1-gpu", "ddp", "all")
    nine = [Residual(keys, 0.01 * i) for i in range(9)]  # band (0.00, 0.08)
    folds = [
        (nine, [Residual(keys, 0.05), Residual(keys, 0.09)]),  # inside, outside
        (nine[:8], [Residual(keys, 0.05)]),  # too few to learn a band: outside
        (nine, [Residual(("offload, 1-gpu", "offload", "all"), 0.0)]),  # falls back to all: inside
    ]
    assert coverage(folds, 80) == (2, 4)


def test_prediction_bands_on_values() -> None:
    bands = BandSet(80, {"zero3-fsdp": (-0.1, 0.25, 12), "all": (-0.2, 0.2, 40)}, {"all": (-0.5, 0.0, 30)},
                    {"memory": (9, 12), "throughput": (24, 30)})
    document = errorband.prediction_bands(knobs(), 1, 100 * 2**30, 1000.0, bands).to_dict()
    assert document == {
        "nominal_coverage": 0.8,
        "memory": {"low_bytes": 80 * 2**30, "high_bytes": round(100 * 2**30 / 0.9), "class": "zero3-fsdp",
                   "class_runs": 12, "error_low": -0.1, "error_high": 0.25, "held_out_coverage": 0.75},
        "throughput": {"low_tokens_per_s": 1000.0, "high_tokens_per_s": 2000.0, "class": "all", "class_runs": 30,
                       "error_low": -0.5, "error_high": 0.0, "held_out_coverage": 0.8},
    }
    assert errorband.prediction_bands(knobs(), 1, 2**30, None, bands).throughput is None


# --- on the measured runs -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def nested() -> NestedLoso:
    return nested_loso(CASES)


def test_shipped_bands_are_the_harness_bands(nested: NestedLoso) -> None:
    bands = harness_bands(nested)
    print("\n" + bands_markdown(bands))
    shipped = errorband.SHIPPED
    assert shipped.nominal_pct == bands.nominal_pct == fittedbands.NOMINAL_COVERAGE_PCT
    assert shipped.memory == bands.memory, f"regenerate: {REGENERATE}"
    assert shipped.throughput == bands.throughput, f"regenerate: {REGENERATE}"
    assert shipped.held_out == bands.held_out, f"regenerate: {REGENERATE}"


def test_nested_folds_hold_out_each_source(nested: NestedLoso) -> None:
    from tests.unit.test_planner_accuracy import evaluate_loso

    loso, _ = evaluate_loso(CASES)
    assert [(o.case.id, o.predicted_memory_bytes, o.predicted_tokens_per_s_per_gpu) for o in nested.outcomes] == [
        (o.case.id, o.predicted_memory_bytes, o.predicted_tokens_per_s_per_gpu) for o in loso]
    residuals = run_residuals(nested.outcomes)
    sources = sorted({c.file for c in CASES if c.expressible})
    for quantity in QUANTITIES:
        per_source = collections.Counter(source for source, _ in residuals[quantity])
        folds = nested.folds[quantity]
        assert len(folds) == len(sources)
        assert nested.sources == sources
        for source, (learned_from, held_out) in zip(sources, folds, strict=True):
            # Held out: the source's own runs; learned from: every other source's, none of its own.
            assert len(held_out) == per_source[source]
            assert len(learned_from) == len(residuals[quantity]) - per_source[source]


def test_held_out_coverage_is_near_the_nominal(nested: NestedLoso) -> None:
    bands = harness_bands(nested)
    rows = coverage_by_source(nested).splitlines()[2:]
    assert len(rows) == len(nested.sources)
    for quantity, column in zip(QUANTITIES, (1, 2), strict=True):
        inside, total = bands.held_out[quantity]
        counts = [row.strip("| ").split(" | ")[column] for row in rows]
        # The per-source rows add up to the coverage over all runs.
        assert sum(int(c.split(" of ")[0]) for c in counts if c != "-") == inside
        assert sum(int(c.split(" of ")[1]) for c in counts if c != "-") == total
        assert total >= 40, quantity
        assert abs(inside / total - bands.nominal_pct / 100) <= COVERAGE_TOLERANCE, bands_markdown(bands)
