"""Error bands: the measured values a prediction is consistent with, learned from how far the
planner was off on measured runs like it.

**Sign convention.** A run's error is ``e = predicted / measured - 1`` (the accuracy harness's
signed error, as a fraction): +0.10 when the planner said 10 % more than was measured. A band is
an interval ``[low, high]`` of ``e``; for a new prediction ``P`` the measurement ``M`` it is
consistent with satisfies ``low <= P / M - 1 <= high``, that is
``M in [P / (1 + high), P / (1 + low)]`` (:meth:`Band.measured_range`). A planner that
over-predicts (``e > 0``) puts the band below its prediction.

**Learned from.** The errors of the measured runs in tests/fixtures/planner/measured/, each
predicted leave one source out (with the fitted constants re-fitted without its source, so no
run's error is read off constants fitted on itself), one set for memory and one for throughput.
Each run falls into classes from fine to coarse (:func:`class_keys`): its framework profile with
its strategy family and scale (only for a profile other than the default), its strategy family
and scale, its strategy family, and all runs. A prediction takes the band of its finest class
that holds at least :func:`min_runs` runs.

**The interval.** Of a class's ``n`` errors, sorted, the band runs from the ``k``-th smallest to
the ``k``-th largest with ``k = floor((n + 1) (1 - c) / 2)`` for the nominal coverage ``c``: the
split-conformal interval (Vovk et al., *Algorithmic Learning in a Random World*, 2005; Lei et al.,
"Distribution-free predictive inference for regression", JASA 2018, sec. 2.2), which holds a new
run's error with probability at least ``(n + 1 - 2k) / (n + 1)`` when the runs are exchangeable.
``k >= 1`` needs ``n >= 2 / (1 - c) - 1``: 9 runs for 80 %, the least a class needs
(:func:`min_runs`). Runs of one source are alike, not exchangeable with another source's, which
is why the harness also reports the coverage honestly: each source's runs against bands learned
without that source (:func:`coverage`).

Pure: values in, values out. The shipped bands are :mod:`fstrain.core.plan.fittedbands`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fstrain.core.plan import fittedbands
from fstrain.core.plan.frameworks import DEFAULT_FRAMEWORK  # the profile without a class of its own
from fstrain.core.plan.schema import PlanKnobs

DIGITS = 3  # band ends are rounded so that the shipped table can equal the harness exactly
LARGE_WORLD = 256  # GPUs from which a job is its own scale class
ALL = "all"
# (low, high, runs) of a class, as fittedbands.py ships them
BandTable = Mapping[str, tuple[float, float, int]]


def strategy_family(knobs: PlanKnobs) -> str:
    """What dominates a plan's memory and time beyond data parallelism, first match wins:
    ``offload`` (CPU offload), ``pipeline`` (pp > 1), ``tp-cp-ep`` (tensor, context or expert
    parallel), else by sharding: ``ddp``, ``zero1-2`` (ZeRO-1/2, FSDP grad-op: the optimizer
    states or gradients sharded, the parameters whole), ``zero3-fsdp`` (ZeRO-3, FSDP full and
    hybrid: everything sharded)."""
    if knobs.offload != "none":
        return "offload"
    if knobs.pp > 1:
        return "pipeline"
    if knobs.tp > 1 or knobs.cp > 1 or knobs.ep > 1:
        return "tp-cp-ep"
    if knobs.strategy == "ddp":
        return "ddp"
    if knobs.strategy in ("zero1", "zero2", "fsdp-grad-op"):
        return "zero1-2"
    return "zero3-fsdp"


def scale_bucket(world_size: int, num_nodes: int) -> str:
    """``1-gpu``, ``1-node``, ``multi-node`` (under 256 GPUs) or ``256+gpus``."""
    if world_size >= LARGE_WORLD:
        return f"{LARGE_WORLD}+gpus"
    if world_size == 1:
        return "1-gpu"
    return "1-node" if num_nodes == 1 else "multi-node"


def class_keys(knobs: PlanKnobs, num_nodes: int) -> tuple[str, ...]:
    """The classes a plan falls into, finest first, ending with ``all``."""
    world = knobs.dp * knobs.cp * knobs.tp * knobs.pp
    family, scale = strategy_family(knobs), scale_bucket(world, num_nodes)
    keys: tuple[str, ...] = (f"{family}, {scale}", family, ALL)
    if knobs.framework != DEFAULT_FRAMEWORK:
        keys = (f"{knobs.framework}, {keys[0]}", *keys)
    return keys


def min_runs(nominal_pct: int) -> int:
    """The fewest errors whose conformal interval at ``nominal_pct`` is finite (``k >= 1``)."""
    if not 0 < nominal_pct < 100:
        raise ValueError(f"nominal coverage must be between 0 and 100 %, got {nominal_pct}")
    n = 1
    while _rank(n, nominal_pct) < 1:
        n += 1
    return n


def _rank(n: int, nominal_pct: int) -> int:
    """``k = floor((n + 1) (1 - c) / 2)`` in integers (no rounding at the boundary)."""
    return (n + 1) * (100 - nominal_pct) // 200


def interval(errors: Sequence[float], nominal_pct: int) -> tuple[float, float] | None:
    """The ``k``-th smallest and ``k``-th largest of ``errors`` (module doc), rounded; None
    when there are too few for the nominal coverage."""
    k = _rank(len(errors), nominal_pct)
    if k < 1:
        return None
    ordered = sorted(errors)
    return round(ordered[k - 1], DIGITS), round(ordered[-k], DIGITS)


@dataclass(frozen=True)
class Residual:
    """One measured run's error (``e``, module doc) and the classes it falls into."""

    keys: tuple[str, ...]
    error: float


def learn_bands(residuals: Iterable[Residual], nominal_pct: int) -> dict[str, tuple[float, float, int]]:
    """Every class with enough runs: its (low, high) error band and its number of runs."""
    by_class: dict[str, list[float]] = {}
    for residual in residuals:
        for key in residual.keys:
            by_class.setdefault(key, []).append(residual.error)
    bands = {}
    for key in sorted(by_class):
        band = interval(by_class[key], nominal_pct)
        if band is not None:
            bands[key] = (*band, len(by_class[key]))
    return bands


@dataclass(frozen=True)
class Band:
    """The band of one prediction: its error interval, the class it was learned on and how many
    runs that class holds."""

    low: float
    high: float
    runs: int
    label: str

    def measured_range(self, predicted: float) -> tuple[float, float]:
        """The measured values ``predicted`` is consistent with: ``[P / (1 + high), P / (1 + low)]``."""
        return predicted / (1 + self.high), predicted / (1 + self.low)

    def holds(self, error: float) -> bool:
        return self.low <= error <= self.high


def band_for(bands: BandTable, keys: Sequence[str]) -> Band | None:
    """The band of the finest of ``keys`` that ``bands`` has; None when it has none of them."""
    for key in keys:
        if key in bands:
            low, high, runs = bands[key]
            return Band(low, high, runs, key)
    return None


def coverage(folds: Iterable[tuple[Sequence[Residual], Sequence[Residual]]], nominal_pct: int) -> tuple[int, int]:
    """Held-out runs inside their band, and held-out runs: each fold is (the residuals the
    bands are learned from, the residuals judged against them). A held-out run without a band
    (no class of it has enough runs) counts as outside."""
    inside = total = 0
    for learned_from, held_out in folds:
        bands = learn_bands(learned_from, nominal_pct)
        for residual in held_out:
            band = band_for(bands, residual.keys)
            inside += band is not None and band.holds(residual.error)
            total += 1
    return inside, total



@dataclass(frozen=True)
class BandSet:
    """Bands for memory and throughput at one nominal coverage, with their held-out coverage
    (per quantity: held-out runs inside the band learned without their source, and held-out runs)."""

    nominal_pct: int
    memory: BandTable
    throughput: BandTable
    held_out: Mapping[str, tuple[int, int]]

    def held_out_share(self, quantity: str) -> float | None:
        inside, total = self.held_out.get(quantity, (0, 0))
        return round(inside / total, DIGITS) if total else None


SHIPPED = BandSet(fittedbands.NOMINAL_COVERAGE_PCT, fittedbands.MEMORY_BANDS, fittedbands.THROUGHPUT_BANDS,
                  fittedbands.HELD_OUT_COVERAGE)



@dataclass(frozen=True)
class PredictedRange:
    """One prediction's band: the measured values it is consistent with (in the prediction's
    unit), the band it came from and that band's held-out coverage."""

    low: float
    high: float
    band: Band
    held_out_coverage: float | None

    def to_dict(self, unit: str, whole: bool = False) -> dict[str, object]:
        low, high = (round(self.low), round(self.high)) if whole else (self.low, self.high)
        return {f"low_{unit}": low, f"high_{unit}": high, "class": self.band.label, "class_runs": self.band.runs,
                "error_low": self.band.low, "error_high": self.band.high, "held_out_coverage": self.held_out_coverage}


@dataclass(frozen=True)
class PlanBands:
    """The bands of one plan's memory peak and throughput (None: no band, or no prediction)."""

    nominal_pct: int
    memory: PredictedRange | None
    throughput: PredictedRange | None

    def to_dict(self) -> dict[str, object]:
        """``error_band`` of ``plan --json`` and of the plan file's ``predicted``."""
        return {"nominal_coverage": self.nominal_pct / 100,
                "memory": self.memory.to_dict("bytes", whole=True) if self.memory else None,
                "throughput": self.throughput.to_dict("tokens_per_s") if self.throughput else None}


def prediction_bands(knobs: PlanKnobs, num_nodes: int, peak_bytes: int, tokens_per_s: float | None,
                     bands: BandSet = SHIPPED) -> PlanBands:
    """The bands of a plan of ``knobs`` on ``num_nodes`` nodes predicted to peak at ``peak_bytes``
    and to train ``tokens_per_s``: each the finest class's band with enough runs, as the measured
    range the prediction is consistent with."""
    keys = class_keys(knobs, num_nodes)

    def predicted_range(quantity: str, table: BandTable, value: float | None) -> PredictedRange | None:
        band = band_for(table, keys)
        if band is None or value is None:
            return None
        return PredictedRange(*band.measured_range(value), band, bands.held_out_share(quantity))

    return PlanBands(bands.nominal_pct, predicted_range("memory", bands.memory, float(peak_bytes)),
                     predicted_range("throughput", bands.throughput, tokens_per_s))



def plan_error_band(knobs: PlanKnobs, num_nodes: int, peak_bytes: int, tokens_per_s: float | None,
                    architecture: bool = True) -> dict[str, object] | None:
    """``error_band`` of a plan, as ``plan --json`` and the plan file carry it (the shipped bands'
    :meth:`PlanBands.to_dict`); None for a model given by its parameter count only
    (``architecture`` False): its peak leaves out the activations the measured runs held, so no
    band learned on them applies."""
    if not architecture:
        return None
    return prediction_bands(knobs, num_nodes, peak_bytes, tokens_per_s).to_dict()
