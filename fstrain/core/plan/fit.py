"""The planner's constants that are read off measured runs, as one function of the runs.

Everything else the planner assumes comes from a datasheet, a paper, a framework's code or a
benchmark of kernels (:mod:`fstrain.core.plan.assumptions`, :mod:`fstrain.core.plan.kernelcost`);
these two are not, so they are fitted, and only here:

- ``compute_time_scale``, per GPU generation (:func:`fstrain.core.plan.kernelcost.generation`:
  Volta, Ampere and Ada, Hopper and newer): measured step time over what the kernel model
  prices, on the part of the step that scales with the kernels' time. Each run gives the scale
  that would reproduce it exactly, ``(measured - fixed) / scaled``, where the caller linearises
  the model's step time as ``fixed + scale x scaled`` (two plans at scale 1 and 2); the fit is
  the median of those over a generation's runs (half slower than predicted, half faster: no run
  weighs more than another), and over all runs (``all``) for a generation without runs.
- ``fragmentation_fraction``: the caching allocator's reserve above the live tensors, as a
  fraction of the step's transient memory (everything live at the peak but the parameters and
  the optimizer states, which are allocated once and never freed: the cache holds the freed
  blocks of activations, gradients and buffers of varying sizes). Each run that reports
  PyTorch's max reserved bytes gives the fraction that would reproduce it,
  ``(reserved - live) / (live - persistent)`` with the model's live and persistent bytes at the
  peak; the fit is their median.

``fit_constants`` of every source is what ships (:mod:`fstrain.core.plan.fitted`); the accuracy
harness re-fits it without each source in turn to predict that source's runs (leave one source
out, docs/validation/planner.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

DIGITS = 3  # the fitted values are rounded so that the shipped table can equal the fit exactly


@dataclass(frozen=True)
class TimeRun:
    """One measured run's step time against the model's linearised prediction (seconds)."""

    source: str
    generation: str  # of the run's GPU (kernelcost.generation)
    measured_step_s: float
    fixed_s: float  # the predicted step time that does not scale with the kernels' time
    scaled_s: float  # the part that does, at compute_time_scale 1


@dataclass(frozen=True)
class MemoryRun:
    """One measured run's peak reserved memory (PyTorch's caching allocator) against the model's
    live and persistent bytes at that peak, without any allocator margin (bytes)."""

    source: str
    max_reserved_bytes: float
    predicted_live_bytes: float
    predicted_persistent_bytes: float  # parameters and optimizer states


@dataclass(frozen=True)
class FittedConstants:
    compute_time_scale: dict[str, float]  # by GPU generation, and "all"
    fragmentation_fraction: float

    def scale_for(self, generation: str) -> float:
        return self.compute_time_scale.get(generation, self.compute_time_scale["all"])

    def as_dict(self) -> dict[str, object]:
        return {"compute_time_scale": dict(self.compute_time_scale),
                "fragmentation_fraction": self.fragmentation_fraction}


def fit_constants(times: Iterable[TimeRun], memories: Iterable[MemoryRun]) -> FittedConstants:
    """The constants that best reproduce ``times`` and ``memories`` (see the module doc)."""
    scales = [(r.generation, (r.measured_step_s - r.fixed_s) / r.scaled_s) for r in times
              if r.scaled_s > 0 and r.measured_step_s > r.fixed_s]
    reserves = [(r.max_reserved_bytes - r.predicted_live_bytes) / transient
                for r in memories if (transient := r.predicted_live_bytes - r.predicted_persistent_bytes) > 0]
    if not scales or not reserves:
        raise ValueError(f"nothing to fit: {len(scales)} step times, {len(reserves)} memory measurements")
    by_generation = {"all": round(statistics.median(v for _, v in scales), DIGITS)}
    for name in sorted({g for g, _ in scales}):
        by_generation[name] = round(statistics.median(v for g, v in scales if g == name), DIGITS)
    return FittedConstants(by_generation, round(max(0.0, statistics.median(reserves)), DIGITS))

