"""Which ranks are stragglers: the one rule `fstrain report` and `fstrain status --watch` share.

A rank is a straggler when its step time is more than STRAGGLER_FRACTION over the median step
time of the *other* ranks. The report compares each rank's median step time over the run
(fstrain/core/report/series.py), the live view each rank's latest one (fstrain/core/monitor/watch.py).

Why the other ranks' median, not all ranks': the rank itself pulls a median that includes it
towards its own time, the more so the fewer ranks there are. With two ranks the median of both
is their mean, so a rank 20 % slower than the other stands only 9 % above it, and a 10 % rule
would never name a rank with two. Left out of its own reference, a rank is measured against the
same thing with 2 ranks as with 2,000: what the rest of the job does.

Pure and stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping

# 10 % is well above the step-to-step noise of a synchronous step (every rank waits at the same
# collectives, so their times differ only by what each does on its own), and well below what a
# throttled GPU or a busy host costs.
STRAGGLER_FRACTION = 0.10


def stragglers(step_s_by_rank: Mapping[int, float], fraction: float = STRAGGLER_FRACTION) -> list[int]:
    """The ranks whose step time (seconds) is over ``(1 + fraction)`` times the median of the
    other ranks' step times, in rank order; none with fewer than two ranks."""
    if len(step_s_by_rank) < 2:
        return []
    ordered = sorted((seconds, rank) for rank, seconds in step_s_by_rank.items())
    times = [seconds for seconds, _ in ordered]
    found = [rank for index, (seconds, rank) in enumerate(ordered)
             if seconds > _median_without(times, index) * (1 + fraction)]
    return sorted(found)


def _median_without(times: list[float], left_out: int) -> float:
    """The median of sorted ``times`` without the one at index ``left_out``, in O(1): the
    positions of the rest shift by one past it."""
    count = len(times) - 1

    def at(position: int) -> float:
        return times[position if position < left_out else position + 1]

    middle = count // 2
    return at(middle) if count % 2 else (at(middle - 1) + at(middle)) / 2
